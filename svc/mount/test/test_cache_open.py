"""
Tests for opening the chunk cache: layout, locking, and reconciling
C{index.sqlite} with the chunk files.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from svc.audit.names import EventName
from svc.mount.chunks.cache import CacheInUse, ChunkCache
from svc.mount.chunks.cache_index import (
    CHUNKS_DIR_NAME,
    INDEX_NAME,
    TEMP_PREFIX,
    CacheDisk,
    chunk_path,
)
from svc.mount.test.test_cache_support import Opened, chunk, open_cache
from svc.testing.worker import ImmediateWorker, ManualWorker


def reopen(case: SynchronousTestCase, opened: Opened, **options: Any) -> Opened:
    """Close C{opened} and open its root again (same clock)."""
    case.successResultOf(opened.cache.close())
    return open_cache(case, opened.root, clock=opened.clock, **options)


class OpenTests(SynchronousTestCase):
    """
    L{ChunkCache.open} creates the layout and holds the root exclusively.
    """

    def test_creates_layout(self) -> None:
        """Opening a new root creates chunks/ and index.sqlite, private to the user."""
        root = Path(self.mktemp())
        open_cache(self, root)
        self.assertTrue((root / CHUNKS_DIR_NAME).is_dir())
        self.assertTrue((root / INDEX_NAME).is_file())
        self.assertEqual(os.stat(root / CHUNKS_DIR_NAME).st_mode & 0o777, 0o700)

    def test_exclusive(self) -> None:
        """A second open of a root in use fails with CacheInUse; after close it opens."""
        opened = open_cache(self)
        second = ChunkCache.open(opened.root, ImmediateWorker(), Clock(), emit=print)
        self.failureResultOf(second, CacheInUse)
        reopen(self, opened)

    def test_bad_limits(self) -> None:
        """Water marks out of order are refused when the cache is opened."""
        with self.assertRaises(ValueError):
            ChunkCache.open(
                Path(self.mktemp()), ImmediateWorker(), Clock(), emit=print, low_water=10**12
            )

    def test_survives_reopen(self) -> None:
        """Chunks stored before close are served after reopening."""
        opened = open_cache(self)
        name, data = chunk(1)
        self.successResultOf(opened.cache.put(name, data))
        again = reopen(self, opened)
        self.assertEqual(self.successResultOf(again.cache.get(name)), data)
        self.assertEqual(again.cache.usage().bytes_used, len(data))

    def test_recency_survives_reopen(self) -> None:
        """LRU order after reopening follows the hits recorded before close."""
        limits: dict[str, Any] = {"budget_bytes": 1000, "high_water": 900, "low_water": 500}
        opened = open_cache(self, **limits)
        names = []
        for seed in range(9):
            name, data = chunk(seed)
            self.successResultOf(opened.cache.put(name, data))
            names.append(name)
            opened.clock.advance(1)
        self.successResultOf(opened.cache.get(names[0]))
        again = reopen(self, opened, **limits)
        self.successResultOf(again.cache.put(*chunk(9)))
        self.assertIn(names[0], again.cache.contains(names))
        self.assertNotIn(names[1], again.cache.contains(names))

    def test_open_with_queued_worker(self) -> None:
        """Opening runs its blocking work on the worker, firing only once it ran."""
        worker = ManualWorker()
        opening = ChunkCache.open(Path(self.mktemp()), worker, Clock(), emit=print)
        self.assertNoResult(opening)
        worker.run()
        cache = self.successResultOf(opening)
        closing = cache.close()
        worker.run()
        self.successResultOf(closing)


class ReconcileTests(SynchronousTestCase):
    """
    Opening brings the index and the files back in step.
    """

    def test_orphan_file_adopted(self) -> None:
        """A chunk file without a row is adopted as least recently used and served."""
        opened = open_cache(self)
        kept, kept_data = chunk(1)
        self.successResultOf(opened.cache.put(kept, kept_data))
        self.successResultOf(opened.cache.close())
        orphan, data = chunk(2)
        path = chunk_path(opened.root / CHUNKS_DIR_NAME, orphan)
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data)
        again = open_cache(self, opened.root)
        self.assertEqual(again.index_rows()[orphan], (len(data), 0))
        self.assertEqual(self.successResultOf(again.cache.get(orphan)), data)
        self.assertEqual(again.cache.usage().bytes_used, len(data) + len(kept_data))

    def test_missing_file_row_dropped(self) -> None:
        """A row whose file is gone is dropped and no longer counted."""
        opened = open_cache(self)
        (a, data_a), (b, data_b) = chunk(1), chunk(2)
        self.successResultOf(opened.cache.put(a, data_a))
        self.successResultOf(opened.cache.put(b, data_b))
        self.successResultOf(opened.cache.close())
        opened.file_of(a).unlink()
        again = open_cache(self, opened.root)
        self.assertEqual(set(again.index_rows()), {b})
        self.assertEqual(again.cache.contains([a, b]), frozenset({b}))
        self.assertEqual(again.cache.usage().bytes_used, len(data_b))

    def test_temp_files_removed(self) -> None:
        """Temporary files left by an interrupted store are removed at open."""
        opened = open_cache(self)
        name, data = chunk(1)
        self.successResultOf(opened.cache.put(name, data))
        self.successResultOf(opened.cache.close())
        temp = opened.file_of(name).with_name(f"{TEMP_PREFIX}{name}.0123456789abcdef")
        temp.write_bytes(data[:10])
        again = open_cache(self, opened.root)
        self.assertFalse(temp.exists())
        self.assertEqual(again.cache.usage().bytes_used, len(data))

    def test_size_corrected_from_file(self) -> None:
        """A row whose size disagrees with its file takes the file's size; reads then miss."""
        opened = open_cache(self)
        name, data = chunk(1)
        self.successResultOf(opened.cache.put(name, data))
        self.successResultOf(opened.cache.close())
        opened.file_of(name).write_bytes(data[:50])
        again = open_cache(self, opened.root)
        self.assertEqual(again.index_rows()[name][0], 50)
        self.assertIsNone(self.successResultOf(again.cache.get(name)))
        self.assertEqual(again.event_names(), [EventName.CACHE_CORRUPT])

    def test_unrecognised_entries_left(self) -> None:
        """Files that are not chunks are neither counted nor removed."""
        opened = open_cache(self)
        self.successResultOf(opened.cache.close())
        chunks = opened.root / CHUNKS_DIR_NAME
        (chunks / "notes.txt").write_text("x")
        (chunks / "ab").mkdir()
        stray = chunks / "ab" / ("cd" * 32)  # a hash in the wrong shard
        stray.write_bytes(b"y")
        again = open_cache(self, opened.root)
        self.assertTrue(stray.exists())
        self.assertEqual(again.cache.usage().chunk_count, 0)

    def test_unreadable_index_rebuilt(self) -> None:
        """A garbage index.sqlite is replaced and the files are adopted."""
        opened = open_cache(self)
        name, data = chunk(1)
        self.successResultOf(opened.cache.put(name, data))
        self.successResultOf(opened.cache.close())
        for suffix in ("-wal", "-shm"):
            Path(f"{opened.root / INDEX_NAME}{suffix}").unlink(missing_ok=True)
        (opened.root / INDEX_NAME).write_bytes(b"not a database" * 100)
        again = open_cache(self, opened.root)
        self.assertEqual(self.successResultOf(again.cache.get(name)), data)

    def test_report(self) -> None:
        """The reconcile report counts what opening found and did."""
        opened = open_cache(self)
        (a, data_a), (b, data_b), (c, data_c) = chunk(1), chunk(2), chunk(3)
        opened.clock.advance(1)
        self.successResultOf(opened.cache.put(a, data_a))
        self.successResultOf(opened.cache.put(b, data_b))
        self.successResultOf(opened.cache.close())
        opened.file_of(b).unlink()
        chunk_path(opened.root / CHUNKS_DIR_NAME, c).parent.mkdir(exist_ok=True)
        opened.file_of(c).write_bytes(data_c)
        disk, report, rows = CacheDisk.open(opened.root)
        disk.close()
        self.assertEqual(
            (report.chunk_count, report.adopted_files, report.dropped_rows, report.index_rebuilt),
            (2, 1, 1, False),
        )
        self.assertEqual([row.hash for row in rows], [c, a])

    def test_over_budget_trimmed_at_open(self) -> None:
        """A cache above high water at open (budget lowered) is trimmed: one low_water line."""
        opened = open_cache(self)
        for seed in range(10):
            self.successResultOf(opened.cache.put(*chunk(seed)))
        again = reopen(self, opened, budget_bytes=500, high_water=450, low_water=300)
        self.assertEqual(again.cache.usage().bytes_used, 300)
        [event] = again.events
        self.assertEqual(event.event, EventName.CACHE_EVICTED)
        self.assertEqual(
            (event.size, dict(event.extra)), (700, {"chunks_reused": 7, "reason": "low_water"})
        )
