"""
Requests and answers as both sides handle them, from the declarations of
L{svc.wire.commands}: a server finds a request's operation, decodes its map
within the operation's limits into the declared message, and encodes the
answer; a client encodes requests (C{op} first) and decodes answers and
pushes.

Bounded decoding (``docs/specifications/wire.md`` section 3.1): a server
receives REQUEST payloads undecoded (L{svc.wire.decoder.FrameDecoder} with
C{packed}). L{peek_op} reads the C{op} first: when it is the map's first key
(as every svc client sends it) from the first bytes alone, otherwise by
skipping the other values without building them (C speed, no allocation).
L{decode_request} then refuses a payload over the operation's size limit
without reading it, and decodes the rest with msgpack's own limits set to
the operation's widest array, largest map and longest string, counting
containers as they are built and stopping at the operation's limit, so a
hostile map costs at most what a legitimate one of that operation could.
A refusal of the payload's shape is L{RequestRefused} (C{EPROTO}); a map
that fits but whose fields do not is L{svc.wire.schema.FieldRefused}. Pure.
"""

from __future__ import annotations

import gc
from collections.abc import Mapping
from typing import Any, NoReturn, TypeVar

import attrs
import msgpack

from svc.wire.answers import MissingDetails
from svc.wire.commands import COMMANDS, PUSHES, Command, command_named
from svc.wire.errno import WireErrno
from svc.wire.kinds import FieldRefused
from svc.wire.ops import Op
from svc.wire.schema import decode_message, encode_message

T = TypeVar("T")

QUIET_COLLECTOR_FROM = 64 * 1024
"""Payloads of at least this many bytes are decoded with the cyclic collector paused."""

MAX_OP_SCAN_KEYS = 64
"""The most keys scanned for C{op} when it is not the first key."""

_STR_HEADERS = frozenset(range(0xA0, 0xC0)) | {0xD9, 0xDA, 0xDB}


class RequestRefused(Exception):
    """
    A REQUEST payload refused before (or instead of) being decoded: not a
    map, no C{op}, or larger, wider or deeper than its operation allows.
    Answered C{EPROTO}; not audited (there is no request to name), counted
    and logged at a bounded rate by the server.

    @ivar op: the operation, when it was found.
    @ivar reason: a short machine-readable cause (a metric label).
    """

    errno = WireErrno.EPROTO

    def __init__(self, reason: str, message: str, op: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.op = op
        self.details: Mapping[str, object] = {}


def _str_at(data: bytes, at: int) -> tuple[str, int] | None:
    """The msgpack str at C{at} and the offset after it, if one is there (fixstr or str8)."""
    if at >= len(data):
        return None
    first = data[at]
    if 0xA0 <= first <= 0xBF:
        start, length = at + 1, first & 0x1F
    elif first == 0xD9 and at + 1 < len(data):
        start, length = at + 2, data[at + 1]
    else:
        return None
    end = start + length
    if end > len(data):
        return None
    try:
        return data[start:end].decode("utf-8"), end
    except UnicodeDecodeError:
        return None


def _map_start(data: bytes) -> int | None:
    """Where the first key of the map C{data} holds starts (None: not a non-empty map)."""
    if not data:
        return None
    first = data[0]
    if 0x81 <= first <= 0x8F:
        return 1
    if first == 0xDE and len(data) >= 3 and (data[1] or data[2]):
        return 3
    if first == 0xDF and len(data) >= 5 and any(data[1:5]):
        return 5
    return None


def peek_op(packed: bytes) -> str:
    """
    The C{op} of a REQUEST payload, without decoding the rest.

    @raise RequestRefused: not a map, or no string C{op} among its first
        L{MAX_OP_SCAN_KEYS} keys.
    """
    start = _map_start(packed)
    if start is None:
        raise RequestRefused("not_a_map", "the payload is not a non-empty map")
    key = _str_at(packed, start)
    if key is not None and key[0] == "op":
        value = _str_at(packed, key[1])
        if value is not None:
            return value[0]
    return _scan_op(packed)


def _scan_op(packed: bytes) -> str:
    unpacker = msgpack.Unpacker(
        raw=False, max_buffer_size=max(len(packed), 1), strict_map_key=False, max_ext_len=0
    )
    unpacker.feed(packed)
    try:
        count = unpacker.read_map_header()
        for _ in range(min(count, MAX_OP_SCAN_KEYS)):
            at = unpacker.tell()
            if at >= len(packed) or packed[at] not in _STR_HEADERS:
                break
            key = unpacker.unpack()
            if key == "op":
                at = unpacker.tell()
                if at < len(packed) and packed[at] in _STR_HEADERS:
                    value = unpacker.unpack()
                    if isinstance(value, str):
                        return value
                break
            unpacker.skip()
    except Exception:
        raise RequestRefused("not_a_map", "the payload is not a valid map") from None
    raise RequestRefused("no_op", "the payload has no string 'op' among its first keys")


class _Over(Exception):
    pass


def _refuse_ext(code: int, data: bytes) -> NoReturn:
    raise ValueError(f"extension type {code} refused")


def unpack_bounded(
    packed: bytes,
    *,
    containers: int,
    width: int,
    keys: int,
    string: int,
    depth: int,
    op: str | None = None,
    declared: frozenset[str] | None = None,
) -> dict[str, object]:
    """
    Decode a payload map within limits: arrays of at most C{width} items,
    maps of at most C{keys}, strings of at most C{string} bytes, no binary
    or extension values, at most C{containers} arrays and maps in all
    (counted as they are built: decoding stops at the first one over) and
    C{depth} levels (when C{declared} names the top-level keys a message
    declares, only the other keys' values are walked for depth: the declared
    ones are their kinds' to check); every map key a string, none twice.

    @raise RequestRefused: for anything else.
    """
    built = 0

    def pairs(items: list[tuple[object, object]]) -> dict[object, object]:
        nonlocal built
        built += 1
        if built > containers:
            raise _Over("containers")
        result = dict(items)
        if len(result) != len(items):
            raise ValueError("duplicate map key")
        for name in result:
            if type(name) is not str:
                raise ValueError("a map key is not a string")
        return result

    def array(items: list[object]) -> list[object]:
        nonlocal built
        built += 1
        if built > containers:
            raise _Over("containers")
        return items

    try:
        value = msgpack.unpackb(
            packed,
            raw=False,
            use_list=True,
            strict_map_key=True,
            unicode_errors="strict",
            object_pairs_hook=pairs,
            list_hook=array,
            ext_hook=_refuse_ext,
            max_str_len=string,
            max_bin_len=0,
            max_array_len=width,
            max_map_len=keys,
            max_ext_len=0,
        )
    except _Over:
        raise RequestRefused(
            "too_many_containers", f"more than {containers} arrays and maps", op
        ) from None
    except Exception as e:
        # msgpack raises ValueError for a length over a limit, ExtraData,
        # FormatError, StackError and others: all are a refused payload.
        raise RequestRefused("malformed", f"payload refused: {type(e).__name__}: {e}", op) from None
    if not isinstance(value, dict):
        raise RequestRefused("not_a_map", "the payload is not a map", op)
    if declared is None:
        _check_depth(value, depth, op)
    else:
        # Declared fields are checked by their kinds, which refuse anything
        # nested deeper than declared at the first such value; only the
        # values of unknown keys need walking (16 of them at most).
        for name, item in value.items():
            if name not in declared and isinstance(item, dict | list):
                _check_depth({name: item}, depth, op)
    return value


def _check_depth(value: dict[str, object], depth: int, op: str | None) -> None:
    level: list[dict[str, object] | list[object]] = [value]
    for _ in range(depth):
        following: list[dict[str, object] | list[object]] = []
        for node in level:
            children = node.values() if isinstance(node, dict) else node
            following.extend(child for child in children if isinstance(child, dict | list))
        if not following:
            return
        level = following
    raise RequestRefused("too_deep", f"nested deeper than {depth} levels", op)


def decode_request(command: Command, packed: bytes) -> tuple[object, Mapping[str, object]]:
    """
    The request message of C{command} in C{packed}, with the decoded map
    (for an audit line naming its path, if its fields are then refused).

    @raise RequestRefused: the payload does not fit the operation's limits.
    @raise FieldRefused: its map does not fit the operation's message; the
        map is C{error.payload}.
    """
    limits = command.limits
    op = str(command.op)
    if len(packed) > limits.payload:
        raise RequestRefused(
            "too_large", f"payload of {len(packed)} bytes is over {limits.payload} for {op}", op
        )
    if len(packed) < QUIET_COLLECTOR_FROM or not gc.isenabled():
        return _decode_request(command, packed)
    # A large map is tens of thousands of small containers, all alive until
    # decoding ends and dead soon after: with the cyclic collector running,
    # they would be promoted to its oldest generation and make it scan the
    # whole heap every few such requests (tens of milliseconds of a reactor
    # turn each). They form no cycles; their memory is returned by reference
    # counting, so the collector waits until decoding is over.
    gc.disable()
    try:
        return _decode_request(command, packed)
    finally:
        gc.enable()


def _decode_request(command: Command, packed: bytes) -> tuple[object, Mapping[str, object]]:
    limits = command.limits
    op = str(command.op)
    payload = unpack_bounded(
        packed,
        containers=limits.containers,
        width=limits.width,
        keys=limits.keys,
        string=limits.string,
        depth=limits.depth,
        op=op,
        declared=limits.declared,
    )
    try:
        return decode_message(command.request, payload), payload
    except FieldRefused as error:
        error.payload = payload
        raise


@attrs.frozen
class DecodedRequest:
    """
    A request's map decoded for its command: the C{request} message, or the
    refusal of its fields (C{refused}); C{payload} is the map itself and
    C{size} the packed map's length in bytes.
    """

    request: object | None
    refused: FieldRefused | None
    payload: Mapping[str, object]
    size: int


def decode(command: Command, packed: bytes) -> DecodedRequest:
    """
    C{packed} decoded for C{command}: a refusal of its fields is part of the
    result (the handler audits it); a refusal of its shape is raised.

    @raise RequestRefused: the payload does not fit the operation's limits.
    """
    try:
        request, payload = decode_request(command, packed)
    except FieldRefused as error:
        return DecodedRequest(None, error, error.payload or {}, len(packed))
    return DecodedRequest(request, None, payload, len(packed))


def find_command(packed: bytes, commands: Mapping[str, Command] | None = None) -> Command:
    """
    The command a REQUEST payload names, among C{commands} (default: every
    request operation of the protocol).

    @raise RequestRefused: no C{op} can be found (L{peek_op}).
    @raise KeyError: the C{op} is not a request operation (answer C{ENOSYS}).
    """
    op = peek_op(packed)
    found = command_named(op) if commands is None else commands.get(op)
    if found is None:
        raise KeyError(op)
    return found


def request_map(request: object, op: Op) -> dict[str, object]:
    """The map of a request: C{op} first, then the message's keys."""
    return encode_message(request, {"op": op.value})


def answer_map(answer: object) -> dict[str, object]:
    """The map of an answer or push message."""
    return encode_message(answer)


def decode_answer(command: Command, payload: Mapping[str, object]) -> Any:
    """
    The answer message of C{command} in a RESPONSE map.

    @raise FieldRefused: the map does not fit.
    """
    return decode_message(command.reply, payload)


def decode_push(op: Op, payload: Mapping[str, object]) -> Any:
    """
    The message of push C{op}.

    @raise FieldRefused: the map does not fit.
    """
    return decode_message(PUSHES[op].message, payload)


def missing_hashes(details: Mapping[str, object]) -> tuple[str, ...]:
    """The C{missing} hashes of an error's details (none when it does not fit)."""
    try:
        return decode_message(MissingDetails, details).missing
    except FieldRefused:
        return ()


__all__ = [
    "COMMANDS",
    "DecodedRequest",
    "RequestRefused",
    "answer_map",
    "decode",
    "decode_answer",
    "decode_push",
    "decode_request",
    "find_command",
    "missing_hashes",
    "peek_op",
    "request_map",
    "unpack_bounded",
]
