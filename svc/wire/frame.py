"""
Data-plane frames: the value, the fixed header and the encoder.

A frame on the wire is a 20-byte header, a msgpack payload map and an optional
raw byte segment carried beside the map so chunk bytes are never copied
through msgpack::

    offset  size  field
         0     4  magic           b"SVCW"
         4     1  version         1
         5     1  frame type      L{FrameType}
         6     1  flags           0 (none defined in version 1)
         7     1  reserved        0
         8     4  request id      unsigned, big-endian
        12     4  payload length  unsigned, big-endian, >= 1
        16     4  raw length      unsigned, big-endian

The full contract is C{docs/specifications/wire.md}.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable, Mapping

import attrs

from svc.wire.errors import CodecError
from svc.wire.payload import pack_payload

MAGIC = b"SVCW"
"""The first four bytes of every frame."""

PROTOCOL_VERSION = 1
"""The protocol version this module speaks, carried in every header."""

HEADER = struct.Struct(">4sBBBBIII")
"""Magic, version, type, flags, reserved, request id, payload length, raw length."""

HEADER_SIZE = HEADER.size

MAX_PAYLOAD_SIZE = 1024 * 1024
"""The default and largest msgpack payload a version 1 peer accepts (1 MiB)."""

MAX_RAW_SIZE = 16 * 1024 * 1024
"""The default and largest raw segment a version 1 peer accepts (16 MiB, one chunk)."""

MAX_FRAME_SIZE = HEADER_SIZE + MAX_PAYLOAD_SIZE + MAX_RAW_SIZE
"""The largest whole frame with the default limits: 17,825,812 bytes."""

MAX_REQUEST_ID = 2**32 - 1

_U32_MAX = 2**32 - 1

Buffer = bytes | bytearray | memoryview
"""What a raw segment may be: any contiguous byte buffer."""


class FrameType(enum.IntEnum):
    """
    The frame types of protocol version 1 (header byte 5).
    """

    HELLO = 1
    """Server to client, first frame, sent once on admission; request id 0."""

    REQUEST = 2
    """Client to server; a fresh non-zero request id; payload has C{op}."""

    RESPONSE = 3
    """Server to client; success answer to the request with the same id."""

    ERROR = 4
    """Server to client; failure answer: C{errno}, C{message}, C{details}."""

    PUSH = 5
    """Server to client, unsolicited; request id 0; payload has C{op}."""

    GOAWAY = 6
    """Either direction; orderly close: C{reason}, C{message}; request id 0."""


FRAMES_TO_CLIENT = frozenset(
    {FrameType.HELLO, FrameType.RESPONSE, FrameType.ERROR, FrameType.PUSH, FrameType.GOAWAY}
)
"""The frame types a client may receive; pass as the decoder's C{accept}."""

FRAMES_TO_SERVER = frozenset({FrameType.REQUEST, FrameType.GOAWAY})
"""The frame types a server may receive; pass as the decoder's C{accept}."""

_ZERO_ID_TYPES = frozenset({FrameType.HELLO, FrameType.PUSH, FrameType.GOAWAY})
_NO_RAW_TYPES = frozenset({FrameType.HELLO, FrameType.ERROR, FrameType.GOAWAY})


def check_request_id(frame_type: FrameType, request_id: int) -> None:
    """
    Check the request id rule for C{frame_type}: 0 for HELLO, PUSH and GOAWAY;
    1 .. 2**32-1 for REQUEST, RESPONSE and ERROR.

    @raise CodecError: if it is broken.
    """
    if frame_type in _ZERO_ID_TYPES:
        if request_id != 0:
            raise CodecError(f"{frame_type.name} frame with request id {request_id}, not 0")
    elif not 1 <= request_id <= MAX_REQUEST_ID:
        raise CodecError(f"{frame_type.name} frame with request id {request_id}")


def allows_raw(frame_type: FrameType) -> bool:
    """
    Whether frames of this type may carry a raw segment (REQUEST, RESPONSE and
    PUSH may; HELLO, ERROR and GOAWAY may not).
    """
    return frame_type not in _NO_RAW_TYPES


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _require_str(payload: Mapping[str, object], frame_type: FrameType, key: str) -> None:
    if not isinstance(payload.get(key), str):
        raise CodecError(f"{frame_type.name} payload needs a string {key!r}")


def _optional_str(payload: Mapping[str, object], frame_type: FrameType, key: str) -> None:
    if key in payload and not isinstance(payload[key], str):
        raise CodecError(f"{frame_type.name} payload {key!r} is not a string")


def _require_int(
    payload: Mapping[str, object], frame_type: FrameType, key: str, low: int, high: int
) -> None:
    value = payload.get(key)
    if not _is_int(value) or not low <= value <= high:  # type: ignore[operator]
        raise CodecError(f"{frame_type.name} payload needs an integer {key!r} in {low}..{high}")


def _check_op(payload: Mapping[str, object], frame_type: FrameType) -> None:
    op = payload.get("op")
    if not isinstance(op, str) or not op:
        raise CodecError(f"{frame_type.name} payload needs a non-empty string 'op'")


def _check_error(payload: Mapping[str, object], frame_type: FrameType) -> None:
    _require_int(payload, frame_type, "errno", 1, 2**31 - 1)
    _require_str(payload, frame_type, "message")
    if "details" in payload and not isinstance(payload["details"], dict):
        raise CodecError("ERROR payload 'details' is not a map")


def _check_hello(payload: Mapping[str, object], frame_type: FrameType) -> None:
    versions = payload.get("versions")
    if (
        not isinstance(versions, list | tuple)
        or not versions
        or not all(_is_int(v) and 1 <= v <= 255 for v in versions)
    ):
        raise CodecError("HELLO payload needs 'versions', a non-empty list of 1..255")
    _require_int(payload, frame_type, "max_payload", 1, _U32_MAX)
    _require_int(payload, frame_type, "max_raw", 0, _U32_MAX)
    _require_int(payload, frame_type, "max_in_flight", 1, _U32_MAX)
    _optional_str(payload, frame_type, "server")


def _check_goaway(payload: Mapping[str, object], frame_type: FrameType) -> None:
    _require_str(payload, frame_type, "reason")
    _optional_str(payload, frame_type, "message")


def _check_nothing(payload: Mapping[str, object], frame_type: FrameType) -> None:
    pass


_PAYLOAD_CHECKS = {
    FrameType.HELLO: _check_hello,
    FrameType.REQUEST: _check_op,
    FrameType.RESPONSE: _check_nothing,
    FrameType.ERROR: _check_error,
    FrameType.PUSH: _check_op,
    FrameType.GOAWAY: _check_goaway,
}


def _raw_buffer(raw: Buffer) -> Buffer:
    if isinstance(raw, memoryview) and (raw.format != "B" or raw.ndim != 1):
        if not raw.c_contiguous:
            raise CodecError("raw segment is not a contiguous buffer")
        return raw.cast("B")
    return raw


def raw_bytes(raw: Buffer) -> bytes:
    """
    A raw segment as C{bytes} of its own, to keep. A view that spans a whole
    C{bytes} object (what the decoder gives for a frame received in pieces,
    which is every large one) is unwrapped, not copied; anything else is
    copied, since it may share memory with more than the segment.
    """
    if isinstance(raw, bytes):
        return raw
    if isinstance(raw, memoryview):
        owner = raw.obj
        if type(owner) is bytes and raw.nbytes == len(owner) and raw.c_contiguous:
            return owner
    return bytes(raw)


def _raw_repr(raw: Buffer) -> str:
    return f"<{len(raw)} bytes>"


@attrs.frozen(eq=True)
class Frame:
    """
    One data-plane frame.

    Built either by local code (then encoded with L{encode_frame}) or by the
    decoder. Construction checks every rule that does not need the msgpack
    encoding (type, request id, raw allowed, top-level payload keys, the
    payload keys HELLO, REQUEST, ERROR, PUSH and GOAWAY require) and raises
    L{CodecError} if one is broken. Deeper payload rules (key types at every
    depth, nesting, value types) are checked when encoding and decoding.

    @ivar type: the frame type.
    @ivar request_id: the request id (0 for HELLO, PUSH, GOAWAY).
    @ivar payload: the msgpack payload map. Do not mutate it.
    @ivar raw: the raw segment (empty when absent). Decoded frames hold a
        read-only C{memoryview} that may share memory with the received
        data: take C{bytes(frame.raw)} to keep a small one for long.
    @ivar release_raw: set by a decoder that lent C{raw} from a
        L{svc.buffer_pool.BufferPool}: call it once the raw segment is no
        longer needed, so the buffer can be lent again (C{raw} then refuses
        use; other views of it stay valid and keep the buffer out of the
        pool). Not part of equality; never encoded.
    """

    type: FrameType
    request_id: int
    payload: Mapping[str, object] = attrs.field(factory=dict)
    raw: Buffer = attrs.field(default=b"", converter=_raw_buffer, repr=_raw_repr)
    release_raw: Callable[[], None] | None = attrs.field(
        default=None, eq=False, repr=False, kw_only=True
    )

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.type, FrameType):
            raise CodecError(f"frame type {self.type!r} is not a FrameType")
        if not _is_int(self.request_id):
            raise CodecError("request id is not an integer")
        check_request_id(self.type, self.request_id)
        if not isinstance(self.raw, bytes | bytearray | memoryview):
            raise CodecError(f"raw segment of type {type(self.raw).__name__}")
        if len(self.raw) > _U32_MAX:
            raise CodecError("raw segment longer than 2**32-1 bytes")
        if self.raw and not allows_raw(self.type):
            raise CodecError(f"{self.type.name} frame with a raw segment")
        if not isinstance(self.payload, Mapping):
            raise CodecError(f"payload of type {type(self.payload).__name__}, not a map")
        for key in self.payload:
            if not isinstance(key, str):
                raise CodecError(f"payload key of type {type(key).__name__}, not str")
        _PAYLOAD_CHECKS[self.type](self.payload, self.type)


@attrs.frozen(eq=True)
class PackedFrame:
    """
    A received frame whose payload is left undecoded: what a server's
    decoder gives for REQUEST and GOAWAY frames, so that a payload is
    decoded within the limits of its operation (L{svc.wire.contract}) rather
    than the frame's. The header rules are checked as for any frame.

    @ivar payload: the msgpack payload, undecoded.
    @ivar raw: the raw segment, as L{Frame.raw}.
    @ivar release_raw: as L{Frame.release_raw}.
    """

    type: FrameType
    request_id: int
    payload: bytes
    raw: Buffer = attrs.field(default=b"", converter=_raw_buffer, repr=_raw_repr)
    release_raw: Callable[[], None] | None = attrs.field(
        default=None, eq=False, repr=False, kw_only=True
    )


def encode_frame(
    frame: Frame, *, max_payload: int = MAX_PAYLOAD_SIZE, max_raw: int = MAX_RAW_SIZE
) -> list[Buffer]:
    """
    Encode a frame as buffers for C{transport.writeSequence}: the header and
    msgpack payload in one C{bytes}, then the raw segment itself (never
    copied), if there is one.

    @param max_payload: the peer's payload limit (from its HELLO, or
        L{MAX_PAYLOAD_SIZE}).
    @param max_raw: the peer's raw limit (from its HELLO, or L{MAX_RAW_SIZE}).
    @raise CodecError: if the payload does not fit the msgpack profile or a
        part is over its limit; nothing should be sent then.
    """
    packed = pack_payload(frame.payload)
    if len(packed) > max_payload:
        raise CodecError(f"payload of {len(packed)} bytes is over the limit of {max_payload}")
    raw_length = len(frame.raw)
    if raw_length > max_raw:
        raise CodecError(f"raw segment of {raw_length} bytes is over the limit of {max_raw}")
    header = HEADER.pack(
        MAGIC, PROTOCOL_VERSION, frame.type, 0, 0, frame.request_id, len(packed), raw_length
    )
    if raw_length:
        return [header + packed, frame.raw]
    return [header + packed]


@attrs.frozen
class FrameHeader:
    """
    A parsed and checked frame header (see L{read_header}).
    """

    type: FrameType
    request_id: int
    payload_length: int
    raw_length: int


def read_header(data: Buffer) -> FrameHeader:
    """
    Parse exactly L{HEADER_SIZE} bytes as a version 1 frame header and check
    everything the header alone decides: magic, version, known type, flags
    and reserved byte zero, the request id rule, a payload of at least one
    byte, no raw segment where the type allows none. Size limits are the
    decoder's to apply.

    @raise CodecError: if any check fails.
    """
    if len(data) != HEADER_SIZE:
        raise CodecError(f"header of {len(data)} bytes, not {HEADER_SIZE}")
    magic, version, type_byte, flags, reserved, request_id, payload_length, raw_length = (
        HEADER.unpack(data)
    )
    if magic != MAGIC:
        raise CodecError(f"bad magic {bytes(magic)!r}")
    if version != PROTOCOL_VERSION:
        raise CodecError(f"unsupported protocol version {version}")
    try:
        frame_type = FrameType(type_byte)
    except ValueError:
        raise CodecError(f"unknown frame type {type_byte}") from None
    if flags != 0:
        raise CodecError(f"flags 0x{flags:02x} set; none are defined")
    if reserved != 0:
        raise CodecError(f"reserved byte is 0x{reserved:02x}, not 0")
    check_request_id(frame_type, request_id)
    if payload_length == 0:
        raise CodecError("empty payload; a frame carries at least an empty map")
    if raw_length and not allows_raw(frame_type):
        raise CodecError(f"{frame_type.name} frame with a raw segment")
    return FrameHeader(frame_type, request_id, payload_length, raw_length)
