"""
The chunk operations (C{chunk_put}, C{chunk_get}, C{chunk_has}), run by
L{svc.dataplane.connection.AgentConnection} like every operation. A chunk
the agent may not see (L{svc.dataplane.chunk_visibility}) is answered
exactly as an absent one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from svc.dataplane.calls import Call, Outcome, Release, payload_size
from svc.dataplane.errors import BadValue, chunk_not_present
from svc.dataplane.interfaces import OpReply
from svc.dataplane.ops import ChunkGetRequest, ChunkHasRequest, ChunkPutRequest
from svc.store.errors import NotFound
from svc.wire.ops import Op

if TYPE_CHECKING:
    from svc.dataplane.connection import AgentConnection


async def chunk_get(
    conn: AgentConnection, call: Call, raw: memoryview, release: Release
) -> Outcome:
    """C{chunk_get}: the bytes of a visible chunk in the raw segment; ENOENT otherwise."""
    request = call.request
    assert isinstance(request, ChunkGetRequest)
    storage = await conn.storage()
    if request.hash not in await conn.visible_of(storage, [request.hash]):
        raise chunk_not_present(request.hash)
    try:
        chunk = await storage.chunk_get(request.hash)
    except NotFound:
        raise chunk_not_present(request.hash) from None
    size = len(chunk.data)
    metrics = conn.metrics
    metrics.count_chunk("fetched")
    metrics.count_bytes("out", Op.CHUNK_GET.value, size)
    # The bytes are lent by the store: released once the reply is written.
    reply = OpReply({"hash": request.hash, "size": size}, chunk.data, sent=chunk.release)
    return Outcome(reply, size=size, extra={"hash": request.hash})


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
    reply = OpReply({"hash": result.hash, "size": result.size})
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
    reply: dict[str, object] = {"present": answer}
    metrics.count_bytes("out", Op.CHUNK_HAS.value, payload_size(reply))
    return Outcome(OpReply(reply), extra={"count": len(request.hashes)})
