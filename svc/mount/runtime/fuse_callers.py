"""
The process behind a FUSE request (L{caller_of}): the pid, uid and gid of
llfuse's request context, and the command name from C{/proc}. The bridge
asks for it on the FUSE thread of most requests (for the operation's audit
line, and the owner of a file it creates).
"""

from __future__ import annotations

import os
from typing import Any

from svc.audit.events import CallerProcess


def process_name(pid: int, proc: str = "/proc") -> str | None:
    """The command name of C{pid} (C{/proc/<pid>/comm}), L{None} if unknown."""
    if pid <= 0:
        return None
    # Three system calls (a Python file object would add fstat, ioctl and
    # lseek): this runs for most FUSE requests.
    try:
        fd = os.open(f"{proc}/{pid}/comm", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        raw = os.read(fd, 64)
    except OSError:
        return None
    finally:
        os.close(fd)
    name = raw.rstrip(b"\n").decode("utf-8", "replace")
    return name or None


def caller_of(ctx: Any) -> CallerProcess:
    """The L{CallerProcess} behind an llfuse C{RequestContext}."""
    pid = getattr(ctx, "pid", None)
    uid = getattr(ctx, "uid", None)
    gid = getattr(ctx, "gid", None)
    if not isinstance(pid, int) or pid <= 0:
        return CallerProcess(uid=uid, gid=gid)
    return CallerProcess(command=process_name(pid), pid=pid, uid=uid, gid=gid)
