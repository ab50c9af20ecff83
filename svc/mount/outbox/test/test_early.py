"""Tests for L{svc.mount.outbox.early}: the one rule for answering before the data plane."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from svc.mount.outbox.early import (
    EARLY,
    MAX_BYTES,
    MAX_EARLY_FILE_BYTES,
    MAX_ENTRIES,
    QUOTA_HEADROOM,
    Backlog,
    Call,
    Decision,
    Verdict,
    may_return_early,
)
from svc.mount.outbox.entries import Op


def decide(
    call: Call,
    backlog: Backlog | None = None,
    *,
    durable_close: bool = False,
    read_only: bool = False,
    quota_room: int | None = None,
) -> Decision:
    return may_return_early(
        call,
        backlog or Backlog(),
        durable_close=durable_close,
        read_only=read_only,
        quota_room=quota_room,
    )


class MayReturnEarlyTests(SynchronousTestCase):
    """Which calls return once their entry is persisted, and which wait."""

    def test_every_kind_returns_early_by_default(self) -> None:
        """With room, no refusal and no special setting, every kind of entry returns early."""
        for op in Op:
            self.assertEqual(decide(Call(op, content_bytes=10)), EARLY)

    def test_read_only_and_a_refusal_wait_for_the_answer(self) -> None:
        """A read-only mount, or one whose last answer was a refusal, reports each answer."""
        for decision in (
            decide(Call(Op.UNLINK), read_only=True),
            decide(Call(Op.UNLINK), Backlog(refused=True)),
        ):
            self.assertEqual(decision.verdict, Verdict.WAIT_FOR_ANSWER)

    def test_a_directory_moving_waits(self) -> None:
        """A rename of a directory waits (the data plane checks its whole subtree)."""
        self.assertEqual(decide(Call(Op.RENAME, directory=True)).verdict, Verdict.WAIT_FOR_ANSWER)
        self.assertEqual(decide(Call(Op.RMDIR, directory=True)), EARLY)

    def test_commits_wait_when_durable_large_or_near_the_quota(self) -> None:
        """C{SVC_DURABLE_CLOSE}, a file over the early size, or little quota room: wait."""
        self.assertEqual(decide(Call(Op.COMMIT), durable_close=True).reason, "durable close")
        self.assertEqual(decide(Call(Op.UNLINK), durable_close=True), EARLY)
        big = decide(Call(Op.COMMIT, content_bytes=MAX_EARLY_FILE_BYTES + 1))
        self.assertEqual(big.reason, "a large file")
        room = QUOTA_HEADROOM + 100
        self.assertEqual(decide(Call(Op.COMMIT, content_bytes=50), quota_room=room), EARLY)
        near = decide(Call(Op.COMMIT, content_bytes=50), Backlog(1, 60), quota_room=room)
        self.assertEqual(near.reason, "near the quota")

    def test_a_full_outbox_waits_for_room(self) -> None:
        """Past its entry or byte bound, a call waits for room, not for its own answer."""
        full = Backlog(entries=MAX_ENTRIES)
        self.assertEqual(decide(Call(Op.UNLINK), full).verdict, Verdict.WAIT_FOR_ROOM)
        heavy = Backlog(entries=1, content_bytes=MAX_BYTES - 10)
        self.assertEqual(
            decide(Call(Op.COMMIT, content_bytes=20), heavy).verdict, Verdict.WAIT_FOR_ROOM
        )
        self.assertEqual(decide(Call(Op.COMMIT, content_bytes=10), heavy), EARLY)
