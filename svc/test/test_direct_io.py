"""
Tests for L{svc.direct_io}: whole files written and read past the page cache.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import stat

from twisted.trial.unittest import SynchronousTestCase

from svc.buffer_pool import BufferPool
from svc.direct_io import (
    ALIGNMENT,
    DIRECT_MIN_BYTES,
    SCRATCH_SIZE,
    DirectReader,
    DirectWriter,
)

FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC

SIZES = [
    0,
    1,
    ALIGNMENT - 1,
    ALIGNMENT,
    ALIGNMENT + 1,
    SCRATCH_SIZE - 1,
    SCRATCH_SIZE,
    SCRATCH_SIZE + 1,
    2 * SCRATCH_SIZE + 5,
]


def _pattern(size: int) -> bytes:
    block = bytes(range(251))  # a prime length, so no block lines up with ALIGNMENT
    return (block * (size // len(block) + 1))[:size]


class DirectWriterTests(SynchronousTestCase):
    """
    L{DirectWriter} leaves exactly the bytes given, whatever their length,
    with or without C{O_DIRECT}.
    """

    def _write(self, writer: DirectWriter, directory: str, data: bytes | memoryview) -> str:
        path = os.path.join(directory, f"file-{len(data)}")
        fd = writer.create(path, FLAGS, 0o600)
        try:
            writer.write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        return path

    def _assert_exact(self, path: str, data: bytes) -> None:
        with open(path, "rb") as handle:
            self.assertEqual(handle.read(), data)
        self.assertEqual(os.stat(path).st_size, len(data))

    def test_exact_content_and_length(self) -> None:
        """Every length, aligned or not, one scratch buffer or several, is written exactly."""
        directory = self.mktemp()
        os.mkdir(directory)
        writer = DirectWriter()
        for size in SIZES:
            data = _pattern(size)
            self._assert_exact(self._write(writer, directory, data), data)
        # This test's directory is on a disk filesystem here, which takes O_DIRECT.
        self.assertTrue(writer.direct)

    def test_opened_direct(self) -> None:
        """On a filesystem that allows it, the file is opened with O_DIRECT."""
        directory = self.mktemp()
        os.mkdir(directory)
        writer = DirectWriter()
        fd = writer.create(os.path.join(directory, "f"), FLAGS, 0o600)
        try:
            self.assertTrue(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT)
        finally:
            os.close(fd)

    def test_small_file_through_the_page_cache(self) -> None:
        """
        A file said to hold fewer than DIRECT_MIN_BYTES is opened without
        O_DIRECT (and written exactly); one of that size or more, or of
        unknown size, with it.
        """
        directory = self.mktemp()
        os.mkdir(directory)
        writer = DirectWriter()
        for size, direct in [
            (DIRECT_MIN_BYTES - 1, False),
            (DIRECT_MIN_BYTES, True),
            (None, True),
        ]:
            path = os.path.join(directory, f"f-{size}")
            fd = writer.create(path, FLAGS, 0o600, size)
            data = _pattern(size or 10)
            try:
                self.assertEqual(bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT), direct, size)
                writer.write_all(fd, data)
            finally:
                os.close(fd)
            self._assert_exact(path, data)
        self.assertTrue(writer.direct)

    def test_unaligned_view(self) -> None:
        """A view starting at an odd address of a larger buffer is copied, not passed as is."""
        directory = self.mktemp()
        os.mkdir(directory)
        backing = _pattern(3 * ALIGNMENT + 7)
        view = memoryview(backing)[3 : 3 * ALIGNMENT + 4]
        path = self._write(DirectWriter(), directory, view)
        self._assert_exact(path, bytes(view))

    def test_lent_view_written_in_place(self) -> None:
        """
        A lent buffer's view goes to the device from the buffer itself (no
        scratch copy), its zero padding cut off again, for every length.
        """
        directory = self.mktemp()
        os.mkdir(directory)
        sources: list[object] = []

        def recording_write(fd: int, view: memoryview) -> int:
            sources.append(view.obj)
            return os.write(fd, view)

        writer = DirectWriter(os_write=recording_write)
        pool = BufferPool(2 * SCRATCH_SIZE + 5, keep=1)
        for size in SIZES:
            loan = pool.lend()
            data = _pattern(size)
            loan.buffer[:size] = data
            tail = min(ALIGNMENT, len(loan.buffer) - size)
            loan.buffer[size : size + tail] = b"\xee" * tail  # must not reach the file
            sources.clear()
            self._assert_exact(self._write(writer, directory, loan.view(size)), data)
            self.assertTrue(all(source is loan.buffer for source in sources), size)
            loan.give_back()
        self.assertTrue(writer.direct)

    def test_refused_at_open_falls_back(self) -> None:
        """A filesystem refusing O_DIRECT at open (EINVAL): page cache, and no more tries."""
        directory = self.mktemp()
        os.mkdir(directory)
        attempts: list[int] = []

        def refusing_open(path: str, flags: int, mode: int) -> int:
            attempts.append(flags & os.O_DIRECT)
            if flags & os.O_DIRECT:
                raise OSError(errno.EINVAL, "no direct I/O here")
            return os.open(path, flags, mode)

        writer = DirectWriter(os_open=refusing_open)
        for size in (ALIGNMENT + 1, 5):
            data = _pattern(size)
            self._assert_exact(self._write(writer, directory, data), data)
        self.assertFalse(writer.direct)
        self.assertEqual(attempts, [os.O_DIRECT, 0, 0])

    def test_refused_at_write_falls_back(self) -> None:
        """Opened with O_DIRECT but the write refused (EINVAL): rewritten through the cache."""
        directory = self.mktemp()
        os.mkdir(directory)

        def refusing_write(fd: int, data: memoryview) -> int:
            if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
                raise OSError(errno.EINVAL, "no direct writes here")
            return os.write(fd, data)

        writer = DirectWriter(os_write=refusing_write)
        data = _pattern(SCRATCH_SIZE + ALIGNMENT + 3)
        self._assert_exact(self._write(writer, directory, data), data)
        self.assertFalse(writer.direct)

    def test_other_errors_raised(self) -> None:
        """Errors other than EINVAL (a full disk, say) are raised, not hidden by a fallback."""
        directory = self.mktemp()
        os.mkdir(directory)

        def full_disk(fd: int, data: memoryview) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        writer = DirectWriter(os_write=full_disk)
        fd = writer.create(os.path.join(directory, "f"), FLAGS, 0o600)
        try:
            error = self.assertRaises(OSError, writer.write_all, fd, b"x" * 10)
        finally:
            os.close(fd)
        self.assertEqual(error.errno, errno.ENOSPC)
        self.assertTrue(writer.direct)

    def test_disabled(self) -> None:
        """With enabled=False files are opened without O_DIRECT and written exactly."""
        directory = self.mktemp()
        os.mkdir(directory)
        writer = DirectWriter(enabled=False)
        path = os.path.join(directory, "f")
        fd = writer.create(path, FLAGS, 0o600)
        try:
            self.assertFalse(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT)
            writer.write_all(fd, b"abc")
        finally:
            os.close(fd)
        self._assert_exact(path, b"abc")


READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC


class DirectReaderTests(SynchronousTestCase):
    """
    L{DirectReader} fills a page-aligned buffer with a whole file, with or
    without C{O_DIRECT}, and says how much it read.
    """

    def setUp(self) -> None:
        self.directory = self.mktemp()
        os.mkdir(self.directory)
        # Not closed at cleanup: a raised error's traceback may still hold views of it.
        self.buffer = mmap.mmap(-1, 2 * SCRATCH_SIZE + 2 * ALIGNMENT)

    def _file(self, data: bytes) -> str:
        path = os.path.join(self.directory, f"file-{len(data)}")
        with open(path, "wb") as handle:
            handle.write(data)
        return path

    def test_whole_files_of_any_length(self) -> None:
        """Every size reads back exactly, directly where the filesystem allows it."""
        writer, reader = DirectWriter(), DirectReader()
        for size in SIZES:
            data = _pattern(size)
            path = os.path.join(self.directory, f"direct-{size}")
            fd = writer.create(path, FLAGS, 0o600)
            try:
                writer.write_all(fd, data)
            finally:
                os.close(fd)
            seen, count = reader.read_into(path, READ_FLAGS, self.buffer)
            self.assertEqual((seen.st_size, count), (size, size))
            self.assertEqual(self.buffer[:count], data)
        self.assertEqual(reader.direct, writer.direct)

    def test_longer_than_the_buffer(self) -> None:
        """A file longer than the buffer fills it and no more: the caller sees the excess."""
        data = _pattern(len(self.buffer) + 10)
        seen, count = DirectReader().read_into(self._file(data), READ_FLAGS, self.buffer)
        self.assertEqual((seen.st_size, count), (len(data), len(self.buffer)))
        self.assertEqual(self.buffer[:], data[: len(self.buffer)])

    def test_not_a_regular_file(self) -> None:
        """A directory reads as nothing, with its stat, for the caller to refuse."""
        seen, count = DirectReader().read_into(self.directory, READ_FLAGS, self.buffer)
        self.assertTrue(stat.S_ISDIR(seen.st_mode))
        self.assertEqual(count, 0)

    def test_refused_at_open_falls_back(self) -> None:
        """A filesystem refusing O_DIRECT at open (EINVAL): page cache, and no more tries."""
        attempts: list[int] = []

        def refusing_open(path: str, flags: int) -> int:
            attempts.append(flags & os.O_DIRECT)
            if flags & os.O_DIRECT:
                raise OSError(errno.EINVAL, "no direct I/O here")
            return os.open(path, flags)

        reader = DirectReader(os_open=refusing_open)
        for size in (ALIGNMENT + 1, 5):
            data = _pattern(size)
            self.assertEqual(reader.read_into(self._file(data), READ_FLAGS, self.buffer)[1], size)
            self.assertEqual(self.buffer[:size], data)
        self.assertFalse(reader.direct)
        self.assertEqual(attempts, [os.O_DIRECT, 0, 0])

    def test_refused_at_read_falls_back(self) -> None:
        """Opened with O_DIRECT but the read refused (EINVAL): read through the cache."""

        def refusing_preadv(fd: int, buffers: list[memoryview], offset: int) -> int:
            if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
                raise OSError(errno.EINVAL, "no direct reads here")
            return os.preadv(fd, buffers, offset)

        reader = DirectReader(os_preadv=refusing_preadv)
        data = _pattern(SCRATCH_SIZE + 3)
        self.assertEqual(reader.read_into(self._file(data), READ_FLAGS, self.buffer)[1], len(data))
        self.assertEqual(self.buffer[: len(data)], data)
        self.assertFalse(reader.direct)

    def test_short_reads_continue(self) -> None:
        """Reads that return less than asked (whole blocks) are continued to the end."""

        def block_at_a_time(fd: int, buffers: list[memoryview], offset: int) -> int:
            return os.preadv(fd, [buffers[0][:ALIGNMENT]], offset)

        data = _pattern(3 * ALIGNMENT + 17)
        reader = DirectReader(os_preadv=block_at_a_time)
        self.assertEqual(reader.read_into(self._file(data), READ_FLAGS, self.buffer)[1], len(data))
        self.assertEqual(self.buffer[: len(data)], data)

    def test_other_errors_raised(self) -> None:
        """Errors other than EINVAL (a bad disk, say) are raised, not hidden by a fallback."""

        def bad_disk(fd: int, buffers: list[memoryview], offset: int) -> int:
            raise OSError(errno.EIO, "Input/output error")

        reader = DirectReader(os_preadv=bad_disk)
        error = self.assertRaises(
            OSError, reader.read_into, self._file(b"abc"), READ_FLAGS, self.buffer
        )
        self.assertEqual(error.errno, errno.EIO)
        self.assertTrue(reader.direct)
