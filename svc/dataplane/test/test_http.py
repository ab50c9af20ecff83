"""
Tests for L{svc.dataplane.http}: the unauthenticated routes, the
authentication rules shared by every protected route, and C{GET /audit}.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from prometheus_client import CONTENT_TYPE_LATEST
from twisted.trial.unittest import SynchronousTestCase

from svc.audit.events import AuditEvent, CertFields, server_event
from svc.audit.server_events import gc_swept_chunks_event, lease_event
from svc.dataplane.http_audit import MAX_LIMIT
from svc.dataplane.test.test_http_support import HttpFixture, rfc3339
from svc.pki.identity import DenyList
from svc.pki.names import format_serial
from svc.store.lease_values import LeaseEventName, LeaseMode, LeaseReason

A1 = CertFields("agent-1", "tenant-a", "a1", "CN=user-1")
A2 = CertFields("agent-2", "tenant-a", "a2", "CN=user-1")
B1 = CertFields("agent-1", "tenant-b", "b1", "CN=user-1")


def listing(ts: float, cert: CertFields, path: str = "/x") -> AuditEvent:
    """A C{list_entries} server line."""
    return server_event("list_entries", ts=ts, cert=cert, path=path, allowed=True)


class PublicRouteTests(SynchronousTestCase):
    """
    C{/healthz} and C{/metrics} need no certificate; unknown routes get
    JSON errors.
    """

    def setUp(self) -> None:
        self.f = HttpFixture(self)

    def test_healthz(self) -> None:
        """GET /healthz without a certificate is 200 {"status": "ok"}."""
        answer = self.f.call("GET", "/healthz")
        self.assertEqual((answer.status, answer.json()), (200, {"status": "ok"}))
        self.assertEqual(answer.header("content-type"), "application/json")

    def test_metrics(self) -> None:
        """GET /metrics without a certificate is the Prometheus exposition."""
        self.f.metrics.count_chunk("fetched", 3)
        answer = self.f.call("GET", "/metrics")
        self.assertEqual(answer.status, 200)
        self.assertEqual(answer.header("content-type"), CONTENT_TYPE_LATEST)
        self.assertIn(b'svc_chunks_total{state="fetched"} 3.0', answer.body)

    def test_unknown_path(self) -> None:
        """An unknown path is 404 not_found with a JSON error body."""
        answer = self.f.call("GET", "/nope")
        self.assertEqual((answer.status, answer.json()), (404, {"error": "not_found"}))

    def test_wrong_method(self) -> None:
        """A known path with another method is 405 with an Allow header."""
        answer = self.f.call("POST", "/healthz")
        self.assertEqual(answer.status, 405)
        self.assertEqual(answer.json()["error"], "method_not_allowed")
        self.assertIn("GET", answer.header("allow") or "")

    def test_public_routes_not_audited(self) -> None:
        """Neither public route writes an audit line."""
        self.f.call("GET", "/healthz")
        self.f.call("GET", "/metrics")
        self.assertEqual(self.f.emitted, [])


class AuthenticationTests(SynchronousTestCase):
    """
    Protected routes: no certificate is 401, the wrong kind (or a refused
    one) is 403, both audited as C{http_auth} with the path and query.
    """

    def setUp(self) -> None:
        self.f = HttpFixture(self)

    def assert_refused(self, status: int, code: str, target: str) -> None:
        method, _, path = target.partition(" ")
        answer = self.f.call(method, path, body={} if method != "GET" else None)
        self.assertEqual((answer.status, answer.json()["error"]), (status, code))
        (line,) = self.f.events("http_auth")
        self.assertEqual((line.path, line.allowed), (path, False))
        self.assertEqual((line.agent_id, line.tenant_id, line.cert_serial), (None, None, None))

    def test_audit_without_certificate(self) -> None:
        """/audit without a certificate is 401 invalid_client, audited with the query."""
        self.f.anonymous()
        self.assert_refused(401, "invalid_client", "GET /audit?limit=5")

    def test_audit_with_control_certificate(self) -> None:
        """/audit with the control certificate is 403 access_denied."""
        self.f.as_control()
        self.assert_refused(403, "access_denied", "GET /audit")

    def test_control_without_certificate(self) -> None:
        """A /control route without a certificate is 401."""
        self.f.anonymous()
        self.assert_refused(401, "invalid_client", "PUT /control/cert-revocations")

    def test_control_with_agent_certificate(self) -> None:
        """A /control route with an agent certificate is 403."""
        self.f.as_agent()
        self.assert_refused(403, "access_denied", "GET /control/usage?owner=acme")

    def test_server_leaf_as_client(self) -> None:
        """The server leaf presented as a client certificate is 403 everywhere."""
        self.f.chain = [self.f.pki.server.cert, self.f.pki.root.cert]
        self.assert_refused(403, "access_denied", "PUT /control/quotas")

    def test_foreign_root(self) -> None:
        """A chain ending at another root is never admitted (403)."""
        foreign = self.f.pki.foreign_agent("tenant-a", "agent-1")
        self.f.chain = [foreign.leaf.cert, *foreign.chain, self.f.pki.other_root.cert]
        self.assert_refused(403, "access_denied", "GET /audit")

    def test_tenant_only_certificate(self) -> None:
        """A leaf without an agent SAN is refused on /audit."""
        agent = self.f.pki.tenant_only_agent("tenant-a")
        self.f.chain = [agent.leaf.cert, *agent.chain, agent.root]
        self.assert_refused(403, "access_denied", "GET /audit")

    def test_denied_agent(self) -> None:
        """An agent whose serial is on the deny-list in force is 403."""
        agent = self.f.as_agent()
        serial = format_serial(agent.leaf.cert.serial_number)
        self.f.deny_list = DenyList.of([(serial, agent.leaf.cert.not_valid_after_utc)])
        self.assert_refused(403, "access_denied", "GET /audit")

    def test_denied_control(self) -> None:
        """A deny-listed control certificate is refused too."""
        serial = self.f.as_control()
        self.f.deny_list = DenyList.of([(serial, self.f.pki.control.cert.not_valid_after_utc)])
        self.assert_refused(403, "access_denied", "GET /control/usage?owner=acme")

    def test_expired_on_open_connection(self) -> None:
        """A leaf that expired since the handshake is refused on a later request."""
        agent = self.f.as_agent()
        expiry = agent.leaf.cert.not_valid_after_utc.timestamp()
        self.f.clock.advance(expiry - self.f.clock.seconds())
        self.assert_refused(403, "access_denied", "GET /audit")


class AuditRouteTests(SynchronousTestCase):
    """
    C{GET /audit}: an agent sees only its own lines in its own tenant,
    newest C{limit}, oldest first, and the read is audited.
    """

    def setUp(self) -> None:
        self.f = HttpFixture(self)
        self.t0 = self.f.clock.seconds() - 100

    def lines(self) -> None:
        lease = lease_event(
            ts=self.t0 + 4,
            event=LeaseEventName.GRANT,
            agent_id="agent-1",
            lease_id="ab" * 16,
            mode=LeaseMode.WRITE,
            reason=LeaseReason.NONE,
            path="/agent-1/f",
        )
        sweep = gc_swept_chunks_event(
            ts=self.t0 + 5, tenant_id="tenant-a", count=1, bytes_freed=2, dry_run=False
        )
        self.f.write_audit(
            listing(self.t0, A1, "/agent-1/one"),
            listing(self.t0 + 1, A2),
            listing(self.t0 + 2, B1),
            lease,
            sweep,
            listing(self.t0 + 6, A1, "/agent-1/two"),
        )

    def test_scoped_to_tenant_and_agent(self) -> None:
        """Only lines with the cert's tenant_id and agent_id come back, oldest first."""
        self.lines()
        self.f.as_agent("tenant-a", "agent-1")
        answer = self.f.call("GET", "/audit")
        self.assertEqual(answer.status, 200)
        records = answer.json()["records"]
        self.assertEqual([r["path"] for r in records], ["/agent-1/one", "/agent-1/two"])
        self.assertEqual(
            {(r["tenant_id"], r["agent_id"]) for r in records}, {("tenant-a", "agent-1")}
        )

    def test_lease_lines_never_returned(self) -> None:
        """A lease line (agent_id, no tenant_id) is not returned even to its agent id."""
        self.lines()
        self.f.as_agent("tenant-b", "agent-1")
        records = self.f.call("GET", "/audit").json()["records"]
        self.assertEqual([r["tenant_id"] for r in records], ["tenant-b"])
        self.assertNotIn("lease_grant", [r["event"] for r in records])

    def test_audited_with_count(self) -> None:
        """The read writes http_get_audit with size = records returned and the cert fields."""
        self.lines()
        agent = self.f.as_agent()
        self.f.call("GET", "/audit?limit=1")
        (line,) = self.f.events("http_get_audit")
        self.assertEqual((line.path, line.size, line.allowed), ("/audit", 1, True))
        self.assertEqual(line.agent_id, "agent-1")
        self.assertEqual(line.tenant_id, "tenant-a")
        self.assertEqual(line.cert_serial, format_serial(agent.leaf.cert.serial_number))

    def test_limit_keeps_newest(self) -> None:
        """limit=1 returns the newest matching line."""
        self.lines()
        self.f.as_agent()
        records = self.f.call("GET", "/audit?limit=1").json()["records"]
        self.assertEqual([r["path"] for r in records], ["/agent-1/two"])

    def test_limit_capped(self) -> None:
        """A limit above the cap returns at most MAX_LIMIT records."""
        self.f.write_audit(*[listing(self.t0, A1) for _ in range(MAX_LIMIT + 5)])
        self.f.as_agent()
        records = self.f.call("GET", "/audit?limit=999999999999").json()["records"]
        self.assertEqual(len(records), MAX_LIMIT)
        self.assertEqual(self.f.events("http_get_audit")[0].size, MAX_LIMIT)

    def test_event_filter_and_since(self) -> None:
        """event and since narrow the records."""
        self.lines()
        self.f.write_audit(
            server_event(
                "manifest_delete", ts=self.t0 + 7, cert=A1, path="/agent-1/z", allowed=True
            )
        )
        self.f.as_agent()
        since = rfc3339(datetime.fromtimestamp(self.t0 + 1, UTC))
        answer = self.f.call("GET", f"/audit?event=list_entries&event=manifest_put&since={since}")
        self.assertEqual([r["path"] for r in answer.json()["records"]], ["/agent-1/two"])

    def test_missing_log(self) -> None:
        """No audit file yet: an empty record list."""
        self.f.as_agent()
        answer = self.f.call("GET", "/audit")
        self.assertEqual((answer.status, answer.json()), (200, {"records": []}))

    def test_bad_query(self) -> None:
        """A malformed or unknown parameter is 400 invalid_request and not audited."""
        self.f.as_agent()
        for query, description in [
            ("limit=0", "bad_limit"),
            ("limit=x", "bad_limit"),
            ("limit=1&limit=2", "repeated_limit"),
            ("since=yesterday", "bad_since"),
            ("since=2026-01-01T00:00:00", "bad_since"),
            ("tenant=tenant-b", "unknown_parameter"),
        ]:
            answer = self.f.call("GET", f"/audit?{query}")
            self.assertEqual(
                (answer.status, answer.json()),
                (400, {"error": "invalid_request", "error_description": description}),
                query,
            )
        self.assertEqual(self.f.emitted, [])

    def test_since_in_future(self) -> None:
        """A since after every line returns nothing."""
        self.lines()
        self.f.as_agent()
        later = rfc3339(datetime.now(UTC) + timedelta(days=1))
        self.assertEqual(self.f.call("GET", f"/audit?since={later}").json()["records"], [])
