"""
Changes a mount's outbox sends, applied exactly once
(``docs/specifications/mount-outbox.md`` section 6): a request naming its
entry (C{outbox}: L{svc.wire.kinds.OutboxTag}) becomes a writer position
whose answer the store keeps with the change (L{position_of}); the same
entry sent again is answered with that kept answer (L{answered_before}).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import msgpack

from svc.dataplane.calls import Outcome
from svc.dataplane.interfaces import OpReply
from svc.store.outbox_answers import AnsweredBefore, OutboxPosition

AnswerOf = Callable[[Any], Mapping[str, object]]
"""A change's answer payload, made from the store's result."""


def position_of(request: object, answer: AnswerOf | None) -> OutboxPosition | None:
    """
    The outbox position of C{request}, whose answer is C{answer} of the
    result, packed with msgpack; L{None} when it names no entry (or the
    change keeps no answer).
    """
    tag = getattr(request, "outbox", None)
    if tag is None or answer is None:
        return None

    def packed(result: object) -> bytes:
        data: bytes = msgpack.packb(answer(result), use_bin_type=True)
        return data

    return OutboxPosition(bytes.fromhex(tag.outbox), tag.seq, tag.settled, answer=packed)


def answered_before(before: AnsweredBefore) -> Outcome:
    """The answer the entry's first run gave, as this request's answer."""
    return Outcome(OpReply(msgpack.unpackb(before.answer, raw=False)))
