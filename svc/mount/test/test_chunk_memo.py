"""
Tests for L{svc.mount.open_files.ChunkMemo}: recently read chunks kept in
memory within a byte budget.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from svc.mount.open_files import ChunkMemo
from svc.mount.test.test_writeback import DictSource


class ChunkMemoTests(SynchronousTestCase):
    """What the memo keeps, and what it counts against its budget."""

    def test_fetches_once_and_keeps_within_budget(self) -> None:
        """A chunk is fetched once; the least recently used is dropped beyond the budget."""
        source = DictSource({"a": b"a" * 40, "b": b"b" * 40, "c": b"c" * 40})
        memo = ChunkMemo(source, budget=100)
        for name in ("a", "b", "a", "c", "a", "b"):
            self.assertEqual(self.successResultOf(memo.get(name)), source.chunks[name])
        # a, b, (a held), c drops b, (a held), b fetched again.
        self.assertEqual(source.fetched, 4)

    def test_a_view_counts_the_object_it_keeps_alive(self) -> None:
        """A remembered view of a large read counts the whole read, so memory stays bounded."""
        source = DictSource({})
        memo = ChunkMemo(source, budget=1000)
        window = bytes(range(256)) * 3  # 768 bytes
        memo.remember("x", memoryview(window)[:10])
        memo.remember("y", memoryview(window)[10:20])  # 1536 counted: x is dropped
        self.assertEqual(bytes(self.successResultOf(memo.get("y"))), window[10:20])
        source.chunks["x"] = window[:10]
        self.assertEqual(self.successResultOf(memo.get("x")), window[:10])
        self.assertEqual(source.fetched, 1)

    def test_a_view_larger_than_the_budget_is_not_kept(self) -> None:
        """A view whose object exceeds the budget is not remembered at all."""
        source = DictSource({})
        memo = ChunkMemo(source, budget=100)
        memo.remember("x", memoryview(bytes(200))[:10])
        source.chunks["x"] = bytes(10)
        self.successResultOf(memo.get("x"))
        self.assertEqual(source.fetched, 1)
