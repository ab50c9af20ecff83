"""
A new connection of an agent runs its ordered requests only after those its
closed connections had received have run (``docs/specifications/dataplane-ops.md``
section 7, "Connections of one agent").

When a connection is lost, the request the server was running still
finishes (the ones queued behind it are refused): its answer goes nowhere.
A client that reconnects and asks what its lost requests did (the mount's
C{head_file} after a lost rename, ``mount-consistency.md`` section 2.6)
must see their effects, or it would send them again. So each closed
connection's I{drain} -- a Deferred that fires once its ordered requests
have run or been refused -- is kept per agent until it fires, and a
connection admitted meanwhile holds its own order until every drain of its
agent has fired, or L{FENCE_SECONDS} have passed (a warning: the server
must not stall an agent for a request that does not end).
"""

from __future__ import annotations

from collections.abc import Hashable

from twisted.internet.defer import Deferred, DeferredList
from twisted.logger import Logger

from svc.timers import TimerClock

_log = Logger()

FENCE_SECONDS = 10.0
"""The longest a new connection waits for its agent's closed connections."""


class DrainFences:
    """The drains of closed connections, per agent; see the module docstring."""

    def __init__(self, clock: TimerClock) -> None:
        self._clock = clock
        self._draining: dict[Hashable, list[Deferred[None]]] = {}

    def closing(self, agent: Hashable, drained: Deferred[None]) -> None:
        """A connection of C{agent} closed; C{drained} fires once its ordered requests ran."""
        waiting = self._draining.setdefault(agent, [])
        waiting.append(drained)

        def done(result: object) -> object:
            if drained in waiting:
                waiting.remove(drained)
            if not waiting and self._draining.get(agent) is waiting:
                del self._draining[agent]
            return result

        drained.addBoth(done)

    def fence(self, agent: Hashable) -> Deferred[None] | None:
        """
        For a connection of C{agent} admitted now: a Deferred that fires once
        every closed connection of the agent has drained (at most
        L{FENCE_SECONDS} from now), or L{None} when none is draining.
        """
        waiting = list(self._draining.get(agent, ()))
        if not waiting:
            return None
        fence: Deferred[None] = Deferred()
        everyone = DeferredList(waiting)  # passes each drain's result on unchanged

        def opened(_: object) -> None:
            if timer.active():
                timer.cancel()
            if not fence.called:
                fence.callback(None)

        def too_long() -> None:
            _log.warn(
                "a new connection of {agent} goes ahead after {seconds}s although its"
                " agent's closed connections still run requests",
                agent=agent,
                seconds=FENCE_SECONDS,
            )
            if not fence.called:
                fence.callback(None)

        timer = self._clock.callLater(FENCE_SECONDS, too_long)
        everyone.addCallback(opened)
        return fence
