"""
Tests for L{svc.dataplane.gc_loop}: the periodic sweep over a real storage
engine, its audit lines, and its scheduling rules.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from svc.audit.events import AuditEvent
from svc.dataplane.gc_loop import GarbageCollectionLoop, SweepsTenant
from svc.store.gc import SweepReport
from svc.store.layout import TenantLocation
from svc.store.test.test_engine import EngineFixture, blob

ACME = TenantLocation.for_owner("acme")
LABS = TenantLocation("acme", "labs")
INTERVAL = 120.0


class EngineSweepTests(SynchronousTestCase):
    """
    The loop against a real L{StorageEngine} in a temporary directory.
    """

    def setUp(self) -> None:
        self.store = EngineFixture(self)
        self.addCleanup(self.store.close)
        self.emitted: list[AuditEvent] = []
        acme = self.store.tenant(ACME)
        self.store.tenant(LABS)
        self.garbage_hash, data = blob("orphan", 700)
        self.store.ok(acme.chunk_put("a1", self.garbage_hash, data))
        self.store.clock.advance(1)  # the upload's charge committed
        self.acme = acme

    def loop(self, dry_run: bool = False) -> GarbageCollectionLoop:
        loop = GarbageCollectionLoop(
            self.store.engine,
            self.store.clock,
            self.emitted.append,
            interval=INTERVAL,
            dry_run=dry_run,
        )
        loop.startService()
        self.addCleanup(loop.stopService)
        return loop

    def lines(self) -> dict[str | None, tuple[object, object, object, str]]:
        return {
            e.tenant_id: (e.get("count"), e.get("bytes_freed"), e.get("dry_run"), e.path)
            for e in self.emitted
        }

    def test_first_sweep_after_interval(self) -> None:
        """Nothing is swept at start; one interval later every tenant is."""
        loop = self.loop()
        self.store.clock.advance(INTERVAL - 1)
        self.assertEqual((self.emitted, loop.sweeps), ([], 0))
        self.store.clock.advance(1)
        self.assertEqual(self.lines(), {"acme": (1, 700, False, ""), "labs": (0, 0, False, "")})
        self.assertEqual({e.event for e in self.emitted}, {"gc_swept_chunks"})
        absent = self.store.ok(self.acme.chunk_has([self.garbage_hash])).absent
        self.assertEqual(absent, (self.garbage_hash,))

    def test_every_interval(self) -> None:
        """Each interval runs one more cycle with one line per tenant."""
        loop = self.loop()
        self.store.clock.pump([INTERVAL] * 3)
        self.assertEqual((loop.sweeps, len(self.emitted)), (3, 6))

    def test_dry_run(self) -> None:
        """A dry run reports what it would free and deletes nothing."""
        self.loop(dry_run=True)
        self.store.clock.advance(INTERVAL)
        self.assertEqual(self.lines()["acme"], (1, 700, True, ""))
        present = self.store.ok(self.acme.chunk_has([self.garbage_hash])).present
        self.assertEqual(present, (self.garbage_hash,))

    def test_tenants_not_opened_since_start(self) -> None:
        """After a restart, tenants on disk that no agent opened are swept too."""
        self.store.close()
        restarted = EngineFixture(self, root=self.store.root)
        self.addCleanup(restarted.close)
        self.assertEqual(restarted.engine.opened(), [])
        loop = GarbageCollectionLoop(
            restarted.engine, restarted.clock, self.emitted.append, interval=INTERVAL
        )
        loop.startService()
        self.addCleanup(loop.stopService)
        restarted.clock.advance(INTERVAL)
        self.assertEqual(self.lines(), {"acme": (1, 700, False, ""), "labs": (0, 0, False, "")})
        acme = restarted.tenant(ACME)
        self.assertEqual(restarted.ok(acme.chunk_has([self.garbage_hash])).present, ())

    def test_stop_cancels(self) -> None:
        """After stopping, no sweep is scheduled any more."""
        loop = self.loop()
        self.successResultOf(loop.stopService())
        self.assertEqual(self.store.clock.getDelayedCalls(), [])
        self.store.clock.advance(INTERVAL * 2)
        self.assertEqual(self.emitted, [])


@attrs.define
class FakeTenant:
    """A tenant whose sweeps the test controls."""

    tenant_id: str
    pending: list[Deferred[SweepReport]] = attrs.Factory(list)
    broken: bool = False

    def sweep(self, *, dry_run: bool = False) -> Deferred[SweepReport]:
        """A sweep that fails at once when broken, else waits for L{finish}."""
        if self.broken:
            return fail(OSError("disk on fire"))
        d: Deferred[SweepReport] = Deferred()
        self.pending.append(d)
        return d

    def finish(self) -> None:
        """Complete the oldest pending sweep."""
        self.pending.pop(0).callback(SweepReport(self.tenant_id, 2, 20, False))


@attrs.define
class FakeEngine:
    """An engine whose tenants are exactly C{tenants}."""

    tenants: list[FakeTenant]

    def sweepable(self) -> Deferred[Sequence[SweepsTenant]]:
        """The fake tenants."""
        return succeed(self.tenants)


class SchedulingTests(SynchronousTestCase):
    """
    No overlapping sweeps, failures contained, stop waits for a sweep.
    """

    def setUp(self) -> None:
        self.clock = Clock()
        self.emitted: list[AuditEvent] = []

    def loop(self, *tenants: FakeTenant) -> GarbageCollectionLoop:
        loop = GarbageCollectionLoop(
            FakeEngine(list(tenants)), self.clock, self.emitted.append, interval=10
        )
        loop.startService()
        self.addCleanup(loop.stopService)
        return loop

    def test_no_overlap(self) -> None:
        """A sweep still running when the next interval comes is not started twice."""
        slow = FakeTenant("slow")
        loop = self.loop(slow)
        self.clock.pump([10, 10, 10])
        self.assertEqual(len(slow.pending), 1)
        slow.finish()
        self.assertEqual(loop.sweeps, 1)
        self.clock.advance(10)
        self.assertEqual(len(slow.pending), 1)

    def test_sweep_now_joins_running(self) -> None:
        """sweep_now during a running sweep waits for it instead of starting another."""
        slow = FakeTenant("slow")
        loop = self.loop(slow)
        first = loop.sweep_now()
        second = loop.sweep_now()
        self.assertEqual(len(slow.pending), 1)
        slow.finish()
        self.assertEqual(self.successResultOf(first), self.successResultOf(second))
        self.assertEqual(len(self.emitted), 1)

    def test_failed_tenant_skipped(self) -> None:
        """A failing tenant is logged; the others are swept and the loop continues."""
        bad = FakeTenant("bad", broken=True)
        good = FakeTenant("good")
        loop = self.loop(bad, good)
        self.clock.advance(10)
        good.finish()
        self.assertEqual(len(self.flushLoggedErrors(OSError)), 1)
        self.assertEqual([e.tenant_id for e in self.emitted], ["good"])
        self.clock.advance(10)
        good.finish()
        self.assertEqual(loop.sweeps, 2)
        self.assertEqual(len(self.flushLoggedErrors(OSError)), 1)

    def test_stop_waits_for_sweep(self) -> None:
        """stopService fires only after the sweep in progress finished."""
        slow = FakeTenant("slow")
        loop = self.loop(slow)
        self.clock.advance(10)
        stopped = loop.stopService()
        self.assertNoResult(stopped)
        slow.finish()
        self.successResultOf(stopped)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_interval_positive(self) -> None:
        """A zero or negative interval is refused."""
        for interval in (0.0, -1.0):
            self.assertRaises(
                ValueError,
                GarbageCollectionLoop,
                FakeEngine([]),
                self.clock,
                self.emitted.append,
                interval=interval,
            )
