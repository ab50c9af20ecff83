"""
Tests for L{svc.mount.chunks.chunk_memo.ChunkMemo}: recently read chunks kept in
memory within a byte budget.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from svc.mount.chunks.chunk_memo import ChunkMemo
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


class _SlowSource(DictSource):
    """A L{DictSource} whose fetches are answered when the test says so."""

    def __init__(self, chunks: dict[str, bytes]) -> None:
        super().__init__(chunks)
        self.waiting: dict[str, Deferred[bytes]] = {}

    def fetch(self, chunk_hash: str, /) -> Deferred[bytes]:
        self.fetched += 1
        self.waiting[chunk_hash] = Deferred()
        return self.waiting[chunk_hash]

    def answer(self, chunk_hash: str) -> None:
        self.waiting.pop(chunk_hash).callback(self.chunks[chunk_hash])

    def refuse(self, chunk_hash: str) -> None:
        self.waiting.pop(chunk_hash).errback(OSError("gone"))


class ReadAheadAllowanceTests(SynchronousTestCase):
    """
    Chunks fetched ahead and not yet asked for hold at most half the budget,
    so read-ahead never pushes out what readers are about to read.
    """

    def setUp(self) -> None:
        self.source = _SlowSource({name: name.encode() * 10 for name in "abcdefgh"})
        self.memo = ChunkMemo(self.source, budget=100)  # read-ahead allowance: 50

    def test_prefetch_stops_at_half_the_budget(self) -> None:
        """Prefetches beyond the allowance are skipped, not queued."""
        started = [self.memo.prefetch(name, 10) for name in "abcdefg"]
        self.assertEqual(started, [True] * 5 + [False] * 2)
        self.assertEqual(self.memo.ahead_bytes, 50)
        self.assertEqual(sorted(self.source.waiting), list("abcde"))

    def test_asking_for_a_chunk_frees_its_share(self) -> None:
        """Once a prefetched chunk is asked for (arrived or not), it is no longer ahead."""
        for name in "abcde":
            self.memo.prefetch(name, 10)
        self.source.answer("a")
        self.assertEqual(self.successResultOf(self.memo.get("a")), b"a" * 10)
        pending = self.memo.get("b")  # still on its way
        self.assertEqual(self.memo.ahead_bytes, 30)
        self.assertTrue(self.memo.prefetch("f", 10))
        self.assertTrue(self.memo.prefetch("g", 10))
        self.assertFalse(self.memo.prefetch("h", 10))
        self.source.answer("b")
        self.assertEqual(self.successResultOf(pending), b"b" * 10)
        self.assertEqual(self.source.fetched, 7, "the shared fetches were not repeated")

    def test_a_failed_or_dropped_prefetch_frees_its_share(self) -> None:
        """A prefetch that fails, or whose chunk is pushed out unread, stops counting."""
        self.memo.prefetch("a", 10)
        self.source.refuse("a")
        self.assertEqual(self.memo.ahead_bytes, 0)
        self.memo.prefetch("b", 10)
        self.source.answer("b")
        self.assertEqual(self.memo.ahead_bytes, 10)
        for name in "cdefghijkl":  # 100 more bytes remembered: b (least recent) goes
            self.memo.remember(name, name.encode() * 10)
        self.assertEqual(self.memo.ahead_bytes, 0)

    def test_a_held_or_fetching_chunk_is_not_fetched_again(self) -> None:
        """Prefetching a chunk held or on its way fetches nothing and says it is there."""
        self.memo.remember("a", b"a" * 10)
        self.assertTrue(self.memo.prefetch("a", 10))
        self.memo.get("b")
        self.assertTrue(self.memo.prefetch("b", 10))
        self.assertEqual(self.source.fetched, 1)
        self.assertEqual(self.memo.ahead_bytes, 0)
