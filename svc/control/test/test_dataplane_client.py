"""
Tests for L{svc.control.dataplane_client}: request bodies and answers of the
control calls against an in-memory fake data plane, certificate renewal, and
one real mutual-TLS loopback call.

L{FakeDataPlane} and L{fake_client} are also used by the route and push-loop
tests.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
from treq.testing import StubTreq
from twisted.internet import reactor as global_reactor
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.resource import Resource
from twisted.web.server import Request, Site

from svc.control.dataplane_client import (
    AccountBudget,
    AgentGrant,
    ControlCertificateKeeper,
    ControlCredentials,
    DataPlaneCallFailed,
    DataPlaneClient,
    DataPlaneTarget,
    OwnerUsage,
    PurgeResult,
    SessionFence,
    mtls_http_client,
    rfc3339,
    target_for,
)
from svc.control.store.values import Revocation, Server
from svc.pki.issuance import issue_control_cert
from svc.testing.pki import SERVER_NAME, TestPKI, shared_test_pki

T0 = datetime(2026, 11, 22, 19, 0, 0, tzinfo=UTC)


@attrs.frozen
class RecordedRequest:
    """One request the fake data plane received."""

    method: str
    path: str
    args: Mapping[str, list[str]]
    body: Any
    content_type: str | None


class FakeDataPlane(Resource):
    """
    A data-plane server's C{/control/*} surface, in memory: records every
    request; answers 204 to PUTs, the configured JSON to purge and usage, or
    the status forced for a path in C{statuses}.
    """

    isLeaf = True

    def __init__(self, fqdn: str = SERVER_NAME) -> None:
        super().__init__()
        self.fqdn = fqdn
        self.requests: list[RecordedRequest] = []
        self.statuses: dict[str, int] = {}
        self.purge_answer: object = {"count": 3, "bytes_freed": 4096}
        self.usage_answer: object = {"owner": "acme", "used_bytes": 10, "agents": {"a1": 7}}
        self.gc_answer: object = {
            "tenants": 2,
            "count": 5,
            "bytes_freed": 5000,
            "kept_young": 1,
            "dry_run": False,
            "swept": [],
        }
        self.reachable = True

    def render(self, request: Request) -> bytes:
        path = (request.path or b"").decode()
        content = request.content.read() if request.content is not None else b""
        args = {k.decode(): [v.decode() for v in vs] for k, vs in (request.args or {}).items()}
        content_type = request.getHeader(b"content-type")
        self.requests.append(
            RecordedRequest(
                method=(request.method or b"").decode(),
                path=path,
                args=args,
                body=json.loads(content) if content else None,
                content_type=None if content_type is None else content_type.decode(),
            )
        )
        status = self.statuses.get(path)
        if status is not None:
            request.setResponseCode(status)
            return b'{"error":"forced"}'
        if path == "/control/purge-agent":
            return json.dumps(self.purge_answer).encode()
        if path == "/control/usage":
            return json.dumps(self.usage_answer).encode()
        if path == "/control/gc":
            return json.dumps(self.gc_answer).encode()
        request.setResponseCode(204)
        return b""

    def bodies(self, path: str) -> list[Any]:
        """The JSON bodies received at C{path}, oldest first."""
        return [r.body for r in self.requests if r.path == path]


class _Unreachable:
    """An HTTP client whose every request fails to connect."""

    def request(self, method: str, url: str, **kwargs: object) -> Deferred[Any]:
        return fail(ConnectionRefusedError("connection refused"))


def credentials(pki: TestPKI | None = None) -> ControlCredentials:
    """Control credentials from the test PKI."""
    pki = pki or shared_test_pki()
    return ControlCredentials(pki.control.cert, pki.control.key, pki.root.cert)


def fake_client(
    planes: Mapping[str, FakeDataPlane],
    clock: Clock,
    creds: ControlCredentials | None = None,
    *,
    with_credentials: bool = True,
) -> DataPlaneClient:
    """
    A L{DataPlaneClient} whose calls reach C{planes[target.fqdn]} in memory
    (an unknown FQDN, or a plane marked unreachable, refuses connections).
    """
    creds = creds or credentials()

    def http_client(target: DataPlaneTarget, given: ControlCredentials) -> Any:
        plane = planes.get(target.fqdn)
        if plane is None or not plane.reachable:
            return _Unreachable()
        return StubTreq(plane)

    return DataPlaneClient(
        lambda: creds if with_credentials else None, http_client, clock, timeout=5.0
    )


def server(fqdn: str = SERVER_NAME, address: str = "10.0.0.1:7443") -> Server:
    """A registered server record."""
    return Server(
        server_id="s" * 32,
        fqdn=fqdn,
        address=address,
        capacity=10,
        registered_at=T0,
        last_seen_at=T0,
    )


TARGET = DataPlaneTarget(SERVER_NAME, "10.0.0.1:8443")


class DataPlaneClientTests(SynchronousTestCase):
    """The calls' bodies and the answers' parsing."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.plane = FakeDataPlane()
        self.client = fake_client({SERVER_NAME: self.plane}, self.clock)

    def test_revocations_body(self) -> None:
        """The revocation push carries every serial with its not-after, and generated_at."""
        revocations = [
            Revocation("1f3a", T0 + timedelta(hours=1), T0),
            Revocation("2b", T0 + timedelta(minutes=30), T0),
        ]
        self.successResultOf(self.client.put_revocations(TARGET, revocations, T0))
        [request] = self.plane.requests
        self.assertEqual((request.method, request.path), ("PUT", "/control/cert-revocations"))
        self.assertEqual(request.content_type, "application/json; charset=UTF-8")
        self.assertEqual(
            request.body,
            {
                "revocations": [
                    {"serial": "1f3a", "not_after": "2026-11-22T20:00:00Z"},
                    {"serial": "2b", "not_after": "2026-11-22T19:30:00Z"},
                ],
                "generated_at": "2026-11-22T19:00:00Z",
            },
        )

    def test_empty_revocation_set(self) -> None:
        """An empty active set is still pushed (it clears the server's deny-list)."""
        self.successResultOf(self.client.put_revocations(TARGET, [], T0))
        self.assertEqual(self.plane.bodies("/control/cert-revocations")[0]["revocations"], [])

    def test_agent_grant_body(self) -> None:
        """An agent grant sends owner, tenant, agent_id and grant_bytes."""
        self.successResultOf(self.client.put_quotas(TARGET, AgentGrant("acme", "t1", "a1", 1024)))
        self.assertEqual(
            self.plane.bodies("/control/quotas"),
            [{"owner": "acme", "tenant": "t1", "agent_id": "a1", "grant_bytes": 1024}],
        )

    def test_account_budget_body(self) -> None:
        """A budget update sends account_budget_bytes (null lifts it) and no agent."""
        self.successResultOf(self.client.put_quotas(TARGET, AccountBudget("acme", "t1", None)))
        self.assertEqual(
            self.plane.bodies("/control/quotas"),
            [{"owner": "acme", "tenant": "t1", "account_budget_bytes": None}],
        )

    def test_session_fence_body(self) -> None:
        """A session fence sends owner, tenant, agent_id and epoch to /control/session-epochs."""
        fence = SessionFence("acme", "t1", "a1", 9)
        self.successResultOf(self.client.put_update(TARGET, fence))
        self.assertEqual(
            self.plane.bodies("/control/session-epochs"),
            [{"owner": "acme", "tenant": "t1", "agent_id": "a1", "epoch": 9}],
        )
        self.successResultOf(self.client.put_update(TARGET, AgentGrant("acme", "t1", "a1", 1)))
        self.assertEqual(len(self.plane.bodies("/control/quotas")), 1)

    def test_purge(self) -> None:
        """Purge posts owner, tenant and agent_id and returns count and bytes_freed."""
        result = self.successResultOf(self.client.purge_agent(TARGET, "acme", "t1", "a1"))
        self.assertEqual(result, PurgeResult(count=3, bytes_freed=4096))
        self.assertEqual(
            self.plane.bodies("/control/purge-agent"),
            [{"owner": "acme", "tenant": "t1", "agent_id": "a1"}],
        )

    def test_usage(self) -> None:
        """Usage asks with ?owner= and returns the account and per-agent figures."""
        result = self.successResultOf(self.client.usage(TARGET, "acme"))
        self.assertEqual(result, OwnerUsage("acme", 10, {"a1": 7}))
        [request] = self.plane.requests
        self.assertEqual((request.method, request.args), ("GET", {"owner": ["acme"]}))

    def test_error_status_fails(self) -> None:
        """A non-2xx answer is DataPlaneCallFailed naming the status."""
        self.plane.statuses["/control/quotas"] = 403
        failure = self.failureResultOf(
            self.client.put_quotas(TARGET, AgentGrant("acme", "t1", "a1", 1)), DataPlaneCallFailed
        )
        self.assertEqual(failure.value.reason, "HTTP 403")

    def test_malformed_answers_fail(self) -> None:
        """Answers that are not the documented shape are DataPlaneCallFailed."""
        answers: list[object] = [
            [],
            {"count": -1, "bytes_freed": 0},
            {"count": True, "bytes_freed": 0},
        ]
        for answer in answers:
            self.plane.purge_answer = answer
            self.failureResultOf(
                self.client.purge_agent(TARGET, "acme", "t1", "a1"), DataPlaneCallFailed
            )
        self.plane.usage_answer = {"owner": "acme", "used_bytes": 1, "agents": []}
        self.failureResultOf(self.client.usage(TARGET, "acme"), DataPlaneCallFailed)

    def test_unreachable_fails(self) -> None:
        """A refused connection is DataPlaneCallFailed."""
        self.plane.reachable = False
        self.failureResultOf(self.client.put_revocations(TARGET, [], T0), DataPlaneCallFailed)

    def test_no_credentials_fails(self) -> None:
        """Without a control certificate no call is attempted."""
        client = fake_client({SERVER_NAME: self.plane}, self.clock, with_credentials=False)
        failure = self.failureResultOf(client.put_revocations(TARGET, [], T0), DataPlaneCallFailed)
        self.assertIn("no control certificate", failure.value.reason)
        self.assertEqual(self.plane.requests, [])

    def test_timeout(self) -> None:
        """A call that gets no answer fails once the timeout passes on the clock."""
        hanging: Deferred[Any] = Deferred()

        class Hanging:
            def request(self, method: str, url: str, **kwargs: Any) -> Deferred[Any]:
                kwargs["reactor"].callLater(kwargs["timeout"], hanging.cancel)
                return hanging

        client = DataPlaneClient(credentials, lambda t, c: Hanging(), self.clock, 5.0)
        d = client.put_revocations(TARGET, [], T0)
        self.assertNoResult(d)
        self.clock.advance(5)
        self.failureResultOf(d, DataPlaneCallFailed)


class ValuesTests(SynchronousTestCase):
    """Pure helpers."""

    def test_rfc3339(self) -> None:
        """Timestamps are UTC with a Z suffix, to the second."""
        moment = datetime(2026, 1, 2, 3, 4, 5, 600, tzinfo=UTC)
        self.assertEqual(rfc3339(moment), "2026-01-02T03:04:05Z")

    def test_rfc3339_refuses_naive(self) -> None:
        """A naive datetime is refused."""
        self.assertRaises(ValueError, rfc3339, datetime(2026, 1, 1))

    def test_target_for_server(self) -> None:
        """A server record's target keeps its FQDN for verification."""
        target = target_for(server())
        self.assertEqual(target.fqdn, SERVER_NAME)
        self.assertEqual(target.base_url, "https://10.0.0.1:7443")

    def test_quota_keys(self) -> None:
        """Updates for the same agent (or account and tenant) share a key."""
        self.assertEqual(AgentGrant("o", "t", "a", 1).key, AgentGrant("o", "t", "a", 2).key)
        self.assertNotEqual(AgentGrant("o", "t", "a", 1).key, AgentGrant("o", "t", "b", 1).key)
        self.assertEqual(AccountBudget("o", "t", 1).key, AccountBudget("o", "t", None).key)


class ControlCertificateKeeperTests(SynchronousTestCase):
    """Issuing and renewing the control certificate."""

    def setUp(self) -> None:
        self.pki = shared_test_pki()
        self.now = T0
        self.issued: list[datetime] = []

    def issue(self, at: datetime) -> Deferred[ControlCredentials]:
        self.issued.append(at)
        pair = issue_control_cert(self.pki.root, self.pki.trust_domain, at)
        return succeed(ControlCredentials(pair.cert, pair.key, self.pki.root.cert))

    def test_first_refresh_issues(self) -> None:
        """With no certificate, refresh issues one."""
        keeper = ControlCertificateKeeper(self.issue, lambda: self.now)
        self.assertIsNone(keeper.current())
        self.assertTrue(keeper.due())
        creds = self.successResultOf(keeper.refresh())
        self.assertIs(keeper.current(), creds)
        self.assertEqual(self.issued, [T0])

    def test_renewed_after_two_thirds(self) -> None:
        """The certificate is kept until two thirds of its life, then renewed."""
        keeper = ControlCertificateKeeper(self.issue, lambda: self.now)
        first = self.successResultOf(keeper.refresh())
        self.now = first.renew_at - timedelta(seconds=1)
        self.assertFalse(keeper.due())
        self.assertIs(self.successResultOf(keeper.refresh()), first)
        self.now = first.renew_at
        self.assertTrue(keeper.due())
        second = self.successResultOf(keeper.refresh())
        self.assertNotEqual(second.serial, first.serial)
        self.assertEqual(len(self.issued), 2)
        self.assertLess(first.renew_at, first.not_after)


class _Recorder(Resource):
    """A real data-plane stand-in: records PUT bodies, answers 204."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[Any] = []
        self.peer_serials: list[int] = []

    def render(self, request: Request) -> bytes:
        handle = request.channel.transport.getHandle()  # type: ignore[union-attr]
        peer = handle.get_peer_certificate(as_cryptography=True)
        self.peer_serials.append(peer.serial_number)
        self.bodies.append(json.loads(request.content.read()))  # type: ignore[union-attr]
        request.setResponseCode(204)
        return b""


class MutualTlsTests(TestCase):
    """One real call over loopback mutual TLS 1.3."""

    def listen(self, leaf: Any) -> tuple[_Recorder, DataPlaneTarget]:
        pki = shared_test_pki()
        recorder = _Recorder()
        port = global_reactor.listenSSL(
            0, Site(recorder), pki.server_options(leaf), interface="127.0.0.1"
        )
        self.addCleanup(port.stopListening)
        return recorder, DataPlaneTarget(SERVER_NAME, f"127.0.0.1:{port.getHost().port}")

    async def test_push_over_mtls(self) -> None:
        """The control certificate is presented and the body arrives over real TLS."""
        pki = shared_test_pki()
        recorder, target = self.listen(pki.server)
        client = DataPlaneClient(credentials, mtls_http_client(global_reactor), global_reactor)
        revocation = Revocation("abc", datetime.now(UTC) + timedelta(hours=1), datetime.now(UTC))
        await client.put_revocations(target, [revocation], datetime.now(UTC))
        self.assertEqual(recorder.bodies[0]["revocations"][0]["serial"], "abc")
        self.assertEqual(recorder.peer_serials, [pki.control.cert.serial_number])

    async def test_foreign_server_refused(self) -> None:
        """A server leaf from another org's root is refused before any request is sent."""
        pki = shared_test_pki()
        recorder, target = self.listen(pki.foreign_server())
        client = DataPlaneClient(credentials, mtls_http_client(global_reactor), global_reactor)
        with self.assertRaises(DataPlaneCallFailed):
            await client.put_revocations(target, [], datetime.now(UTC))
        self.assertEqual(recorder.bodies, [])
