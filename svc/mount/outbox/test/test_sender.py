"""
Tests for L{svc.mount.outbox.sender} against the real data-plane service
(in process): entries of every kind go in order; answers lost with the
connection are sent again and applied once; an outage is held and
retried; refusals reach the source; commits upload their held chunks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
from twisted.internet.defer import Deferred, succeed
from twisted.trial.unittest import SynchronousTestCase

from svc.chunking import ChunkRef, chunk_hash
from svc.dataplane.test.test_service_support import ServiceFixture
from svc.mount.core.errors import RemoteFailure
from svc.mount.outbox.entries import (
    Commit,
    Entry,
    Link,
    Mkdir,
    Mknod,
    Owner,
    Rename,
    Rmdir,
    SetAttributes,
    Symlink,
    Unlink,
)
from svc.mount.outbox.held_chunks import HeldChunks, new_chunks
from svc.mount.outbox.log import OutboxLog
from svc.mount.outbox.sender import DEFAULT_BACKOFF, OutboxSender, Unsendable
from svc.mount.remote.data_plane import Remote
from svc.mount.test.test_fs_support import AGENT, HeldAnswers
from svc.testing.local_connection import LocalConnection
from svc.wire.errno import WireErrno

ROOT = f"/{AGENT.agent_id}"
FILE = Owner(0o100644, 1000, 1000)
DIR = Owner(0o40755, 1000, 1000)


def refs(*pieces: bytes) -> tuple[ChunkRef, ...]:
    """The chunk list of C{pieces}, in order."""
    out, offset = [], 0
    for piece in pieces:
        out.append(ChunkRef(offset, len(piece), chunk_hash(piece)))
        offset += len(piece)
    return tuple(out)


class LogSource:
    """
    The sender's source as the mount will be: a real outbox log and held
    chunks; answers and refusals settle their entries and are recorded.
    """

    def __init__(self, root: Path) -> None:
        self.log, _ = OutboxLog.open(root / "log")
        self.held, _ = HeldChunks.open(root / "chunks", {})
        self.answers: list[tuple[int, Any]] = []
        self.refusals: list[tuple[int, RemoteFailure]] = []
        self.holds: list[RemoteFailure] = []
        self.ready: Deferred[None] = succeed(None)

    @property
    def outbox_id(self) -> bytes:
        return self.log.outbox_id

    def settled_through(self) -> int:
        return self.log.settled_through()

    def held_chunk(self, name: str) -> bytes | None:
        return self.held.read(name)

    def answered(self, entry: Entry, answer: Any) -> None:
        self.answers.append((entry.seq, answer))
        self.settle(entry)

    def refused(self, entry: Entry, failure: RemoteFailure) -> None:
        self.refusals.append((entry.seq, failure))
        self.settle(entry)

    def gave_up(self, entry: Entry, failure: RemoteFailure, *, resent: bool) -> bool:
        return False

    def held_back(self, failure: RemoteFailure) -> None:
        self.holds.append(failure)

    def resend_ready(self) -> Deferred[None]:
        return self.ready

    def settle(self, entry: Entry) -> None:
        self.log.settle(entry.seq)
        self.held.release(entry.seq)


class OutboxSenderTests(SynchronousTestCase):
    """One sender over one connection of the agent."""

    def setUp(self) -> None:
        self.service = ServiceFixture(self)
        self.addCleanup(self.service.close)
        self.connection = LocalConnection(self.service.service, AGENT, "outbox-1")
        self.answers = HeldAnswers(self.connection)
        self.source = LogSource(Path(self.mktemp()))
        self.addCleanup(self.source.log.close)
        self.sender = OutboxSender(
            Remote(self.answers), self.source, self.service.clock, session_id=lambda: None
        )
        self.addCleanup(self.sender.stop)
        self.check = self.service.agent(AGENT)

    def send(self, make: Any, data: dict[str, bytes] | None = None) -> Entry:
        """Append C{make(seq)} to the log (holding C{data} first) and to the sender."""
        log = self.source.log
        entry: Entry = make(log.settled_through() + 1 + len(log.unsettled()))
        if data:
            self.source.held.hold(entry.seq, data)
        log.append(lambda seq: entry)
        self.sender.append(entry)
        return entry

    def commit(self, seq: int, name: str, expected: int, *pieces: bytes) -> Commit:
        chunks = refs(*pieces)
        size = sum(len(piece) for piece in pieces)
        return Commit(seq, f"{ROOT}/{name}", expected, False, (), chunks, size, FILE, 7)

    def test_every_kind_goes_in_order(self) -> None:
        """Every kind of entry is applied, in order, and settled; the log is left empty."""
        self.send(lambda seq: Mkdir(seq, f"{ROOT}/d", DIR))
        self.send(
            lambda seq: self.commit(seq, "d/f", 0, b"hello"), {chunk_hash(b"hello"): b"hello"}
        )
        self.send(lambda seq: Link(seq, f"{ROOT}/d/h", existing=f"{ROOT}/d/f"))
        self.send(lambda seq: Symlink(seq, f"{ROOT}/s", "d/f", 1000, 1000))
        self.send(lambda seq: Mknod(seq, f"{ROOT}/fifo", Owner(0o10600, 0, 0), 0))
        self.send(lambda seq: SetAttributes(seq, f"{ROOT}/d/f", mode=0o600))
        self.send(lambda seq: Rename(seq, f"{ROOT}/d/f", f"{ROOT}/g"))
        self.send(lambda seq: Unlink(seq, f"{ROOT}/d/h"))
        self.send(lambda seq: Rmdir(seq, f"{ROOT}/d"))
        self.successResultOf(self.sender.drained())
        self.assertEqual([seq for seq, _ in self.source.answers], list(range(1, 10)))
        self.assertEqual(self.source.refusals, [])
        head = self.check.ok("head_file", path=f"{ROOT}/g")
        self.assertEqual((head["size"], head["mode"] & 0o7777), (5, 0o600))
        self.assertEqual(self.check.ok("readlink", path=f"{ROOT}/s")["target"], "d/f")
        self.assertEqual(self.check.errno("head_file", path=f"{ROOT}/d"), WireErrno.ENOENT)
        self.assertEqual(self.source.log.unsettled(), ())
        self.assertEqual(self.source.held.held(), frozenset())

    def test_answers_lost_after_running_are_applied_once(self) -> None:
        """
        The connection is lost with the answers of entries that ran: they
        are sent again at once, in order, and answered as the first time;
        the file has one version per commit, not two.
        """
        self.answers.hold("manifest_put", "dir_create")
        self.send(lambda seq: Mkdir(seq, f"{ROOT}/d", DIR))
        self.send(lambda seq: self.commit(seq, "d/f", 0))
        self.send(lambda seq: self.commit(seq, "d/f", 1))
        self.answers.release(lost=True)
        self.successResultOf(self.sender.drained())
        self.assertEqual(self.source.holds, [])
        self.assertEqual(self.source.refusals, [])
        versions = [answer.version for seq, answer in self.source.answers if seq > 1]
        self.assertEqual(versions, [1, 2])
        self.assertEqual(self.check.ok("head_file", path=f"{ROOT}/d/f")["version"], 2)

    def test_an_outage_is_held_and_retried(self) -> None:
        """While no connection can be had, nothing is refused; sending resumes after it."""
        self.answers.down = True
        self.send(lambda seq: Mkdir(seq, f"{ROOT}/a", DIR))
        self.send(lambda seq: Mkdir(seq, f"{ROOT}/a/b", DIR))
        for _ in range(5):
            self.service.clock.advance(DEFAULT_BACKOFF.maximum)
        self.assertEqual((self.source.answers, self.source.refusals), ([], []))
        self.assertEqual(self.sender.unanswered, 2)
        self.answers.down = False
        self.service.clock.advance(DEFAULT_BACKOFF.maximum)
        self.successResultOf(self.sender.drained())
        self.assertEqual([seq for seq, _ in self.source.answers], [1, 2])

    def test_a_lost_entry_goes_again_when_the_last_in_flight_is_answered(self) -> None:
        """
        One entry's answer is lost while the entry after it is answered
        (the last to come back): the lost one is sent again all the same.
        """
        self.answers.hold("dir_create", "symlink")
        self.send(lambda seq: Mkdir(seq, f"{ROOT}/d", DIR))
        self.send(lambda seq: Symlink(seq, f"{ROOT}/s", "d", 1000, 1000))
        self.answers.release(lost=["dir_create"])
        self.successResultOf(self.sender.drained())
        self.assertEqual(sorted(seq for seq, _ in self.source.answers), [1, 2])
        self.assertEqual(self.connection.calls.count("dir_create"), 2)

    def test_a_second_loss_waits_out_a_pause(self) -> None:
        """
        An entry lost again on its resend is held back (the source told)
        and sent after a pause; the answer ends the pauses.
        """
        self.answers.lose("dir_create", ran=False, times=2)
        self.send(lambda seq: Mkdir(seq, f"{ROOT}/d", DIR))
        self.assertEqual((self.source.answers, len(self.source.holds)), ([], 1))
        self.assertTrue(self.sender.holding)
        self.service.clock.advance(DEFAULT_BACKOFF.delay(1))
        self.successResultOf(self.sender.drained())
        self.assertFalse(self.sender.holding)
        self.assertEqual([seq for seq, _ in self.source.answers], [1])

    def test_an_entry_the_source_takes_back_is_not_sent_again(self) -> None:
        """
        The source takes back an entry that came back without an answer
        (a caller that waits): it is not sent again; the others are.
        """
        taken: list[tuple[int, bool]] = []

        def gave_up(entry: Entry, failure: RemoteFailure, *, resent: bool) -> bool:
            taken.append((entry.seq, resent))
            return entry.seq == 1

        self.source.gave_up = gave_up  # type: ignore[method-assign]
        self.answers.hold("dir_create")
        self.send(lambda seq: Mkdir(seq, f"{ROOT}/a", DIR))
        self.send(lambda seq: Mkdir(seq, f"{ROOT}/b", DIR))
        self.answers.release(lost=True)
        self.successResultOf(self.sender.drained())
        self.assertEqual(taken, [(1, False), (2, False)])
        self.assertEqual([seq for seq, _ in self.source.answers], [2])
        self.assertEqual(self.connection.calls.count("dir_create"), 3)

    def test_what_came_back_waits_until_the_source_is_ready(self) -> None:
        """
        Entries whose answers were lost, and those appended after them, are
        sent again only once the source says so (the commits sent beside
        them answered first).
        """
        self.source.ready = Deferred()
        self.answers.hold("dir_create")
        self.send(lambda seq: Mkdir(seq, f"{ROOT}/a", DIR))
        self.answers.release(lost=True)
        self.send(lambda seq: Mkdir(seq, f"{ROOT}/b", DIR))
        self.assertEqual(self.connection.calls, ["dir_create"])
        self.assertTrue(self.sender.holding)
        self.source.ready.callback(None)
        self.successResultOf(self.sender.drained())
        self.assertEqual([seq for seq, _ in self.source.answers], [1, 2])

    def test_a_refusal_reaches_the_source_and_the_rest_goes_on(self) -> None:
        """A commit the compare-and-swap refuses is the source's to reconcile; later entries run."""
        self.send(lambda seq: self.commit(seq, "f", 5))
        self.send(lambda seq: Mkdir(seq, f"{ROOT}/after", DIR))
        self.successResultOf(self.sender.drained())
        [(seq, failure)] = self.source.refusals
        self.assertEqual((seq, failure.wire), (1, WireErrno.ESTALE))
        self.assertEqual([seq for seq, _ in self.source.answers], [2])

    def test_a_commit_uploads_its_new_chunks_first(self) -> None:
        """The chunks a commit adds to its base go up before its put, from the held chunks."""
        entry = self.send(
            lambda seq: self.commit(seq, "f", 0, b"one", b"two"),
            {chunk_hash(b"one"): b"one", chunk_hash(b"two"): b"two"},
        )
        self.successResultOf(self.sender.drained())
        self.assertEqual(self.connection.calls, ["chunk_put", "chunk_put", "manifest_put"])
        self.assertEqual(len(new_chunks(entry)), 2)
        manifest = self.check.ok("manifest_get", path=f"{ROOT}/f")
        self.assertEqual(manifest["size"], 6)

    def test_a_commit_whose_chunk_is_not_held_is_refused_unsent(self) -> None:
        """A new chunk missing from the cache disk: the entry is refused, nothing is sent."""
        self.send(lambda seq: self.commit(seq, "f", 0, b"lost"))
        self.successResultOf(self.sender.drained())
        [(_, failure)] = self.source.refusals
        self.assertIsInstance(failure, Unsendable)
        self.assertEqual(self.connection.calls, [])

    def test_a_chained_commit_is_not_sent(self) -> None:
        """A commit whose expected version is an earlier answer's is refused unsent (for now)."""
        self.send(lambda seq: attrs.evolve(self.commit(seq, "f", 0), chained=True))
        self.successResultOf(self.sender.drained())
        [(_, failure)] = self.source.refusals
        self.assertIsInstance(failure, Unsendable)
        self.assertEqual(self.connection.calls, [])

    def test_a_long_run_of_immediate_answers_does_not_recurse(self) -> None:
        """Two thousand entries answered inside their own sends go out in order."""
        for number in range(2000):
            self.send(lambda seq, n=number: Mkdir(seq, f"{ROOT}/d{n}", DIR))
        self.successResultOf(self.sender.drained())
        self.assertEqual([seq for seq, _ in self.source.answers], list(range(1, 2001)))

    def test_the_window_bounds_what_is_in_flight(self) -> None:
        """No more than the window's entries are sent before answers come back."""
        self.sender = OutboxSender(
            Remote(self.answers), self.source, self.service.clock, session_id=lambda: None, window=2
        )
        self.answers.hold("dir_create")
        for name in "abcd":
            self.send(lambda seq, name=name: Mkdir(seq, f"{ROOT}/{name}", DIR))
        self.assertEqual(self.connection.calls, ["dir_create", "dir_create"])
        self.answers.release()
        self.successResultOf(self.sender.drained())
        self.assertEqual(len(self.source.answers), 4)
