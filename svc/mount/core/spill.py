"""
Spill files: an open file's local changes, on local disk rather than in
memory -- except for small files, whose changes are kept in memory
(L{MemorySpill}) until they outgrow a per-file limit or the spill
directory's memory budget runs out.

A L{SpillFile} is a sparse file in the spill directory holding, at their own
offsets, the bytes written to one open file. Bytes never written are holes
(zeros) and cost no disk blocks, so a write at 1 GiB costs one block, and
truncating or extending a file costs no I/O beyond C{ftruncate}. Which
ranges hold real data is tracked by L{svc.mount.core.extents.FileLayout}, not here.

The methods of L{SpillFile} are blocking: call them on a worker
(L{svc.worker.IWorker}), never on the reactor thread. C{pread}/C{pwrite}
carry their own offsets, so several worker threads may use one spill file at
once. A L{MemorySpill} has the same methods, none blocking
(C{in_memory} tells them apart): a worker round trip costs more than copying
a few KiB.

Spill files are named C{<ino>-<serial>.spill} and removed when the open file
is written back or closed; L{SpillDirectory.sweep} removes leftovers of a
previous run at start-up (their content was never committed; see
``docs/specifications/mount-fs.md``). An open file's state shares its spill
with the reads and writes in flight (L{SpillHandle}), so a spill retired
while one of them uses it is removed once the last is done.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

from twisted.internet.defer import Deferred

from svc.worker import IWorker

SPILL_SUFFIX = ".spill"

DEFAULT_MEMORY_FILE_BYTES = 256 << 10
"""Changes of a file are kept in memory while they lie below this offset."""

DEFAULT_MEMORY_BYTES = 64 << 20
"""Memory all in-memory spills of a mount may reserve (each reserves the per-file limit)."""


class SpillFile:
    """One sparse spill file; see the module docstring."""

    in_memory = False

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

    def release_pages(self, end: int) -> None:
        """
        Tell the kernel the cached pages before C{end} are not needed soon
        (C{POSIX_FADV_DONTNEED}): dirty ones start going to disk, clean
        ones (those of an earlier call) are freed. The bytes stay in the
        file; reading them again reads the disk.
        """
        if end > 0:
            os.posix_fadvise(self._fd, 0, end, os.POSIX_FADV_DONTNEED)

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


class MemorySpill:
    """
    A spill held in memory, for changes below C{limit}; see the module
    docstring. Bytes never written read as zeros. It gives its reservation
    back to C{budget} when removed.
    """

    in_memory = True

    def __init__(self, limit: int, budget: MemoryBudget) -> None:
        self.limit = limit
        self._budget = budget
        self._data = bytearray()
        self._removed = False

    def fits(self, end: int) -> bool:
        """Whether a write ending at offset C{end} can stay in memory."""
        return end <= self.limit

    def write(self, offset: int, data: bytes) -> None:
        """Store C{data} at C{offset} (below the limit)."""
        end = offset + len(data)
        if end > self.limit:
            raise ValueError("write beyond the in-memory spill's limit")
        if offset > len(self._data):
            self._data.extend(bytes(offset - len(self._data)))
        self._data[offset:end] = data

    def read(self, offset: int, length: int) -> bytes:
        """C{length} bytes at C{offset}; past what was written, zeros."""
        data = bytes(self._data[offset : offset + length])
        return data + bytes(length - len(data)) if len(data) < length else data

    def truncate(self, size: int) -> None:
        """Drop everything at or after C{size}."""
        del self._data[size:]

    def contents(self) -> bytes:
        """Everything held, from offset 0."""
        return bytes(self._data)

    def allocated(self) -> int:
        """Bytes held."""
        return len(self._data)

    def remove(self) -> None:
        """Drop the bytes and the reservation; idempotent."""
        if not self._removed:
            self._removed = True
            self._data = bytearray()
            self._budget.release(self.limit)


class MemoryBudget:
    """The bytes in-memory spills may reserve together."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.reserved = 0

    def reserve(self, size: int) -> bool:
        """Reserve C{size} bytes if they are left; whether they were."""
        if self.reserved + size > self.total:
            return False
        self.reserved += size
        return True

    def release(self, size: int) -> None:
        """Give back a reservation."""
        self.reserved -= size


class SpillDirectory:
    """
    Where spill files are created (a directory the mount client owns), and
    the memory budget of in-memory spills.
    """

    def __init__(
        self,
        root: Path,
        *,
        memory_file_bytes: int = DEFAULT_MEMORY_FILE_BYTES,
        memory_bytes: int = DEFAULT_MEMORY_BYTES,
    ) -> None:
        self.root = root
        self._serial = itertools.count(1)
        self._memory_file_bytes = memory_file_bytes
        self._budget = MemoryBudget(memory_bytes)

    def in_memory(self, end: int) -> MemorySpill | None:
        """
        A new in-memory spill for a file whose first write ends at offset
        C{end}, or L{None} when it would not fit (the limit or the budget):
        then use L{create}. Not blocking.
        """
        limit = self._memory_file_bytes
        if end > limit or not self._budget.reserve(limit):
            return None
        return MemorySpill(limit, self._budget)

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


Spill = SpillFile | MemorySpill
"""Where an open file's written bytes are (on disk, or in memory for small files)."""


class SpillHandle:
    """
    A spill file shared by a L{svc.mount.core.file_state.FileState} and its
    in-flight reads: removed once retired and no read uses it.
    """

    def __init__(self, spill: Spill, worker: IWorker) -> None:
        self.spill = spill
        self._worker = worker
        self._users = 0
        self._retired = False

    def acquire(self) -> None:
        self._users += 1

    def release(self) -> Deferred[None] | None:
        self._users -= 1
        return self._maybe_remove()

    def retire(self) -> Deferred[None] | None:
        self._retired = True
        return self._maybe_remove()

    def _maybe_remove(self) -> Deferred[None] | None:
        if self._retired and self._users == 0:
            self._users = -1  # removed once
            if self.spill.in_memory:
                self.spill.remove()
                return None
            return self._worker.submit(self.spill.remove)
        return None
