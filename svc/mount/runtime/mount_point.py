"""
The mount point: whether a directory can take a mount (the check
C{twist svc-mount} and the demo make before enrolling, so a bad mount point
is refused with a reason instead of failing inside libfuse after the
enrollment token was spent), clearing the dead mount a killed svc mount
leaves behind, and the command that unmounts.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

FSTYPE = "fuse.svc"
"""How the kernel lists our mounts in C{/proc/mounts} (fsname C{svc})."""

_ESCAPES = {"\\040": " ", "\\011": "\t", "\\012": "\n", "\\134": "\\"}
"""C{/proc/mounts} writes these characters of a path as octal escapes."""


def mount_point_problem(path: Path) -> str | None:
    """
    Why C{path} cannot take the mount, or L{None}: it must be an existing,
    empty directory that is not already a mount point. libfuse refuses a
    non-empty one ("mountpoint is not empty"), and mounting over files
    would hide them from the agent: files written there while nothing was
    mounted are not on the agent's disk.
    """
    try:
        if os.path.ismount(path):
            return f"{path} is already a mount point (unmount it first: umount {path})"
        status = os.stat(path)
        if not stat.S_ISDIR(status.st_mode):
            return f"{path} is not a directory"
        with os.scandir(path) as entries:
            first = next(entries, None)
    except OSError as error:
        if error.errno == errno.ENOTCONN:
            return f"{path} is a dead FUSE mount (unmount it first: umount -l {path})"
        return f"{path} cannot be used: {error.strerror or error}"
    if first is not None:
        return (
            f"{path} is not empty (it holds {first.name!r}); files written there while "
            "svc was not mounted are not on the agent's disk: move them away first"
        )
    return None


def unmount_command(mount_point: Path, *, lazy: bool = False) -> list[str]:
    """The command that unmounts C{mount_point} (C{umount} as root, else C{fusermount -u})."""
    if os.geteuid() == 0 and shutil.which("umount"):
        return ["umount", "-l", str(mount_point)] if lazy else ["umount", str(mount_point)]
    return (
        ["fusermount", "-u", "-z", str(mount_point)]
        if lazy
        else ["fusermount", "-u", str(mount_point)]
    )


def _unescape(field: str) -> str:
    for escaped, plain in _ESCAPES.items():
        field = field.replace(escaped, plain)
    return field


def fstypes_at(path: Path, mounts: Path = Path("/proc/mounts")) -> list[str]:
    """The filesystem types mounted at C{path} according to C{mounts}, oldest first."""
    try:
        lines = mounts.read_text(errors="replace").splitlines()
    except OSError:
        return []
    where = os.path.abspath(path)
    return [
        fields[2]
        for fields in (line.split() for line in lines)
        if len(fields) >= 3 and _unescape(fields[1]) == where
    ]


def _run(argv: list[str]) -> object:
    return subprocess.run(argv, check=False, capture_output=True)  # noqa: S603 (umount/fusermount)


def release_dead_mount(
    path: Path,
    *,
    mounts: Path = Path("/proc/mounts"),
    probe: Callable[[Path], object] = os.statvfs,
    run: Callable[[list[str]], object] = _run,
) -> bool:
    """
    If C{path} is a dead svc mount (its process was killed: the kernel
    answers C{ENOTCONN}, and the newest mount there is C{fuse.svc}),
    unmount it lazily so a new mount can take its place; whether it did
    so. Any other state, and another filesystem's dead mount, is left alone.
    The probe is C{statvfs}, which the kernel always asks the filesystem:
    a C{stat} may be answered from its attribute cache for a while after
    the process died.
    """
    try:
        probe(path)
    except OSError as error:
        if error.errno != errno.ENOTCONN:
            return False
    else:
        return False
    types = fstypes_at(path, mounts)
    if not types or types[-1] != FSTYPE:
        return False
    run(unmount_command(path, lazy=True))
    return True
