"""Tests for L{svc.mount.remote.in_flight.InFlight}."""

from __future__ import annotations

from twisted.internet.defer import CancelledError
from twisted.trial.unittest import SynchronousTestCase

from svc.mount.remote.in_flight import InFlight


class InFlightTests(SynchronousTestCase):
    """A count, and waiters for zero."""

    def test_settled_at_once_when_idle(self) -> None:
        """Nothing under way: settled fires at once."""
        self.successResultOf(InFlight().settled())

    def test_settled_when_the_last_ends(self) -> None:
        """Waiters fire when the count drops to zero, not before."""
        tally = InFlight()
        tally.add()
        tally.add()
        waiter = tally.settled()
        tally.done()
        self.assertNoResult(waiter)
        self.assertEqual(tally.count, 1)
        tally.done()
        self.successResultOf(waiter)

    def test_done_without_add(self) -> None:
        """More done than add is a bug, refused."""
        self.assertRaises(ValueError, InFlight().done)

    def test_cancelled_waiter_is_forgotten(self) -> None:
        """A waiter cancelled (its operation abandoned) is not fired when the count drops."""
        tally = InFlight()
        tally.add()
        cancelled = tally.settled()
        kept = tally.settled()
        cancelled.cancel()
        self.failureResultOf(cancelled, CancelledError)
        tally.done()
        self.successResultOf(kept)
