"""
Cutting files and streams with bounded memory.

These are blocking functions: call them from a worker thread (see
L{svc.chunking.off_reactor}), never on the reactor thread.

Memory: one stream holds one buffer of at most L{STREAM_BUFFER_SIZE} bytes
(twice the maximum chunk size): borrowed from a L{BufferPool} when the caller
passes one (the fast choice for repeated use), otherwise allocated per call,
sized down to the file for smaller files and grown from
L{FIRST_READER_BUFFER_SIZE} for readers of unknown length. The
buffer is refilled whenever less than one maximum chunk is left, so the cutter
always sees at least L{MAX_CHUNK_SIZE} bytes or the true end of the input:
that is why streaming cuts exactly where L{svc.chunking.core.chunk_bytes} does
over the whole input, whatever the read sizes of the underlying stream. The
unread tail is moved to the front only then, about once per 16 MiB consumed
rather than once per chunk.
"""

from __future__ import annotations

import mmap
import os
import stat
from collections.abc import Generator, Iterator
from contextlib import ExitStack
from typing import Final, Protocol

from pyfastcdc import FastCDC

from svc.chunking.buffers import STREAM_BUFFER_SIZE, BufferPool
from svc.chunking.core import MAX_CHUNK_SIZE, MIN_CHUNK_SIZE, ChunkRef, chunk_hash, new_cutter

FIRST_READER_BUFFER_SIZE: Final = MIN_CHUNK_SIZE
"""
Initial buffer for a reader of unknown length; doubled as needed up to
L{STREAM_BUFFER_SIZE}, so a short stream never costs a 32 MiB allocation.
"""

MAPPED_MIN_SIZE: Final = MIN_CHUNK_SIZE
"""
Regular files with at least this many bytes to cut are mapped rather than
read (see L{_iter_mapped_views}); below it a mapping saves nothing.
"""

StrPath = str | os.PathLike[str]


class BinaryReader(Protocol):
    """
    A blocking binary stream: a raw or buffered file, a C{BytesIO}, a pipe.

    C{readinto} must block until at least one byte is available and return 0
    only at the end of the input.
    """

    def readinto(self, buffer: memoryview, /) -> int | None:
        """
        Fill a prefix of C{buffer}; return how many bytes were written.
        """


class ChunkMismatch(Exception):
    """
    The bytes at a chunk's offset no longer hash to the chunk's name: the file
    changed after it was cut.
    """

    def __init__(self, expected: ChunkRef, actual_hash: str, actual_length: int) -> None:
        super().__init__(
            f"chunk at offset {expected.offset} changed: expected {expected.length} bytes "
            f"named {expected.hash}, found {actual_length} bytes named {actual_hash}"
        )
        self.expected = expected
        self.actual_hash = actual_hash
        self.actual_length = actual_length


class _Window:
    """
    The unread part of a stream, C{buffer[head:tail]}, refilled so that it
    always holds at least L{MAX_CHUNK_SIZE} bytes unless the stream ended.
    """

    def __init__(self, reader: BinaryReader, buffer: bytearray) -> None:
        self._reader = reader
        self.buffer = buffer
        self.view = memoryview(buffer)
        self.head = 0
        self.tail = 0
        self.ended = False

    def refill(self) -> None:
        if self.ended or self.tail - self.head >= MAX_CHUNK_SIZE:
            return
        pending = self.tail - self.head
        if self.head:
            # Slice assignment between views of one buffer is a memmove.
            self.view[:pending] = self.view[self.head : self.tail]
            self.head, self.tail = 0, pending
        while True:
            if self.tail == len(self.buffer):
                if len(self.buffer) >= STREAM_BUFFER_SIZE:
                    return
                self._grow()
            count = self._reader.readinto(self.view[self.tail :])
            if count is None:
                raise BlockingIOError("chunking needs a blocking stream; readinto returned None")
            if not count:
                self.ended = True
                return
            self.tail += count

    def _grow(self) -> None:
        # A new buffer rather than a resize: views already handed out keep
        # the old one alive and unchanged.
        bigger = bytearray(min(2 * len(self.buffer), STREAM_BUFFER_SIZE))
        bigger[: self.tail] = self.view[: self.tail]
        self.buffer = bigger
        self.view = memoryview(bigger)


def _iter_reader_views(
    reader: BinaryReader, base: int, capacity: int, pool: BufferPool | None
) -> Iterator[tuple[ChunkRef, memoryview]]:
    with ExitStack() as stack:
        if pool is None:
            buffer = bytearray(max(1, min(capacity, STREAM_BUFFER_SIZE)))
        else:
            buffer = stack.enter_context(pool.borrow())
        yield from _cut_window(_Window(reader, buffer), base)


def _cut_window(window: _Window, base: int) -> Iterator[tuple[ChunkRef, memoryview]]:
    cutter = new_cutter()
    offset = base
    while True:
        window.refill()
        if window.head == window.tail:
            return
        pending = window.view[window.head : window.tail]
        length = _first_length(cutter, pending)
        data = pending[:length]
        yield ChunkRef(offset, length, chunk_hash(data)), data
        window.head += length
        offset += length


def _first_length(cutter: FastCDC, pending: memoryview) -> int:
    """
    The length of the chunk that starts C{pending}, which holds at least one
    maximum chunk or the true end of the input (so the cut is the one over
    the whole input).
    """
    length: int = next(iter(cutter.cut_buf(pending))).length
    return length


def _iter_mapped_views(fd: int, start: int, size: int) -> Iterator[tuple[ChunkRef, memoryview]]:
    """
    Cut the bytes C{[start, size)} straight from the page cache.

    The file is mapped read-only instead of read: a read copies every byte
    into the process, and on the project's VMs that copy (about 2.7 GB/s)
    costs as much as cutting or hashing; cutting and hashing the mapping
    reads each byte from the page cache without it (measured in
    C{bench/chunk_hash.py}). Only C{size} bytes (the size when the file was
    opened) are mapped and cut.
    """
    mapping = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    try:
        mapping.madvise(mmap.MADV_SEQUENTIAL)
        whole = memoryview(mapping)
        try:
            cutter = new_cutter()
            offset = start
            while offset < size:
                pending = whole[offset : min(size, offset + MAX_CHUNK_SIZE)]
                length = _first_length(cutter, pending)
                data = pending[:length]
                try:
                    yield ChunkRef(offset, length, chunk_hash(data)), data
                finally:
                    data.release()
                    pending.release()
                offset += length
        finally:
            whole.release()
    finally:
        try:
            mapping.close()
        except BufferError:
            # The caller kept a slice of a chunk's view beyond the iteration:
            # the mapping stays valid until the last such slice is gone.
            pass


def iter_chunk_views(
    source: StrPath | BinaryReader, *, start: int = 0, pool: BufferPool | None = None
) -> Generator[tuple[ChunkRef, memoryview], None, None]:
    """
    Cut C{source} (a path or a L{BinaryReader}) and yield each chunk's
    L{ChunkRef} with a view of its bytes, without copying them.

    Each view is valid only until the iterator advances (or is closed); copy
    it (C{bytes(view)}) or use L{iter_chunks} to keep the bytes. Close an
    iterator you abandon early (C{.close()}) to release its file and buffer.

    @param start: for a path, the file offset to start cutting at, as if the
        file began there (chunk offsets stay file offsets). For a reader,
        the offset the reader is already at, added to the reported offsets.
    @param pool: where to borrow the stream buffer; without one a buffer is
        allocated for this call, sized down to the file or grown with the
        stream.
    """
    if isinstance(source, str | os.PathLike):
        with open(source, "rb", buffering=0) as raw:
            status = os.fstat(raw.fileno())
            remaining = max(0, status.st_size - start)
            if stat.S_ISREG(status.st_mode) and remaining >= MAPPED_MIN_SIZE:
                yield from _iter_mapped_views(raw.fileno(), start, status.st_size)
                return
            # Unbuffered: reads go straight into the window's buffer, which
            # is sized to the file when that is smaller than the usual window.
            if start:
                raw.seek(start)
            yield from _iter_reader_views(raw, start, remaining + 1, pool)
    else:
        yield from _iter_reader_views(source, start, FIRST_READER_BUFFER_SIZE, pool)


def iter_chunks(
    source: StrPath | BinaryReader, *, start: int = 0, pool: BufferPool | None = None
) -> Generator[tuple[ChunkRef, bytes], None, None]:
    """
    Cut C{source} and yield each chunk's L{ChunkRef} with a copy of its bytes,
    which the caller may keep (for instance to upload it).

    Holds the stream buffer plus the chunk being yielded; see
    L{iter_chunk_views} for C{start} and C{pool}.
    """
    for ref, view in iter_chunk_views(source, start=start, pool=pool):
        yield ref, view.tobytes()


def chunk_stream(
    source: StrPath | BinaryReader, *, pool: BufferPool | None = None
) -> list[ChunkRef]:
    """
    Cut C{source} from its current position to its end and name every chunk.

    Equal to L{svc.chunking.core.chunk_bytes} applied to the whole content.
    """
    return [ref for ref, _view in iter_chunk_views(source, pool=pool)]


def chunk_range(
    path: StrPath, start: int, stop: int, *, pool: BufferPool | None = None
) -> list[ChunkRef]:
    """
    Cut the file at C{path} as if it began at C{start}, and stop after the
    first chunk that ends at or after C{stop} (or at the end of the file).

    With C{start=0} these are the file's real first chunks. With any other
    C{start} they are speculative: a real boundary may not fall at C{start};
    L{svc.chunking.segments.join_segments} reconciles them.
    """
    refs: list[ChunkRef] = []
    for ref, _view in iter_chunk_views(path, start=start, pool=pool):
        refs.append(ref)
        if ref.end >= stop:
            break
    return refs


def read_chunk(source: StrPath | BinaryReader, ref: ChunkRef) -> bytes:
    """
    Read the bytes of C{ref} back from a seekable file and check their name.

    @raise ChunkMismatch: if the bytes there no longer hash to C{ref.hash}
        (or the file got shorter).
    """
    if isinstance(source, str | os.PathLike):
        with open(source, "rb", buffering=0) as raw:
            return read_chunk(raw, ref)
    seek = getattr(source, "seek", None)
    if seek is None:
        raise TypeError("read_chunk needs a seekable reader")
    seek(ref.offset)
    buffer = bytearray(ref.length)
    view = memoryview(buffer)
    filled = 0
    while filled < ref.length:
        count = source.readinto(view[filled:])
        if not count:
            break
        filled += count
    data = view[:filled]
    actual = chunk_hash(data)
    if filled != ref.length or actual != ref.hash:
        raise ChunkMismatch(ref, actual, filled)
    return bytes(buffer)
