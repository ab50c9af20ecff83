"""
The order of one connection's requests (``dataplane-ops.md`` section 7):
which request may start when.

 - C{chunk_put} and C{ping} start at once (L{UNORDERED}).
 - C{chunk_get}, C{chunk_has} and C{statfs} wait until every earlier ordered
   request has ended, but hold up nothing (L{AFTER_EARLIER}).
 - Every other request is I{ordered}: it starts once the earlier ones have
   ended, and the next starts once it ends, or earlier when it gives way
   (L{Turn.release}): a lease request as soon as it is queued in the lease
   table.
 - A I{namespace change} (L{PIPELINED}: C{manifest_put}, C{manifest_delete},
   C{manifest_rename}, C{dir_create}, C{dir_remove}, C{setattr},
   C{symlink}, C{mknod}, C{link}) gives way once its checks have passed and
   its work is queued in the tenant's database, where everything submitted
   later runs after it (L{svc.store.tenant.TenantStorage.manifest_put}'s
   C{queued}; the other changes are queued before the store returns them).
   Only a namespace change may start while such changes are still
   finishing: any other request waits until they have ended. So a stream
   of changes (the closes of many small files, C{rm -r}, C{tar x}'s
   attribute changes) reaches the database together and shares its
   transactions (group commit), while every request still sees the effects
   of the changes before it (a later change through the database's order;
   any other request because it starts after they ended, their pushes
   sent), as if the changes had run one at a time.

A request given up while it waits for its turn takes nothing (L{Running}).

Giving the order back starts the next request at once, inside the call that
gave it back; a namespace change started so may give way in turn before it
waits for anything. So the order is given back through a trampoline
(L{RequestOrder._give_back}): a give-back made while another is running is
done by that one once the request it started has returned, and a stream of
changes ready at the same moment starts one after the other rather than each
inside the previous one's call (hundreds deep: Python's stack overflowed).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred, DeferredLock, succeed
from twisted.python.failure import Failure

from svc.wire.ops import Op

UNORDERED = frozenset({Op.CHUNK_PUT, Op.PING})
"""Requests that start at once."""

AFTER_EARLIER = frozenset({Op.CHUNK_GET, Op.CHUNK_HAS, Op.STATFS})
"""Requests that wait for the earlier ordered ones and hold up nothing."""

PIPELINED = frozenset(
    {
        Op.MANIFEST_PUT,
        Op.MANIFEST_DELETE,
        Op.MANIFEST_RENAME,
        Op.DIR_CREATE,
        Op.DIR_REMOVE,
        Op.SETATTR,
        Op.SYMLINK,
        Op.MKNOD,
        Op.LINK,
    }
)
"""The namespace changes: ordered requests that, once they gave way, let only their kind start."""


class _Finishing:
    """The pipelined requests that gave way and have not ended yet."""

    def __init__(self) -> None:
        self._turns: set[Turn] = set()
        self._waiters: list[Deferred[None]] = []

    def add(self, turn: Turn) -> None:
        self._turns.add(turn)

    def discard(self, turn: Turn) -> None:
        self._turns.discard(turn)
        if not self._turns:
            waiters, self._waiters = self._waiters, []
            for waiter in waiters:
                waiter.callback(None)

    def settled(self) -> Deferred[None]:
        """Fires once none is finishing (at once if none is); cancellable."""
        if not self._turns:
            return succeed(None)

        def cancelled(waiter: Deferred[None]) -> None:
            self._waiters.remove(waiter)

        waiter: Deferred[None] = Deferred(cancelled)
        self._waiters.append(waiter)
        return waiter


class Turn:
    """
    One request's place in the order: C{ready} fires when it may start.
    L{release} lets the next request start (called early by a request that
    gives way); L{end} marks the request over. Both are idempotent, and a
    wait cancelled before C{ready} fired took nothing.
    """

    def __init__(
        self,
        ready: Deferred[Any],
        release: Callable[[], object] | None = None,
        finishing: _Finishing | None = None,
    ) -> None:
        self.ready = ready
        self._release: Callable[[], object] | None = None
        self._finishing = finishing
        if release is not None:
            ready.addCallback(self._taken, release)

    def _taken(self, result: object, release: Callable[[], object]) -> object:
        self._release = release
        return result

    def release(self) -> None:
        """Let the next request start; a pipelined one counts as finishing until L{end}."""
        release, self._release = self._release, None
        if release is None:
            return
        if self._finishing is not None:
            # Before the release: it may start the next request at once.
            self._finishing.add(self)
        release()

    def end(self) -> None:
        """The request is over (however it ended)."""
        release, self._release = self._release, None
        if release is not None:
            release()
        if self._finishing is not None:
            self._finishing.discard(self)


class Running:
    """
    One request the protocol may give up on (its timeout, or the
    connection closing). Giving up stops a request still waiting for its
    turn: it never runs. One that has started runs to its end, holding its
    turn until then (or until it gives way), so a later request never
    overtakes its work.
    """

    def __init__(self) -> None:
        self.turn: Turn | None = None

    def give_up(self) -> None:
        turn = self.turn
        if turn is not None and not turn.ready.called:
            turn.ready.cancel()


class RequestOrder:
    """
    The order of one connection's requests; see the module docstring.

    @param after: given, no ordered request starts before it fires (the
        agent's closed connections still running theirs: L{DrainFences}).
    """

    def __init__(self, after: Deferred[None] | None = None) -> None:
        self._lock = DeferredLock()
        self._finishing = _Finishing()
        self._giving_back = False
        self._owed = 0  # give-backs asked for while one was running
        if after is not None:
            self._lock.acquire()  # free: taken at once, given back when the fence opens
            after.addBoth(lambda _: self._give_back())

    def enter(self, op: Op) -> Turn:
        """The turn of a request of C{op}, received now."""
        if op in UNORDERED:
            return Turn(succeed(None))
        acquired = self._lock.acquire()
        if op in PIPELINED:
            return Turn(acquired, self._give_back, self._finishing)
        ready = acquired.addCallback(self._after_finishing)
        if op in AFTER_EARLIER:
            return Turn(ready.addCallback(lambda _: self._give_back()))
        return Turn(ready, self._give_back)

    def drained(self) -> Deferred[None]:
        """Fires once every request received so far has ended (or was given up)."""
        ready = self._lock.acquire().addCallback(self._after_finishing)
        return ready.addCallback(lambda _: self._give_back())

    def _give_back(self) -> None:
        """
        Release the order (see the module docstring): at once, unless a
        release is running further up this call, which then does it.
        """
        self._owed += 1
        if self._giving_back:
            return
        self._giving_back = True
        try:
            while self._owed:
                self._owed -= 1
                self._lock.release()
        finally:
            self._giving_back = False

    def _after_finishing(self, lock: object) -> Deferred[None] | None:
        """Holding the order, wait for the pipelined requests still finishing."""
        settled = self._finishing.settled()
        if settled.called:
            return None

        def given_up(failure: Failure) -> Failure:
            # Cancelled while waiting for them: give the order back.
            self._give_back()
            return failure

        return settled.addErrback(given_up)
