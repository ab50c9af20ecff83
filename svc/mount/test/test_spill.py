"""
Tests for L{svc.mount.core.spill} (sparse spill files, in-memory spills) and the
byte map of open files in L{svc.mount.core.extents} (L{RangeSet}, L{FileLayout}).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from svc.chunking import ChunkRef
from svc.mount.chunks.chunk_memo import ChunkMemo
from svc.mount.core.extents import FileLayout, RangeSet, Segment, Source, chunk_layout
from svc.mount.core.file_state import FileState
from svc.mount.core.spill import SpillDirectory
from svc.mount.test.test_writeback import DictSource
from svc.testing.worker import ImmediateWorker

T = TypeVar("T")

MiB = 1 << 20
H = "0" * 64


class RangeSetTests(SynchronousTestCase):
    """Sorted disjoint ranges, merged on contact."""

    def test_add_merges(self) -> None:
        """Overlapping and touching ranges merge; separate ones stay apart."""
        ranges = RangeSet([(10, 20), (30, 40)])
        ranges.add(20, 25)
        self.assertEqual(list(ranges), [(10, 25), (30, 40)])
        ranges.add(5, 35)
        self.assertEqual(list(ranges), [(5, 40)])
        ranges.add(50, 50)
        self.assertEqual(list(ranges), [(5, 40)])

    def test_clip_overlaps_within(self) -> None:
        """Clipping cuts at a limit; overlaps and within answer by range."""
        ranges = RangeSet([(0, 10), (20, 30), (40, 50)])
        self.assertTrue(ranges.overlaps(9, 12))
        self.assertFalse(ranges.overlaps(10, 20))
        self.assertEqual(ranges.within(5, 45), [(5, 10), (20, 30), (40, 45)])
        ranges.clip(25)
        self.assertEqual(list(ranges), [(0, 10), (20, 25)])
        ranges.clip(20)
        self.assertEqual(list(ranges), [(0, 10)])
        self.assertEqual(ranges.total, 10)

    def test_matches_a_set_model(self) -> None:
        """Random adds and clips agree with a plain set of offsets."""
        rng = random.Random(7)
        ranges = RangeSet()
        model: set[int] = set()
        for _ in range(300):
            start = rng.randrange(200)
            end = start + rng.randrange(20)
            if rng.random() < 0.1:
                ranges.clip(start)
                model = {x for x in model if x < start}
            else:
                ranges.add(start, end)
                model.update(range(start, end))
            self.assertEqual({x for s, e in ranges for x in range(s, e)}, model)
            spans = list(ranges)
            for (_, end1), (start2, _) in itertools.pairwise(spans):
                self.assertLess(end1, start2)


class FileLayoutTests(SynchronousTestCase):
    """Which bytes come from the base and which from the spill file."""

    def setUp(self) -> None:
        self.layout = FileLayout(chunk_layout([(H, 100), (H, 100), (H, 50)]))

    def test_clean(self) -> None:
        """An untouched layout reads everything from the base and is not dirty."""
        self.assertFalse(self.layout.dirty)
        self.assertEqual(self.layout.segments(0, 1000), [Segment(0, 250, Source.ORIGINAL)])

    def test_write_and_truncate(self) -> None:
        """Writes read from the spill; truncated-off bytes never come back from the base."""
        self.layout.write(90, 20)
        self.assertEqual(
            self.layout.segments(80, 40),
            [
                Segment(80, 90, Source.ORIGINAL),
                Segment(90, 110, Source.SPILL),
                Segment(110, 120, Source.ORIGINAL),
            ],
        )
        self.layout.truncate(95)
        self.layout.truncate(300)
        self.assertEqual(
            self.layout.segments(0, 300),
            [Segment(0, 90, Source.ORIGINAL), Segment(90, 300, Source.SPILL)],
        )
        self.assertEqual(list(self.layout.changed()), [(90, 300)])
        self.assertTrue(self.layout.dirty)
        self.assertTrue(self.layout.is_hole(95, 300))
        self.assertFalse(self.layout.is_hole(90, 300))

    def test_reusable(self) -> None:
        """A base chunk is reusable only if it and the byte after it are unchanged."""
        self.assertTrue(self.layout.reusable(0))
        self.layout.write(100, 1)  # the first byte after chunk 0
        self.assertFalse(self.layout.reusable(0))
        self.assertTrue(self.layout.reusable(2))
        self.layout.write(250, 1)  # the file grows: the last chunk ended at the old end
        self.assertFalse(self.layout.reusable(2))

    def test_base_lookup(self) -> None:
        """Base chunks are found by offset and by range."""
        self.assertEqual(self.layout.base_index_at(200), 2)
        self.assertIsNone(self.layout.base_index_at(150))
        self.assertEqual(
            self.layout.base_chunks(99, 201),
            [ChunkRef(0, 100, H), ChunkRef(100, 100, H), ChunkRef(200, 50, H)],
        )

    def test_first_cut(self) -> None:
        """
        The first cut starts after the longest run of reusable base chunks:
        the end of the file when nothing changed, the last chunk for an
        append, the chunk before an edit of a chunk's first byte, 0 for a
        file emptied.
        """
        self.assertEqual(self.layout.first_cut(), 250)
        self.layout.write(250, 10)  # an append
        self.assertEqual(self.layout.first_cut(), 200)
        self.assertFalse(self.layout.unchanged_beyond(200))
        self.layout.write(150, 1)  # an edit inside chunk 1
        self.assertEqual(self.layout.first_cut(), 100)
        self.layout.write(100, 1)  # the byte after chunk 0
        self.assertEqual(self.layout.first_cut(), 0)
        emptied = FileLayout(chunk_layout([(H, 100), (H, 100)]))
        emptied.truncate(0)
        emptied.write(0, 500)
        self.assertEqual(emptied.first_cut(), 0)
        self.assertFalse(emptied.unchanged_beyond(0))

    def test_unchanged_beyond(self) -> None:
        """An edit inside the file leaves original bytes after its first cut's chunk."""
        self.layout.write(120, 5)
        self.assertEqual(self.layout.first_cut(), 100)
        self.assertTrue(self.layout.unchanged_beyond(100))
        self.layout.truncate(180)  # nothing original after chunk 1 any more
        self.layout.write(180, 100)
        self.assertFalse(self.layout.unchanged_beyond(100))

    def test_first_cut_matches_a_walk_from_the_start(self) -> None:
        """
        For random bases and random writes and truncations, C{first_cut}
        (which skips the chunks ending well before the first change) equals
        a walk of L{FileLayout.reusable} from chunk 0.
        """
        rng = random.Random(20261126)
        for _ in range(400):
            sizes = [rng.randint(1, 40) for _ in range(rng.randint(0, 8))]
            layout = FileLayout(chunk_layout([(H, size) for size in sizes]))
            for _ in range(rng.randint(0, 4)):
                if rng.random() < 0.7:
                    layout.write(rng.randint(0, layout.size + 20), rng.randint(1, 30))
                else:
                    layout.truncate(rng.randint(0, layout.size + 20))
                walked = 0
                while walked < len(layout.base) and layout.reusable(walked):
                    walked += 1
                expected = (
                    layout.base[walked].offset if walked < len(layout.base) else (layout.base_size)
                )
                self.assertEqual(layout.first_cut(), expected, (sizes, layout.written))


class SpillFileTests(SynchronousTestCase):
    """Sparse spill files on local disk."""

    def setUp(self) -> None:
        self.directory = SpillDirectory(Path(self.mktemp()))
        self.spill = self.directory.create(7)
        self.addCleanup(self.spill.remove)

    def test_read_back_and_holes(self) -> None:
        """Written bytes read back; holes and the region past the end read as zeros."""
        self.spill.write(10, b"abc")
        self.assertEqual(self.spill.read(8, 8), b"\0\0abc\0\0\0")

    def test_sparse(self) -> None:
        """A write at 256 MiB allocates almost nothing."""
        self.spill.write(256 * MiB, b"x" * 4096)
        self.assertLess(self.spill.allocated(), MiB)
        self.assertEqual(self.spill.read(256 * MiB, 4), b"xxxx")

    def test_released_pages_keep_their_bytes(self) -> None:
        """Releasing the cached pages before an offset changes nothing that reads see."""
        data = bytes(range(256)) * 4096
        self.spill.write(0, data)
        self.spill.release_pages(len(data) // 2)
        self.spill.release_pages(len(data) // 2)  # again: now clean pages are freed
        self.assertEqual(self.spill.read(0, len(data)), data)
        self.spill.release_pages(0)  # nothing before 0: no call

    def test_truncate_drops_data(self) -> None:
        """Bytes beyond a truncation read as zeros afterwards."""
        self.spill.write(0, b"abcdef")
        self.spill.truncate(2)
        self.assertEqual(self.spill.read(0, 6), b"ab\0\0\0\0")

    def test_sweep(self) -> None:
        """Spill files left by an earlier run are removed."""
        self.directory.create(8)
        self.assertEqual(self.directory.sweep(), 2)
        self.assertEqual(list(self.directory.root.iterdir()), [])
        self.spill.remove()
        self.assertFalse(self.spill.path.exists())


class MemorySpillTests(SynchronousTestCase):
    """Small files' changes stay in memory, within a per-file limit and a budget."""

    def setUp(self) -> None:
        self.directory = SpillDirectory(
            Path(self.mktemp()), memory_file_bytes=100, memory_bytes=250
        )

    def test_read_back_holes_and_truncate(self) -> None:
        """Written bytes read back, holes and the end read as zeros, truncation drops."""
        spill = self.directory.in_memory(13)
        assert spill is not None
        spill.write(10, b"abc")
        self.assertEqual(spill.read(8, 8), b"\0\0abc\0\0\0")
        spill.truncate(11)
        self.assertEqual(spill.read(8, 8), b"\0\0a\0\0\0\0\0")
        self.assertEqual(spill.contents(), bytes(10) + b"a")

    def test_limit_and_budget(self) -> None:
        """Past the per-file limit, or once the budget is reserved, there is none."""
        self.assertIsNone(self.directory.in_memory(101))
        first = self.directory.in_memory(1)
        second = self.directory.in_memory(1)
        self.assertIsNone(self.directory.in_memory(1))
        assert first is not None and second is not None
        self.assertFalse(first.fits(101))
        self.assertRaises(ValueError, first.write, 99, b"xy")
        first.remove()
        first.remove()
        self.assertIsNotNone(self.directory.in_memory(1))
        self.assertEqual(list(self.directory.root.glob("*")), [])


class SpilledStateTests(SynchronousTestCase):
    """An open file's bytes move from memory to a spill file when they outgrow it."""

    def state(self, directory: SpillDirectory) -> FileState:
        state = FileState(
            3,
            1,
            (),
            worker=ImmediateWorker(),
            spill_dir=directory,
            memo=ChunkMemo(DictSource({}), budget=0),
            now_ns=lambda: 1,
        )
        self.addCleanup(state.close)
        return state

    def drive(self, coroutine: Coroutine[Any, Any, T]) -> T:
        result: T = self.successResultOf(Deferred.fromCoroutine(coroutine))
        return result

    def test_grows_onto_disk(self) -> None:
        """Small writes stay in memory; a write past the limit moves everything to disk."""
        root = Path(self.mktemp())
        state = self.state(SpillDirectory(root, memory_file_bytes=100))
        self.drive(state.write(0, b"head"))
        assert state.spill is not None
        self.assertTrue(state.spill.in_memory)
        self.assertFalse(root.exists())
        self.drive(state.write(200, b"tail"))
        self.assertFalse(state.spill.in_memory)
        self.assertEqual(len(list(root.glob("*.spill"))), 1)
        content = self.successResultOf(state.read(0, 204))
        self.assertEqual(content, b"head" + bytes(196) + b"tail")

    def test_budget_spent_goes_to_disk(self) -> None:
        """With no memory budget left, the first write makes a spill file."""
        root = Path(self.mktemp())
        state = self.state(SpillDirectory(root, memory_file_bytes=100, memory_bytes=0))
        self.drive(state.write(0, b"x"))
        assert state.spill is not None
        self.assertFalse(state.spill.in_memory)
        self.assertEqual(self.successResultOf(state.read(0, 1)), b"x")
