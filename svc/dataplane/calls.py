"""
One request as the data-plane operations see it (L{Call}), what a
successful one produces (L{Outcome}), and small helpers they share.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import attrs
from twisted.internet.defer import Deferred

from svc.audit.events import ExtraValue
from svc.dataplane.errors import BadValue
from svc.dataplane.interfaces import OpReply
from svc.wire.errors import CodecError
from svc.wire.messages import ManifestPutRequest
from svc.wire.ops import Op
from svc.wire.payload import pack_payload

Release = Callable[[], None]
"""Lets the connection's later requests start (lease requests call it once issued)."""


@attrs.define
class Call:
    """One request being handled: what its audit line needs to know so far."""

    op: Op
    request: object
    session_id: str | None = None
    inline_stored: list[Deferred[Exception | None]] = attrs.field(factory=list)
    """A C{manifest_put}'s inline chunks being stored: each fires with the
    error that refused it, or L{None} once stored."""
    answer_reserved: bool = False
    """The answer's bytes are reserved already (a C{manifest_get}'s inline
    chunk: the whole reply reserved them, L{svc.dataplane.answer_budget})."""


@attrs.frozen
class Outcome:
    """
    A successful operation's reply and what its audit line carries beyond
    the envelope (C{size}, event-specific C{extra}); C{inline} names the
    chunks a C{manifest_get} reply is to carry in its raw segment.
    """

    reply: OpReply
    size: int | None = None
    extra: Mapping[str, ExtraValue] = attrs.field(factory=dict)
    inline: tuple[str, ...] = ()


def inline_segments(request: object, raw: memoryview) -> list[tuple[str, memoryview]]:
    """
    The chunks a C{manifest_put} carries in its raw segment (C{inline}),
    each with its bytes; none for any other request.

    @raise BadValue: the raw segment is not exactly the inline chunks' bytes.
    """
    if not isinstance(request, ManifestPutRequest):
        return []
    inline = request.inline_entries()
    if len(raw) != sum(chunk.size for chunk in inline):
        raise BadValue("the raw segment must hold exactly the inline chunks' bytes")
    segments = []
    offset = 0
    for chunk in inline:
        segments.append((chunk.hash, raw[offset : offset + chunk.size]))
        offset += chunk.size
    return segments


def payload_size(payload: Mapping[str, object]) -> int:
    """The msgpack-encoded size of a payload map (0 if it cannot be encoded)."""
    try:
        return len(pack_payload(payload))
    except CodecError:
        return 0


def empty_outcome() -> Outcome:
    """The outcome of an operation that answers an empty map."""
    return Outcome(OpReply({}))
