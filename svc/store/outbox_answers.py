"""
Exactly once for a mount's outbox (``docs/specifications/mount-outbox.md``
section 6, ``routes-db.md``'s C{outbox_answers}): a change that names its
outbox entry (L{OutboxPosition}) has its answer stored in the transaction
that applies it, and the same entry sent again (its first answer was lost)
is answered with that stored answer instead of being applied twice.

Only changes that were applied are stored: a refused change applied
nothing, so sending it again simply asks again. The answers of the entries
the mount says are settled (C{settled}: every entry up to it) are dropped
by the next change of that outbox; those of an outbox no change names any
more (its cache is gone) after L{KEEP_MS}, by a change of another outbox of
the agent.

The answer is opaque bytes the caller makes from the change's result
(L{OutboxPosition.answer}; the data plane stores the wire answer it sends),
so a replay gives the client exactly what the first run would have.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

import attrs

OUTBOX_ID_BYTES = 16
"""The length of an outbox id."""

KEEP_MS = 7 * 24 * 3600 * 1000
"""How long an answer of I{another} outbox of the agent is kept: a cache that
was thrown away never says its entries are settled, so its answers go when
they are this old (a mount replaying a week-old cache is answered as if its
entries were new: their compare-and-swap still guards them)."""


@attrs.frozen
class OutboxPosition:
    """
    Which outbox entry a change is.

    @ivar outbox: the outbox's id (16 bytes, random, made by the mount).
    @ivar seq: the entry's sequence number (at least 1).
    @ivar settled: every entry of the outbox up to this one is settled at
        the mount (their answers may be dropped); less than C{seq}.
    @ivar answer: makes the answer to store from the change's result.
    """

    outbox: bytes = attrs.field()
    seq: int = attrs.field()
    settled: int = attrs.field()
    answer: Callable[[Any], bytes] = attrs.field(eq=False, repr=False)

    @outbox.validator
    def _check_outbox(self, _: object, value: bytes) -> None:
        if not isinstance(value, bytes) or len(value) != OUTBOX_ID_BYTES:
            raise ValueError(f"an outbox id is {OUTBOX_ID_BYTES} bytes")

    @seq.validator
    def _check_seq(self, _: object, value: int) -> None:
        if value < 1:
            raise ValueError("an outbox seq is at least 1")

    @settled.validator
    def _check_settled(self, _: object, value: int) -> None:
        if not 0 <= value < self.seq:
            raise ValueError("settled must be between 0 and seq - 1")


class AnsweredBefore(Exception):
    """
    The change's outbox entry was applied before: C{answer} is what that
    first run answered. Nothing was changed now.
    """

    def __init__(self, answer: bytes) -> None:
        super().__init__("outbox entry applied before")
        self.answer = answer


def before(
    connection: sqlite3.Connection, agent_id: str, position: OutboxPosition, at_ms: int
) -> None:
    """
    Drop the answers C{position} says are settled, and the agent's answers
    of other outboxes older than L{KEEP_MS}; raise L{AnsweredBefore} if its
    own entry was applied already.
    """
    connection.execute(
        "DELETE FROM outbox_answers WHERE agent_id = ? AND outbox = ? AND seq <= ?",
        (agent_id, position.outbox, position.settled),
    )
    connection.execute(
        "DELETE FROM outbox_answers WHERE agent_id = ? AND outbox != ? AND at_ms < ?",
        (agent_id, position.outbox, at_ms - KEEP_MS),
    )
    row = connection.execute(
        "SELECT answer FROM outbox_answers WHERE agent_id = ? AND outbox = ? AND seq = ?",
        (agent_id, position.outbox, position.seq),
    ).fetchone()
    if row is not None:
        raise AnsweredBefore(bytes(row[0]))


def applied(
    connection: sqlite3.Connection,
    agent_id: str,
    position: OutboxPosition,
    result: object,
    at_ms: int,
) -> None:
    """Store the answer to C{position}'s change, applied in this transaction at C{at_ms}."""
    connection.execute(
        "INSERT INTO outbox_answers (agent_id, outbox, seq, at_ms, answer) VALUES (?, ?, ?, ?, ?)",
        (agent_id, position.outbox, position.seq, at_ms, position.answer(result)),
    )


def forget_agent(connection: sqlite3.Connection, agent_id: str) -> int:
    """Drop every stored answer of C{agent_id} (its disk is purged); how many."""
    return connection.execute("DELETE FROM outbox_answers WHERE agent_id = ?", (agent_id,)).rowcount
