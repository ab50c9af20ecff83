"""
The one rule for "may this call return before its outbox entry is
answered?" (``mount-outbox.md`` section 4). Pure: no I/O, no clock.

Every call that appends an entry asks L{may_return_early} once, with what
the call is (L{Call}), what the outbox holds (L{Backlog}) and the mount's
settings; the answer is one of three:

 - L{Verdict.EARLY}: return once the entry is appended (it is persisted);
 - L{Verdict.WAIT_FOR_ROOM}: the outbox is full; wait until an entry
   settles, then ask again (what is unanswered stays bounded, and the call
   waits for the oldest entry, not behind all the others for its own);
 - L{Verdict.WAIT_FOR_ANSWER}: append, then wait for this entry's answer
   and report it (L{Decision.reason} says why, for the log).
"""

from __future__ import annotations

import enum

import attrs

from svc.mount.outbox.entries import Op

MAX_ENTRIES = 4096
"""Most unsettled entries before a call waits for room."""

MAX_BYTES = 256 << 20
"""Most bytes of unsettled commits' content before a call waits for room."""

MAX_EARLY_FILE_BYTES = 64 << 20
"""Largest file whose commit may be answered early (a bigger one's close is
mostly its uploads, which it waits for anyway)."""

QUOTA_HEADROOM = 64 << 20
"""Room under the disk's quota that must remain once every unsettled commit
is stored for a commit to be answered early (else it waits, to report
C{EDQUOT})."""


class Verdict(enum.Enum):
    """What a call does about its entry's answer."""

    EARLY = "early"
    WAIT_FOR_ROOM = "wait_for_room"
    WAIT_FOR_ANSWER = "wait_for_answer"


@attrs.frozen
class Decision:
    """A L{Verdict} and, unless early, why."""

    verdict: Verdict
    reason: str | None = None


EARLY = Decision(Verdict.EARLY)


@attrs.frozen
class Call:
    """
    The call asking.

    @ivar op: the entry it appends.
    @ivar content_bytes: a commit: the file's size; otherwise 0.
    @ivar directory: a rename or rmdir of a directory.
    """

    op: Op
    content_bytes: int = 0
    directory: bool = False


@attrs.frozen
class Backlog:
    """
    The outbox now.

    @ivar entries: unsettled entries.
    @ivar content_bytes: the content bytes of its unsettled commits.
    @ivar refused: an entry was refused and no entry was confirmed since.
    """

    entries: int = 0
    content_bytes: int = 0
    refused: bool = False


def may_return_early(
    call: Call,
    backlog: Backlog,
    *,
    durable_close: bool,
    read_only: bool,
    quota_room: int | None,
) -> Decision:
    """
    Whether C{call} may return before its entry is answered.

    @param durable_close: the mount's C{SVC_DURABLE_CLOSE}: commits wait.
    @param read_only: the mount was made read-only (nothing is appended
        then; a call that gets here anyway waits and hears the refusal).
    @param quota_room: bytes the disk's quota leaves free as last reported
        (L{None}: no quota, or none known).
    """
    if read_only:
        return Decision(Verdict.WAIT_FOR_ANSWER, "read-only")
    if backlog.refused:
        return Decision(Verdict.WAIT_FOR_ANSWER, "an entry was refused since the last answer")
    if call.op is Op.RENAME and call.directory:
        # The data plane checks every path below the directory (their
        # lengths, its policy); the mount does not know the whole subtree.
        return Decision(Verdict.WAIT_FOR_ANSWER, "a directory moves")
    if call.op is Op.COMMIT:
        if durable_close:
            return Decision(Verdict.WAIT_FOR_ANSWER, "durable close")
        if call.content_bytes > MAX_EARLY_FILE_BYTES:
            return Decision(Verdict.WAIT_FOR_ANSWER, "a large file")
        if quota_room is not None and (
            quota_room - backlog.content_bytes - call.content_bytes < QUOTA_HEADROOM
        ):
            return Decision(Verdict.WAIT_FOR_ANSWER, "near the quota")
    if backlog.entries >= MAX_ENTRIES or (
        backlog.content_bytes and backlog.content_bytes + call.content_bytes > MAX_BYTES
    ):
        return Decision(Verdict.WAIT_FOR_ROOM, "the outbox is full")
    return EARLY
