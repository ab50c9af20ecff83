"""
The message codec: how one declared message (a frozen C{attrs} class whose
fields carry a wire kind, L{svc.wire.kinds}) becomes a payload map and back.

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

from collections.abc import Mapping
from typing import Any, TypeVar

import attrs

from svc.wire.errno import WireErrno
from svc.wire.kinds import HEADER_BYTES, Bound, FieldRefused, Kind, shape_error

T = TypeVar("T")

_WIRE = "svc.wire"


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
        return attrs.evolve(inner, size=inner.size - HEADER_BYTES, containers=inner.containers - 1)

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
    size = HEADER_BYTES
    containers = 1
    width = keys = string = depth = 0
    count = 0
    for entry in _entries(message):
        inner = entry.spec.kind.bound
        if entry.flat is None:
            count += 1
            size += HEADER_BYTES + len(entry.name.encode())
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
