"""
Reading an open file's current content (L{FileReader}, one per
L{svc.mount.core.file_state.FileState}): base chunks stitched through the
L{svc.mount.chunks.chunk_memo.ChunkMemo} and the injected chunk source, changed
ranges from the spill, and a sequential reader's next chunks fetched
ahead.

Reads do not wait for the state's lock: they take a snapshot of the layout
and keep the spill file they read from alive
(L{svc.mount.core.spill.SpillHandle}) even if a write-back finishes meanwhile
and retires it.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred, succeed

from svc.chunking import ChunkRef
from svc.mount.chunks.chunk_memo import ChunkMemo
from svc.mount.core.extents import FileLayout, Source
from svc.mount.core.spill import Spill, SpillHandle
from svc.mount.remote.data_plane import gather
from svc.worker import IWorker

READ_AHEAD_BYTES = 16 << 20
"""
How far past a sequential read the chunks of the committed content are
fetched before they are asked for: one maximum-size chunk, about four
average ones, so the next chunk's C{chunk_get} overlaps reading this one.
"""


class FileReader:
    """
    The reads of one open file's content, laid out by C{layout} (the
    state's own, changed in place by its writes and commits).
    """

    def __init__(self, layout: FileLayout, memo: ChunkMemo, worker: IWorker) -> None:
        self._layout = layout
        self._memo = memo
        self._worker = worker
        self._read_end: int | None = None

    def read(self, offset: int, length: int, spill: SpillHandle | None) -> Deferred[bytes]:
        """
        C{length} bytes at C{offset} (fewer at the end of the file) of the
        current content, whose changed bytes are in C{spill} (the state's,
        if any write created one).
        """
        segments = self._layout.segments(offset, length)
        if offset == self._read_end:
            self._read_ahead(offset + length)
        self._read_end = offset + length
        reads: list[Deferred[bytes]] = []
        if spill is not None:
            spill.acquire()
        for segment in segments:
            if segment.source is Source.ORIGINAL:
                refs = self._layout.base_chunks(segment.start, segment.end)
                reads.append(self._read_original(refs, segment.start, segment.end))
            elif spill is None:
                reads.append(succeed(bytes(segment.length)))
            else:
                reads.append(self._read_spill(spill.spill, segment.start, segment.length))

        async def reading() -> bytes:
            try:
                return b"".join(await gather(reads))
            finally:
                if spill is not None:
                    done = spill.release()
                    if done is not None:
                        await done

        return Deferred.fromCoroutine(reading())

    def _read_ahead(self, end: int) -> None:
        """
        A sequential reader reached C{end}: start fetching the committed
        chunks of the next L{READ_AHEAD_BYTES} that it will read from the
        original content (not bytes written since the open), in order,
        while the memo's read-ahead allowance has room
        (L{ChunkMemo.prefetch}).
        """
        layout = self._layout
        for segment in layout.segments(end, READ_AHEAD_BYTES):
            if segment.source is Source.ORIGINAL:
                for ref in layout.base_chunks(segment.start, segment.end):
                    if not self._memo.prefetch(ref.hash, ref.length):
                        return

    def _read_spill(self, spill: Spill, offset: int, length: int) -> Deferred[bytes]:
        if spill.in_memory:
            return succeed(spill.read(offset, length))
        return self._worker.submit(lambda: spill.read(offset, length))

    def _read_original(self, refs: list[ChunkRef], start: int, end: int) -> Deferred[bytes]:
        fetches = [self._memo.get(ref.hash) for ref in refs]

        async def stitching() -> bytes:
            pieces = await gather(fetches)
            parts = []
            for ref, data in zip(refs, pieces, strict=True):
                low = max(start, ref.offset) - ref.offset
                high = min(end, ref.end) - ref.offset
                parts.append(data[low:high] if (low, high) != (0, len(data)) else data)
            return b"".join(parts)

        return Deferred.fromCoroutine(stitching())
