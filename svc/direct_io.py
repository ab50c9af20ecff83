"""
Reading and writing whole files with C{O_DIRECT}, past the page cache.

On the project's virtual machines a buffered write of a new 4 MiB file often
costs 7 to 12 ms of kernel CPU (allocating fresh page-cache pages, which the
hypervisor must back, and copying into them: 300 to 600 MB/s), more than
receiving the same bytes over TLS; the same write with C{O_DIRECT} from an
aligned buffer costs about 0.5 ms and runs at about 1.9 GB/s (measured in
C{docs/specifications/chunk-store.md}, "Measured"). Chunk files are written
once, read rarely soon after, and must be fsync'd anyway, so they lose
nothing by bypassing the cache; on any machine they save a copy and the
page-cache churn.

C{O_DIRECT} wants the buffer address, the file offset and the length aligned
to the device's logical block size. L{DirectWriter} copies the data through a
page-aligned scratch buffer kept per thread (L{SCRATCH_SIZE} bytes), pads the
last block with zeros and cuts the file back to its true length with
C{ftruncate}. Data that is a lent buffer's view (a request body the
data plane's decoder assembled, L{svc.buffer_pool.page_padded}) is already
page aligned and zero padded, and is written from where it lies, with no
copy. L{DirectReader} reads a whole file straight into a caller's
page-aligned buffer (a L{svc.buffer_pool.BufferPool} loan): the device
fills the buffer, with no page-cache pages to allocate and no copy out of
them. Where the filesystem refuses C{O_DIRECT} (tmpfs, some FUSE and
network filesystems answer C{EINVAL}) both go through the page cache
instead, and stop trying for the life of the object.

Durability is unchanged: the caller still fsyncs the file (C{O_DIRECT} alone
does not flush the device's cache nor write the file's size and extents).
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import stat
import threading
from collections.abc import Callable
from typing import Final

from svc.buffer_pool import page_padded

ALIGNMENT: Final = 4096
"""Offsets and lengths of direct writes are multiples of this (covers 512 and 4096-byte devices)."""

DIRECT_MIN_BYTES: Final = 64 * 1024
"""Files smaller than this are written through the page cache: a direct write
waits for the device (about 70 us of a 4 KiB file's 120 us on these VMs),
while the page cache costs such a file a page or two."""

SCRATCH_SIZE: Final = 4 * 1024 * 1024
"""The aligned buffer each writing thread keeps: one copy and one write per this many bytes."""

_per_thread = threading.local()
"""Each thread's scratch buffer, shared by every L{DirectWriter} it uses."""


class _DirectFiles:
    """
    What reading and writing share: whether C{O_DIRECT} is still tried, and
    opening with it while the filesystem accepts it (C{EINVAL} turns it off
    for the life of the object).
    """

    def __init__(self, enabled: bool) -> None:
        self._enabled = enabled

    @property
    def direct(self) -> bool:
        """Whether the next file will be tried with C{O_DIRECT}."""
        return self._enabled

    def _opened(self, open_file: Callable[[int], int], flags: int) -> int:
        """C{open_file(flags)}, with C{O_DIRECT} added while it is accepted."""
        if self._enabled:
            try:
                return open_file(flags | os.O_DIRECT)
            except OSError as err:
                if err.errno != errno.EINVAL:
                    raise
                self._enabled = False
        return open_file(flags)

    def _refused_on(self, fd: int) -> None:
        """C{fd} was opened with C{O_DIRECT}, then refused I/O: go on without it."""
        self._enabled = False
        _clear_direct(fd)


class DirectWriter(_DirectFiles):
    """
    Creates files and writes their whole content with C{O_DIRECT} when the
    filesystem allows it. Thread-safe. Cheap: keep one per directory tree
    (it remembers whether that filesystem refused C{O_DIRECT}); the scratch
    buffers belong to the threads, one per thread whatever the number of
    writers.
    """

    def __init__(
        self,
        *,
        enabled: bool = True,
        os_open: Callable[[str, int, int], int] = os.open,
        os_write: Callable[[int, memoryview], int] = os.write,
    ) -> None:
        """
        @param enabled: C{False} always writes through the page cache.
        @param os_open: C{os.open}, replaceable to test a filesystem that
            refuses C{O_DIRECT}.
        @param os_write: C{os.write}, likewise.
        """
        super().__init__(enabled)
        self._open = os_open
        self._write = os_write

    def create(self, path: str, flags: int, mode: int, size: int | None = None) -> int:
        """
        C{os.open(path, flags, mode)}, adding C{O_DIRECT} while the
        filesystem accepts it, unless the file will hold C{size} bytes,
        fewer than L{DIRECT_MIN_BYTES}. Write the file with L{write_all} only.
        """
        if size is not None and size < DIRECT_MIN_BYTES:
            return self._open(path, flags, mode)
        return self._opened(lambda with_flags: self._open(path, with_flags, mode), flags)

    def write_all(self, fd: int, data: bytes | bytearray | memoryview) -> None:
        """
        Write all of C{data} from offset 0 of the new, empty file C{fd}
        (opened by L{create}), leaving the file exactly C{len(data)} long.
        Does not fsync.
        """
        view = memoryview(data).cast("B")
        if _is_direct(fd):
            try:
                self._write_direct(fd, view)
                return
            except OSError as err:
                if err.errno != errno.EINVAL:
                    raise
                # Opened, but the filesystem will not write directly after
                # all: start again through the page cache.
                self._refused_on(fd)
                os.lseek(fd, 0, os.SEEK_SET)
                os.ftruncate(fd, 0)
        written = 0
        while written < len(view):
            written += self._write(fd, view[written:])

    def _write_direct(self, fd: int, view: memoryview) -> None:
        padded = page_padded(view)
        if padded is not None:
            with padded:
                self._write_aligned(fd, padded)
        else:
            self._write_copied(fd, view)
        if len(view) % ALIGNMENT:
            os.ftruncate(fd, len(view))

    def _write_aligned(self, fd: int, space: memoryview) -> None:
        """Write all of C{space}: page-aligned memory, a whole number of blocks."""
        written = 0
        while written < len(space):
            done = self._write(fd, space[written:])
            if done <= 0 or done % ALIGNMENT:
                raise OSError(errno.EIO, f"short direct write of {done} bytes")
            written += done

    def _write_copied(self, fd: int, view: memoryview) -> None:
        scratch = _scratch()
        total = len(view)
        position = 0
        with memoryview(scratch) as space:
            while position < total:
                count = min(SCRATCH_SIZE, total - position)
                padded = -(-count // ALIGNMENT) * ALIGNMENT
                space[:count] = view[position : position + count]
                if padded > count:
                    space[count:padded] = bytes(padded - count)
                self._write_aligned(fd, space[:padded])
                position += count


class DirectReader(_DirectFiles):
    """
    Reads whole files with C{O_DIRECT} into a caller's buffer while the
    filesystem allows it. Thread-safe; keep one per directory tree.
    """

    def __init__(
        self,
        *,
        enabled: bool = True,
        os_open: Callable[[str, int], int] = os.open,
        os_preadv: Callable[[int, list[memoryview], int], int] = os.preadv,
    ) -> None:
        """
        @param enabled: C{False} always reads through the page cache.
        @param os_open: C{os.open}, replaceable to test a filesystem that
            refuses C{O_DIRECT}.
        @param os_preadv: C{os.preadv}, likewise.
        """
        super().__init__(enabled)
        self._open = os_open
        self._preadv = os_preadv

    def read_into(self, path: str, flags: int, buffer: mmap.mmap) -> tuple[os.stat_result, int]:
        """
        Open C{path} (C{os.open} with C{flags}, plus C{O_DIRECT} while the
        filesystem accepts it) and read it from offset 0 into C{buffer},
        which must be page aligned (an anonymous mapping) and a whole number
        of L{ALIGNMENT} blocks long. Reads until the end of the file or of
        the buffer, whichever comes first.

        @return: the file's C{fstat} taken before reading, and the bytes
            read. A regular file that fits leaves the second equal to its
            size; more means it grew, less that it shrank.
        """
        fd = self._opened(lambda with_flags: self._open(path, with_flags), flags)
        try:
            seen = os.fstat(fd)
            if not stat.S_ISREG(seen.st_mode):
                return seen, 0
            # Up to one byte past the size (rounded to a block), so a file
            # that grew since fstat is noticed.
            wanted = min(len(buffer), -(-(seen.st_size + 1) // ALIGNMENT) * ALIGNMENT)
            with memoryview(buffer) as space:
                return seen, self._fill(fd, space[:wanted])
        finally:
            os.close(fd)

    def _fill(self, fd: int, space: memoryview) -> int:
        position = 0
        while position < len(space):
            try:
                count = self._preadv(fd, [space[position:]], position)
            except OSError as err:
                if err.errno != errno.EINVAL or not _is_direct(fd):
                    raise
                # Opened, but the filesystem will not read directly after
                # all: go on through the page cache.
                self._refused_on(fd)
                continue
            if count <= 0:
                break
            position += count
            if position % ALIGNMENT:
                break  # A direct read ends mid-block only at the end of the file.
        return position


def _scratch() -> mmap.mmap:
    scratch: mmap.mmap | None = getattr(_per_thread, "scratch", None)
    if scratch is None:
        # An anonymous mapping is page-aligned, hence block-aligned.
        scratch = mmap.mmap(-1, SCRATCH_SIZE)
        _per_thread.scratch = scratch
    return scratch


def _is_direct(fd: int) -> bool:
    return bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT)


def _clear_direct(fd: int) -> None:
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_DIRECT)
