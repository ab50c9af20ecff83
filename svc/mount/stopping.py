"""
Whether the mount is shutting down, and pauses that end early when it
does: what retries waiting for the data plane use, so that shutdown does
not wait out their pauses (L{svc.mount.unanswered}). The pauses also end
when a new data-plane connection opens (L{Stopping.reconnected}), so such a
retry asks at once rather than up to a pause later (while the look into a
lost change waits, changes that would wait for it fail: C{NamespaceLock.stalled}).
"""

from __future__ import annotations

from twisted.internet.defer import Deferred

from svc.timers import Timer, TimerClock


class Stopping:
    """See the module docstring."""

    def __init__(self, clock: TimerClock) -> None:
        self._clock = clock
        self._begun = False
        self._pauses: dict[Deferred[None], Timer] = {}

    @property
    def begun(self) -> bool:
        """Whether shutdown began."""
        return self._begun

    def begin(self) -> None:
        """Shutdown begins: every pause ends now, and later ones at once."""
        self._begun = True
        self._end_pauses()

    def pause(self, seconds: float) -> Deferred[None]:
        """Fires after C{seconds}, or when shutdown begins, whichever comes first."""
        done: Deferred[None] = Deferred()
        if self._begun:
            done.callback(None)
            return done

        def over() -> None:
            if self._pauses.pop(done, None) is not None:
                done.callback(None)

        self._pauses[done] = self._clock.callLater(seconds, over)
        return done

    def reconnected(self) -> None:
        """A data-plane connection opened: every pause going on ends now."""
        self._end_pauses()

    def _end_pauses(self) -> None:
        pauses, self._pauses = self._pauses, {}
        for done, timer in pauses.items():
            timer.cancel()
            done.callback(None)
