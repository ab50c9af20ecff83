"""
Tests for L{svc.store.observer}: what the storage engine reports for the
metrics C{svc_chunk_batch_*{operation="delete"}} and C{svc_journal_rows_total}.
"""

from __future__ import annotations

from collections.abc import Collection

from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from svc.store.layout import TenantLocation
from svc.store.manifest_values import Writer
from svc.store.observer import JOURNAL_ROWS_DELAY, JournalRowsReporter
from svc.store.test.test_engine import GRACE, RETENTION, WRITER, EngineFixture, blob

ACME = TenantLocation.for_owner("acme")


class RecordingObserver:
    """A L{svc.store.observer.StoreObserver} that keeps what it is told."""

    def __init__(self) -> None:
        self.batches: list[tuple[str, int]] = []
        self.items: dict[tuple[str, str], int] = {}
        self.rows: dict[str, int] = {}
        self.forgotten: list[str] = []

    def observe_chunk_batch(self, operation: str, seconds: float, size: int) -> None:
        assert seconds >= 0
        self.batches.append((operation, size))

    def count_chunk_batch_items(self, operation: str, result: str, n: int = 1) -> None:
        self.items[operation, result] = self.items.get((operation, result), 0) + n

    def set_journal_rows(self, allocation_id: str, rows: int) -> None:
        assert rows > 0
        self.rows[allocation_id] = rows

    def forget_allocation(self, allocation_id: str) -> None:
        self.forgotten.append(allocation_id)
        self.rows.pop(allocation_id, None)


class JournalRowsReporterTests(SynchronousTestCase):
    """One count per delay, of the disks marked since the last one."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.observer = RecordingObserver()
        self.table: dict[str, int] = {"a1": 3, "a2": 5}
        self.asked: list[list[str] | None] = []
        self.reporter = JournalRowsReporter(ACME, self.count, self.observer, self.clock)

    def count(self, tops: Collection[str] | None) -> Deferred[dict[str, int]]:
        self.asked.append(None if tops is None else sorted(tops))
        if tops is None:
            return succeed({t: n for t, n in self.table.items() if n})
        return succeed({t: self.table.get(t, 0) for t in tops})

    def test_changes_within_the_delay_share_one_count(self) -> None:
        """Marks made before the delay passes are counted together, once."""
        self.reporter.changed("a1")
        self.reporter.changed("a2")
        self.reporter.changed("a1")
        self.assertEqual(self.asked, [])
        self.clock.advance(JOURNAL_ROWS_DELAY)
        self.assertEqual(self.asked, [["a1", "a2"]])
        self.assertEqual(self.observer.rows, {"acme/a1": 3, "acme/a2": 5})
        self.clock.advance(JOURNAL_ROWS_DELAY * 10)
        self.assertEqual(len(self.asked), 1)

    def test_a_disk_without_rows_loses_its_series(self) -> None:
        """A disk whose rows are all gone has its series removed; one never reported is not."""
        self.reporter.changed_all()
        self.clock.advance(JOURNAL_ROWS_DELAY)
        self.table["a1"] = 0
        self.reporter.changed("a1")
        self.reporter.changed("a9")
        self.clock.advance(JOURNAL_ROWS_DELAY)
        self.assertEqual(self.observer.rows, {"acme/a2": 5})
        self.assertEqual(self.observer.forgotten, ["acme/a1"])

    def test_count_all_forgets_disks_gone(self) -> None:
        """A count of every disk removes the series of a reported disk that has no rows now."""
        self.reporter.changed_all()
        self.clock.advance(JOURNAL_ROWS_DELAY)
        del self.table["a2"]
        self.reporter.changed_all()
        self.clock.advance(JOURNAL_ROWS_DELAY)
        self.assertEqual(self.asked, [None, None])
        self.assertEqual(self.observer.rows, {"acme/a1": 3})
        self.assertEqual(self.observer.forgotten, ["acme/a2"])

    def test_changes_during_a_count_are_counted_after_it(self) -> None:
        """A mark made while a count runs gets a count of its own, after the delay."""
        pending: Deferred[dict[str, int]] = Deferred()
        answers = [pending]

        def slow(tops: Collection[str] | None) -> Deferred[dict[str, int]]:
            self.asked.append(None if tops is None else sorted(tops))
            return answers.pop(0) if answers else succeed({"a2": 7})

        reporter = JournalRowsReporter(ACME, slow, self.observer, self.clock)
        reporter.changed("a1")
        self.clock.advance(JOURNAL_ROWS_DELAY)
        reporter.changed("a2")
        self.clock.advance(JOURNAL_ROWS_DELAY)
        self.assertEqual(self.asked, [["a1"]])
        pending.callback({"a1": 1})
        self.clock.advance(JOURNAL_ROWS_DELAY)
        self.assertEqual(self.asked, [["a1"], ["a2"]])
        self.assertEqual(self.observer.rows, {"acme/a1": 1, "acme/a2": 7})

    def test_close_stops_counting(self) -> None:
        """After close no count runs and no delayed call is left."""
        self.reporter.changed("a1")
        self.successResultOf(self.reporter.close())
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.reporter.changed("a2")
        self.assertEqual(self.clock.getDelayedCalls(), [])


class EngineReportsTests(SynchronousTestCase):
    """The engine reports deletions and journal rows to the observer it was given."""

    def setUp(self) -> None:
        self.observer = RecordingObserver()
        self.f = EngineFixture(self, observer=self.observer)
        self.addCleanup(self.f.close)
        self.storage = self.f.tenant()
        self.f.mkdir(self.storage, "/a1")
        self.f.mkdir(self.storage, "/a2")

    def settle(self) -> None:
        self.f.clock.advance(JOURNAL_ROWS_DELAY)

    def test_journal_rows_follow_writes(self) -> None:
        """Each disk's series counts its journal rows a moment after the writes."""
        self.f.ok(self.f.put_file(self.storage, "/a1/f", [blob("one", 10)]))
        self.f.ok(self.f.put_file(self.storage, "/a1/f", [blob("two", 10)], expected_version=1))
        self.f.mkdir(self.storage, "/a2/d")
        self.settle()
        self.assertEqual(self.observer.rows, {"acme/a1": 3, "acme/a2": 2})

    def test_journal_rows_counted_when_a_tenant_opens(self) -> None:
        """A tenant opened with journal rows on disk reports them without any write."""
        self.f.ok(self.f.put_file(self.storage, "/a1/f", [blob("one", 10)]))
        self.settle()
        self.f.close()
        observer = RecordingObserver()
        reopened = EngineFixture(self, root=self.f.root, observer=observer)
        self.addCleanup(reopened.close)
        reopened.tenant()
        reopened.clock.advance(JOURNAL_ROWS_DELAY)
        self.assertEqual(observer.rows, {"acme/a1": 2, "acme/a2": 1})

    def test_pruned_journal_lowers_the_series(self) -> None:
        """A sweep past the retention prunes the rows and their series go."""
        self.f.ok(self.f.put_file(self.storage, "/a1/f", [blob("one", 10)]))
        self.settle()
        self.f.clock.advance(GRACE + RETENTION + 1)
        self.f.ok(self.storage.sweep())
        self.settle()
        self.assertEqual(self.observer.rows, {})
        self.assertEqual(sorted(self.observer.forgotten), ["acme/a1", "acme/a2"])

    def test_sweep_reports_a_delete_batch(self) -> None:
        """A sweep deleting an old unreferenced chunk reports one delete batch, item deleted."""
        h, d = blob("orphan", 25)
        self.f.ok(self.storage.chunk_put("a1", h, d))
        self.f.clock.advance(GRACE + 1)
        self.f.ok(self.storage.sweep())
        self.assertEqual(self.observer.batches, [("delete", 1)])
        self.assertEqual(self.observer.items, {("delete", "deleted"): 1})

    def test_sweep_with_nothing_to_delete_reports_no_batch(self) -> None:
        """A sweep that finds nothing to delete reports no batch."""
        self.f.ok(self.f.put_file(self.storage, "/a1/f", [blob("kept", 10)]))
        self.f.clock.advance(GRACE + 1)
        self.f.ok(self.storage.sweep())
        self.assertEqual(self.observer.batches, [])

    def test_purge_reports_its_batch_and_forgets_the_disk(self) -> None:
        """A purge reports its deletion batch, and the purged disk's journal series goes."""
        self.f.ok(self.f.put_file(self.storage, "/a1/f", [blob("mine", 20), blob("more", 5)]))
        self.f.ok(
            self.f.put_file(self.storage, "/a2/g", [blob("theirs", 7)], writer=Writer("a2", None))
        )
        self.settle()
        self.assertEqual(self.observer.rows, {"acme/a1": 2, "acme/a2": 2})
        self.f.ok(self.storage.purge_agent("a1"))
        self.settle()
        self.assertEqual(self.observer.batches, [("delete", 2)])
        self.assertEqual(self.observer.items, {("delete", "deleted"): 2})
        self.assertEqual(self.observer.rows, {"acme/a2": 2})
        self.assertEqual(self.observer.forgotten, ["acme/a1"])

    def test_reclaim_reports_missing_chunks(self) -> None:
        """A reclaim pass whose chunk is already gone from the store counts it missing."""
        part = blob("released", 10)
        self.f.ok(self.f.put_file(self.storage, "/a1/f", [part]))
        self.f.ok(self.storage.manifest_delete("/a1/f", writer=WRITER))
        self.f.ok(self.storage.chunks.delete([part[0]]))
        self.f.clock.advance(GRACE + RETENTION + 1)
        self.f.ok(self.storage.sweep())
        self.assertIn(("delete", "missing"), self.observer.items)
        self.assertTrue(all(op == "delete" for op, _ in self.observer.batches))
