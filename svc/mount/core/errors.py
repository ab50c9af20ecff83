"""
The one exception of the mount client's filesystem core: L{FSError}, carrying
a local errno (Python's L{errno} module numbering, which differs per
platform). The FUSE bridge turns it into C{FUSEError(error.errno)}, once.

Data-plane errors are translated where they enter (L{svc.mount.remote.remote_calls}):
wire errno values are mapped to local ones by name, never by number.
"""

from __future__ import annotations

import errno as errno_module
from collections.abc import Mapping

from svc.wire.errno import WireErrno


class FSError(Exception):
    """
    A filesystem operation failed with C{errno} (local numbering).

    @ivar errno: the local errno value, e.g. C{errno.ENOENT}.
    @ivar message: human-readable text for logs.
    """

    def __init__(self, errno: int, message: str = "") -> None:
        super().__init__(f"{errno_module.errorcode.get(errno, str(errno))}: {message}")
        self.errno = errno
        self.message = message


class RemoteFailure(FSError):
    """
    A data-plane request failed.

    @ivar wire: the server's L{WireErrno}, or L{None} when the request never
        got an answer (connection lost, timeout: then C{errno} is EIO).
    @ivar details: the ERROR frame's machine-readable extras (maybe empty).
    @ivar unknown: the request was sent and its answer never came (the
        connection was lost, or the call timed out): it may have run.
    """

    def __init__(
        self,
        errno: int,
        message: str,
        wire: WireErrno | None = None,
        details: Mapping[str, object] | None = None,
        *,
        unknown: bool = False,
    ) -> None:
        super().__init__(errno, message)
        self.wire = wire
        self.details: Mapping[str, object] = dict(details or {})
        self.unknown = unknown


def no_answer(error: FSError | None) -> bool:
    """Whether C{error} says the data plane gave no answer (not a refusal)."""
    return isinstance(error, RemoteFailure) and error.wire is None


def local_errno(wire: WireErrno) -> int:
    """
    The local errno with the same name as C{wire}; EIO when this platform
    has no such name.
    """
    value = getattr(errno_module, wire.name, None)
    return value if isinstance(value, int) else errno_module.EIO
