"""
The mount's namespace lock, aware of commits in flight.

Operations that change names run one at a time, so a path computed from the
inode table is still the server's path when the request arrives. A
write-back's commit is sent under the lock, but its answer is awaited
without it (``docs/specifications/mount-consistency.md`` section 2.5): the
data plane runs one connection's namespace requests in arrival order
(``dataplane-ops.md`` section 7), so any request sent after the commit sees
it. Until the answer, though, the mount's own picture of the file (a new
file still I{pending}, its data-plane inode, its version) is not yet
updated; so an operation that may touch such a file waits until no commit
is in flight:

 - C{async with lock:} holds the lock with no commit in flight (every
   namespace change, a listing);
 - C{async with lock.sending_commit():} holds the lock to send a commit
   (then counted with L{NamespaceLock.commit_sent} until the returned
   callable is called, once the mount's picture is updated from its
   answer). It first waits while an operation waits for the commits in
   flight to settle, so a steady stream of closes cannot keep a namespace
   change waiting;
 - C{async with lock.beside_commits():} holds the lock while commits may be
   in flight, without that wait: only for work that cannot touch a file
   whose commit is in flight and must not wait for one (creating a new file,
   whose name is free; saving a conflict copy under a fresh name, which a
   commit in flight does itself).

An C{unlink}, C{rmdir} or C{rename} may likewise return once its request is
sent (a I{handed-off} change, ``mount-consistency.md`` section 2.6), its
answer counted with L{NamespaceLock.hand_off_sent}. The mount's picture
already shows the change; what waits for the answer is the directories'
times as the server sets them (and, should the server refuse, the mount's
picture is corrected). So every exclusive holder (C{async with lock:}) also
waits until no handed-off change is in flight, while C{async with
lock.handing_off():} -- the next removal or rename -- waits only for
commits, so a stream of them (C{rm -r}, atomic saves) is pipelined.
Commits and creates go on beside handed-off changes in flight: the server
runs them in arrival order.

A handed-off rename may even go out beside commits in flight (an atomic
save's rename right behind its temporary file's commit, ``mount-consistency.md``
section 2.6): it is counted for the node it moves too
(C{hand_off_sent(ino)}), and a write-back of that node waits for
L{NamespaceLock.moves_settled} before it computes the path it commits at, so
a refused rename's correction comes first.

A handed-off rename, unlink or rmdir is counted for the name it takes its
node away from, too (C{hand_off_sent(leaving=(folder, name))}): an
operation that would give that name to another node (a create, a link, a
rename onto it) first waits for L{NamespaceLock.vacated}, so a change
whose answer was lost can still be sent again, the name being nobody
else's meanwhile (``mount-consistency.md`` section 2.6, "An answer that
never came").

While such a change cannot be settled because the server cannot be asked
(L{NamespaceLock.stalled}: the data plane out of reach), an operation that
would wait for it -- an exclusive holder, or one waiting for a name to be
L{vacated} -- fails at once with C{EIO} instead, as do those already
waiting: every one of them needs the server, and each would otherwise hold
one of the mount's few FUSE workers until its timeout, one after another.

A close answered on its FUSE thread (``mount-consistency.md`` section
2.5) has returned before its commit is sent: its hand-off starts on the
reactor before any later request, but may wait there (for the file's lock,
an upload) before sending. It is counted from that start until its commit is
sent or its write-back ends (L{NamespaceLock.close_answered}), and every
namespace change -- an exclusive holder, C{handing_off()}, a rename sent
with C{sending_commit(after_closes=True)} -- first waits until none is
counted, before it counts as waiting itself (so the commit it waits for can
still be sent). It then finds that commit in flight, as it would have had
the close waited for the sending.

Every wait for the lock also ends, with C{EIO}, once the program behind the
operation has been answered without it (its bridge timeout:
L{svc.mount.core.op_ticket}), so an operation never takes effect after its
program was told it failed.
"""

from __future__ import annotations

import errno
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from types import TracebackType
from typing import TypeVar

from twisted.internet.defer import Deferred, DeferredLock, succeed

from svc.mount.core.errors import FSError
from svc.mount.core.op_ticket import unless_abandoned
from svc.mount.remote.in_flight import InFlight

K = TypeVar("K")


class NamespaceLock:
    """See the module docstring."""

    def __init__(self) -> None:
        self._lock = DeferredLock()
        self._commits = InFlight()
        self._unanswered_commits = InFlight()
        self._handed_off = InFlight()
        self._moving: dict[int, InFlight] = {}
        self._leaving: dict[tuple[int, str], InFlight] = {}
        self._exclusive_waiting = InFlight()
        self._unsent_closes = InFlight()
        self._stalls: list[str] = []
        self._stall_waiters: list[Deferred[None]] = []

    @property
    def locked(self) -> bool:
        """Whether some operation holds the lock (either way)."""
        return bool(self._lock.locked)

    @property
    def commits_in_flight(self) -> int:
        """Commits sent whose answers are not handled yet."""
        return self._commits.count

    @asynccontextmanager
    async def beside_commits(self) -> AsyncIterator[None]:
        """The lock alone: C{async with} it holds it, commits in flight or not."""
        await self._acquire()
        try:
            yield
        finally:
            self._lock.release()

    def close_answered(self) -> Callable[[], None]:
        """
        A close was answered before its commit is sent (its hand-off starts
        now); the returned callable (idempotent) says the commit is sent, or
        the write-back ended without sending.
        """
        return _counted(self._unsent_closes)

    async def _after_unsent_closes(self) -> None:
        """Returns once no close answered early waits to send its commit."""
        while self._unsent_closes.count:
            await unless_abandoned(self._unsent_closes.settled())

    @asynccontextmanager
    async def sending_commit(self, *, after_closes: bool = False) -> AsyncIterator[None]:
        """
        Hold the lock to send a commit (or, C{after_closes}, a rename beside
        the commits in flight, which first waits for the closes answered
        early to send theirs), after any operation already waiting.
        """
        if after_closes:
            await self._after_unsent_closes()
        while self._exclusive_waiting.count:
            await unless_abandoned(self._exclusive_waiting.settled())
        await self._acquire()
        try:
            yield
        finally:
            self._lock.release()

    @asynccontextmanager
    async def handing_off(self) -> AsyncIterator[None]:
        """
        Hold the lock with no commit in flight (handed-off changes in flight
        or not), after any exclusive operation already waiting.
        """
        await self._after_unsent_closes()
        while self._exclusive_waiting.count:
            await unless_abandoned(self._exclusive_waiting.settled())
        await self._acquire_with_none_in_flight(self._commits)
        try:
            yield
        finally:
            self._lock.release()

    def hand_off_sent(
        self, moved: int | None = None, *, leaving: tuple[int, str] | None = None
    ) -> Callable[[], None]:
        """
        One more handed-off change in flight (a rename of inode C{moved}, if
        given, counts for that inode too, and for the name C{leaving}, a
        folder's inode and a name, it moves it away from); the returned
        callable settles it (once).
        """
        settles = [_counted(self._handed_off)]
        if moved is not None:
            settles.append(_keyed(self._moving, moved))
        if leaving is not None:
            settles.append(_keyed(self._leaving, leaving))

        def settle() -> None:
            for one in reversed(settles):  # the node and the name first
                one()

        return settle

    def moving(self, ino: int) -> bool:
        """Whether a handed-off rename of inode C{ino} is in flight."""
        return ino in self._moving

    def moves_settled(self, ino: int) -> Deferred[None]:
        """Fires once no handed-off rename of inode C{ino} is in flight (at once when none is)."""
        moving = self._moving.get(ino)
        return moving.settled() if moving is not None else succeed(None)

    async def vacated(self, folder: int, name: str) -> None:
        """
        Returns once no handed-off rename moving a node away from C{name} in
        folder C{folder} is in flight (at once when none is).

        @raise FSError: C{EIO} while handed-off changes are L{stalled}.
        """
        while (leaving := self._leaving.get((folder, name))) is not None and leaving.count:
            await self._settled_unless_stalled(leaving)

    def stalled(self, why: str) -> Callable[[], None]:
        """
        A handed-off change cannot be settled now, for the reason C{why}
        (the server cannot be asked what became of it). Until the returned
        callable (idempotent) is called, waiting for handed-off changes
        fails with C{EIO} (module docstring).
        """
        self._stalls.append(why)
        waiters, self._stall_waiters = self._stall_waiters, []
        for waiter in waiters:
            if not waiter.called:
                waiter.callback(None)
        ended = False

        def end() -> None:
            nonlocal ended
            if not ended:
                ended = True
                self._stalls.remove(why)

        return end

    async def _settled_unless_stalled(self, kind: InFlight) -> None:
        """Returns once none of C{kind} is in flight; fails C{EIO} while stalled."""
        while kind.count:
            if self._stalls:
                raise FSError(
                    errno.EIO,
                    "an earlier change is not settled, and the data plane cannot be"
                    f" asked about it: {self._stalls[-1]}",
                )
            woken: Deferred[None] = Deferred()
            self._stall_waiters.append(woken)
            kind.settled().addCallback(_waking(woken))
            await unless_abandoned(woken)
            if woken in self._stall_waiters:
                self._stall_waiters.remove(woken)

    def hand_offs_settled(self) -> Deferred[None]:
        """Fires once no handed-off change is in flight (at once when none is)."""
        return self._handed_off.settled()

    @property
    def hand_offs_in_flight(self) -> int:
        """Handed-off changes whose answers are not handled yet."""
        return self._handed_off.count

    def commits_answered(self) -> Deferred[None]:
        """
        Fires once every commit in flight has its answer (at once when none
        lacks one; waiters in order). Commits not yet sent hold off
        meanwhile, as for an operation waiting for the lock
        (L{sending_commit}), so a stream of closes cannot keep it waiting:
        the outbox's sender sends a change whose answer was lost again only
        after this (L{svc.mount.outbox.outbox.Outbox.on_resend}), so a
        handed-off rename stays behind its file's commit, whose write-back
        sends a lost put again itself (unless a rename moved the file
        behind it).
        """
        if not self._unanswered_commits.count:
            return succeed(None)
        self._exclusive_waiting.add()

        def over(result: object) -> None:
            self._exclusive_waiting.done()

        answered = self._unanswered_commits.settled()
        answered.addBoth(over)
        return answered

    def commit_sent(self) -> CommitCount:
        """
        Count one more commit in flight, until the returned L{CommitCount}
        is called (idempotent); it lacks its answer until then, or until
        L{CommitCount.answered}.
        """
        return CommitCount(_counted(self._commits), _counted(self._unanswered_commits))

    async def __aenter__(self) -> NamespaceLock:
        """
        Hold the lock with no commit and no handed-off change in flight.

        @raise FSError: C{EIO} while handed-off changes are L{stalled}.
        """
        await self._after_unsent_closes()
        self._exclusive_waiting.add()
        try:
            await self._acquire_with_none_in_flight(self._commits, self._handed_off)
            return self
        finally:
            self._exclusive_waiting.done()

    async def _acquire(self) -> None:
        """Take the lock, unless the operation is abandoned meanwhile (then EIO)."""
        await unless_abandoned(self._lock.acquire(), lambda _: self._lock.release())

    async def _acquire_with_none_in_flight(self, *kinds: InFlight) -> None:
        """Take the lock at a moment when none of C{kinds} is in flight."""
        while True:
            for kind in kinds:
                if kind is self._handed_off:
                    await self._settled_unless_stalled(kind)
                else:
                    await unless_abandoned(kind.settled())
            await self._acquire()
            if all(kind.count == 0 for kind in kinds):
                return
            # One was sent while this waited for the lock.
            self._lock.release()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._lock.release()


def _waking(woken: Deferred[None]) -> Callable[[object], None]:
    """A callback that fires C{woken}, unless something else has already."""

    def wake(_: object) -> None:
        if not woken.called:
            woken.callback(None)

    return wake


class CommitCount:
    """One commit in flight (L{NamespaceLock.commit_sent}); calling it counts it settled."""

    def __init__(self, settle: Callable[[], None], answer: Callable[[], None]) -> None:
        self._settle = settle
        self.answered = answer
        """Its answer came (idempotent): L{NamespaceLock.commits_answered} waits no more."""

    def __call__(self) -> None:
        self.answered()
        self._settle()


def _counted(in_flight: InFlight) -> Callable[[], None]:
    """Count one more in C{in_flight}; the returned callable (idempotent) counts it done."""
    in_flight.add()
    settled = False

    def settle() -> None:
        nonlocal settled
        if not settled:
            settled = True
            in_flight.done()

    return settle


def _keyed(table: dict[K, InFlight], key: K) -> Callable[[], None]:
    """
    Count one more in C{table}'s entry for C{key} (made when missing); the
    returned callable (idempotent) counts it done, and drops the entry at
    zero.
    """
    entry = table.setdefault(key, InFlight())
    settle_one = _counted(entry)

    def settle() -> None:
        settle_one()
        if entry.count == 0 and table.get(key) is entry:
            del table[key]

    return settle
