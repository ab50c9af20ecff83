"""
Readers for the fields of a request payload map, shared by the operation
schemas of L{svc.dataplane.ops}: each reads one key, checks its type
(L{SchemaMismatch}, EPROTO) and range (L{BadValue}, EINVAL). An optional key
whose value is nil counts as absent; booleans are never integers.
"""

from __future__ import annotations

from collections.abc import Mapping

from svc.dataplane.errors import BadValue, SchemaMismatch

MAX_SESSION_ID_LENGTH = 256
"""Longest C{session_id} string accepted (a real one is 70 characters)."""

U32 = 2**32 - 1
"""Largest uid, gid."""
I64 = 2**63 - 1
"""Largest signed 64-bit value (versions, sizes, times)."""
MODE_BITS = 0o7777
"""Largest mode (permission bits only)."""
HEX_DIGITS = frozenset("0123456789abcdef")

MISSING = object()
"""What L{get_value} returns for an absent (or nil) key."""


def get_value(payload: Mapping[str, object], key: str, required: bool) -> object:
    """The value of C{key}, L{MISSING} when absent or nil; EPROTO if required."""
    value = payload.get(key)
    if value is None:
        if required:
            raise SchemaMismatch(f"missing required key {key!r}")
        return MISSING
    return value


def type_error(key: str, wanted: str, value: object) -> SchemaMismatch:
    """The EPROTO failure for C{key} holding a value of the wrong type."""
    return SchemaMismatch(f"{key!r} must be {wanted}, not {type_name(value)}")


def type_name(value: object) -> str:
    """The msgpack-ish name of a value's type, for messages."""
    names = {bool: "boolean", int: "integer", float: "float", str: "string", bytes: "binary"}
    names |= {list: "array", dict: "map"}
    return names.get(type(value), type(value).__name__)


def require_str(payload: Mapping[str, object], key: str) -> str:
    """A required string."""
    value = get_value(payload, key, True)
    if not isinstance(value, str):
        raise type_error(key, "a string", value)
    return value


def optional_str(payload: Mapping[str, object], key: str, max_length: int) -> str | None:
    """An optional string of at most C{max_length} characters."""
    value = get_value(payload, key, False)
    if value is MISSING:
        return None
    if not isinstance(value, str):
        raise type_error(key, "a string", value)
    if len(value) > max_length:
        raise BadValue(f"{key!r} longer than {max_length} characters")
    return value


def require_int(payload: Mapping[str, object], key: str, low: int, high: int) -> int:
    """A required integer in C{[low, high]}."""
    value = get_value(payload, key, True)
    return check_int(key, value, low, high)


def optional_int(
    payload: Mapping[str, object], key: str, low: int, high: int, default: int | None = None
) -> int | None:
    """An optional integer in C{[low, high]}, else C{default}."""
    value = get_value(payload, key, False)
    if value is MISSING:
        return default
    return check_int(key, value, low, high)


def check_int(key: str, value: object, low: int, high: int) -> int:
    """C{value} if it is an integer (not a boolean) in C{[low, high]}."""
    if type(value) is not int:
        raise type_error(key, "an integer", value)
    if not low <= value <= high:
        raise BadValue(f"{key!r} must be between {low} and {high}")
    return value


def optional_bool(payload: Mapping[str, object], key: str, default: bool) -> bool:
    """An optional boolean, else C{default}."""
    value = get_value(payload, key, False)
    if value is MISSING:
        return default
    if not isinstance(value, bool):
        raise type_error(key, "a boolean", value)
    return value


def require_list(payload: Mapping[str, object], key: str, max_items: int) -> list[object]:
    """A required array of at most C{max_items} items."""
    value = get_value(payload, key, True)
    if not isinstance(value, list | tuple):
        raise type_error(key, "an array", value)
    if len(value) > max_items:
        raise SchemaMismatch(f"{key!r} holds more than {max_items} items")
    return list(value)


def optional_list(payload: Mapping[str, object], key: str, max_items: int) -> list[object]:
    """An optional array of at most C{max_items} items (empty when absent)."""
    if get_value(payload, key, False) is MISSING:
        return []
    return require_list(payload, key, max_items)


def chunk_hash_value(key: str, value: object) -> str:
    """C{value} if it is a chunk hash: 64 lowercase hex digits."""
    if not isinstance(value, str):
        raise type_error(key, "a string", value)
    if len(value) != 64 or not HEX_DIGITS.issuperset(value):
        raise BadValue(f"{key!r} must be 64 lowercase hex digits")
    return value


def session_value(payload: Mapping[str, object]) -> str | None:
    """The optional C{session_id} string."""
    return optional_str(payload, "session_id", MAX_SESSION_ID_LENGTH)


def mode_value(payload: Mapping[str, object], required: bool = True) -> int | None:
    """The C{mode} permission bits (0 to 0o7777), required or optional."""
    if required:
        return require_int(payload, "mode", 0, MODE_BITS)
    return optional_int(payload, "mode", 0, MODE_BITS)


def owner_values(payload: Mapping[str, object]) -> tuple[int, int]:
    """The optional C{uid} and C{gid} (0 to 2**32-1, default 0)."""
    uid = optional_int(payload, "uid", 0, U32, 0)
    gid = optional_int(payload, "gid", 0, U32, 0)
    assert uid is not None and gid is not None
    return uid, gid
