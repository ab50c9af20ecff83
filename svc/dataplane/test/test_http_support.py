"""
Shared fixture for the data-plane HTTP tests: a L{DataPlaneHttp} over a real
storage engine in a temporary directory, requests through StubTreq, and the
caller's verified chain chosen by the test (no TLS here; see
L{svc.dataplane.test.test_http_tls} for the real handshake).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path

from cryptography import x509
from prometheus_client import CollectorRegistry
from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from svc.audit.events import AuditEvent
from svc.audit.jsonl import render_line
from svc.dataplane.http import DataPlaneHttp
from svc.dataplane.revocations import DenyListFile, Revocations
from svc.metrics import DataPlaneMetrics
from svc.pki.identity import DenyList
from svc.pki.names import format_serial
from svc.store.gc import SweepReport
from svc.store.layout import TenantLocation
from svc.store.test.test_engine import EngineFixture
from svc.testing.pki import AgentCredentials, shared_test_pki
from svc.testing.web import Answer, request
from svc.testing.worker import ImmediateWorker
from svc.web.readiness import ReadinessProbe


class HttpFixture:
    """
    The app, its engine, the audit lines it emitted, the deny-list it
    holds (merged by a real L{Revocations} kept in C{state_dir}; every
    installed list is appended to C{replaced}), and the chain the next
    request presents (C{chain}).
    """

    def __init__(
        self,
        case: SynchronousTestCase,
        *,
        max_body_bytes: int = 64 * 1024,
        serve_metrics: bool = True,
        readiness: ReadinessProbe | None = None,
        sweep: Callable[[], Deferred[list[SweepReport]]] | None = None,
    ) -> None:
        self.case = case
        self.store = EngineFixture(case)
        case.addCleanup(self.store.close)
        self.clock = self.store.clock
        self.pki = shared_test_pki()
        self.registry = CollectorRegistry()
        self.metrics = DataPlaneMetrics(self.registry)
        self.audit_log = Path(case.mktemp())
        self.emitted: list[AuditEvent] = []
        self.deny_list = DenyList()
        self.replaced: list[DenyList] = []
        self.state_dir = Path(case.mktemp())
        self.revocations = Revocations(
            DenyListFile(self.state_dir), ImmediateWorker(), self.clock, self._replace
        )
        self.chain: list[x509.Certificate] = []
        self.fences: list[tuple[TenantLocation, str, int]] = []
        self.http = DataPlaneHttp(
            engine=self.store.engine,
            registry=self.registry,
            audit_log=self.audit_log,
            emit=self.emitted.append,
            current_deny_list=lambda: self.deny_list,
            merge_deny_list=self.revocations.merge,
            org_root=self.pki.root.cert,
            trust_domain=self.pki.trust_domain,
            now=self.clock.seconds,
            clock=self.clock,
            io=ImmediateWorker(),
            verified_chain=lambda _request: self.chain,
            max_body_bytes=max_body_bytes,
            serve_metrics=serve_metrics,
            readiness=readiness,
            sweep=sweep,
            fence=lambda location, agent_id, epoch: self.fences.append((location, agent_id, epoch)),
        )
        self.resource = self.http.resource()

    def _replace(self, deny_list: DenyList) -> None:
        self.deny_list = deny_list
        self.replaced.append(deny_list)

    def as_agent(self, tenant_id: str = "tenant-a", agent_id: str = "agent-1") -> AgentCredentials:
        """Present a good agent chain; returns its credentials."""
        agent = self.pki.agent(tenant_id, agent_id)
        self.chain = [agent.leaf.cert, *agent.chain, agent.root]
        return agent

    def as_control(self) -> str:
        """Present the control-plane chain; returns its serial."""
        self.chain = [self.pki.control.cert, self.pki.root.cert]
        return format_serial(self.pki.control.cert.serial_number)

    def anonymous(self) -> None:
        """Present no certificate."""
        self.chain = []

    def call(
        self,
        method: str,
        path: str,
        *,
        body: object = None,
        raw: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Answer:
        """One request; C{body} is sent as JSON unless C{raw} is given."""
        sent_headers = dict(headers or {})
        data = raw
        if body is not None:
            data = json.dumps(body).encode()
            sent_headers.setdefault("Content-Type", "application/json")
        return request(self.case, self.resource, method, path, headers=sent_headers, body=data)

    def write_audit(self, *events: AuditEvent) -> None:
        """Append rendered lines to the audit log the app reads."""
        with open(self.audit_log, "a", encoding="utf-8") as handle:
            for event in events:
                handle.write(render_line(event))

    def events(self, name: str) -> list[AuditEvent]:
        """The emitted audit lines named C{name}."""
        return [e for e in self.emitted if e.event == name]


def rfc3339(moment: datetime) -> str:
    """C{moment} as an RFC 3339 UTC string with a Z suffix."""
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
