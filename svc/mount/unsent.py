"""
Changes the mount has to give up on are saved on its own disk.

A file's changes are discarded when they cannot be committed: at shutdown
while the data plane is out of reach (its last attempt failed, or was not
made: L{svc.mount.kept_write_backs}), or when a write-back fails for good
(the quota, a read-only mount, a file kept too long). Rather than lose the
bytes, the mount copies the file's content, as it stood, to
C{<unsent directory>/<UTC time>-<inode>/<path in the disk>} (directories
0700, the file 0600, written and fsynced before the spill file goes) and
names that place in its warning. Nothing reads it back: recovering it is
the operator's or the agent's business (``docs/guides/operator.md``).

A content that cannot be read whole (a part of it was committed before,
is not in the chunk cache, and the data plane cannot be asked for it) is
not saved: the partial copy is removed and the warning says so.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path, PurePosixPath

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from svc.worker import IWorker

_log = Logger()

PIECE_BYTES = 1 << 20
"""Bytes read from the file and written to the copy at a time."""


class UnsentFiles:
    """Where discarded changes are saved; see the module docstring."""

    def __init__(self, directory: Path | None, worker: IWorker, now: Callable[[], float]) -> None:
        """
        @param directory: where copies go (None: nothing is saved).
        @param worker: runs the blocking file I/O.
        @param now: the time, for the copy's directory name.
        """
        self._directory = directory
        self._worker = worker
        self._now = now

    async def save(
        self, rel: str, ino: int, size: int, read: Callable[[int, int], Deferred[bytes]]
    ) -> Path | None:
        """
        Copy C{size} bytes, read with C{read(offset, length)}, of the file
        at C{rel} (mount-relative, inode C{ino}); the copy's path, or
        L{None} when there is no directory or the copy failed (logged).
        """
        if self._directory is None:
            return None
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self._now()))
        parts = [part for part in PurePosixPath(rel).parts if part not in ("", "/", ".", "..")]
        target = self._directory / f"{stamp}-{ino}" / Path(*(parts or ["unnamed"]))
        try:
            fd = await self._worker.submit(lambda: _create(target))
        except OSError as error:
            _log.error("could not save the changes to {path}: {error}", path=rel, error=error)
            return None
        offset = 0
        try:
            while offset < size:
                piece = await read(offset, min(PIECE_BYTES, size - offset))
                if not piece:
                    break
                await self._worker.submit(partial(_write_all, fd, piece, offset))
                offset += len(piece)
            await self._worker.submit(lambda: os.fsync(fd))
        except Exception as error:
            _log.error(
                "could not save the changes to {path} ({offset} of {size} bytes read): {error}",
                path=rel,
                offset=offset,
                size=size,
                error=error,
            )
            await self._worker.submit(lambda: _drop(fd, target))
            return None
        await self._worker.submit(lambda: os.close(fd))
        return target


def _create(target: Path) -> int:
    """Make C{target}'s directories (each 0700) and open it new (0600) for writing."""
    missing: list[Path] = []
    folder = target.parent
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for folder in reversed(missing):
        folder.mkdir(mode=0o700, exist_ok=True)
    return os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


def _drop(fd: int, target: Path) -> None:
    os.close(fd)
    target.unlink(missing_ok=True)
