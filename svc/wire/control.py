"""
Typed views of the frames the protocol itself defines: ERROR, HELLO, GOAWAY.

Each has a constructor returning a L{Frame} and a reader taking a decoded
L{Frame} (whose payload keys L{Frame} has already checked) back to a value.
Readers ignore keys they do not know, as the protocol requires.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import cast

import attrs

from svc.wire.errno import WireErrno, from_wire
from svc.wire.errors import CodecError
from svc.wire.frame import (
    MAX_PAYLOAD_SIZE,
    MAX_RAW_SIZE,
    PROTOCOL_VERSION,
    Frame,
    FrameType,
)

DEFAULT_MAX_IN_FLIGHT = 32
"""
The C{max_in_flight} a server advertises unless configured otherwise. With
16 MiB raw segments, 32 requests in flight can hold about 512 MiB per
connection at the server.
"""


def _expect(frame: Frame, frame_type: FrameType) -> None:
    if frame.type is not frame_type:
        raise CodecError(f"expected a {frame_type.name} frame, got {frame.type.name}")


@attrs.frozen
class ErrorInfo:
    """
    The content of an ERROR frame.

    @ivar errno: the error number; a number this side does not know reads as
        L{WireErrno.EIO}.
    @ivar message: human-readable text (no secrets, no tracebacks).
    @ivar details: extra machine-readable fields (empty when absent), e.g.
        the hashes of missing chunks or the current version after a lost
        compare-and-swap; the operation's schema names them.
    """

    errno: WireErrno
    message: str
    details: Mapping[str, object] = attrs.field(factory=dict)


def error_frame(
    request_id: int,
    errno: WireErrno,
    message: str,
    details: Mapping[str, object] | None = None,
) -> Frame:
    """
    An ERROR frame answering request C{request_id}.

    @raise CodecError: if C{errno} is not a L{WireErrno} or another field is
        invalid.
    """
    if not isinstance(errno, WireErrno):
        raise CodecError(f"errno {errno!r} is not a WireErrno")
    payload: dict[str, object] = {"errno": int(errno), "message": message}
    if details:
        payload["details"] = dict(details)
    return Frame(FrameType.ERROR, request_id, payload)


def read_error(frame: Frame) -> ErrorInfo:
    """
    The content of an ERROR frame; unknown errno numbers become EIO.

    @raise CodecError: if C{frame} is not an ERROR frame.
    """
    _expect(frame, FrameType.ERROR)
    payload = frame.payload
    details = cast(Mapping[str, object], payload.get("details", {}))
    return ErrorInfo(from_wire(cast(int, payload["errno"])), cast(str, payload["message"]), details)


@attrs.frozen
class Hello:
    """
    The server's admission frame: what it speaks and what it accepts.

    @ivar versions: the protocol versions the server speaks, ascending.
    @ivar max_payload: the largest msgpack payload the server accepts.
    @ivar max_raw: the largest raw segment the server accepts.
    @ivar max_in_flight: how many requests a client may have unanswered.
    @ivar server: software name and version, informational only.
    """

    versions: tuple[int, ...] = (PROTOCOL_VERSION,)
    max_payload: int = MAX_PAYLOAD_SIZE
    max_raw: int = MAX_RAW_SIZE
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    server: str = ""

    def common_version(self, supported: tuple[int, ...] = (PROTOCOL_VERSION,)) -> int | None:
        """
        The highest version both sides speak, or C{None}: then the client
        sends GOAWAY C{version_unsupported} and closes.
        """
        common = set(self.versions) & set(supported)
        return max(common) if common else None


def hello_frame(hello: Hello) -> Frame:
    """
    The HELLO frame announcing C{hello}.

    @raise CodecError: if a field is out of range.
    """
    payload: dict[str, object] = {
        "versions": list(hello.versions),
        "max_payload": hello.max_payload,
        "max_raw": hello.max_raw,
        "max_in_flight": hello.max_in_flight,
    }
    if hello.server:
        payload["server"] = hello.server
    return Frame(FrameType.HELLO, 0, payload)


def read_hello(frame: Frame) -> Hello:
    """
    The content of a HELLO frame.

    @raise CodecError: if C{frame} is not a HELLO frame.
    """
    _expect(frame, FrameType.HELLO)
    payload = frame.payload
    return Hello(
        versions=tuple(sorted(cast(list[int], payload["versions"]))),
        max_payload=cast(int, payload["max_payload"]),
        max_raw=cast(int, payload["max_raw"]),
        max_in_flight=cast(int, payload["max_in_flight"]),
        server=cast(str, payload.get("server", "")),
    )


class GoAwayReason(enum.StrEnum):
    """
    The GOAWAY reasons version 1 defines. Receivers treat any other string
    like L{SHUTDOWN}.
    """

    SHUTDOWN = "shutdown"
    """The sender is going away (restart, maintenance, client unmount)."""

    IDLE_TIMEOUT = "idle_timeout"
    """The connection carried nothing for too long."""

    PROTOCOL_ERROR = "protocol_error"
    """The sender received a frame that broke the protocol."""

    VERSION_UNSUPPORTED = "version_unsupported"
    """The client speaks none of the versions the server's HELLO lists."""

    CREDENTIALS_EXPIRED = "credentials_expired"
    """The client's certificate expired or was deny-listed during the session."""


@attrs.frozen
class GoAway:
    """
    The content of a GOAWAY frame.

    @ivar reason: machine-readable, one of L{GoAwayReason} or a newer value.
    @ivar message: human-readable detail, possibly empty.
    """

    reason: str
    message: str = ""


def goaway_frame(goaway: GoAway) -> Frame:
    """
    The GOAWAY frame announcing C{goaway}.

    @raise CodecError: if a field is not a string.
    """
    reason = goaway.reason
    payload: dict[str, object] = {"reason": str(reason) if isinstance(reason, str) else reason}
    if goaway.message:
        payload["message"] = goaway.message
    return Frame(FrameType.GOAWAY, 0, payload)


def read_goaway(frame: Frame) -> GoAway:
    """
    The content of a GOAWAY frame.

    @raise CodecError: if C{frame} is not a GOAWAY frame.
    """
    _expect(frame, FrameType.GOAWAY)
    return GoAway(cast(str, frame.payload["reason"]), cast(str, frame.payload.get("message", "")))
