"""
The msgpack profile of frame payloads.

A payload is one msgpack map with string keys. Values are nil, booleans,
integers (-2**63 .. 2**64-1), floats, UTF-8 strings, binary strings, arrays
and maps whose keys are strings, nested at most L{MAX_NESTING} containers deep.
Extension types, duplicate keys and trailing bytes are refused. See
C{docs/specifications/wire.md}, "Payload encoding".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NoReturn

import msgpack

from svc.wire.errors import CodecError

MAX_NESTING = 32
"""
The deepest nesting of containers a payload may have; the top-level map is at
depth 1, a list directly inside it at depth 2.
"""

_SCALARS = (type(None), bool, int, float, str, bytes)
_EXACT_SCALARS = frozenset(_SCALARS)
_CONTAINERS = (dict, list, tuple)


def check_payload_tree(payload: Mapping[str, object]) -> None:
    """
    Check that C{payload} and everything inside it fits the profile: every map
    key at every depth is a string, containers nest at most L{MAX_NESTING}
    deep, and every value has a type msgpack encodes as the profile allows.

    Iterative, so a hostile nesting cannot exhaust the Python stack.

    @raise CodecError: if it does not fit.
    """
    stack: list[tuple[object, int]] = [(payload, 1)]
    pop = stack.pop
    push = stack.append
    while stack:
        node, depth = pop()
        if depth > MAX_NESTING:
            raise CodecError(f"payload nested deeper than {MAX_NESTING} containers")
        if isinstance(node, dict):
            for key in node:
                if type(key) is not str and not isinstance(key, str):
                    raise CodecError(f"map key of type {type(key).__name__}, not str")
            values: Iterable[object] = node.values()
        elif isinstance(node, list | tuple):
            values = node
        else:
            raise CodecError(f"payload of type {type(node).__name__}, not a map")
        for value in values:
            # Exact-type set lookup first: the common case, and cheap.
            if type(value) in _EXACT_SCALARS:
                continue
            if isinstance(value, _CONTAINERS):
                if isinstance(value, msgpack.ExtType):  # a tuple msgpack packs as ext
                    raise CodecError("extension type in payload")
                push((value, depth + 1))
            elif not isinstance(value, _SCALARS):
                raise CodecError(f"value of type {type(value).__name__} in payload")


def pack_payload(payload: Mapping[str, object]) -> bytes:
    """
    Encode a payload map to msgpack (strings as C{str}, bytes as C{bin}).

    @raise CodecError: if the payload does not fit the profile (a non-string
        key, an unsupported type, an integer out of range, a string that is
        not encodable as UTF-8, nesting too deep).
    """
    if not isinstance(payload, dict):
        payload = dict(payload)
    check_payload_tree(payload)
    try:
        packed: bytes = msgpack.packb(payload, use_bin_type=True, datetime=False)
    except (ValueError, TypeError, OverflowError) as e:
        raise CodecError(f"payload not encodable: {type(e).__name__}: {e}") from None
    return packed


def _refuse_ext(code: int, data: bytes) -> NoReturn:
    raise ValueError(f"extension type {code} refused")


def _map_without_duplicates(pairs: list[tuple[object, object]]) -> dict[object, object]:
    result = dict(pairs)
    if len(result) != len(pairs):
        raise ValueError("duplicate map key")
    return result


def unpack_payload(data: bytes | memoryview) -> dict[str, object]:
    """
    Decode a whole msgpack payload, which must be exactly one map fitting the
    profile with nothing after it.

    @raise CodecError: for anything else; no other exception escapes.
    """
    size = len(data)
    try:
        value = msgpack.unpackb(
            data,
            raw=False,
            use_list=True,
            strict_map_key=True,
            unicode_errors="strict",
            object_pairs_hook=_map_without_duplicates,
            ext_hook=_refuse_ext,
            max_str_len=size,
            max_bin_len=size,
            max_array_len=size,
            max_map_len=size,
            max_ext_len=0,
        )
    except Exception as e:
        # msgpack documents ExtraData, ValueError, FormatError and StackError
        # and warns that "other exceptions can be raised during unpacking"
        # (UnicodeDecodeError, TypeError, OverflowError...): all are bad input.
        raise CodecError(f"payload not valid msgpack: {type(e).__name__}: {e}") from None
    if not isinstance(value, dict):
        raise CodecError(f"payload is a {type(value).__name__}, not a map")
    check_payload_tree(value)
    return value
