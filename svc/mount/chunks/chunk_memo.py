"""
The chunk memo: the bytes of the most recently read chunks of the committed
content of open files, in memory, shared by every open file of a mount
(L{svc.mount.core.file_reader.FileReader} reads base chunks through it; the
write-back keeps the chunks it uploads in it).
"""

from __future__ import annotations

from collections import OrderedDict

from twisted.internet.defer import Deferred, succeed
from twisted.python.failure import Failure

from svc.buffer_pool import footprint
from svc.mount.remote.data_plane import IChunkSource

DEFAULT_MEMO_BYTES = 64 << 20
"""Chunk bytes kept in memory for reads (a few maximum-size chunks)."""


class ChunkMemo:
    """
    The most recently read chunks' bytes, least recently used dropped first
    beyond C{budget} bytes, so that many small reads of one chunk cost one
    fetch. Concurrent fetches of one chunk share one request.

    Read-ahead (L{prefetch}) may hold at most half the budget in chunks
    fetched ahead and not yet asked for (L{ahead_bytes}); past that,
    prefetches are skipped. Without the bound, readers that together read
    ahead more than the budget pushed each other's chunks out before they
    were read (the chunk a reader was in the middle of included), and
    every later read of such a chunk fetched all of it again: eight
    concurrent readers of cold 32 MiB files with two FUSE workers read each
    4 MiB chunk back from the disk cache about once per 128 KiB read.
    """

    def __init__(self, source: IChunkSource, budget: int = DEFAULT_MEMO_BYTES) -> None:
        self.source = source
        self._budget = budget
        self._held = 0
        self._chunks: OrderedDict[str, bytes | memoryview] = OrderedDict()
        self._pending: dict[str, list[Deferred[bytes | memoryview]]] = {}
        self._ahead: dict[str, int] = {}
        self.ahead_bytes = 0
        """Bytes of the chunks prefetched (on their way or held) and not yet asked for."""

    @property
    def ahead_budget(self) -> int:
        """The most L{ahead_bytes} a prefetch may bring about: half the budget."""
        return self._budget // 2

    def prefetch(self, chunk_hash: str, size: int) -> bool:
        """
        Start fetching C{chunk_hash} (of C{size} bytes) unless it is held
        or on its way, or the read-ahead allowance (L{ahead_budget}) has no
        room for it; a later L{get} shares the fetch. A failure is
        forgotten (the reader that needs the chunk fetches it again and
        sees the error). Whether the chunk is held or on its way now.
        """
        if chunk_hash in self._chunks or chunk_hash in self._pending:
            return True
        if self.ahead_bytes + size > self.ahead_budget:
            return False
        self._ahead[chunk_hash] = size
        self.ahead_bytes += size
        self._pending[chunk_hash] = []
        self.source.fetch(chunk_hash).addBoth(self._fetched, chunk_hash)
        return True

    def get(self, chunk_hash: str) -> Deferred[bytes | memoryview]:
        """The bytes of C{chunk_hash} (a view of C{bytes} if so remembered)."""
        self._arrived(chunk_hash)
        data = self._chunks.get(chunk_hash)
        if data is not None:
            self._chunks.move_to_end(chunk_hash)
            return succeed(data)
        waiter: Deferred[bytes | memoryview] = Deferred()
        waiters = self._pending.get(chunk_hash)
        if waiters is not None:
            waiters.append(waiter)
            return waiter
        self._pending[chunk_hash] = [waiter]
        self.source.fetch(chunk_hash).addBoth(self._fetched, chunk_hash)
        return waiter

    def _arrived(self, chunk_hash: str) -> None:
        """A chunk fetched ahead was asked for (or dropped): it no longer counts as ahead."""
        size = self._ahead.pop(chunk_hash, None)
        if size is not None:
            self.ahead_bytes -= size

    def _fetched(self, result: bytes | Failure, chunk_hash: str) -> None:
        waiters = self._pending.pop(chunk_hash, [])
        if isinstance(result, Failure):
            self._arrived(chunk_hash)
            for waiter in waiters:
                waiter.errback(result)
        else:
            self.remember(chunk_hash, result)
            if chunk_hash not in self._chunks:
                self._arrived(chunk_hash)  # not kept (larger than the budget)
            for waiter in waiters:
                waiter.callback(result)

    def holds(self, chunk_hash: str) -> bool:
        """Whether C{chunk_hash} is held here or in the source (no fetch needed, most likely)."""
        return chunk_hash in self._chunks or self.source.holds(chunk_hash)

    def remembers(self, chunk_hash: str) -> bool:
        """Any thread: whether C{chunk_hash}'s bytes are held in memory here."""
        return chunk_hash in self._chunks

    def remember(self, chunk_hash: str, data: bytes | memoryview) -> None:
        """
        Keep C{data} (also offered to the source, e.g. after an upload). A
        view must be of C{bytes}; it counts as the whole object it keeps
        alive.
        """
        size = footprint(data)
        if size > self._budget:
            return
        if chunk_hash in self._chunks:
            self._chunks.move_to_end(chunk_hash)
            return
        self._chunks[chunk_hash] = data
        self._held += size
        while self._held > self._budget:
            dropped_hash, dropped = self._chunks.popitem(last=False)
            self._held -= footprint(dropped)
            self._arrived(dropped_hash)
