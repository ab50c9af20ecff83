"""
The kinds of value a wire message's field may hold (L{svc.wire.schema}
declares the messages): how each is checked when received, encoded when
sent, and what it can cost on the wire at most (L{Bound}). A value that
does not fit is L{FieldRefused}, C{EPROTO} for its shape and C{EINVAL} for
its range or set (a kind may name its own errno for a string too long).
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import partial
from typing import Any, NamedTuple, Protocol

import attrs

from svc.wire.errno import WireErrno

I64 = 2**63 - 1
"""Largest signed 64-bit value (versions, sizes, times)."""
U32 = 2**32 - 1
"""Largest unsigned 32-bit value (uid, gid)."""
U64 = 2**64 - 1
"""Largest msgpack unsigned integer."""

_HEX_DIGITS = frozenset("0123456789abcdef")
_INT_BYTES = 9
HEADER_BYTES = 5
"""The most a msgpack container or string header takes."""


class FieldRefused(Exception):
    """
    A payload map that does not fit its message: C{errno} is C{EPROTO}
    (shape: missing key, wrong type, array too long) or C{EINVAL} (a value
    out of its range or set), or the errno a kind declares for a string too
    long (C{ENAMETOOLONG} for paths). Carries C{errno}, C{message} and
    C{details} as every refusal sent in an ERROR frame does.
    """

    def __init__(self, errno: WireErrno, message: str) -> None:
        super().__init__(message)
        self.errno = errno
        self.message = message
        self.details: Mapping[str, object] = {}
        self.payload: Mapping[str, object] | None = None
        """The map refused, when the refusal is of a whole request's fields."""


def _type_name(value: object) -> str:
    names = {bool: "boolean", int: "integer", float: "float", str: "string", bytes: "binary"}
    names |= {list: "array", tuple: "array", dict: "map", type(None): "nil"}
    return names.get(type(value), type(value).__name__)


def shape_error(key: str, wanted: str, value: object) -> FieldRefused:
    """The C{EPROTO} refusal of C{key} holding a value of the wrong type."""
    return FieldRefused(WireErrno.EPROTO, f"{key!r} must be {wanted}, not {_type_name(value)}")


def value_error(key: str, message: str) -> FieldRefused:
    """The C{EINVAL} refusal of C{key}'s value."""
    return FieldRefused(WireErrno.EINVAL, f"{key!r} {message}")


@attrs.frozen
class Bound:
    """
    The most a value of some kind can cost on the wire.

    @ivar size: the longest msgpack encoding, in bytes.
    @ivar containers: arrays and maps, this one included.
    @ivar width: the longest array inside (0: none).
    @ivar keys: the largest map inside (0: none).
    @ivar string: the longest string or key inside, in bytes.
    @ivar depth: containers nested, this one counted (a scalar is 0).
    """

    size: int
    containers: int = 0
    width: int = 0
    keys: int = 0
    string: int = 0
    depth: int = 0


class Kind(Protocol):
    """What a field is: how its value is checked, encoded, and bounded."""

    @property
    def bound(self) -> Bound:
        """The most a value of this kind costs on the wire."""

    @property
    def identity(self) -> bool:
        """Whether L{encode} returns its argument unchanged (then it is skipped)."""

    def decode(self, value: object, key: str) -> Any:
        """The value of C{key} as received (never nil), checked; or L{FieldRefused}."""

    def encode(self, value: Any) -> object:
        """The value to send."""


@attrs.frozen
class Int:
    """An integer in C{[low, high]} (never a boolean)."""

    low: int = -I64
    high: int = U64
    bound: Bound = Bound(_INT_BYTES)
    identity = True

    def decode(self, value: object, key: str) -> int:
        if type(value) is not int:
            raise shape_error(key, "an integer", value)
        if not self.low <= value <= self.high:
            raise value_error(key, f"must be between {self.low} and {self.high}")
        return value

    def encode(self, value: int) -> object:
        return value


@attrs.frozen
class Bool:
    """A boolean."""

    bound: Bound = Bound(1)
    identity = True

    def decode(self, value: object, key: str) -> bool:
        if type(value) is not bool:
            raise shape_error(key, "a boolean", value)
        return value

    def encode(self, value: bool) -> object:
        return value


@attrs.frozen
class Str:
    """
    A string of C{min_bytes} to C{max_bytes} UTF-8 bytes; longer is
    C{too_long} (C{EINVAL} unless declared), shorter C{EINVAL}.
    """

    max_bytes: int
    min_bytes: int = 0
    too_long: WireErrno = WireErrno.EINVAL
    bound: Bound = attrs.field(init=False)
    identity = True

    @bound.default
    def _bound(self) -> Bound:
        return Bound(HEADER_BYTES + self.max_bytes, string=self.max_bytes)

    def decode(self, value: object, key: str) -> str:
        if type(value) is not str:
            raise shape_error(key, "a string", value)
        length = len(value)
        # A character is 1 to 4 bytes: count bytes only when it could matter.
        if length * 4 > self.max_bytes or length < self.min_bytes:
            length = len(value.encode("utf-8", "surrogatepass"))
            if length > self.max_bytes:
                raise FieldRefused(self.too_long, f"{key!r} is longer than {self.max_bytes} bytes")
            if length < self.min_bytes:
                raise value_error(key, f"must be at least {self.min_bytes} bytes")
        return value

    def encode(self, value: str) -> object:
        return value


@attrs.frozen
class Hash:
    """A chunk name: BLAKE3-256 as 64 lowercase hex digits."""

    bound: Bound = Bound(2 + 64, string=64)
    identity = True

    def decode(self, value: object, key: str) -> str:
        if type(value) is not str:
            raise shape_error(key, "a string", value)
        if len(value) != 64 or not _HEX_DIGITS.issuperset(value):
            raise value_error(key, "must be 64 lowercase hex digits")
        return value

    def encode(self, value: str) -> object:
        return value


@attrs.frozen
class Choice:
    """A string from a fixed set."""

    values: frozenset[str]
    bound: Bound = attrs.field(init=False)
    identity = True

    @bound.default
    def _bound(self) -> Bound:
        longest = max(len(v.encode()) for v in self.values)
        return Bound(HEADER_BYTES + longest, string=longest)

    def decode(self, value: object, key: str) -> str:
        if type(value) is not str:
            raise shape_error(key, "a string", value)
        if value not in self.values:
            raise value_error(key, f"must be one of {', '.join(sorted(self.values))}")
        return value

    def encode(self, value: str) -> object:
        return value


class ChunkEntry(NamedTuple):
    """
    One entry of a chunk list, in file order: the chunk's name and its size.
    On the wire, the two-element array C{[hash, size]} (a tuple, so it
    encodes as exactly that).
    """

    hash: str
    size: int


MAX_CHUNK_SIZE = 16 * 1024 * 1024
"""The largest chunk, in bytes (the chunker's maximum)."""


@attrs.frozen
class ChunkEntryKind:
    """A L{ChunkEntry}: C{[hash, size]} with size 1 to L{MAX_CHUNK_SIZE}."""

    bound: Bound = Bound(1 + 66 + _INT_BYTES, containers=1, width=2, string=64, depth=1)
    identity = True

    def decode(self, value: object, key: str) -> ChunkEntry:
        if type(value) is not list or len(value) != 2:
            if not isinstance(value, list | tuple) or len(value) != 2:
                raise shape_error(key, "a [hash, size] array", value)
        chunk_hash, size = value
        if type(chunk_hash) is not str or len(chunk_hash) != 64:
            _HASH.decode(chunk_hash, f"{key}[0]")
        elif not _HEX_DIGITS.issuperset(chunk_hash):
            raise value_error(f"{key}[0]", "must be 64 lowercase hex digits")
        if type(size) is not int or not 0 < size <= MAX_CHUNK_SIZE:
            _CHUNK_SIZE.decode(size, f"{key}[1]")
        return ChunkEntry(chunk_hash, size)

    def encode(self, value: ChunkEntry) -> object:
        return value


class OutboxTag(NamedTuple):
    """
    Which entry of a mount's outbox a change is (``mount-outbox.md``
    section 6): the outbox's id (32 lowercase hex digits), the entry's
    C{seq} (at least 1) and C{settled} (every entry up to it is settled at
    the mount; below C{seq}). On the wire, C{[outbox, seq, settled]}.
    """

    outbox: str
    seq: int
    settled: int


@attrs.frozen
class OutboxTagKind:
    """An L{OutboxTag}: C{[32 hex digits, seq >= 1, 0 <= settled < seq]}."""

    bound: Bound = Bound(1 + 34 + 2 * _INT_BYTES, containers=1, width=3, string=32, depth=1)
    identity = False

    def decode(self, value: object, key: str) -> OutboxTag:
        if not isinstance(value, list | tuple) or len(value) != 3:
            raise shape_error(key, "an [outbox, seq, settled] array", value)
        outbox, seq, settled = value
        if type(outbox) is not str or len(outbox) != 32 or not _HEX_DIGITS.issuperset(outbox):
            raise value_error(f"{key}[0]", "must be 32 lowercase hex digits")
        _SEQ.decode(seq, f"{key}[1]")
        _SETTLED.decode(settled, f"{key}[2]")
        if settled >= seq:
            raise value_error(f"{key}[2]", "must be below the seq")
        return OutboxTag(outbox, seq, settled)

    def encode(self, value: OutboxTag) -> object:
        return list(value)


_HASH = Hash()
_SEQ = Int(1, I64)
_SETTLED = Int(0, I64)
_CHUNK_SIZE = Int(1, MAX_CHUNK_SIZE)
_MAKE_ENTRY = partial(tuple.__new__, ChunkEntry)
_UPPER_HEX = "ABCDEF"


def _bulk_chunk_entries(value: list[Any] | tuple[Any, ...]) -> tuple[ChunkEntry, ...] | None:
    """
    A chunk list checked in bulk (C-speed steps: one C{bytes.fromhex} over
    every hash joined, no Python call per entry), or L{None} when some entry
    is wrong: then the entries are checked one by one for the message.
    """
    if not all(type(entry) is list and len(entry) == 2 for entry in value):
        return None
    hashes = [entry[0] for entry in value]
    if not all(type(name) is str and len(name) == 64 for name in hashes):
        return None
    joined = "".join(hashes)
    try:
        if len(bytes.fromhex(joined)) != 32 * len(hashes):
            return None  # whitespace, which fromhex skips
    except ValueError:
        return None
    if any(letter in joined for letter in _UPPER_HEX):
        return None
    if not all(type(entry[1]) is int and 0 < entry[1] <= MAX_CHUNK_SIZE for entry in value):
        return None
    return tuple(map(_MAKE_ENTRY, value))


@attrs.frozen
class ChunkList:
    """
    A chunk list: an array of at most C{max_items} L{ChunkEntry}s. Decoding
    is checked in bulk (a file of 12000 chunks costs a few milliseconds);
    the refusal is the one L{ListOf} of L{ChunkEntryKind} gives.
    """

    max_items: int
    bound: Bound = attrs.field(init=False)
    identity = True

    @bound.default
    def _bound(self) -> Bound:
        return ListOf(ChunkEntryKind(), self.max_items).bound

    def decode(self, value: object, key: str) -> tuple[ChunkEntry, ...]:
        if isinstance(value, list) and len(value) <= self.max_items:
            entries = _bulk_chunk_entries(value)
            if entries is not None:
                return entries
        result: tuple[ChunkEntry, ...] = ListOf(ChunkEntryKind(), self.max_items).decode(value, key)
        return result

    def encode(self, value: Iterable[ChunkEntry]) -> object:
        return value if isinstance(value, list | tuple) else list(value)


@attrs.frozen
class ListOf:
    """
    An array of at most C{max_items} (and at least C{min_items}) values of
    kind C{item}; decoded as a tuple.
    """

    item: Kind
    max_items: int
    min_items: int = 0
    bound: Bound = attrs.field(init=False)

    @bound.default
    def _bound(self) -> Bound:
        inner = self.item.bound
        return Bound(
            HEADER_BYTES + self.max_items * inner.size,
            containers=1 + self.max_items * inner.containers,
            width=max(self.max_items, inner.width),
            keys=inner.keys,
            string=inner.string,
            depth=1 + inner.depth,
        )

    @property
    def identity(self) -> bool:
        return self.item.identity

    def decode(self, value: object, key: str) -> tuple[Any, ...]:
        if not isinstance(value, list | tuple):
            raise shape_error(key, "an array", value)
        if len(value) > self.max_items:
            raise FieldRefused(WireErrno.EPROTO, f"{key!r} holds more than {self.max_items} items")
        if len(value) < self.min_items:
            raise FieldRefused(WireErrno.EPROTO, f"{key!r} holds fewer than {self.min_items} items")
        decode = self.item.decode
        try:
            return tuple([decode(item, key) for item in value])
        except FieldRefused:
            # Name the item at fault (only now: formatting costs).
            for index, item in enumerate(value):
                decode(item, f"{key}[{index}]")
            raise

    def encode(self, value: Iterable[Any]) -> object:
        if self.item.identity:
            return value if isinstance(value, list | tuple) else list(value)
        encode = self.item.encode
        return [encode(item) for item in value]
