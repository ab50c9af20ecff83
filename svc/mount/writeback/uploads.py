"""
Write-back, part one: turning an open file's content into a chunk list and
uploading the chunks the server lacks.

L{rechunk} produces exactly the chunk list that cutting the whole current
content from offset 0 would produce (FastCDC, L{svc.chunking}), but reads
and cuts only around the changes:

 - A cut always starts at a real boundary of the new content (offset 0, or
   the end of the previous chunk). If the file's write-behind
   (L{svc.mount.writeback.write_behind}) already cut and stored a chunk starting
   there, it is taken as is. If a base chunk starts there and is
   I{reusable} (L{svc.mount.core.extents.FileLayout.reusable}: its bytes and the
   byte after it are unchanged), cutting would find the same chunk, so it
   is taken as is: no read, no hashing, no upload. So the clean prefix is
   skipped, and once the cuts after a change fall back onto a base boundary
   (content-defined chunking re-synchronises within a chunk or two) the
   rest of the base is reused.
 - Otherwise the next chunk is cut from a window of at most
   L{MAX_CHUNK_SIZE} bytes (the cutter never needs more to place one cut),
   read through the open file (base chunks and spill file), on the worker.
 - A window that lies wholly in a hole (zeros never written) is the
   all-zero maximum chunk, known without reading (checked once against the
   cutter: L{zero_chunk}).

Memory: one window (16 MiB of content ahead, plus at most as much again of
consumed bytes not yet dropped: L{_Window}) plus two upload batches
(L{ChunkUploader}): one being uploaded while the next is cut.

L{ChunkUploader} batches new chunks: one C{chunk_has} per batch (at most
L{CHUNK_HAS_LIMIT} hashes or C{batch_bytes} bytes), then a C{chunk_put} for
each absent chunk, all in flight at once, while the next batch is cut (a full
batch first waits for the previous one's uploads); a chunk is asked about or
sent at most once per write-back. A batch of fewer than C{probe_min_bytes} bytes is
sent without asking (uploading a few KiB costs less than the round trip of
C{chunk_has}; the server deduplicates). An uploader made with
C{inline_max_bytes} holds a last batch that small back instead
(L{ChunkUploader.take_inline}): the commit carries it in its
C{manifest_put}, so a small file costs one request, not two. The last batch's uploads are not
waited for by L{ChunkUploader.finish}: the commit sends its C{manifest_put}
behind them on the same connection (the server runs it once they are stored,
``docs/specifications/dataplane-ops.md`` section 7) and then waits for both
(L{ChunkUploader.settle}). Part two (the compare-and-swap commit) is
L{svc.mount.writeback.commit}.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from functools import cache, partial
from typing import Protocol

from twisted.internet.defer import Deferred

from svc.buffer_pool import footprint
from svc.chunking import MAX_CHUNK_SIZE, ChunkRef, chunk_hash
from svc.chunking.core import iter_cut_points
from svc.mount.core.errors import FSError
from svc.mount.core.extents import FileLayout
from svc.mount.remote.data_plane import CHUNK_HAS_LIMIT, INLINE_CHUNK_LIMIT, Remote, gather
from svc.worker import IWorker

DEFAULT_BATCH_BYTES = 32 << 20
"""New-chunk bytes held before their C{chunk_has} batch is sent (one batch is
uploaded while the next is cut)."""

DEFAULT_PROBE_MIN_BYTES = 64 << 10
"""Batches holding fewer new-chunk bytes than this are uploaded without C{chunk_has}."""

DEFAULT_INLINE_MAX_BYTES = 64 << 10
"""A write-back's last batch of at most this many new-chunk bytes goes inline in
its C{manifest_put} (and no C{chunk_put})."""

INLINE_CUT_BYTES = 64 << 10
"""Windows up to this size are cut and hashed on the calling thread (a worker
round trip costs more than cutting and hashing them)."""

Reader = Callable[[int, int], Deferred[bytes]]
"""C{read(offset, length)} of the content being written back."""

Precut = Callable[[int], ChunkRef | None]
"""C{at(offset)}: a chunk of the current content, already cut and stored,
starting at C{offset} (L{svc.mount.writeback.write_behind.WriteBehind.at})."""


def first_chunk(window: bytes | bytearray, length: int, start: int = 0) -> tuple[int, str]:
    """
    The first chunk of C{window[start:start + length]} (which holds
    L{MAX_CHUNK_SIZE} bytes, or everything up to the end of the content):
    its length and name. Blocking (hashing): run it on a worker. No view of
    C{window} outlives the call, so a C{bytearray} can be resized after it.
    """
    with memoryview(window) as whole, whole[start : start + length] as view:
        _offset, size = next(iter_cut_points(view))
        with view[:size] as data:
            return size, chunk_hash(data)


@cache
def zero_chunk() -> str | None:
    """
    The name of a L{MAX_CHUNK_SIZE} run of zeros, if the cutter cuts such a
    run as one maximum-size chunk (it does: FastCDC never finds a boundary
    in zeros); L{None} otherwise, which disables the shortcut.
    """
    zeros = bytearray(MAX_CHUNK_SIZE)
    size, name = first_chunk(zeros, MAX_CHUNK_SIZE)
    return name if size == MAX_CHUNK_SIZE else None


class ChunkUploader:
    """
    Sends the new chunks of one write-back; see the module docstring.

    @ivar uploaded: chunks sent with C{chunk_put} and stored (the flush's
        C{chunks_new}), once L{settle} has returned, and those sent inline
        once L{inline_stored} has said so.
    """

    Inline = tuple[tuple[str, bytes | memoryview], ...]
    """Chunks held back for the commit's C{manifest_put}: C{(hash, bytes)}."""

    def __init__(
        self,
        remote: Remote,
        session_id: str | None,
        *,
        on_uploaded: Callable[[str, bytes | memoryview], object] = lambda chunk_hash, data: None,
        batch_bytes: int = DEFAULT_BATCH_BYTES,
        probe_min_bytes: int = DEFAULT_PROBE_MIN_BYTES,
        inline_max_bytes: int = 0,
        keep: dict[str, bytes | memoryview] | None = None,
    ) -> None:
        """
        @param keep: where every chunk added is also kept, by name (for a
            commit recorded in the outbox, which holds the new chunks).
        """
        self._keep = keep
        self._remote = remote
        self._session_id = session_id
        self._on_uploaded = on_uploaded
        self._batch_bytes = batch_bytes
        self._probe_min_bytes = probe_min_bytes
        self._inline_max_bytes = min(inline_max_bytes, probe_min_bytes)
        self._batch: dict[str, bytes | memoryview] = {}
        self._held = 0
        self._settled: set[str] = set()
        self._counted: set[str] = set()
        self._in_flight: list[Deferred[None]] = []
        self._inline: ChunkUploader.Inline = ()
        self.uploaded = 0

    def knows(self, chunk_hash: str) -> bool:
        """Whether C{chunk_hash} was already added to this write-back."""
        return chunk_hash in self._settled or chunk_hash in self._batch

    async def add(self, chunk_hash: str, data: bytes | memoryview) -> None:
        """
        A chunk of the new content; sends the batch when it is full. A view
        must be of C{bytes}; it counts as the whole object it keeps alive.
        """
        if self.knows(chunk_hash):
            return
        if self._keep is not None:
            self._keep[chunk_hash] = data
        self._batch[chunk_hash] = data
        self._held += footprint(data)
        if self._held >= self._batch_bytes or len(self._batch) >= CHUNK_HAS_LIMIT:
            await self.settle()  # the previous batch: at most one in flight
            await self._send()

    async def finish(self) -> None:
        """
        Send what is left, without waiting for the uploads to be answered:
        every added chunk is stored once L{settle} returns, except a last
        batch small enough to be held back for L{take_inline}.
        """
        batch = self._batch
        if not batch:
            return
        if (
            len(batch) <= INLINE_CHUNK_LIMIT
            and sum(len(data) for data in batch.values()) <= self._inline_max_bytes
        ):
            self._inline = tuple(batch.items())
            self._settled.update(batch)
            self._batch, self._held = {}, 0
            return
        await self._send()

    def take_inline(self) -> ChunkUploader.Inline:
        """The chunks held back by L{finish} (once): the commit must carry them."""
        inline, self._inline = self._inline, ()
        return inline

    def inline_stored(self, inline: ChunkUploader.Inline) -> None:
        """The server stored C{inline} (taken from L{take_inline}): count and cache them."""
        for name, data in inline:
            if name not in self._counted:  # not uploaded again by L{put}
                self._stored(len(data), name, data)

    async def settle(self) -> None:
        """
        Wait for every upload sent; the first failure is raised (after all
        have been answered).
        """
        in_flight, self._in_flight = self._in_flight, []
        await gather(in_flight)

    async def drain(self) -> None:
        """Wait for every upload sent, ignoring failures (a write-back given up)."""
        try:
            await self.settle()
        except Exception:
            return

    async def put(self, chunk_hash: str, data: bytes) -> None:
        """Upload one chunk unconditionally (a commit found it missing)."""
        size = await self._remote.chunk_put(chunk_hash, data, session_id=self._session_id)
        self._settled.add(chunk_hash)
        self._stored(size, chunk_hash, data)

    async def _send(self) -> None:
        batch, self._batch, held, self._held = self._batch, {}, self._held, 0
        hashes = list(batch)
        self._settled.update(hashes)
        if held < self._probe_min_bytes:
            absent = hashes
        else:
            present = await self._remote.chunk_has(hashes)
            absent = [name for name, found in zip(hashes, present, strict=True) if not found]
        for name in absent:
            put = self._remote.chunk_put(name, batch[name], session_id=self._session_id)
            self._in_flight.append(put.addCallback(self._stored, name, batch[name]))

    def _stored(self, _size: int, chunk_hash: str, data: bytes | memoryview) -> None:
        self.uploaded += 1
        self._counted.add(chunk_hash)
        self._on_uploaded(chunk_hash, data)


class ChunkSink(Protocol):
    """Where L{rechunk} puts the chunks it cuts: a L{ChunkUploader}, or a record's."""

    def knows(self, chunk_hash: str) -> bool:
        """Whether C{chunk_hash} was given already (or is known to be stored)."""

    async def add(self, chunk_hash: str, data: bytes | memoryview) -> None:
        """Take chunk C{chunk_hash}."""

    async def finish(self) -> None:
        """Every chunk was given: finish what is under way."""


async def rechunk(
    layout: FileLayout,
    read: Reader,
    worker: IWorker,
    uploader: ChunkSink,
    precut: Precut | None = None,
) -> tuple[ChunkRef, ...]:
    """
    The chunk list of the content described by C{layout} (read through
    C{read}); every chunk not reused from the base or from C{precut} goes
    to C{uploader}. See the module docstring.
    """
    size = layout.size
    zero = zero_chunk()
    chunks: list[ChunkRef] = []
    position = 0
    window = _Window()  # the content from position on, as far as read
    while position < size:
        cut = precut(position) if precut is not None else None
        if cut is not None:
            chunks.append(cut)
            window.advance(cut.length)
            position = cut.end
            continue
        index = layout.base_index_at(position)
        if index is not None and layout.reusable(index):
            reused = layout.base[index]
            chunks.append(reused)
            window.advance(reused.length)
            position = reused.end
            continue
        want = min(MAX_CHUNK_SIZE, size - position)
        hole = want == MAX_CHUNK_SIZE and layout.is_hole(position, position + want)
        if zero is not None and hole:
            chunks.append(ChunkRef(position, want, zero))
            if not uploader.knows(zero):
                await uploader.add(zero, bytes(want))
            window.advance(want)
            position += want
            continue
        if window.held < want:
            window.extend(await read(position + window.held, want - window.held))
            if window.held < want:
                raise FSError(errno.EIO, "content shorter than its size during write-back")
        cut_first = partial(first_chunk, window.buffer, want, window.start)
        if want <= INLINE_CUT_BYTES:
            length, name = cut_first()
        else:
            length, name = await worker.submit(cut_first)
        data = window.take(length)
        chunks.append(ChunkRef(position, length, name))
        await uploader.add(name, data)
        position += length
    await uploader.finish()
    return tuple(chunks)


class _Window:
    """
    The bytes read ahead of the cut position: C{buffer[start:]}. Advancing
    moves C{start}; the consumed front is dropped only once it is at least
    half of the buffer, so each byte is moved at most about once (deleting
    the front at every chunk moved up to 12 MiB per 4 MiB chunk).
    """

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.start = 0

    @property
    def held(self) -> int:
        """Bytes read and not yet consumed."""
        return len(self.buffer) - self.start

    def extend(self, more: bytes) -> None:
        """Append the next bytes of the content."""
        self.buffer += more

    def take(self, length: int) -> bytes:
        """The next C{length} bytes, as C{bytes} (one copy), consumed."""
        with memoryview(self.buffer) as whole, whole[self.start : self.start + length] as view:
            data = bytes(view)
        self.advance(length)
        return data

    def advance(self, length: int) -> None:
        """Consume C{length} bytes (possibly more than are held: nothing is left)."""
        if self.held <= length:
            self.buffer.clear()
            self.start = 0
            return
        self.start += length
        if self.start * 2 >= len(self.buffer):
            del self.buffer[: self.start]
            self.start = 0
