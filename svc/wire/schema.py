"""
Field kinds and the message codec: how one declared message (a frozen
C{attrs} class whose fields carry a wire kind) becomes a payload map and back.

A message class is declared once (L{svc.wire.messages}) and both sides use
it: a sender builds an instance and L{encode_message} turns it into the map
it sends; a receiver checks a received map with L{decode_message} and gets
the instance. Each field is declared with L{arg}: its kind (L{Int},
L{Str}, L{ListOf}, ...), and a default when it is optional. The rules of
``docs/specifications/dataplane-ops.md`` section 1.1:

  - keys the message does not declare are ignored;
  - an optional key whose value is nil counts as absent; a required key that
    is absent or nil is L{FieldRefused} C{EPROTO};
  - a value of the wrong type, or an array longer than declared, is
    C{EPROTO}; a value of the right type outside its range or set is
    C{EINVAL} (a string longer than declared: the kind's own errno);
  - booleans are never integers.

Each kind also knows the most it can cost on the wire (L{Bound}): the
largest encoding, how many containers, the widest array and map, the
longest string and the deepest nesting. L{message_bound} adds them up for a
whole message, which is how L{svc.wire.contract} bounds the decoding of a
request by what its operation legitimately needs. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import partial
from typing import Any, NamedTuple, Protocol, TypeVar

import attrs

from svc.wire.errno import WireErrno

T = TypeVar("T")

I64 = 2**63 - 1
"""Largest signed 64-bit value (versions, sizes, times)."""
U32 = 2**32 - 1
"""Largest unsigned 32-bit value (uid, gid)."""
U64 = 2**64 - 1
"""Largest msgpack unsigned integer."""

_WIRE = "svc.wire"
_HEX_DIGITS = frozenset("0123456789abcdef")
_INT_BYTES = 9
_HEADER_BYTES = 5


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
        return Bound(_HEADER_BYTES + self.max_bytes, string=self.max_bytes)

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
        return Bound(_HEADER_BYTES + longest, string=longest)

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


_HASH = Hash()
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
            _HEADER_BYTES + self.max_items * inner.size,
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


@attrs.frozen
class Nested:
    """A map holding one message of class C{message}."""

    message: type
    bound: Bound = attrs.field(init=False)
    identity = False

    @bound.default
    def _bound(self) -> Bound:
        return message_bound(self.message)

    def decode(self, value: object, key: str) -> Any:
        if not isinstance(value, dict):
            raise shape_error(key, "a map", value)
        return decode_message(self.message, value)

    def encode(self, value: Any) -> object:
        return encode_message(value)


@attrs.frozen
class Flat:
    """
    A message of class C{message} whose keys sit in the enclosing map itself
    (the attribute keys of a C{manifest_get} answer, say).
    """

    message: type
    bound: Bound = attrs.field(init=False)
    identity = False

    @bound.default
    def _bound(self) -> Bound:
        inner = message_bound(self.message)
        return attrs.evolve(inner, size=inner.size - _HEADER_BYTES, containers=inner.containers - 1)

    def decode(self, value: object, key: str) -> Any:
        raise AssertionError("flat fields are decoded from the enclosing map")

    def encode(self, value: Any) -> object:
        raise AssertionError("flat fields are encoded into the enclosing map")


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()
"""The default of a required field (L{arg})."""


@attrs.frozen
class FieldSpec:
    """How one field of a message travels (the metadata L{arg} attaches)."""

    kind: Kind
    required: bool
    nil: bool
    """Sent as nil when L{None} (else a L{None} value is left out)."""


def arg(kind: Kind, *, default: Any = REQUIRED, nil: bool = False) -> Any:
    """
    Declare a message field of C{kind}: required unless a C{default} is
    given; C{nil} sends L{None} as nil rather than leaving the key out.
    """
    spec = FieldSpec(kind, default is REQUIRED, nil)
    if default is REQUIRED:
        return attrs.field(metadata={_WIRE: spec})
    return attrs.field(default=default, metadata={_WIRE: spec})


@attrs.frozen
class _Entry:
    name: str
    spec: FieldSpec
    default: object
    flat: type | None


_CODECS: dict[type, tuple[_Entry, ...]] = {}


def _entries(message: type) -> tuple[_Entry, ...]:
    entries = _CODECS.get(message)
    if entries is None:
        built = []
        for field in attrs.fields(message):
            spec = field.metadata.get(_WIRE)
            if not isinstance(spec, FieldSpec):
                raise TypeError(f"{message.__name__}.{field.name} is not a wire field")
            kind = spec.kind
            inner = kind.message if isinstance(kind, Flat) else None
            default = None if field.default is attrs.NOTHING else field.default
            built.append(_Entry(field.name, spec, default, inner))
        entries = tuple(built)
        _CODECS[message] = entries
    return entries


def message_fields(message: type) -> tuple[tuple[str, FieldSpec], ...]:
    """The declared fields of C{message}, in order (flat ones as declared)."""
    return tuple((entry.name, entry.spec) for entry in _entries(message))


def wire_keys(message: type) -> tuple[str, ...]:
    """Every key a map of C{message} may hold, flat fields' keys included."""
    keys: list[str] = []
    for entry in _entries(message):
        if entry.flat is not None:
            keys.extend(wire_keys(entry.flat))
        else:
            keys.append(entry.name)
    return tuple(keys)


def message_bound(message: type) -> Bound:
    """The most a map of C{message} can cost (L{Bound})."""
    size = _HEADER_BYTES
    containers = 1
    width = keys = string = depth = 0
    count = 0
    for entry in _entries(message):
        inner = entry.spec.kind.bound
        if entry.flat is None:
            count += 1
            size += _HEADER_BYTES + len(entry.name.encode())
            string = max(string, len(entry.name.encode()))
            containers += inner.containers
        else:
            count += len(wire_keys(entry.flat))
            containers += inner.containers
        size += inner.size
        width = max(width, inner.width)
        keys = max(keys, inner.keys)
        string = max(string, inner.string)
        depth = max(depth, inner.depth)
    return Bound(
        size,
        containers=containers,
        width=width,
        keys=max(keys, count),
        string=string,
        depth=1 + depth,
    )


def decode_message(message: type[T], payload: Mapping[str, object]) -> T:
    """
    The C{message} a received map holds.

    @raise FieldRefused: see the module docstring.
    """
    values: dict[str, object] = {}
    for entry in _entries(message):
        if entry.flat is not None:
            values[entry.name] = decode_message(entry.flat, payload)
            continue
        name = entry.name
        value = payload.get(name)
        if value is None:
            if entry.spec.required:
                raise FieldRefused(WireErrno.EPROTO, f"missing required key {name!r}")
            values[name] = entry.default
        else:
            values[name] = entry.spec.kind.decode(value, name)
    return message(**values)


def encode_message(value: object, into: dict[str, object] | None = None) -> dict[str, object]:
    """
    The map that carries the message C{value} (added to C{into} when given):
    L{None} fields are left out unless declared C{nil}.
    """
    out: dict[str, object] = {} if into is None else into
    for entry in _entries(type(value)):
        item = getattr(value, entry.name)
        if entry.flat is not None:
            encode_message(item, out)
        elif item is None:
            if entry.spec.nil:
                out[entry.name] = None
        elif entry.spec.kind.identity:
            out[entry.name] = item
        else:
            out[entry.name] = entry.spec.kind.encode(item)
    return out
