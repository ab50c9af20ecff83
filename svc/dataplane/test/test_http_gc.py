"""
Tests for C{POST /control/gc} on the data-plane HTTPS surface: one
garbage-collection cycle run at the control plane's request.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred, succeed
from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane.test.test_http_support import HttpFixture
from svc.store.gc import SweepReport

REPORTS = [
    SweepReport("tenant-a", 3, 3000, False, kept_young=1),
    SweepReport("tenant-b", 0, 0, False),
]


class GcRouteTests(SynchronousTestCase):
    """The route runs the loop's sweep and answers its totals."""

    def setUp(self) -> None:
        self.sweeps = 0

        def sweep() -> Deferred[list[SweepReport]]:
            self.sweeps += 1
            return succeed(REPORTS)

        self.f = HttpFixture(self, sweep=sweep)

    def test_control_runs_a_sweep(self) -> None:
        """With the control certificate: one sweep, its totals and tenants."""
        self.f.as_control()
        answer = self.f.call("POST", "/control/gc")
        self.assertEqual(answer.status, 200, answer.body)
        self.assertEqual(
            answer.json(),
            {
                "tenants": 2,
                "count": 3,
                "bytes_freed": 3000,
                "kept_young": 1,
                "dry_run": False,
                "swept": [
                    {"tenant_id": "tenant-a", "count": 3, "bytes_freed": 3000},
                    {"tenant_id": "tenant-b", "count": 0, "bytes_freed": 0},
                ],
            },
        )
        self.assertEqual(answer.header("cache-control"), "no-store")
        self.assertEqual(self.sweeps, 1)

    def test_agents_and_strangers_refused(self) -> None:
        """No certificate is 401, an agent's is 403; nothing is swept."""
        self.f.anonymous()
        self.assertEqual(self.f.call("POST", "/control/gc").status, 401)
        self.f.as_agent()
        self.assertEqual(self.f.call("POST", "/control/gc").status, 403)
        self.assertEqual(self.sweeps, 0)

    def test_without_a_loop(self) -> None:
        """A surface built without a sweep answers 404."""
        fixture = HttpFixture(self)
        fixture.as_control()
        self.assertEqual(fixture.call("POST", "/control/gc").status, 404)
