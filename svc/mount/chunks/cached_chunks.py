"""
The mount's chunk source in production: the L{ChunkCache} in front of the
data plane's C{chunk_get} (an L{svc.mount.remote.data_plane.IChunkSource}).
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.defer import Deferred

from svc.mount.chunks.cache import CacheClosed, ChunkCache


class CachedChunks:
    """
    Fetches through C{cache} (a miss is C{fetcher(hash)}, verified and
    stored); offered bytes are cached without waiting.
    """

    def __init__(self, cache: ChunkCache, fetcher: Callable[[str], Deferred[bytes]]) -> None:
        self._cache = cache
        self._fetcher = fetcher

    def fetch(self, chunk_hash: str, /) -> Deferred[bytes]:
        """The chunk's bytes, from the cache or fetched."""
        return self._cache.fetch(chunk_hash, self._fetcher)

    def put(self, chunk_hash: str, data: bytes | memoryview, /) -> object:
        """Cache bytes just uploaded or read inline: nobody waits."""
        self._cache.put_soon(chunk_hash, data)
        return None

    def holds(self, chunk_hash: str, /) -> bool:
        """Whether the cache holds (or is storing) the chunk; not when closed or not a name."""
        try:
            return bool(self._cache.contains((chunk_hash,)))
        except (CacheClosed, ValueError):
            return False
