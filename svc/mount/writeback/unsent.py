"""
Changes the mount has to give up on are saved on its own disk.

A file's changes are discarded when they cannot be committed: at shutdown
while the data plane is out of reach (its last attempt failed, or was not
made: L{svc.mount.writeback.kept_write_backs}), or when a write-back fails for good
(the quota, a read-only mount, a file kept too long). Rather than lose the
bytes, the mount copies the file's content, as it stood, to
C{<unsent directory>/<UTC time>-<inode>[.<n>]/<path in the disk>} (directories
0700, the file 0600, written and fsynced before the spill file goes) and
names that place in its warning. Nothing reads it back: recovering it is
the operator's or the agent's business (``docs/guides/operator.md``).

A copy appears under its name only whole: it is written and fsynced as
C{<unsent directory>/.partial-<random>}, then hard-linked to its name (a
name already taken moves it to the next C{.<n>}), and the staging name is
removed. A mount killed while copying leaves at most a C{.partial-} file,
which L{copies_in} does not count.

A content that cannot be read whole (a part of it was committed before,
is not in the chunk cache, and the data plane cannot be asked for it) is
not saved: the partial copy is removed and the warning says so.
"""

from __future__ import annotations

import os
import secrets
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

STAGING_PREFIX = ".partial-"
"""The name, under the unsent directory, of a copy being written."""


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
        inside = Path(*(parts or ["unnamed"]))
        directory = self._directory
        try:
            staging, fd = await self._worker.submit(lambda: _create_staging(directory))
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
            return await self._worker.submit(
                lambda: _publish(staging, directory, f"{stamp}-{ino}", inside)
            )
        except Exception as error:
            _log.error(
                "could not save the changes to {path} ({offset} of {size} bytes read): {error}",
                path=rel,
                offset=offset,
                size=size,
                error=error,
            )
            return None
        finally:
            await self._worker.submit(lambda: _drop(fd, staging))

    async def remove(self, copy: Path) -> None:
        """Remove a copy L{save} made (and its folders, once empty); failures are logged."""
        root = self._directory
        if root is None:
            return
        try:
            await self._worker.submit(lambda: _remove(copy, root))
        except OSError as error:
            _log.warn("could not remove {copy}: {error}", copy=str(copy), error=error)


def copies_in(directory: Path) -> int:
    """How many whole copies C{directory} holds (0 when it does not exist)."""
    if not directory.is_dir():
        return 0
    return sum(
        1
        for folder, _dirs, files in os.walk(directory)
        for name in files
        if not (Path(folder) == directory and name.startswith(STAGING_PREFIX))
    )


def _remove(path: Path, root: Path) -> None:
    """Remove C{path}, then its folders up to C{root} (not included) once empty."""
    path.unlink(missing_ok=True)
    folder = path.parent
    while folder != root and root in folder.parents:
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent


def _create_staging(directory: Path) -> tuple[Path, int]:
    """A new staging file under C{directory} (made 0700 if missing), open for writing."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    while True:
        staging = directory / f"{STAGING_PREFIX}{secrets.token_hex(8)}"
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
            return staging, os.open(staging, flags, 0o600)
        except FileExistsError:
            continue


def _publish(staging: Path, directory: Path, folder: str, inside: Path) -> Path:
    """
    Link the whole, fsynced C{staging} file to C{directory/folder/inside},
    or with C{.2}, C{.3} ... after C{folder} when that is taken (two copies
    of one inode within a second); the path it got.
    """
    for number in range(1, 1000):
        name = folder if number == 1 else f"{folder}.{number}"
        target = directory / name / inside
        _make_folders(target.parent)
        try:
            os.link(staging, target, follow_symlinks=False)
        except FileExistsError:
            continue
        _fsync_folder(target.parent)
        return target
    raise FileExistsError(f"no free name for {folder}/{inside} under {directory}")


def _make_folders(folder: Path) -> None:
    """Make C{folder} and the folders above it that are missing, each 0700."""
    missing: list[Path] = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for each in reversed(missing):
        each.mkdir(mode=0o700, exist_ok=True)


def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


def _drop(fd: int, staging: Path) -> None:
    os.close(fd)
    staging.unlink(missing_ok=True)
