"""
The chunk operations (C{chunk_put}, C{chunk_get}, C{chunk_has}), run by
L{svc.dataplane.connection.AgentConnection} like every operation. A chunk
the agent may not see (L{svc.dataplane.chunk_visibility}) is answered
exactly as an absent one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from svc.dataplane.answer_budget import Reservation
from svc.dataplane.calls import Call, Outcome, Release, payload_size
from svc.dataplane.errors import BadValue, chunk_not_present
from svc.dataplane.interfaces import OpReply
from svc.store.chunks import MAX_CHUNK_SIZE
from svc.store.errors import NotFound
from svc.wire.answers import ChunkHasReply, ChunkReply
from svc.wire.contract import answer_map
from svc.wire.messages import ChunkGetRequest, ChunkHasRequest, ChunkPutRequest
from svc.wire.ops import Op

if TYPE_CHECKING:
    from svc.dataplane.connection import AgentConnection


async def chunk_get(
    conn: AgentConnection, call: Call, raw: memoryview, release: Release
) -> Outcome:
    """
    C{chunk_get}: the bytes of a visible chunk in the raw segment; ENOENT
    otherwise. Before the chunk is read, its answer reserves the largest
    chunk size from the connection's answer budgets (waiting for room:
    L{svc.dataplane.answer_budget}), then keeps only the chunk's size until
    the answer has been sent.
    """
    request = call.request
    assert isinstance(request, ChunkGetRequest)
    storage = await conn.storage()
    if request.hash not in await conn.visible_of(storage, [request.hash]):
        raise chunk_not_present(request.hash)
    reservation = None if call.answer_reserved else await conn.answers.reserve(MAX_CHUNK_SIZE)
    try:
        chunk = await storage.chunk_get(request.hash)
    except NotFound:
        _release(reservation)
        raise chunk_not_present(request.hash) from None
    except BaseException:
        _release(reservation)
        raise
    size = len(chunk.data)
    if reservation is not None:
        reservation.shrink(size)
    metrics = conn.metrics
    metrics.count_chunk("fetched")
    metrics.count_bytes("out", Op.CHUNK_GET.value, size)
    # The bytes are lent by the store: released once the reply is written,
    # and the reservation given back with them.
    reply = OpReply(
        answer_map(ChunkReply(request.hash, size)),
        chunk.data,
        sent=_sent(chunk.release, reservation),
    )
    return Outcome(reply, size=size, extra={"hash": request.hash})


def _release(reservation: Reservation | None) -> None:
    if reservation is not None:
        reservation.release()


def _sent(release: Callable[[], None], reservation: Reservation | None) -> Callable[[], None]:
    """What a C{chunk_get} answer does once sent: give back the chunk, then its reservation."""
    if reservation is None:
        return release

    def both() -> None:
        try:
            release()
        finally:
            reservation.release()

    return both


async def chunk_put(
    conn: AgentConnection, call: Call, raw: memoryview, release: Release
) -> Outcome:
    """C{chunk_put}: store the raw segment under its hash, visible to this connection."""
    request = call.request
    assert isinstance(request, ChunkPutRequest)
    if len(raw) == 0:
        raise BadValue("chunk_put needs the chunk's bytes in the raw segment")
    storage = await conn.storage()
    if request.hash not in conn.visible:
        # Refuse a chunk the budget could not take whether or not the store
        # already holds it: EDQUOT must not reveal another agent's content.
        await storage.account.reserve(len(raw))
        storage.account.release(len(raw))
    result = await storage.chunk_put(conn.agent_id, request.hash, raw)
    conn.visible.add([request.hash])
    conn.metrics.count_chunk("deduped" if result.deduped else "cached")
    reply = OpReply(answer_map(ChunkReply(result.hash, result.size)))
    return Outcome(reply, size=result.size, extra={"hash": result.hash})


async def chunk_has(
    conn: AgentConnection, call: Call, raw: memoryview, release: Release
) -> Outcome:
    """C{chunk_has}: for each hash, whether it is stored I{and} visible, in request order."""
    request = call.request
    assert isinstance(request, ChunkHasRequest)
    metrics = conn.metrics
    started = conn.now()
    try:
        storage = await conn.storage()
        distinct = list(dict.fromkeys(request.hashes))
        visible = await conn.visible_of(storage, distinct)
        asked = [h for h in distinct if h in visible]
        present = set((await storage.chunk_has(asked)).present) if asked else set()
    except Exception:
        metrics.count_chunk_batch_items("has", "error", len(request.hashes))
        raise
    answer = [h in present for h in request.hashes]
    metrics.observe_chunk_batch("has", conn.now() - started, len(request.hashes))
    hits = sum(answer)
    if hits:
        metrics.count_chunk_batch_items("has", "present", hits)
    if len(answer) - hits:
        metrics.count_chunk_batch_items("has", "absent", len(answer) - hits)
    reply = answer_map(ChunkHasReply(tuple(answer)))
    metrics.count_bytes("out", Op.CHUNK_HAS.value, payload_size(reply))
    return Outcome(OpReply(reply), extra={"count": len(request.hashes)})
