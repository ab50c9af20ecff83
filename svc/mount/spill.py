"""
Spill files: an open file's local changes, on local disk rather than in
memory.

A L{SpillFile} is a sparse file in the spill directory holding, at their own
offsets, the bytes written to one open file. Bytes never written are holes
(zeros) and cost no disk blocks, so a write at 1 GiB costs one block, and
truncating or extending a file costs no I/O beyond C{ftruncate}. Which
ranges hold real data is tracked by L{svc.mount.extents.FileLayout}, not here.

The methods are blocking: call them on a worker (L{svc.worker.IWorker}),
never on the reactor thread. C{pread}/C{pwrite} carry their own offsets, so
several worker threads may use one spill file at once.

Spill files are named C{<ino>-<serial>.spill} and removed when the open file
is written back or closed; L{SpillDirectory.sweep} removes leftovers of a
previous run at start-up (their content was never committed; see
``docs/specifications/mount-fs.md``).
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

SPILL_SUFFIX = ".spill"


class SpillFile:
    """One sparse spill file; see the module docstring."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)

    def write(self, offset: int, data: bytes) -> None:
        """Store C{data} at C{offset}."""
        view = memoryview(data)
        while view:
            written = os.pwrite(self._fd, view, offset)
            view = view[written:]
            offset += written

    def read(self, offset: int, length: int) -> bytes:
        """C{length} bytes at C{offset}; past the file's end, zeros."""
        parts = []
        remaining = length
        while remaining > 0:
            data = os.pread(self._fd, remaining, offset)
            if not data:
                break
            parts.append(data)
            offset += len(data)
            remaining -= len(data)
        if remaining > 0:
            parts.append(bytes(remaining))
        return b"".join(parts) if len(parts) != 1 else parts[0]

    def truncate(self, size: int) -> None:
        """Drop everything at or after C{size} if the file is longer."""
        if os.fstat(self._fd).st_size > size:
            os.ftruncate(self._fd, size)

    def allocated(self) -> int:
        """Bytes of disk actually allocated (C{st_blocks} * 512)."""
        return os.fstat(self._fd).st_blocks * 512

    def sync(self) -> None:
        """C{fsync} the spill file (not needed for correctness; for tools)."""
        os.fsync(self._fd)

    def remove(self) -> None:
        """Close and delete the file; idempotent."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass


class SpillDirectory:
    """Where spill files are created (a directory the mount client owns)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._serial = itertools.count(1)

    def create(self, ino: int) -> SpillFile:
        """A new, empty spill file for inode C{ino} (blocking)."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        while True:
            path = self.root / f"{ino}-{next(self._serial)}{SPILL_SUFFIX}"
            try:
                return SpillFile(path)
            except FileExistsError:
                continue

    def sweep(self) -> int:
        """Remove spill files left by an earlier run; how many (blocking)."""
        if not self.root.is_dir():
            return 0
        count = 0
        for path in self.root.glob(f"*{SPILL_SUFFIX}"):
            path.unlink(missing_ok=True)
            count += 1
        return count
