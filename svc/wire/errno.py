"""
The errno values carried in data-plane error frames.

The wire uses the Linux numbering, fixed here rather than taken from the
platform's :mod:`errno` module, so a client on another platform (macOS numbers
ESTALE 70, for example) maps them explicitly. The spec fixes ESTALE at 116.
See ``docs/specifications/wire.md``.
"""

from __future__ import annotations

import enum


class WireErrno(enum.IntEnum):
    """
    Every errno value that may appear in an error frame.
    """

    EPERM = 1
    ENOENT = 2
    EIO = 5
    EBADF = 9
    EAGAIN = 11
    EACCES = 13
    EBUSY = 16
    EEXIST = 17
    EXDEV = 18
    ENOTDIR = 20
    EISDIR = 21
    EINVAL = 22
    EFBIG = 27
    ENOSPC = 28
    EROFS = 30
    EMLINK = 31
    ERANGE = 34
    ENAMETOOLONG = 36
    ENOSYS = 38
    ENOTEMPTY = 39
    ELOOP = 40
    ENODATA = 61
    EPROTO = 71
    EOPNOTSUPP = 95
    ETIMEDOUT = 110
    ESTALE = 116
    EDQUOT = 122


def from_wire(value: int) -> WireErrno:
    """
    The L{WireErrno} for a number received from a peer; unknown numbers
    become L{WireErrno.EIO} so that a newer peer cannot crash an older one.
    """
    try:
        return WireErrno(value)
    except ValueError:
        return WireErrno.EIO
