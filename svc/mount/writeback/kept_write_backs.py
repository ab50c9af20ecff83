"""
Write-backs kept through a data-plane outage
(``docs/specifications/mount-consistency.md`` section 2.5, "Changes kept
through an outage").

The last release of a file whose write-back got no answer from the data
plane (the connection could not be had in time, or was lost) does not
discard the file's changes: L{svc.mount.ops.file_closes.FileCloses} keeps the file open
(its state, spill file and write lease) and gives L{KeptWriteBacks} an
attempt to run later. The attempts run one at a time, oldest first, in
I{rounds}: at once when a new data-plane connection replaces a lost one
(L{KeptWriteBacks.now}), otherwise after a pause that doubles from
L{PAUSE_INITIAL} to L{PAUSE_MAX} while rounds make no progress. A round
stops at the first file kept again (the data plane is still out of reach),
so an outage costs one attempt, and one C{flush} audit line, per round,
not one per file.

At shutdown L{KeptWriteBacks.last_round} gives every kept file a last
attempt (L{Try.LAST}): a file that still cannot be written back then is
let go, its changes left in the outbox for the next mount on the cache
(L{svc.mount.writeback.file_records}; discarded, with a warning, when no
record holds them). Once one last attempt found the data plane out of
reach, the files after it are let go so without trying (L{Try.GIVE_UP}):
each attempt may wait a call's whole connection wait, and shutdown must
not take that long per file. At most
L{MAX_KEPT_FILES} files are kept (each holds a spill file on the mount's
disk); beyond that, and once the last round began, L{KeptWriteBacks.room}
says no and the release discards as before.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from svc.timers import Timer, TimerClock

_log = Logger()

PAUSE_INITIAL = 1.0
"""Seconds between rounds after one that wrote something back (or the first)."""

PAUSE_MAX = 30.0
"""Longest pause between rounds (each attempt also waits for a connection itself)."""

MAX_KEPT_FILES = 4096
"""Most files kept at once."""


class Try(enum.Enum):
    """What an attempt at a kept file does."""

    AGAIN = "again"
    """Write it back; when the data plane is still out of reach, keep it again."""

    LAST = "last"
    """Write it back; when that fails, let it go (shutdown: left recorded, or discarded)."""

    GIVE_UP = "give_up"
    """Let it go without trying (shutdown, the data plane out of reach)."""


Attempt = Callable[[Try], Awaitable[bool]]
"""C{attempt(how)}: act on a kept file as C{how} says; whether the data
plane was reached (C{False}: it was out of reach, and with L{Try.AGAIN} the
attempt kept the file again with L{KeptWriteBacks.keep})."""


class KeptWriteBacks:
    """See the module docstring."""

    def __init__(
        self,
        clock: TimerClock,
        *,
        pause_initial: float = PAUSE_INITIAL,
        pause_max: float = PAUSE_MAX,
        limit: int = MAX_KEPT_FILES,
    ) -> None:
        self._clock = clock
        self._pause_initial = pause_initial
        self._pause_max = pause_max
        self._limit = limit
        self._pause = pause_initial
        self._kept: dict[int, Attempt] = {}
        self._timer: Timer | None = None
        self._round: Deferred[None] | None = None
        self._running = False
        self._trying: int | None = None  # the file whose attempt runs
        self._again = False  # now() was called during a round
        self._final = False

    def __len__(self) -> int:
        return len(self._kept)

    def __contains__(self, key: int) -> bool:
        """Whether file C{key} is kept (its attempt running counts)."""
        return key in self._kept or key == self._trying

    def room(self) -> bool:
        """Whether one more file may be kept."""
        return not self._final and len(self._kept) < self._limit

    def keep(self, key: int, attempt: Attempt) -> None:
        """
        Keep file C{key}, to be written back by C{attempt} in a later round
        (after the pause, or at a reconnection); also from within its own
        attempt (L{Try.AGAIN}), which then returns C{False}.
        """
        self._kept[key] = attempt
        if not self._running:
            self._schedule()

    def now(self) -> None:
        """
        A new data-plane connection is open: run a round at once (after the
        running one, if any); the pause starts over from L{PAUSE_INITIAL}.
        """
        if self._running:
            self._again = True
        elif self._kept:
            self._cancel_timer()
            self._start(fresh=True)

    def last_round(self) -> Deferred[None]:
        """
        Shutdown: after the running round, every kept file's last attempt,
        or, once one found the data plane out of reach, its changes given
        up; fires once all ended. Nothing is kept afterwards.
        """
        self._final = True
        self._cancel_timer()

        async def finishing() -> None:
            if self._round is not None:
                await _wait(self._round)
            while self._kept:
                await _wait(self._start())

        return Deferred.fromCoroutine(finishing())

    def _schedule(self) -> None:
        if self._timer is None and not self._final and self._kept:
            self._timer = self._clock.callLater(self._pause, self._paused)

    def _paused(self) -> None:
        self._timer = None
        if not self._running:
            self._start()

    def _cancel_timer(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()

    def _start(self, *, fresh: bool = False) -> Deferred[None]:
        """
        Run a round (C{fresh}: for a reconnection, so the pause after it is
        the first one); the returned Deferred fires once it ended.
        """
        self._again = False
        self._running = True
        round_ = Deferred.fromCoroutine(self._run(fresh))
        self._round = round_

        def ended(_: object) -> None:
            self._running = False
            if self._round is round_:
                self._round = None
            if self._final:
                return
            if self._again and self._kept:
                self._start(fresh=True)
            else:
                self._schedule()

        round_.addBoth(ended)
        return round_

    async def _run(self, fresh: bool) -> None:
        progressed = False
        out_of_reach = False  # an attempt of this round found the data plane out of reach
        while self._kept:
            key = next(iter(self._kept))
            attempt = self._kept.pop(key)
            if not self._final:
                how = Try.AGAIN
            else:
                how = Try.GIVE_UP if out_of_reach else Try.LAST
            self._trying = key
            try:
                reached = await attempt(how)
            except Exception:
                _log.failure("retrying the write-back of inode {ino} failed", ino=key)
                reached = True
            finally:
                self._trying = None
            if reached:
                progressed = True
                continue
            out_of_reach = True
            if how is Try.AGAIN and not self._final:
                break  # kept again: one attempt per round while the outage lasts
        if progressed or fresh:
            self._pause = self._pause_initial
        else:
            self._pause = min(self._pause * 2, self._pause_max)


def _wait(round_: Deferred[None]) -> Deferred[None]:
    """A Deferred firing when C{round_} does, leaving C{round_}'s result alone."""
    done: Deferred[None] = Deferred()

    def ended(result: object) -> object:
        done.callback(None)
        return result

    round_.addBoth(ended)
    return done
