"""
Whether the program behind a file-system operation still waits for it.

The bridge gives an operation at most its timeout, then answers the program
C{EIO} (``docs/specifications/mount-runtime.md`` section 2); the operation
itself goes on in the reactor. One that was waiting for the namespace lock
(behind a change the data plane has not answered) would then take effect
later: a directory made, or a file created, minutes after its program was
told it failed -- a lock file, say, that then stops every later run of that
program. So the bridge runs each operation with an L{OpTicket} and abandons
the ticket when it answers C{EIO} for want of time; the namespace lock's
waits (L{unless_abandoned}) end with C{EIO} for an abandoned ticket, before
the operation has done anything.

The ticket travels in a context variable: Twisted runs a coroutine
(C{Deferred.fromCoroutine}) in a copy of the context it was started in,
across all its awaits, so an operation's coroutine sees the ticket the
bridge set when it started it, and nothing else does. An operation run
without one (a posted release, a write-back the reactor starts by itself,
the file system's unit tests) is never abandoned.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, TypeVar

from twisted.internet.defer import Deferred, maybeDeferred, succeed
from twisted.python.failure import Failure

from svc.mount.core.errors import FSError

T = TypeVar("T")


class OpTicket:
    """One operation's program: waiting for the answer, or gone (L{abandon})."""

    def __init__(self) -> None:
        self.abandoned = False
        self._waiters: list[Deferred[None]] = []

    def abandon(self) -> None:
        """The program was answered without this operation: it must not start now."""
        self.abandoned = True
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.callback(None)

    def when_abandoned(self) -> Deferred[None]:
        """Fires once L{abandon} is called (at once if it was); cancellable."""
        if self.abandoned:
            return succeed(None)
        waiter: Deferred[None] = Deferred(self._forget)
        self._waiters.append(waiter)
        return waiter

    def _forget(self, waiter: Deferred[None]) -> None:
        if waiter in self._waiters:
            self._waiters.remove(waiter)


_CURRENT: ContextVar[OpTicket | None] = ContextVar("svc_mount_op_ticket", default=None)


def current_ticket() -> OpTicket | None:
    """The ticket of the operation running in this context, if any."""
    return _CURRENT.get()


def run_with_ticket(ticket: OpTicket, f: Callable[..., Any], *args: Any) -> Deferred[Any]:
    """C{f(*args)} (as a Deferred), its coroutines seeing C{ticket} as theirs."""
    token = _CURRENT.set(ticket)
    try:
        return maybeDeferred(f, *args)
    finally:
        _CURRENT.reset(token)


async def unless_abandoned(waiting: Deferred[T], undo: Callable[[T], object] | None = None) -> T:
    """
    C{waiting}'s result; but if the current operation's ticket is abandoned
    first (or already was), C{waiting} is cancelled and C{FSError(EIO)}
    raised. C{waiting} must be cancellable without effect (a lock's pending
    acquire, a count's waiter). A result it already had when the ticket was
    found abandoned is given to C{undo} (a lock just acquired is released).
    """
    ticket = current_ticket()
    if ticket is None:
        return await waiting
    if ticket.abandoned:
        waiting.cancel()
        waiting.addCallbacks(undo or _ignore, _ignore)
        raise _gone()
    if waiting.called:
        # Already there (a free lock, nothing in flight): nothing to race.
        return await waiting
    first: Deferred[None] = Deferred()
    outcome: list[Any] = []

    def landed(result: object) -> None:
        if not first.called:
            outcome.append(result)
            first.callback(None)
        # else: cancelled after the ticket won; its CancelledError ends here

    waiting.addBoth(landed)
    abandoned = ticket.when_abandoned()
    abandoned.addCallbacks(_firing(first), lambda _: None)  # cancelled: waiting won
    await first
    if not outcome:
        waiting.cancel()
        raise _gone()
    abandoned.cancel()
    result = outcome[0]
    if isinstance(result, Failure):
        result.raiseException()
    return result  # type: ignore[no-any-return]


def _ignore(_: object) -> None:
    return None


def _firing(first: Deferred[None]) -> Callable[[object], None]:
    def fire(_: object) -> None:
        if not first.called:
            first.callback(None)

    return fire


def _gone() -> FSError:
    return FSError(errno.EIO, "the program stopped waiting for this operation (its timeout)")
