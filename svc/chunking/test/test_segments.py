"""
Tests for L{svc.chunking.segments}: cutting ranges of a file separately and
joining them gives exactly the sequential cut.
"""

from __future__ import annotations

import itertools
from functools import cache

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from svc.chunking.core import ChunkRef, chunk_bytes
from svc.chunking.segments import MIN_SEGMENT_SIZE, join_segments, plan_segments
from svc.chunking.stream import chunk_range
from svc.chunking.test.inputs import MiB, contents, xof

joins = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@cache
def _mixed() -> bytes:
    # Random bytes with a 40 MiB run of zeros in the middle: seams inside the
    # run never fall into step (every chunk there is a forced 16 MiB cut).
    return xof(b"seams 1", 30 * MiB) + bytes(40 * MiB) + xof(b"seams 2", 30 * MiB + 77)


class PlanSegmentsTests(SynchronousTestCase):
    """
    L{plan_segments} splits a size into contiguous ranges.
    """

    @settings(max_examples=200)
    @given(
        st.integers(min_value=0, max_value=10**12),
        st.integers(min_value=1, max_value=64),
        st.integers(min_value=1, max_value=10**10),
    )
    def test_ranges_tile(self, size: int, parts: int, min_segment: int) -> None:
        """Ranges cover [0, size) in order, number at most parts, each at least min_segment."""
        plan = plan_segments(size, parts, min_segment=min_segment)
        self.assertGreaterEqual(len(plan), 1)
        self.assertLessEqual(len(plan), parts)
        self.assertEqual(plan[0][0], 0)
        self.assertEqual(plan[-1][1], size)
        for (_, stop), (start, _) in itertools.pairwise(plan):
            self.assertEqual(stop, start)
        if len(plan) > 1:
            self.assertTrue(all(stop - start >= min_segment for start, stop in plan))

    def test_default_minimum(self) -> None:
        """By default a file shorter than two 128 MiB ranges is not split."""
        self.assertEqual(MIN_SEGMENT_SIZE, 128 * MiB)
        self.assertEqual(plan_segments(256 * MiB - 1, 4), [(0, 256 * MiB - 1)])
        self.assertEqual(len(plan_segments(256 * MiB, 4)), 2)

    def test_rejects_nonsense(self) -> None:
        """Negative sizes and fewer than one part are refused."""
        self.assertRaises(ValueError, plan_segments, -1, 2)
        self.assertRaises(ValueError, plan_segments, 10, 0)
        self.assertRaises(ValueError, plan_segments, 10, 2, min_segment=0)


class JoinSegmentsTests(SynchronousTestCase):
    """
    L{join_segments} over L{chunk_range} pieces equals the sequential cut.
    """

    def _file(self, data: bytes) -> str:
        path: str = self.mktemp()
        with open(path, "wb") as handle:
            handle.write(data)
        return path

    def _joined(self, path: str, size: int, splits: list[int]) -> list[ChunkRef]:
        bounds = [0, *sorted(set(splits)), size]
        pieces = [
            chunk_range(path, start, stop)
            for start, stop in itertools.pairwise(bounds)
            if stop > start
        ]
        return join_segments(path, pieces)

    @joins
    @given(contents(max_pieces=4, max_piece=16 * MiB), st.lists(st.floats(0, 1), max_size=5))
    def test_any_splits(self, data: bytes, fractions: list[float]) -> None:
        """Splitting anywhere, into any number of ranges, changes nothing."""
        path = self._file(data)
        splits = [int(fraction * len(data)) for fraction in fractions]
        self.assertEqual(self._joined(path, len(data), splits), chunk_bytes(data))

    def test_seams_that_never_resynchronise(self) -> None:
        """Seams inside a run of zeros are re-cut to the end of their range, still exact."""
        data = _mixed()
        path = self._file(data)
        splits = [35 * MiB + 5, 50 * MiB + 1, 60 * MiB]
        self.assertEqual(self._joined(path, len(data), splits), chunk_bytes(data))

    def test_split_on_real_boundary(self) -> None:
        """A split that lands on a real boundary splices without re-cutting."""
        data = _mixed()
        path = self._file(data)
        boundary = chunk_bytes(data)[3].offset
        self.assertEqual(self._joined(path, len(data), [boundary]), chunk_bytes(data))

    def test_empty(self) -> None:
        """No pieces, or one empty piece, join to no chunks."""
        path = self._file(b"")
        self.assertEqual(join_segments(path, []), [])
        self.assertEqual(join_segments(path, [chunk_range(path, 0, 0)]), [])
