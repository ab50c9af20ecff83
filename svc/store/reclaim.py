"""
When a tenant's collectable chunks are deleted: soon after a change makes
some, one pass at a time (``docs/specifications/storage-engine.md``,
"Reclaim").

L{ReclaimSchedule} runs an injected pass (in production
L{svc.store.collection.Collection.reclaim_pass}) on the next reactor turn
after L{ReclaimSchedule.request}, never two at once; requests made while a
pass runs are served by one more pass after it. A pass that leaves chunks it
may not delete yet (written or touched within the safety margin, or whose
deletion failed) runs again after C{retry_seconds}, doubling up to
C{max_retry_seconds} while passes delete nothing.
L{ReclaimSchedule.next_pass} lets an upload held back by its agent's backlog
wait for a pass that starts after it asked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import attrs
from twisted.internet.defer import Deferred, fail, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure

#: At most this many chunks are deleted per pass (the commit gate is held meanwhile).
RECLAIM_BATCH = 4096

#: Seconds before a pass that kept chunks too young to delete runs again
#: (the tenant uses its safety margin, at least L{MIN_RETRY_SECONDS}).
RETRY_SECONDS = 1.0

#: The shortest such wait.
MIN_RETRY_SECONDS = 0.05

#: The longest wait between such passes while they delete nothing.
MAX_RETRY_SECONDS = 60.0


@attrs.frozen
class ReclaimOutcome:
    """
    What one pass did: the ``deleted`` chunks, freeing ``bytes_freed``;
    ``kept`` chunks left for a later pass (written or touched within the
    safety margin, or that could not be deleted); ``more`` when the batch
    was full (another pass follows at once).
    """

    deleted: tuple[str, ...] = ()
    bytes_freed: int = 0
    kept: int = 0
    more: bool = False


class ReclaimStopped(Exception):
    """The tenant storage is closing: no reclaim pass will run any more."""


class ScheduleClock(Protocol):
    """The part of a reactor the schedule uses."""

    def callLater(
        self, delay: float, callable: Callable[..., object], *args: object, **kw: object
    ) -> Any:
        """Schedule a call."""


class ReclaimSchedule:
    """See the module docstring."""

    _log = Logger()

    def __init__(
        self,
        run_pass: Callable[[], Deferred[ReclaimOutcome]],
        clock: ScheduleClock,
        *,
        retry_seconds: float = RETRY_SECONDS,
        max_retry_seconds: float = MAX_RETRY_SECONDS,
    ) -> None:
        self._run_pass = run_pass
        self._clock = clock
        self._retry_seconds = retry_seconds
        self._max_retry_seconds = max_retry_seconds
        self._backoff = retry_seconds
        self._scheduled: Any = None
        self._scheduled_delay = 0.0
        self._running: Deferred[None] | None = None
        self._again = False
        self._waiting: list[Deferred[None]] = []
        self._stopped = False
        self.passes = 0
        """Passes completed (tests, logs)."""

    def request(self, delay: float = 0.0) -> None:
        """
        Run a pass after ``delay`` seconds (or sooner, if one is already
        due sooner); while one runs, run another after it.
        """
        if self._stopped:
            return
        if self._running is not None:
            self._again = True
            return
        if self._scheduled is not None:
            if self._scheduled_delay <= delay:
                return
            self._scheduled.cancel()
        self._scheduled_delay = delay
        self._scheduled = self._clock.callLater(delay, self._start)

    def next_pass(self) -> Deferred[None]:
        """
        Fires once a pass that starts after this call has finished (fails
        with its error if it failed, with L{ReclaimStopped} once stopped);
        asks for one now.
        """
        if self._stopped:
            return fail(ReclaimStopped())
        waiter: Deferred[None] = Deferred()
        self._waiting.append(waiter)
        if self._running is None and self._scheduled is None:
            self.request()
        # Else the pass already due (perhaps a retry for chunks too young
        # yet) serves it, or the one after the running pass.
        return waiter

    def stop(self) -> Deferred[None]:
        """
        Run no more passes; fires once a pass in progress has finished.
        Waiters still waiting fail with L{ReclaimStopped}.
        """
        self._stopped = True
        if self._scheduled is not None:
            self._scheduled.cancel()
            self._scheduled = None
        waiting, self._waiting = self._waiting, []
        for waiter in waiting:
            waiter.errback(ReclaimStopped())
        if self._running is None:
            return succeed(None)
        done: Deferred[None] = Deferred()
        self._running.addBoth(lambda _: done.callback(None))
        return done

    def _start(self) -> None:
        self._scheduled = None
        waiters, self._waiting = self._waiting, []
        self._again = False
        running: Deferred[None] = Deferred()
        self._running = running
        self._run_pass().addBoth(self._finished, waiters).addBoth(lambda _: running.callback(None))

    def _finished(self, outcome: ReclaimOutcome | Failure, waiters: list[Deferred[None]]) -> None:
        self._running = None
        self.passes += 1
        for waiter in waiters:
            if isinstance(outcome, Failure):
                waiter.errback(outcome)
            else:
                waiter.callback(None)
        if isinstance(outcome, Failure):
            self._log.failure("reclaim pass failed", outcome)
            if self._again or self._waiting:
                self.request(self._retry_seconds)
            return
        if outcome.deleted:
            self._backoff = self._retry_seconds
        if outcome.more or self._again:
            self.request()
        elif outcome.kept:
            # Waiters wait for the chunks to age past the margin (or for
            # the disk to let them go), longer while nothing goes.
            self.request(self._backoff)
            self._backoff = min(self._backoff * 2, self._max_retry_seconds)
        elif self._waiting:
            self.request()
