"""
Tests for L{svc.direct_io}: whole files written past the page cache.
"""

from __future__ import annotations

import errno
import fcntl
import os

from twisted.trial.unittest import SynchronousTestCase

from svc.direct_io import ALIGNMENT, SCRATCH_SIZE, DirectWriter

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

    def test_unaligned_view(self) -> None:
        """A view starting at an odd address of a larger buffer is copied, not passed as is."""
        directory = self.mktemp()
        os.mkdir(directory)
        backing = _pattern(3 * ALIGNMENT + 7)
        view = memoryview(backing)[3 : 3 * ALIGNMENT + 4]
        path = self._write(DirectWriter(), directory, view)
        self._assert_exact(path, bytes(view))

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
