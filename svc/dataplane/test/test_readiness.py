"""
Tests for L{svc.dataplane.readiness} (what C{/readyz} checks on a data-plane
server) and L{svc.dataplane.http_operator} (the operator listener's routes),
and the two routes' place on the HTTPS surface (L{svc.dataplane.http}).
"""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane.http_operator import OperatorHttp
from svc.dataplane.readiness import DataPlaneReadiness
from svc.dataplane.test.test_http_support import HttpFixture
from svc.metrics import DataPlaneMetrics
from svc.testing.pki import shared_test_pki
from svc.testing.web import request
from svc.testing.worker import ImmediateWorker
from svc.web.readiness import Check, ReadinessProbe


class DataPlaneReadinessTests(SynchronousTestCase):
    """The three checks, as the server tells the readiness what happened."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.tenants = Path(self.mktemp())
        self.metadata = Path(self.mktemp())
        self.readiness = DataPlaneReadiness(
            (self.tenants, self.metadata), ImmediateWorker(), self.clock
        )

    def checks(self) -> dict[str, str]:
        return dict(self.successResultOf(self.readiness.probe.probe()).checks)

    def test_before_start(self) -> None:
        """Nothing there yet: storage missing, no credentials, not listening."""
        self.assertEqual(
            self.checks(),
            {
                "storage": "storage_missing",
                "credentials": "not_installed",
                "listeners": "not_listening",
            },
        )

    def test_ready(self) -> None:
        """Roots made, credentials installed, listeners open: every check ok."""
        self.tenants.mkdir()
        self.metadata.mkdir()
        cert = shared_test_pki().server.cert
        self.clock.advance(cert.not_valid_before_utc.timestamp() + 1)
        self.readiness.credentials_installed(cert)
        self.readiness.listening(True)
        self.assertEqual(self.checks(), {"storage": "ok", "credentials": "ok", "listeners": "ok"})

    def test_storage_root_not_a_directory(self) -> None:
        """A root that is a file (or went away) is storage_missing."""
        self.tenants.mkdir()
        self.metadata.write_text("not a directory")
        self.assertEqual(self.checks()["storage"], "storage_missing")

    def test_expired_credentials(self) -> None:
        """Past the leaf's not-after, credentials are expired."""
        cert = shared_test_pki().server.cert
        self.readiness.credentials_installed(cert)
        self.clock.advance(cert.not_valid_after_utc.timestamp())
        self.assertEqual(self.checks()["credentials"], "expired")

    def test_listeners_closed_at_stop(self) -> None:
        """Listeners closed again (stopping): not_listening."""
        self.readiness.listening(True)
        self.readiness.listening(False)
        self.assertEqual(self.checks()["listeners"], "not_listening")


class OperatorHttpTests(SynchronousTestCase):
    """The operator listener's three routes."""

    def setUp(self) -> None:
        self.registry = CollectorRegistry()
        self.metrics = DataPlaneMetrics(self.registry)
        self.verdict: str | None = None
        probe = ReadinessProbe([Check("credentials", lambda: self.verdict)], Clock())
        self.resource = OperatorHttp(self.registry, probe).resource()

    def test_metrics(self) -> None:
        """GET /metrics is the exposition."""
        self.metrics.count_chunk("cached", 2)
        answer = request(self, self.resource, "GET", "/metrics")
        self.assertEqual(answer.status, 200)
        self.assertEqual(answer.header("content-type"), CONTENT_TYPE_LATEST)
        self.assertIn(b'svc_chunks_total{state="cached"} 2.0', answer.body)

    def test_healthz(self) -> None:
        """GET /healthz is 200 ok."""
        answer = request(self, self.resource, "GET", "/healthz")
        self.assertEqual((answer.status, answer.json()), (200, {"status": "ok"}))

    def test_readyz(self) -> None:
        """GET /readyz is 503 with the failing check, then 200 once it passes."""
        self.verdict = "not_installed"
        answer = request(self, self.resource, "GET", "/readyz")
        self.assertEqual(answer.status, 503)
        self.assertEqual(answer.header("content-type"), "application/json")
        self.assertEqual(
            answer.json(),
            {
                "error": "temporarily_unavailable",
                "error_description": "not_ready",
                "status": "not_ready",
                "checks": {"credentials": "not_installed"},
            },
        )
        self.verdict = None
        answer = request(self, self.resource, "GET", "/readyz")
        self.assertEqual(
            (answer.status, answer.json()),
            (200, {"status": "ready", "checks": {"credentials": "ok"}}),
        )

    def test_nothing_else(self) -> None:
        """Other paths are 404 and other methods 405, as JSON errors."""
        self.assertEqual(request(self, self.resource, "GET", "/audit").status, 404)
        self.assertEqual(request(self, self.resource, "GET", "/control/usage").status, 404)
        answer = request(self, self.resource, "POST", "/metrics")
        self.assertEqual((answer.status, answer.json()["error"]), (405, "method_not_allowed"))


class HttpsSurfaceTests(SynchronousTestCase):
    """/readyz and /metrics on the HTTPS surface agents reach."""

    def test_metrics_leave_with_an_operator_listener(self) -> None:
        """With serve_metrics off, GET /metrics on the HTTPS surface is 404."""
        fixture = HttpFixture(self, serve_metrics=False)
        answer = fixture.call("GET", "/metrics")
        self.assertEqual((answer.status, answer.json()), (404, {"error": "not_found"}))

    def test_readyz(self) -> None:
        """GET /readyz runs the server's checks, without a certificate."""
        probe = ReadinessProbe([Check("listeners", lambda: None)], Clock())
        fixture = HttpFixture(self, readiness=probe)
        answer = fixture.call("GET", "/readyz")
        self.assertEqual(
            (answer.status, answer.json()),
            (200, {"status": "ready", "checks": {"listeners": "ok"}}),
        )
        self.assertEqual(fixture.emitted, [])
