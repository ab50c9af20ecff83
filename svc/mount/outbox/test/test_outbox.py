"""
Tests for L{svc.mount.outbox.outbox} against the real data-plane service
(in process): entries appended are persisted and sent, the barrier waits
for them, and entries a killed mount left in its log are replayed by the
next mount on the same cache, applied once even where the first mount's
requests ran and their answers were lost.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from svc.chunking import chunk_hash
from svc.dataplane.test.test_service_support import ServiceFixture
from svc.mount.core.errors import RemoteFailure
from svc.mount.core.op_ticket import OpTicket, run_with_ticket
from svc.mount.outbox.entries import Commit, Entry, Mkdir, Owner
from svc.mount.outbox.outbox import Outbox
from svc.mount.outbox.sender import DEFAULT_BACKOFF
from svc.mount.outbox.test.test_sender import refs
from svc.mount.remote.data_plane import Remote
from svc.mount.test.test_fs_support import AGENT, HeldAnswers
from svc.testing.local_connection import LocalConnection
from svc.wire.errno import WireErrno

ROOT = f"/{AGENT.agent_id}"
FILE = Owner(0o100644, 1000, 1000)
DIR = Owner(0o40755, 1000, 1000)


class Recorder:
    """A reconciler that records what it is told."""

    def __init__(self) -> None:
        self.answered: list[tuple[int, Any]] = []
        self.refused: list[tuple[int, RemoteFailure]] = []

    def answered_entry(self, entry: Entry, answer: Any) -> None:
        self.answered.append((entry.seq, answer))

    def refused_entry(self, entry: Entry, failure: RemoteFailure) -> None:
        self.refused.append((entry.seq, failure))


class _Reconciler:
    def __init__(self, recorder: Recorder) -> None:
        self._recorder = recorder

    def answered(self, entry: Entry, answer: Any) -> None:
        self._recorder.answered_entry(entry, answer)

    def refused(self, entry: Entry, failure: RemoteFailure) -> None:
        self._recorder.refused_entry(entry, failure)


class OutboxTests(SynchronousTestCase):
    """One cache's outbox, across mounts."""

    def setUp(self) -> None:
        self.service = ServiceFixture(self)
        self.addCleanup(self.service.close)
        self.root = Path(self.mktemp())
        self.check = self.service.agent(AGENT)
        self.connections = 0

    def mount(self) -> tuple[Outbox, Recorder, HeldAnswers, Any]:
        """A mount's outbox on the cache, started on a new connection."""
        self.connections += 1
        connection = LocalConnection(self.service.service, AGENT, f"m{self.connections}")
        answers = HeldAnswers(connection)
        recorder = Recorder()
        outbox, replay, missing = Outbox.open(self.root, _Reconciler(recorder), lambda f: f())
        self.assertEqual(missing, frozenset())
        outbox.start(Remote(answers), self.service.clock, lambda: None)
        self.addCleanup(outbox.stop)
        return outbox, recorder, answers, replay

    def commit(self, seq: int, name: str, expected: int, data: bytes) -> Commit:
        chunks = refs(data) if data else ()
        return Commit(seq, f"{ROOT}/{name}", expected, False, (), chunks, len(data), FILE, 1)

    def test_appended_entries_are_sent_and_the_barrier_waits_for_them(self) -> None:
        """An entry is sent once appended; C{settled} fires when it and those before it are."""
        outbox, recorder, answers, _ = self.mount()
        answers.hold("dir_create", "manifest_put")
        made = outbox.append(lambda seq: Mkdir(seq, f"{ROOT}/d", DIR))
        data = b"content"
        put = outbox.append(lambda seq: self.commit(seq, "d/f", 0, data), {chunk_hash(data): data})
        self.assertEqual(outbox.backlog().entries, 2)
        self.assertEqual(outbox.backlog().content_bytes, len(data))
        barrier = outbox.settled(put.seq)
        self.assertNoResult(barrier)
        answers.release()
        self.successResultOf(barrier)
        self.assertEqual([seq for seq, _ in recorder.answered], [made.seq, put.seq])
        self.assertEqual(outbox.backlog().entries, 0)
        self.assertEqual(self.check.ok("head_file", path=f"{ROOT}/d/f")["size"], len(data))

    def test_a_killed_mount_s_entries_are_replayed_and_applied_once(self) -> None:
        """
        The first mount's requests ran but their answers were lost when it
        was killed; the next mount on the same cache sends them again before
        anything else, and each is applied once: one version, no refusal.
        """
        first, _, answers, _ = self.mount()
        answers.hold("dir_create", "manifest_put", "chunk_put")
        first.append(lambda seq: Mkdir(seq, f"{ROOT}/d", DIR))
        data = b"closed before the kill"
        first.append(lambda seq: self.commit(seq, "d/f", 0, data), {chunk_hash(data): data})
        answers.down = True  # the resends get nowhere
        answers.release(lost=True)  # they ran; the mount never heard
        first.stop()  # the process is gone: nothing more is sent

        second, recorder, _, replay = self.mount()
        self.assertEqual(len(replay.unsettled), 2)
        self.service.clock.advance(DEFAULT_BACKOFF.maximum)
        self.successResultOf(second.settled(2))
        self.assertEqual(recorder.refused, [])
        head = self.check.ok("head_file", path=f"{ROOT}/d/f")
        self.assertEqual((head["version"], head["size"]), (1, len(data)))

    def test_entries_never_sent_are_replayed_with_their_chunks(self) -> None:
        """A mount killed before sending: the next sends the entries and uploads the held chunks."""
        first, _, answers, _ = self.mount()
        answers.down = True
        data = b"never left the machine"
        first.append(lambda seq: self.commit(seq, "f", 0, data), {chunk_hash(data): data})
        first.stop()

        second, recorder, _, _ = self.mount()
        self.successResultOf(second.settled(1))
        self.assertEqual([seq for seq, _ in recorder.answered], [1])
        manifest = self.check.ok("manifest_get", path=f"{ROOT}/f")
        self.assertEqual(manifest["size"], len(data))

    def test_a_commit_the_next_entry_replaces_whole_is_not_replayed(self) -> None:
        """
        Two commits of one path over the same version left unsettled one
        after the other (an empty close's record, then the file's commit):
        only the later is sent (the earlier would make it lose its
        compare-and-swap), and the earlier is settled in the log.
        """
        first, _, answers, _ = self.mount()
        answers.down = True
        first.append(lambda seq: self.commit(seq, "f", 0, b""), send=False)
        data = b"the file's content"
        first.append(
            lambda seq: self.commit(seq, "f", 0, data), {chunk_hash(data): data}, send=False
        )
        first.stop()

        second, recorder, _, replay = self.mount()
        self.assertEqual([entry.seq for entry in replay.unsettled], [2])
        self.successResultOf(second.settled(2))
        self.assertEqual(([seq for seq, _ in recorder.answered], recorder.refused), ([2], []))
        manifest = self.check.ok("manifest_get", path=f"{ROOT}/f")
        self.assertEqual((manifest["version"], manifest["size"]), (1, len(data)))

    def test_a_refusal_is_reconciled_and_said_in_the_backlog(self) -> None:
        """A refused entry settles, reaches the reconciler, and marks the backlog refused."""
        outbox, recorder, _, _ = self.mount()
        outbox.append(lambda seq: self.commit(seq, "f", 3, b""))
        [(seq, failure)] = recorder.refused
        self.assertEqual((seq, failure.wire), (1, WireErrno.ESTALE))
        self.assertTrue(outbox.backlog().refused)
        outbox.append(lambda seq: Mkdir(seq, f"{ROOT}/ok", DIR))
        self.assertFalse(outbox.backlog().refused)

    def test_an_entry_submitted_answers_its_caller(self) -> None:
        """
        An entry submitted for a caller: the caller gets the answer (not
        the reconciler), and the entry settles; a refusal fails the
        caller's Deferred.
        """
        outbox, recorder, _, _ = self.mount()
        _, made = outbox.submit(lambda seq: Mkdir(seq, f"{ROOT}/d", DIR), waits=True)
        self.assertEqual(self.successResultOf(made).kind, "dir")
        _, refused = outbox.submit(lambda seq: self.commit(seq, "f", 3, b""), waits=True)
        failure = self.failureResultOf(refused, RemoteFailure)
        self.assertEqual(failure.value.wire, WireErrno.ESTALE)
        self.assertEqual((recorder.answered, recorder.refused), ([], []))
        self.assertEqual(outbox.backlog().entries, 0)

    def test_a_lost_answer_is_sent_again_at_once_under_its_tag(self) -> None:
        """
        The answer to an entry that ran is lost: the sender sends it again
        at once, and the data plane answers as it did (one directory, the
        caller answered).
        """
        outbox, _, answers, _ = self.mount()
        answers.lose("dir_create", ran=True)
        _, made = outbox.submit(lambda seq: Mkdir(seq, f"{ROOT}/d", DIR), waits=True)
        self.assertEqual(self.successResultOf(made).kind, "dir")
        self.assertEqual(answers.losses_left, 0)
        self.assertEqual(outbox.backlog().entries, 0)

    def test_a_waiting_caller_is_told_when_its_entry_never_went(self) -> None:
        """
        No connection to be had: an entry its caller waits for fails at
        once (C{EIO}, not unknown: it never ran), is settled, and is not
        sent later.
        """
        outbox, _, answers, _ = self.mount()
        answers.down = True
        _, made = outbox.submit(lambda seq: Mkdir(seq, f"{ROOT}/d", DIR), waits=True)
        error = self.failureResultOf(made, RemoteFailure).value
        self.assertFalse(error.unknown)
        self.assertEqual(outbox.backlog().entries, 0)
        answers.down = False
        outbox.reconnected()
        self.service.clock.advance(DEFAULT_BACKOFF.maximum)
        self.assertEqual(self.check.errno("head_file", path=f"{ROOT}/d"), WireErrno.ENOENT)

    def test_a_waiting_caller_is_told_when_its_entry_is_lost_twice(self) -> None:
        """
        The answer is lost, and the resend's too: the caller's entry is
        taken back (C{EIO}, unknown: it may have run), and settled.
        """
        outbox, _, answers, _ = self.mount()
        answers.lose("dir_create", ran=False, times=2)
        _, made = outbox.submit(lambda seq: Mkdir(seq, f"{ROOT}/d", DIR), waits=True)
        self.assertTrue(self.failureResultOf(made, RemoteFailure).value.unknown)
        self.assertEqual(outbox.backlog().entries, 0)

    def test_a_change_queued_behind_an_outage_is_withdrawn_with_its_program(self) -> None:
        """
        A change its caller waits for, queued behind entries the sender
        holds through an outage, whose program stops waiting (the bridge's
        timeout abandons its ticket): it is taken back, fails C{EIO}, and is
        never sent, while the held entry goes once the data plane is back.
        """
        outbox, _, answers, _ = self.mount()
        answers.down = True
        _, held = outbox.submit(lambda seq: Mkdir(seq, f"{ROOT}/held", DIR), waits=False)
        self.assertTrue(outbox.holding)
        ticket = OpTicket()
        remote = Remote(answers, recorder=outbox)
        queued = run_with_ticket(
            ticket,
            partial(remote.dir_create, mode=0o755, uid=1000, gid=1000, session_id=None),
            f"{ROOT}/late",
        )
        self.assertNoResult(queued)
        ticket.abandon()
        self.assertEqual(self.failureResultOf(queued, RemoteFailure).value.errno, errno.EIO)
        answers.down = False
        outbox.reconnected()
        self.successResultOf(held)
        self.assertEqual(outbox.backlog().entries, 0)
        self.assertEqual(self.check.errno("head_file", path=f"{ROOT}/late"), WireErrno.ENOENT)

    def test_a_caller_held_through_an_outage_stalls_until_answered(self) -> None:
        """
        The sender holds an entry sent for a caller that does not wait (no
        connection): the stall callable is called once, and ended once it
        is answered.
        """
        outbox, _, answers, _ = self.mount()
        stalls: list[str] = []

        def stall(why: str) -> Callable[[], None]:
            stalls.append(why)
            return lambda: stalls.append("ended")

        outbox.on_held(stall)
        answers.down = True
        _, outcome = outbox.submit(lambda seq: Mkdir(seq, f"{ROOT}/d", DIR), waits=False)
        self.assertNoResult(outcome)
        self.assertEqual(len(stalls), 1)
        answers.down = False
        outbox.reconnected()
        self.successResultOf(outcome)
        self.assertEqual(stalls[1:], ["ended"])

    def test_giving_up_waits_for_changes_answered_as_usual(self) -> None:
        """
        Shutdown gives up only on entries that came back without an answer:
        one on its way as usual is still answered, and its caller told.
        """
        outbox, _, answers, _ = self.mount()
        answers.hold("dir_create")
        _, outcome = outbox.submit(lambda seq: Mkdir(seq, f"{ROOT}/d", DIR), waits=False)
        outbox.give_up_resends("the mount is stopping")
        self.assertNoResult(outcome)
        answers.release()
        self.assertEqual(self.successResultOf(outcome).kind, "dir")
        self.assertEqual(outbox.backlog().entries, 0)

    def test_giving_up_leaves_the_entry_for_the_next_mount(self) -> None:
        """
        Shutdown gives up on an entry held for a caller: the caller's
        Deferred fails (unknown outcome), the entry stays unsettled, and the
        next mount on the cache sends it.
        """
        outbox, _, answers, _ = self.mount()
        answers.down = True
        made, outcome = outbox.submit(lambda seq: Mkdir(seq, f"{ROOT}/d", DIR), waits=False)
        outbox.give_up_resends("the mount is stopping")
        self.assertTrue(self.failureResultOf(outcome, RemoteFailure).value.unknown)
        outbox.stop()
        second, _, _, replay = self.mount()
        self.assertEqual([entry.seq for entry in replay.unsettled], [made.seq])
        self.successResultOf(second.settled(made.seq))
        self.assertEqual(self.check.ok("head_file", path=f"{ROOT}/d")["kind"], "dir")
