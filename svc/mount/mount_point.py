"""
Whether a directory can take a mount: the check C{twist svc-mount} (and the
demo) make before enrolling, so a bad mount point is refused with a reason
instead of failing inside libfuse after the enrollment token was spent.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


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
