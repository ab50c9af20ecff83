"""
Tests for L{svc.mount.chunks.cached_chunks.CachedChunks}: the chunk cache as the
mount's chunk source.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred, succeed
from twisted.trial.unittest import SynchronousTestCase

from svc.mount.chunks.cached_chunks import CachedChunks
from svc.mount.test.test_cache_support import chunk, open_cache


class CachedChunksTests(SynchronousTestCase):
    """Fetch, put and holds over a real cache."""

    def setUp(self) -> None:
        self.opened = open_cache(self)
        self.fetched: list[str] = []
        self.source = CachedChunks(self.opened.cache, self.fetch)
        self.name, self.data = chunk(1)

    def fetch(self, chunk_hash: str) -> Deferred[bytes]:
        self.fetched.append(chunk_hash)
        return succeed(self.data)

    def test_a_miss_is_fetched_once_then_held(self) -> None:
        """The first fetch asks the fetcher; the chunk is held afterwards and not fetched again."""
        self.assertFalse(self.source.holds(self.name))
        self.assertEqual(self.successResultOf(self.source.fetch(self.name)), self.data)
        self.assertTrue(self.source.holds(self.name))
        self.assertEqual(self.successResultOf(self.source.fetch(self.name)), self.data)
        self.assertEqual(self.fetched, [self.name])

    def test_offered_bytes_are_held(self) -> None:
        """Bytes offered with C{put} are cached: held, and fetched without the fetcher."""
        self.source.put(self.name, self.data)
        self.assertTrue(self.source.holds(self.name))
        self.assertEqual(self.successResultOf(self.source.fetch(self.name)), self.data)
        self.assertEqual(self.fetched, [])

    def test_holds_nothing_when_closed_or_not_a_name(self) -> None:
        """A name that is not a chunk name, or any name once the cache is closed: not held."""
        self.source.put(self.name, self.data)
        self.assertFalse(self.source.holds("not-a-chunk-name"))
        self.successResultOf(self.opened.cache.close())
        self.assertFalse(self.source.holds(self.name))
