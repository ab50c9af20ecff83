"""
The outbox as the mount's core uses it (``mount-outbox.md``): one log on the
cache disk, the chunks its commits hold, and the one sender, behind four
calls.

    outbox, replay = Outbox.open(cache / "outbox", reconciler, in_reactor)
    outbox.start(remote, reactor, session_id)     # reactor: sends the replay first
    entry = outbox.append(make, chunks)           # any thread: persisted on return
    await outbox.settled(entry.seq)               # reactor: the barrier

C{append} writes the entry (and the chunks it adds) before it returns, so a
killed mount loses nothing it was given, then hands the entry to the sender
on the reactor (C{in_reactor}). Answers and refusals go to the
L{Reconciler}, which brings the mount's picture in line, and then settle
the entry (its settle mark written, its held chunks released). L{Outbox.settled}
fires once every entry up to a seq is settled: C{fsync}, and a call that
waits for its answer, wait on it.

Threads: C{append} and L{backlog} may be called from any thread; the log and
the held chunks are guarded by the outbox's own lock, held only while they
change (a leaf lock: nothing else is taken under it). Everything else is
for the reactor thread.
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

import attrs
from twisted.internet.defer import Deferred, succeed

from svc.chunking import chunk_hash
from svc.mount.core.errors import RemoteFailure
from svc.mount.outbox.early import Backlog
from svc.mount.outbox.entries import Commit, Entry, superseded
from svc.mount.outbox.held_chunks import HeldChunks, new_chunks
from svc.mount.outbox.log import OutboxLog, Replay
from svc.mount.outbox.requests import tag_of
from svc.mount.outbox.sender import OutboxSender
from svc.mount.remote.data_plane import Remote
from svc.timers import TimerClock
from svc.wire.kinds import OutboxTag

E = TypeVar("E", bound=Entry)

INLINE_HELD_BYTES = 64 << 10
"""An entry adding at most this many chunk bytes carries them in its log
record (one write, nothing to delete when it settles); a bigger one's go
to the chunk files (L{HeldChunks})."""


@attrs.frozen
class _Outcome:
    """Where an entry sent for a caller (L{Outbox.submit}) ends, and whether the caller waits."""

    deferred: Deferred[Any]
    waits: bool


class Reconciler(Protocol):
    """Where settled entries' outcomes go: the mount's picture (reactor thread)."""

    def answered(self, entry: Entry, answer: Any) -> None:
        """C{entry} was applied; C{answer} is its decoded answer message."""

    def refused(self, entry: Entry, failure: RemoteFailure) -> None:
        """C{entry} was refused; it applied nothing."""


class Outbox:
    """See the module docstring."""

    def __init__(
        self,
        log: OutboxLog,
        held: HeldChunks,
        reconciler: Reconciler,
        in_reactor: Callable[[Callable[[], None]], object],
    ) -> None:
        self._log = log
        self._held = held
        self._reconciler = reconciler
        self._in_reactor = in_reactor
        self._lock = threading.Lock()
        self._content_bytes = 0
        self._stagings = 0  # the last staging's (negative) holder number
        self._refused = False
        self._stopped = False
        self._sender: OutboxSender | None = None
        self._early: list[Entry] = []  # appended before start
        self._waiters: list[tuple[int, Deferred[None]]] = []
        self._outcomes: dict[int, _Outcome] = {}  # entries sent for a caller
        self._lost: set[int] = set()  # those of them that came back without an answer
        self._on_held: Callable[[str], Callable[[], None]] | None = None
        self._resend_ready: Callable[[], Deferred[None]] = lambda: succeed(None)
        self._unhold: Callable[[], None] | None = None

    @classmethod
    def open(
        cls,
        root: Path,
        reconciler: Reconciler,
        in_reactor: Callable[[Callable[[], None]], object],
    ) -> tuple[Outbox, Replay, frozenset[str]]:
        """
        Open the outbox under C{root} (its log and held chunks), with what
        a previous mount left unsettled (to send first, L{start}) and the
        held chunks that replay needs and are missing.
        """
        log, replay = OutboxLog.open(root / "log")
        replaced = superseded(replay.unsettled)
        for seq in sorted(replaced):
            log.settle(seq)
        replay = attrs.evolve(
            replay, unsettled=tuple(e for e in replay.unsettled if e.seq not in replaced)
        )
        needs = {
            entry.seq: new_chunks(entry) - replay.held.get(entry.seq, {}).keys()
            for entry in replay.unsettled
        }
        held, missing = HeldChunks.open(root / "chunks", needs)
        outbox = cls(log, held, reconciler, in_reactor)
        outbox._early.extend(replay.unsettled)
        outbox._content_bytes = sum(e.size for e in replay.unsettled if isinstance(e, Commit))
        return outbox, replay, missing

    def start(
        self, remote: Remote, clock: TimerClock, session_id: Callable[[], str | None]
    ) -> None:
        """Start sending (reactor): what the log held first, in order, then each new entry."""
        self._sender = OutboxSender(remote, self, clock, session_id=session_id)
        early, self._early = self._early, []
        for entry in early:
            self._sender.append(entry)

    def stop(self) -> None:
        """Stop sending; the log keeps what is unsettled for the next mount."""
        self._stopped = True
        if self._sender is not None:
            self._sender.stop()
        self._log.close()
        self._give_up("the outbox is stopped", set(self._outcomes))

    # Reactor thread: changes sent for a caller, who is told the outcome.

    def submit(self, make: Callable[[int], E], *, waits: bool) -> tuple[E, Deferred[Any]]:
        """
        Append the entry C{make} builds (persisted on return, as
        L{append}) and have the sender send it after the entries before it
        (``mount-outbox.md`` section 6): the entry, and a L{Deferred} that
        fires with its decoded answer message, or fails with its refusal
        (L{RemoteFailure}); it settles as any entry the sender sends. An
        answer lost is sent again under the same tag, held through an
        outage, except for a caller that C{waits} (its program is not
        answered yet): its entry is taken back, failing C{EIO}, when it
        never reached the data plane, or when it is lost a second time
        (then it may have run: C{unknown}). After L{give_up_resends}, the
        L{Deferred}s of entries still unanswered fail C{EIO} (unknown) and
        the entries stay for the next mount.

        @raise OSError: the entry cannot be written, or the outbox is stopped.
        """
        entry = self.append(make, send=False)
        outcome: Deferred[Any] = Deferred()
        self._outcomes[entry.seq] = _Outcome(outcome, waits)
        self._send(entry)
        return entry, outcome

    def withdraw(self, entry: Entry, why: str) -> None:
        """
        The caller of L{submit} that waits for C{entry} stopped waiting
        (its program was answered without it): if the entry was never sent
        it is taken back, settled, and its L{Deferred} fails C{EIO} (C{why}),
        so it never takes effect after its program was told it failed.
        """
        pending = self._outcomes.get(entry.seq)
        if pending is None or self._sender is None or not self._sender.withdraw(entry):
            return
        self._take_back(entry, pending, RemoteFailure(errno.EIO, why))

    def gave_up(self, entry: Entry, failure: RemoteFailure, *, resent: bool) -> bool:
        """
        The sender's: C{entry} came back without an answer. One whose
        caller waits is taken back (L{submit}): settled, and its caller
        told the failure.
        """
        pending = self._outcomes.get(entry.seq)
        if pending is None:
            return False
        if not pending.waits or (failure.unknown and not resent):
            self._lost.add(entry.seq)
            return False
        unknown = failure.unknown or resent
        self._take_back(
            entry,
            pending,
            RemoteFailure(
                failure.errno, failure.message, failure.wire, failure.details, unknown=unknown
            ),
        )
        return True

    def _take_back(self, entry: Entry, pending: _Outcome, failure: RemoteFailure) -> None:
        """C{entry} will not be sent (again): settled, its caller told C{failure}."""
        del self._outcomes[entry.seq]
        self._lost.discard(entry.seq)
        self._settle(entry, refused=False)
        self._wake()
        pending.deferred.errback(failure)

    def on_held(self, stall: Callable[[str], Callable[[], None]]) -> None:
        """
        C{stall(reason)} is called when entries sent for a caller
        (L{submit}) come back without an answer once more (the data
        plane out of reach); the callable it returns, once they are all
        answered or refused.
        """
        self._on_held = stall

    def on_resend(self, ready: Callable[[], Deferred[None]]) -> None:
        """
        Entries whose answers were lost are sent again once C{ready()}
        fires: the mount's commits in flight answered
        (L{svc.mount.core.namespace_lock.NamespaceLock.commits_answered}), so
        an atomic save's rename sent again stays behind its file's commit.
        """
        self._resend_ready = ready

    def resend_ready(self) -> Deferred[None]:
        """The sender's: see L{on_resend}."""
        return self._resend_ready()

    def reconnected(self) -> None:
        """A new data-plane connection: entries waiting out a pause go now."""
        if self._sender is not None:
            self._sender.now()

    def give_up_resends(self, why: str) -> None:
        """
        Shutdown: the callers of L{submit} whose entries came back without
        an answer stop waiting (their entries fail C{EIO}, unknown, and stay
        unsettled for the next mount on the cache unless the sender gets
        their answers first). Entries answered as usual are waited for.
        """
        self._give_up(why, self._lost)

    def _give_up(self, why: str, seqs: set[int]) -> None:
        """The callers of C{seqs} stop waiting (see L{give_up_resends})."""
        for seq in sorted(seqs):
            self._lost.discard(seq)
            outcome = self._outcomes.pop(seq, None)
            if outcome is not None:
                outcome.deferred.errback(RemoteFailure(errno.EIO, why, unknown=True))
        self._unheld()

    def held_back(self, failure: RemoteFailure) -> None:
        """The sender's: entries came back without an answer and wait for a pause."""
        if self._lost and self._unhold is None and self._on_held is not None:
            self._unhold = self._on_held(str(failure))

    def _unheld(self) -> None:
        if not self._lost and self._unhold is not None:
            unhold, self._unhold = self._unhold, None
            unhold()

    # Any thread.

    def append(
        self,
        make: Callable[[int], E],
        chunks: Mapping[str, bytes] = {},
        *,
        send: bool = True,
        staged: int | None = None,
    ) -> E:
        """
        Persist the entry C{make} builds with the next seq (and C{chunks},
        the bytes it adds, first; or the chunks C{staged} with L{stage}),
        then hand it to the sender (C{OSError} when it cannot be written,
        or after L{stop}). Not C{send}: the caller sends the entry's
        request itself (tagged with L{tag}) and calls L{done} once it has
        seen it through; the entry is only replayed if the mount dies
        before that.
        """
        if self._stopped:
            raise OSError(errno.EBADF, "the outbox is stopped")
        carried = chunks if sum(map(len, chunks.values())) <= INLINE_HELD_BYTES else {}
        with self._lock:
            entry = self._log.append(
                lambda seq: self._holding(make(seq), {} if carried else chunks), carried
            )
            if staged is not None:
                self._held.transfer(staged, entry.seq)
            if isinstance(entry, Commit):
                self._content_bytes += entry.size
        if send:
            self._in_reactor(lambda: self._send(entry))
        return entry

    @property
    def holding(self) -> bool:
        """Reactor thread: whether the sender holds entries back (the data plane out of reach)."""
        return self._sender is not None and self._sender.holding

    @property
    def stopped(self) -> bool:
        """Whether L{stop} was called (nothing is appended or settled any more)."""
        return self._stopped

    def staging(self) -> int:
        """
        A new staging: chunks written one by one (L{stage}) before the
        entry that holds them is appended (L{append}'s C{staged}), so a big
        content is never whole in memory. L{unstage} if it is not appended.
        """
        with self._lock:
            self._stagings -= 1
            return self._stagings

    def stage(self, staging: int, name: str, data: bytes | memoryview) -> None:
        """Any thread: write chunk C{name} for C{staging} (at once, unless held already)."""
        with self._lock:
            self._held.hold(staging, {name: data})

    def unstage(self, staging: int) -> None:
        """Any thread: C{staging} will not be appended; its chunks go unless held."""
        with self._lock:
            self._held.release(staging)

    def tag(self, entry: Entry) -> OutboxTag:
        """The C{outbox} field of C{entry}'s request."""
        return tag_of(self.outbox_id, entry.seq, min(self.settled_through(), entry.seq - 1))

    def done(self, entry: Entry) -> None:
        """
        Reactor thread: an entry appended without C{send} was seen through by its caller
        (answered, refused and dealt with, or given up on): settle it.
        After L{stop} nothing settles (the next mount replays the entry).
        """
        if self._stopped:
            return
        self._settle(entry, refused=False)
        if self._waiters:  # reactor thread: no round trip through callFromThread
            self._wake()

    def _holding(self, entry: E, chunks: Mapping[str, bytes]) -> E:
        if chunks:
            self._held.hold(entry.seq, chunks)
        return entry

    def backlog(self) -> Backlog:
        """What is unsettled, for the early-return rule."""
        with self._lock:
            return Backlog(len(self._log.unsettled()), self._content_bytes, self._refused)

    # Reactor thread.

    def _send(self, entry: Entry) -> None:
        if self._sender is None:
            self._early.append(entry)
        else:
            self._sender.append(entry)

    def settled(self, seq: int) -> Deferred[None]:
        """Fires once every entry up to C{seq} is settled (at once if it is)."""
        if self.settled_through() >= seq:
            return succeed(None)
        waiter: Deferred[None] = Deferred()
        self._waiters.append((seq, waiter))
        return waiter

    # The sender's source.

    @property
    def outbox_id(self) -> bytes:
        """The outbox's id."""
        return self._log.outbox_id

    def settled_through(self) -> int:
        """The highest seq up to which every entry is settled."""
        with self._lock:
            return self._log.settled_through()

    def held_chunk(self, name: str) -> bytes | None:
        """A held chunk's verified bytes (from an entry's record or the chunk files), or L{None}."""
        with self._lock:
            carried = self._log.held(name)
            if carried is not None and chunk_hash(carried) == name:
                return carried
            return self._held.read(name)

    def answered(self, entry: Entry, answer: Any) -> None:
        """
        The sender's: C{entry} was applied (reconciled, or given to the
        caller of L{submit}, then settled).
        """
        outcome = self._outcomes.pop(entry.seq, None)
        self._lost.discard(entry.seq)
        if outcome is None:
            self._reconciler.answered(entry, answer)
        self._settle(entry, refused=False)
        self._wake()
        if outcome is not None:
            self._unheld()
            outcome.deferred.callback(answer)

    def refused(self, entry: Entry, failure: RemoteFailure) -> None:
        """
        The sender's: C{entry} was refused. It is reconciled before it
        settles, so the reconciler may still read its held chunks (and
        append an entry holding them: a conflict copy).
        """
        outcome = self._outcomes.pop(entry.seq, None)
        self._lost.discard(entry.seq)
        if outcome is None:
            self._reconciler.refused(entry, failure)
        self._settle(entry, refused=True)
        self._wake()
        if outcome is not None:
            self._unheld()
            outcome.deferred.errback(failure)

    def held_chunks_of(self, entry: Entry) -> dict[str, bytes] | None:
        """
        The verified bytes of every chunk C{entry} holds (L{new_chunks}),
        or L{None} when one is missing or damaged.
        """
        found: dict[str, bytes] = {}
        for name in new_chunks(entry):
            data = self.held_chunk(name)
            if data is None:
                return None
            found[name] = data
        return found

    def _settle(self, entry: Entry, *, refused: bool) -> None:
        with self._lock:
            self._log.settle(entry.seq)
            self._held.release(entry.seq)
            if isinstance(entry, Commit):
                self._content_bytes -= entry.size
            self._refused = refused

    def _wake(self) -> None:
        through = self.settled_through()
        ready = [waiter for seq, waiter in self._waiters if seq <= through]
        self._waiters = [(seq, waiter) for seq, waiter in self._waiters if seq > through]
        for waiter in ready:
            waiter.callback(None)
