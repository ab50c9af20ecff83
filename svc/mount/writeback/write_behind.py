"""
Write-behind: the settled part of a file's new bytes (a new file, or an
append) is cut and uploaded while the file is still being written, so its
write-back (flush, fsync, last close) finds most chunks already stored and
only cuts, uploads and commits the tail. Nothing here commits anything: a
file's content becomes visible on the data plane only through its
write-back's C{manifest_put}.

Which files: only where no unchanged base byte lies beyond the first chunk
the write-back would cut (L{svc.mount.core.extents.FileLayout.first_cut}): a file
created or truncated to empty since it was opened (the cut starts at offset
0), or an existing file being appended to, also after an earlier commit of
this open file (the cut starts at the base's last chunk, the one whose end
moved). An edit inside an existing file never starts it, so the unchanged
bytes after the edit are never read here (the write-back reuses those base
chunks without reading them).

What is cut: chunks chained from that I{origin}, each cut exactly as
L{svc.mount.writeback.uploads.rechunk} would cut it (the first chunk of at most
L{MAX_CHUNK_SIZE} bytes from the end of the previous one; a cut from an
offset depends only on the bytes from there on; L{FIRST_LOOK} bytes are
read first, the whole window only when no boundary lies in them). The next cut
starts only when the file already extends C{lead} bytes beyond the
L{MAX_CHUNK_SIZE} window it needs, so a sequential writer is well ahead
of the bytes being cut.

Invalidation: a write or truncation touching a cut chunk's bytes or the
byte after it (the cutter reads it) drops that chunk and every later one;
one landing in the window being cut drops that cut; one wholly before the
origin changes nothing cut; one reaching back across the origin stops the
task. The write-back then
cuts those bytes itself. The chunks already uploaded stay on the data plane
unreferenced until its garbage collection (they count against the
account's budget until then, as any upload does).

The write-back stops the task (L{WriteBehind.stop}: no new cut, uploads in
flight awaited) and reuses every chunk left (L{WriteBehind.at}) if all
uploads succeeded; if any failed, none is reused and the write-back sends
what it needs itself.

Memory: one window (L{MAX_CHUNK_SIZE}) and the uploader's two batches per
running task; a mount runs at most a few tasks at once (L{Slots}).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from functools import partial

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from svc.chunking import AVG_CHUNK_SIZE, MAX_CHUNK_SIZE, ChunkRef
from svc.mount.writeback.uploads import ChunkUploader, Reader, first_chunk
from svc.worker import IWorker

_log = Logger()

DEFAULT_LEAD_BYTES = 16 << 20
"""How far beyond a cut's window the file must already extend before the cut."""

DEFAULT_FILES = 2
"""Write-behind tasks a mount runs at once."""

_END = 1 << 63
"""An offset past any file (the end of a truncation's touched range)."""

MAX_DISCARDED = 2
"""Cuts in a row dropped by writes into their window before the file's
write-behind gives up (a writer that keeps changing the same region)."""


FIRST_LOOK = 2 * AVG_CHUNK_SIZE
"""
Bytes read for a cut before the whole L{MAX_CHUNK_SIZE} window. The cutter
(FastCDC) places a boundary from the chunk's start alone, its two masks
switching at L{AVG_CHUNK_SIZE}; so in any window of at least that size a
boundary it finds before the window's end is exactly the boundary the full
window gives. Only when it finds none is the full window read. Most chunks
end well within twice the average: a cut reads about 8 MiB instead of
16 MiB, which halved the reading behind a sequential writer.
"""


class Slots:
    """A count of tasks that may run at once."""

    def __init__(self, total: int) -> None:
        self.free = total

    def take(self) -> bool:
        """Take a slot if one is free; whether it was."""
        if self.free <= 0:
            return False
        self.free -= 1
        return True

    def give(self) -> None:
        """Give a slot back."""
        self.free += 1


class WriteBehind:
    """
    The write-behind of one open file; see the module docstring. Runs on
    the reactor thread; C{read} and C{size} are the open file's.
    """

    def __init__(
        self,
        read: Reader,
        size: Callable[[], int],
        worker: IWorker,
        uploader: ChunkUploader,
        slots: Slots,
        *,
        lead: int = DEFAULT_LEAD_BYTES,
        origin: int = 0,
        cut: Callable[[int], object] = lambda end: None,
    ) -> None:
        """
        @param cut: called with the end of each chunk cut and handed to the
            uploader (the file's content before it will not be read again
            by this task).
        """
        self._read = read
        self._on_cut = cut
        self._origin = origin
        self._size = size
        self._worker = worker
        self._uploader = uploader
        self._slots = slots
        self._lead = lead
        self._chunks: list[ChunkRef] = []
        self._ends: list[int] = []
        self._running: Deferred[None] | None = None
        self._busy = False
        self._stopped = False
        self._failed = False
        self._window: tuple[int, int] | None = None
        self._window_touched = False
        self._discarded = 0

    @property
    def chunks(self) -> tuple[ChunkRef, ...]:
        """The chunks cut so far (contiguous from the origin)."""
        return tuple(self._chunks)

    @property
    def frontier(self) -> int:
        """Where the next cut starts."""
        return self._ends[-1] if self._ends else self._origin

    def _due(self) -> bool:
        return (
            not self._stopped
            and not self._failed
            and self._size() >= self.frontier + MAX_CHUNK_SIZE + self._lead
        )

    # Changes (FileState calls these)

    def touched(self, start: int, end: int = _END) -> None:
        """Bytes C{[start, end)} changed (C{end} omitted: a truncation to C{start})."""
        if end <= self._origin:
            return  # before every cut: a cut from the origin reads only bytes after it
        if start < self._origin:
            # A change reaching back across the origin (a truncation below it,
            # a write over it): stop, the write-back cuts from where it must.
            self._stopped = True
        if start <= self.frontier:
            # The first chunk whose bytes or following byte lie in the range
            # (chunks are contiguous from 0, so it is the first ending at or
            # after start), and all after it.
            first = bisect.bisect_left(self._ends, start)
            del self._chunks[first:]
            del self._ends[first:]
        window = self._window
        if window is not None and start <= window[1] and end > window[0]:
            self._window_touched = True

    def poke(self) -> None:
        """The file grew: start cutting if a cut is due and a slot is free."""
        if not self._busy and self._due() and self._slots.take():
            self._busy = True  # before the task starts: it may end at once
            self._running = Deferred.fromCoroutine(self._run())

    # The task

    async def _run(self) -> None:
        try:
            while self._due():
                await self._cut_next()
        except Exception as error:
            self._failed = True
            _log.info("write-behind gave up: {error}", error=error)
        finally:
            self._window = None
            self._busy = False
            self._slots.give()

    async def _cut_next(self) -> None:
        start = self.frontier
        self._window = (start, start + MAX_CHUNK_SIZE)
        self._window_touched = False
        data = await self._read(start, FIRST_LOOK)
        if len(data) < FIRST_LOOK:
            return  # truncated meanwhile: _due decides again
        length, name = await self._worker.submit(partial(first_chunk, data, len(data)))
        if length == len(data) and not (self._stopped or self._window_touched):
            # No boundary in the first look: look as far as a chunk reaches.
            # (Stopped or touched, the checks below end this cut anyway.)
            data = await self._read(start, MAX_CHUNK_SIZE)
            if len(data) < MAX_CHUNK_SIZE:
                return
            length, name = await self._worker.submit(partial(first_chunk, data, len(data)))
        touched, self._window = self._window_touched, None
        if touched or self.frontier != start:
            self._discarded += 1
            if self._discarded >= MAX_DISCARDED:
                self._stopped = True
            return  # cut again from the (new) frontier, if still due
        if self._stopped:
            return
        self._discarded = 0
        self._chunks.append(ChunkRef(start, length, name))
        self._ends.append(start + length)
        # A view, not a slice: slicing copied up to 16 MiB on the reactor
        # thread, holding the GIL, once per chunk. The uploader counts the
        # whole window the view keeps alive against its batch.
        await self._uploader.add(name, data if length == len(data) else memoryview(data)[:length])
        self._on_cut(start + length)

    # The write-back

    async def stop(self) -> int:
        """
        Stop cutting and wait for the uploads; how many chunks were sent.
        Afterwards L{at} offers the chunks cut, unless an upload failed.
        """
        self._stopped = True
        running, self._running = self._running, None
        if running is not None:
            await running
        try:
            await self._uploader.finish()
            await self._uploader.settle()
        except Exception as error:
            self._failed = True
            _log.info("write-behind upload failed: {error}", error=error)
        if self._failed:
            self._chunks.clear()
            self._ends.clear()
        return self._uploader.uploaded

    def cancel(self) -> None:
        """The file was closed without a write-back: cut no more."""
        self._stopped = True

    def at(self, offset: int) -> ChunkRef | None:
        """The chunk cut starting at C{offset}, if any."""
        index = bisect.bisect_left(self._ends, offset + 1)
        if index < len(self._chunks) and self._chunks[index].offset == offset:
            return self._chunks[index]
        return None
