"""
The data-plane HTTPS surface over real TLS 1.3 on loopback: optional client
certificates verified against the org root only, identity taken from the
handshake's verified chain.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import treq
from OpenSSL import SSL
from prometheus_client import CollectorRegistry
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IOpenSSLClientConnectionCreator
from twisted.internet.ssl import TLSVersion, optionsForClientTLS
from twisted.trial.unittest import TestCase
from twisted.web.client import Agent, HTTPConnectionPool, ResponseNeverReceived
from twisted.web.iweb import IPolicyForHTTPS
from twisted.web.server import Site
from zope.interface import implementer  # type: ignore[import-untyped]

from svc.audit.events import AuditEvent, CertFields, server_event
from svc.audit.jsonl import render_line
from svc.dataplane.http import DataPlaneHttp
from svc.dataplane.http_auth import http_tls_options
from svc.metrics import DataPlaneMetrics
from svc.pki.identity import DenyList
from svc.pki.tls import client_tls_options
from svc.store.test.test_engine import EngineFixture
from svc.testing.pki import SERVER_NAME, shared_test_pki
from svc.testing.worker import ImmediateWorker

_reactor: Any = reactor


@implementer(IPolicyForHTTPS)
class FixedCreator:
    """An HTTPS policy that uses one connection creator for every host."""

    def __init__(self, creator: IOpenSSLClientConnectionCreator) -> None:
        self.creator = creator

    def creatorForNetloc(self, hostname: bytes, port: int) -> IOpenSSLClientConnectionCreator:
        """The one creator, whatever the host."""
        return self.creator


class HttpsSurfaceTests(TestCase):
    """
    Real handshakes against a listener built with L{http_tls_options}.
    """

    def setUp(self) -> None:
        self.pki = pki = shared_test_pki()
        store = EngineFixture(self)
        self.addCleanup(store.close)
        self.audit_log = Path(self.mktemp())
        self.emitted: list[AuditEvent] = []
        self.deny_list = DenyList()
        registry = CollectorRegistry()
        DataPlaneMetrics(registry)
        http = DataPlaneHttp(
            engine=store.engine,
            registry=registry,
            audit_log=self.audit_log,
            emit=self.emitted.append,
            current_deny_list=lambda: self.deny_list,
            merge_deny_list=self._replace,
            org_root=pki.root.cert,
            trust_domain=pki.trust_domain,
            now=_reactor.seconds,
            clock=_reactor,
            io=ImmediateWorker(),
        )
        options = http_tls_options(pki.server.cert, pki.server.key, pki.root.cert)
        self.port = _reactor.listenSSL(0, Site(http.resource()), options, interface="127.0.0.1")
        self.addCleanup(self.port.stopListening)
        self.pool = HTTPConnectionPool(_reactor, persistent=False)
        self.addCleanup(self.pool.closeCachedConnections)

    def _replace(self, deny_list: DenyList) -> None:
        self.deny_list = deny_list

    def url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.port.getHost().port}{path}"

    def client(self, creator: IOpenSSLClientConnectionCreator) -> Any:
        agent: Any = Agent(_reactor, contextFactory=FixedCreator(creator), pool=self.pool)
        return treq.client.HTTPClient(agent)

    def anonymous(self) -> Any:
        settings: dict[str, Any] = {"raiseMinimumTo": TLSVersion.TLSv1_3}
        creator = optionsForClientTLS(
            SERVER_NAME, trustRoot=self.pki.trust_root(), extraCertificateOptions=settings
        )
        return self.client(creator)

    def control(self) -> Any:
        control = self.pki.control
        return self.client(
            client_tls_options(control.cert, control.key, (), self.pki.root.cert, SERVER_NAME)
        )

    async def fetch(self, client: Any, method: str, path: str, body: Any = None) -> Any:
        kwargs: dict[str, Any] = {}
        if body is not None:
            kwargs["data"] = json.dumps(body).encode()
            kwargs["headers"] = {"Content-Type": ["application/json"]}
        response = await client.request(method, self.url(path), **kwargs)
        content = await treq.content(response)
        return response.code, content

    def test_metrics_without_certificate(self) -> Deferred[None]:
        """/metrics answers a client that presents no certificate."""

        async def run() -> None:
            status, body = await self.fetch(self.anonymous(), "GET", "/metrics")
            self.assertEqual(status, 200)
            self.assertIn(b"svc_dataplane_op_duration_seconds", body)

        return Deferred.fromCoroutine(run())

    def test_audit_needs_certificate(self) -> Deferred[None]:
        """/audit without a certificate is 401 and audited."""

        async def run() -> None:
            status, _ = await self.fetch(self.anonymous(), "GET", "/audit")
            self.assertEqual(status, 401)
            self.assertEqual([e.event for e in self.emitted], ["http_auth"])

        return Deferred.fromCoroutine(run())

    def test_audit_scoped_to_agent(self) -> Deferred[None]:
        """/audit with an agent certificate returns only that agent's tenant lines."""
        now = _reactor.seconds()
        lines = [
            server_event(
                "list_entries",
                ts=now,
                cert=CertFields(agent, tenant, "1", "CN=u"),
                path=f"/{agent}",
                allowed=True,
            )
            for tenant, agent in [("tenant-a", "agent-1"), ("tenant-b", "agent-1")]
        ]
        self.audit_log.write_text("".join(render_line(e) for e in lines))
        alice = self.pki.agent("tenant-a", "agent-1")

        async def run() -> None:
            status, body = await self.fetch(self.client(alice.client_options()), "GET", "/audit")
            self.assertEqual(status, 200)
            records = json.loads(body)["records"]
            self.assertEqual([r["tenant_id"] for r in records], ["tenant-a"])
            (line,) = self.emitted
            self.assertEqual(
                (line.event, line.tenant_id, line.size), ("http_get_audit", "tenant-a", 1)
            )

        return Deferred.fromCoroutine(run())

    def test_revocations_with_control_certificate(self) -> Deferred[None]:
        """The control certificate may push revocations; 204 and installed."""
        later = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "revocations": [{"serial": "abc", "not_after": later}],
            "generated_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }

        async def run() -> None:
            status, _ = await self.fetch(self.control(), "PUT", "/control/cert-revocations", body)
            self.assertEqual(status, 204)
            self.assertIn("abc", self.deny_list)

        return Deferred.fromCoroutine(run())

    def test_revocations_with_agent_certificate(self) -> Deferred[None]:
        """An agent certificate on a /control route is 403 and changes nothing."""
        alice = self.pki.agent("tenant-a", "agent-1")
        body = {"revocations": [], "generated_at": "2026-01-01T00:00:00Z"}

        async def run() -> None:
            client = self.client(alice.client_options())
            status, _ = await self.fetch(client, "PUT", "/control/cert-revocations", body)
            self.assertEqual(status, 403)
            self.assertEqual([e.event for e in self.emitted], ["http_auth"])

        return Deferred.fromCoroutine(run())

    def test_foreign_root_never_admitted(self) -> Deferred[None]:
        """A client certificate from another root fails the handshake: no response at all."""
        intruder = self.pki.foreign_agent("tenant-a", "agent-1")

        async def run() -> None:
            client = self.client(intruder.client_options())
            try:
                status, _ = await self.fetch(client, "GET", "/audit")
            except ResponseNeverReceived as e:
                # The server refused the chain ("unknown ca") in the handshake.
                self.assertTrue(any(reason.check(SSL.Error) for reason in e.reasons))
            else:
                self.fail(f"a foreign certificate got an HTTP answer ({status})")
            self.assertEqual(self.emitted, [])

        return Deferred.fromCoroutine(run())
