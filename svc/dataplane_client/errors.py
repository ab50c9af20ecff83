"""
The errors the data-plane client reports, in one tree so callers can branch
on what they may do next: re-enroll (L{AdmissionFailed}), resend
(L{NotExecuted}), check before resending (L{OutcomeUnknown}), or handle the
server's errno (L{RemoteError}).
"""

from __future__ import annotations

from collections.abc import Mapping

from svc.wire.control import ErrorInfo, GoAway
from svc.wire.errno import WireErrno


class DataPlaneError(Exception):
    """Anything the data-plane client reports."""


class AdmissionFailed(DataPlaneError):
    """
    The connection ended (or HELLO did not come in time) before the server
    admitted us: the TLS handshake failed, or the server refused the
    certificate (expired, deny-listed, wrong tenant...). Re-enroll rather
    than retry in a loop.

    @ivar handshake_completed: whether our side finished the TLS handshake
        (in TLS 1.3 it does even when the server then refuses us).
    """

    def __init__(self, message: str, handshake_completed: bool) -> None:
        super().__init__(message)
        self.handshake_completed = handshake_completed


class VersionUnsupported(DataPlaneError):
    """The server speaks no protocol version this client speaks."""


class ProtocolViolation(DataPlaneError):
    """The server broke the wire protocol; the connection was dropped."""


class RemoteError(DataPlaneError):
    """
    The server answered the request with ERROR.

    @ivar errno: the L{WireErrno} (unknown numbers read as EIO).
    @ivar message: the server's human-readable text.
    @ivar details: the operation's machine-readable extras (maybe empty).
    """

    def __init__(self, info: ErrorInfo) -> None:
        super().__init__(f"{info.errno.name}: {info.message}")
        self.errno: WireErrno = info.errno
        self.message = info.message
        self.details: Mapping[str, object] = info.details


class NotExecuted(DataPlaneError):
    """The request was never executed; it may be sent again."""


class ConnectionGoingAway(NotExecuted):
    """
    The server sent GOAWAY before executing the request.

    @ivar reason: the GOAWAY reason (e.g. C{shutdown}, C{idle_timeout}).
    """

    def __init__(self, goaway: GoAway) -> None:
        super().__init__(f"server going away ({goaway.reason}): request not executed")
        self.reason = goaway.reason
        self.goaway = goaway


class OutcomeUnknown(DataPlaneError):
    """The request was sent but its answer never came: it may have run."""


class CallTimedOut(OutcomeUnknown):
    """
    No answer within the call's timeout.

    @ivar sent: whether the request had been sent (if not, it did not run).
    """

    def __init__(self, message: str, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent
