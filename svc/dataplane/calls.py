"""
One request as the data-plane operations see it (L{Call}), what a
successful one produces (L{Outcome}), and small helpers they share.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import attrs
from twisted.internet.defer import Deferred

from svc.audit.events import ExtraValue
from svc.dataplane.errors import BadValue
from svc.dataplane.interfaces import OpReply
from svc.store.manifest_values import Attributes, ChunkRef, FileKind
from svc.wire.errors import CodecError
from svc.wire.messages import MAX_INLINE_CHUNKS, ManifestPutRequest
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
class InlineChunks:
    """
    The chunks a reply (of C{manifest_get} or C{list}) is to carry in its
    raw segment, each read after the operation's own line as the
    C{chunk_get} it stands for (L{svc.dataplane.inline_reads}).

    @ivar hashes: the chunks in raw-segment order, one read each (a
        C{list} carries a chunk several entries name once).
    @ivar named: the reply's payload naming them where the operation says
        (C{inline}); used only once every read has succeeded.
    """

    hashes: tuple[str, ...]
    named: Callable[[Mapping[str, object]], Mapping[str, object]]


def inline_named(hashes: tuple[str, ...]) -> InlineChunks | None:
    """
    A C{manifest_get} reply's inline chunks: C{hashes} (each once), named
    in its C{inline}; L{None} when there are none.
    """
    if not hashes:
        return None
    return InlineChunks(hashes, lambda payload: {**payload, "inline": list(hashes)})


def inline_for(
    inline_max: int, attributes: Attributes, chunks: Sequence[ChunkRef]
) -> tuple[str, ...]:
    """
    The chunks a reply carries for a file whose chunk list it carries
    (C{manifest_get}'s "Inline chunks", and each C{list} entry's): for a
    regular file of 1 to C{inline_max} bytes with at most
    C{MAX_INLINE_CHUNKS} distinct chunks, those, each once, in order of
    first use; none otherwise.
    """
    if attributes.kind is not FileKind.FILE or not 0 < attributes.size <= inline_max:
        return ()
    hashes = tuple(dict.fromkeys(chunk.hash for chunk in chunks))
    return hashes if len(hashes) <= MAX_INLINE_CHUNKS else ()


@attrs.frozen
class Outcome:
    """
    A successful operation's reply and what its audit line carries beyond
    the envelope (C{size}, event-specific C{extra}); C{inline}, the chunks
    the reply is to carry in its raw segment.
    """

    reply: OpReply
    size: int | None = None
    extra: Mapping[str, ExtraValue] = attrs.field(factory=dict)
    inline: InlineChunks | None = None


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
