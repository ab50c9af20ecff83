"""
Tests for L{svc.control.readiness}: C{GET /readyz} on the control plane.
"""

from __future__ import annotations

from datetime import UTC, datetime

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from svc.control.app import build_control_app
from svc.control.readiness import control_checks, readiness_probe, readiness_routes
from svc.control.settings import ControlSettings
from svc.testing.control_store import memory_control_store
from svc.testing.web import Answer, request

NOW = datetime(2026, 11, 1, 12, tzinfo=UTC)


class ControlReadinessTests(SynchronousTestCase):
    """The checks of a control plane with a database and an agent CA."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.store = memory_control_store()
        self.addCleanup(self.store.close)
        self.root: object | None = None
        self.certificate: object | None = None

    def readyz(self, with_ca: bool = True) -> Answer:
        probe = readiness_probe(
            self.store,
            (lambda: succeed(self.root)) if with_ca else None,
            lambda: self.certificate,
            self.clock,
        )
        app = build_control_app(
            ControlSettings.from_environ({}), self.clock.seconds, readiness_routes(probe)
        )
        return request(self, app.resource(), "GET", "/readyz")

    def test_fresh_install(self) -> None:
        """No org root, no data plane: 503 not_ready naming both, with the API headers."""
        answer = self.readyz()
        self.assertEqual(answer.status, 503)
        self.assertEqual(answer.header("Svc-API-Version"), "1")
        self.assertIsNotNone(answer.header("X-Request-ID"))
        self.assertEqual(
            answer.json(),
            {
                "error": "temporarily_unavailable",
                "error_description": "not_ready",
                "status": "not_ready",
                "checks": {
                    "database": "ok",
                    "agent_ca": "not_initialised",
                    "dataplane": "none_registered",
                },
            },
        )

    def test_root_but_no_control_certificate(self) -> None:
        """The org root exists but the control certificate is not issued yet."""
        self.root = object()
        self.assertEqual(self.readyz().json()["checks"]["agent_ca"], "no_control_certificate")

    def test_ready_without_data_plane(self) -> None:
        """CA ready: 200 ready; no data plane registered is reported but does not decide."""
        self.root = self.certificate = object()
        answer = self.readyz()
        self.assertEqual(
            (answer.status, answer.json()),
            (
                200,
                {
                    "status": "ready",
                    "checks": {"database": "ok", "agent_ca": "ok", "dataplane": "none_registered"},
                },
            ),
        )

    def test_registered_data_plane(self) -> None:
        """A registered server makes the dataplane check ok."""
        self.root = self.certificate = object()
        self.successResultOf(self.store.register_server("dp1.example", "10.0.0.1:7443", 10, NOW))
        self.assertEqual(self.readyz().json()["checks"]["dataplane"], "ok")

    def test_database_down(self) -> None:
        """A store that cannot answer: database and dataplane unreachable, 503."""
        self.root = self.certificate = object()
        self.successResultOf(self.store.close())
        answer = self.readyz()
        self.assertEqual(answer.status, 503)
        self.assertEqual(answer.json()["checks"]["database"], "unreachable")
        self.assertEqual(answer.json()["checks"]["dataplane"], "unreachable")

    def test_hung_database(self) -> None:
        """A database that does not answer fails the check with timeout, bounded."""
        store = self.store
        hung: Deferred[tuple[object, ...]] = Deferred()
        self.patch(store, "list_servers", lambda: hung)
        probe = readiness_probe(store, None, lambda: None, self.clock)
        probing = probe.probe()
        self.assertNoResult(probing)
        self.clock.advance(60)
        self.assertEqual(self.successResultOf(probing).checks["database"], "timeout")

    def test_only_what_is_configured(self) -> None:
        """Without a database or an agent CA there is nothing to check: 200 ready."""
        self.assertEqual(control_checks(None, None, lambda: None), [])
        probe = readiness_probe(None, None, lambda: None, self.clock)
        app = build_control_app(
            ControlSettings.from_environ({}), self.clock.seconds, readiness_routes(probe)
        )
        answer = request(self, app.resource(), "GET", "/readyz")
        self.assertEqual((answer.status, answer.json()), (200, {"status": "ready", "checks": {}}))

    def test_ca_lookup_failure(self) -> None:
        """A CA that cannot be opened fails agent_ca with error."""
        probe = readiness_probe(
            None, lambda: fail(OSError("permission denied")), lambda: None, self.clock
        )
        readiness = self.successResultOf(probe.probe())
        self.assertEqual(readiness.checks, {"agent_ca": "error"})
