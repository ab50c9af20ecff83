"""
The chunks an answer carries in its raw segment (C{manifest_get} and
C{list} asked with C{inline_max}: ``dataplane-ops.md`` section 3), read
after the operation's own audit line, each exactly as the C{chunk_get} it
stands for: its visibility check, audit line and metrics. If one cannot be
read, the answer carries none (the client asks for them and meets the
error itself). L{svc.dataplane.connection.AgentConnection} runs the reads.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.defer import Deferred, FirstError, gatherResults

from svc.dataplane.answer_budget import ConnectionBudget, Reservation
from svc.dataplane.calls import InlineChunks
from svc.dataplane.interfaces import OpReply
from svc.wire.messages import MAX_INLINE_BYTES

Fetch = Callable[[str], Deferred[OpReply]]
"""Reads one chunk as a C{chunk_get} of it, its answer's bytes already reserved."""


async def with_inline(
    answers: ConnectionBudget, reply: OpReply, inline: InlineChunks, fetch: Fetch
) -> OpReply:
    """
    C{reply} also carrying the bytes of the chunks C{inline} names: each
    read by C{fetch} (all at once), then named in the payload
    (C{inline.named}) and concatenated in the raw segment in
    C{inline.hashes}' order. If one cannot be read, C{reply} unchanged.

    The bytes are reserved once, before any is read, from the answer
    budgets C{answers} (the reads do not reserve their own):
    C{MAX_INLINE_BYTES}, the most an answer carries, then only what the
    reply carries, until it is sent.
    """
    reservation = await answers.reserve(MAX_INLINE_BYTES)
    fetching = [fetch(name) for name in inline.hashes]
    try:
        fetched = await gatherResults(fetching, consumeErrors=True)
    except FirstError:
        reservation.release()
        for settled in fetching:
            settled.addBoth(released)
        return reply
    raw = b"".join(answer.raw for answer in fetched)
    for answer in fetched:
        released(answer)
    if len(raw) > reservation.size:
        reservation.release()
        return reply
    reservation.shrink(len(raw))
    return OpReply(inline.named(reply.payload), raw, sent=_then_release(reply.sent, reservation))


def _then_release(sent: Callable[[], None] | None, reservation: Reservation) -> Callable[[], None]:
    """C{sent} (if any), then give back C{reservation}."""

    def both() -> None:
        try:
            if sent is not None:
                sent()
        finally:
            reservation.release()

    return both


def released(answer: object) -> None:
    """Give back the chunk an inline C{chunk_get} answer lent (its bytes were copied or unused)."""
    if isinstance(answer, OpReply) and answer.sent is not None:
        answer.sent()
