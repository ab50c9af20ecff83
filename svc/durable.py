"""
Durable file replacement: write to a temporary name, fsync, rename, fsync the
directory. A reader (or a process restarted after a crash) sees either the
old complete file or the new complete file, never a torn one.

These are blocking calls; run them through an L{svc.worker.IWorker}.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

TEMP_PREFIX = ".tmp-"


def fsync_directory(path: str | Path) -> None:
    """
    Make a directory's entries (creations, renames, removals) durable.
    """
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_name_for(path: Path) -> Path:
    """
    A fresh temporary name beside ``path``, recognisable by L{TEMP_PREFIX}.
    """
    return path.with_name(f"{TEMP_PREFIX}{path.name}.{secrets.token_hex(8)}")


def write_file_atomically(path: Path, data: bytes, mode: int = 0o600) -> None:
    """
    Replace ``path`` with ``data`` durably, with permission bits ``mode``.

    The temporary file is created with ``mode`` from the start (never
    world-readable in between) and removed if anything fails before the rename.
    """
    temp = temp_name_for(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
    fd = os.open(temp, flags, mode)
    try:
        try:
            os.fchmod(fd, mode)  # the umask filtered os.open's mode.
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def make_directories(path: Path, mode: int = 0o700) -> None:
    """
    Create ``path`` and missing parents with ``mode``, fsyncing each parent
    whose entries changed so the new directories survive a crash.
    """
    missing: list[Path] = []
    current = path
    while not current.exists():
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=mode)
        except FileExistsError:
            continue
        directory.chmod(mode)  # mkdir's mode is filtered by the umask.
        fsync_directory(directory.parent)
