"""A count of things under way, and waiters for the moment none is."""

from __future__ import annotations

from twisted.internet.defer import Deferred


class InFlight:
    """
    Counts things under way (L{add}, L{done}); L{settled} fires once the
    count is zero.
    """

    def __init__(self) -> None:
        self._count = 0
        self._waiters: list[Deferred[None]] = []

    @property
    def count(self) -> int:
        """How many are under way."""
        return self._count

    def add(self) -> None:
        """One more is under way."""
        self._count += 1

    def done(self) -> None:
        """One ended; at zero, every L{settled} waiter fires, in order."""
        if self._count <= 0:
            raise ValueError("done() without a matching add()")
        self._count -= 1
        if self._count == 0:
            waiters, self._waiters = self._waiters, []
            for waiter in waiters:
                waiter.callback(None)

    def settled(self) -> Deferred[None]:
        """Fires once none is under way (at once when none is); cancelling stops the wait."""
        waiter: Deferred[None] = Deferred(self._forget)
        if self._count == 0:
            waiter.callback(None)
        else:
            self._waiters.append(waiter)
        return waiter

    def _forget(self, waiter: Deferred[None]) -> None:
        if waiter in self._waiters:
            self._waiters.remove(waiter)
