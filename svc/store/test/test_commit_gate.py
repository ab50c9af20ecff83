"""
Tests for L{svc.store.commit_gate.CommitGate}: commits beside each other,
deletions alone, served in arrival order.
"""

from __future__ import annotations

from twisted.internet.defer import CancelledError
from twisted.trial.unittest import SynchronousTestCase

from svc.store.commit_gate import CommitGate


class CommitGateTests(SynchronousTestCase):
    """Shared holds (commits) and exclusive ones (GC sweeps, purges)."""

    def setUp(self) -> None:
        self.gate = CommitGate()

    def test_shared_holders_do_not_wait_for_each_other(self) -> None:
        """Any number hold the gate shared at once."""
        for _ in range(3):
            self.successResultOf(self.gate.acquire_shared())
        self.assertEqual(self.gate.holders, 3)

    def test_exclusive_waits_for_every_shared_holder(self) -> None:
        """A deletion starts only once the last commit in flight gave the gate back."""
        self.successResultOf(self.gate.acquire_shared())
        self.successResultOf(self.gate.acquire_shared())
        deleting = self.gate.acquire_exclusive()
        self.gate.release_shared()
        self.assertNoResult(deleting)
        self.gate.release_shared()
        self.successResultOf(deleting)
        self.assertEqual(self.gate.holders, 1)

    def test_shared_waits_while_exclusive_is_held(self) -> None:
        """No commit starts during a deletion; all the waiting ones enter together after it."""
        self.successResultOf(self.gate.acquire_exclusive())
        first = self.gate.acquire_shared()
        second = self.gate.acquire_shared()
        self.assertNoResult(first)
        self.gate.release_exclusive()
        self.successResultOf(first)
        self.successResultOf(second)
        self.assertEqual(self.gate.holders, 2)

    def test_a_waiting_exclusive_holds_back_later_shared(self) -> None:
        """
        A commit arriving after a deletion started waiting queues behind it,
        so a steady stream of commits cannot starve a sweep.
        """
        self.successResultOf(self.gate.acquire_shared())
        deleting = self.gate.acquire_exclusive()
        later = self.gate.acquire_shared()
        self.assertNoResult(later)
        self.gate.release_shared()
        self.successResultOf(deleting)
        self.assertNoResult(later)
        self.gate.release_exclusive()
        self.successResultOf(later)

    def test_exclusive_holders_take_turns(self) -> None:
        """Two deletions never overlap; the second starts when the first ends."""
        self.successResultOf(self.gate.acquire_exclusive())
        second = self.gate.acquire_exclusive()
        self.assertNoResult(second)
        self.gate.release_exclusive()
        self.successResultOf(second)

    def test_a_cancelled_wait_takes_nothing(self) -> None:
        """
        A waiter given up leaves the queue: it never holds the gate, and
        the ones behind it are admitted as if it had never come.
        """
        self.successResultOf(self.gate.acquire_shared())
        deleting = self.gate.acquire_exclusive()
        later = self.gate.acquire_shared()
        deleting.cancel()
        self.failureResultOf(deleting, CancelledError)
        self.successResultOf(later)
        self.assertEqual(self.gate.holders, 2)

    def test_releasing_what_is_not_held_is_an_error(self) -> None:
        """A release without its hold is a bug, reported at once."""
        self.assertRaises(RuntimeError, self.gate.release_shared)
        self.assertRaises(RuntimeError, self.gate.release_exclusive)
        self.successResultOf(self.gate.acquire_shared())
        self.assertRaises(RuntimeError, self.gate.release_exclusive)

    def test_waiters_giving_the_gate_back_at_once_do_not_nest(self) -> None:
        """
        Thousands of commits waiting behind a sweep, each giving the gate
        back as soon as it enters (a put refused before its first wait),
        are admitted one after the other, not each inside the previous
        one's release (which overflowed the stack).
        """
        self.successResultOf(self.gate.acquire_exclusive())
        entered: list[int] = []

        def enter(_: object, index: int) -> None:
            entered.append(index)
            self.gate.release_shared()

        for index in range(5000):
            self.gate.acquire_shared().addCallback(enter, index)
        self.gate.release_exclusive()
        self.assertEqual(entered, list(range(5000)))
        self.assertEqual(self.gate.holders, 0)
