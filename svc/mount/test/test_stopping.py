"""Tests for L{svc.mount.stopping}."""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from svc.mount.stopping import Stopping


class StoppingTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.stopping = Stopping(self.clock)

    def test_a_pause_ends_after_its_seconds(self) -> None:
        paused = self.stopping.pause(2.0)
        self.clock.advance(1.9)
        self.assertNoResult(paused)
        self.clock.advance(0.1)
        self.successResultOf(paused)
        self.assertFalse(self.stopping.begun)

    def test_shutdown_ends_every_pause_and_its_timer(self) -> None:
        first, second = self.stopping.pause(5.0), self.stopping.pause(30.0)
        self.stopping.begin()
        self.successResultOf(first)
        self.successResultOf(second)
        self.assertTrue(self.stopping.begun)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_a_pause_after_shutdown_began_ends_at_once(self) -> None:
        self.stopping.begin()
        self.successResultOf(self.stopping.pause(5.0))

    def test_a_new_connection_ends_every_pause_but_not_later_ones(self) -> None:
        """
        A reconnection ends the pauses going on (their retries ask at once),
        without beginning shutdown: a pause begun afterwards lasts its time.
        """
        first, second = self.stopping.pause(5.0), self.stopping.pause(30.0)
        self.stopping.reconnected()
        self.successResultOf(first)
        self.successResultOf(second)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertFalse(self.stopping.begun)
        later = self.stopping.pause(2.0)
        self.assertNoResult(later)
        self.clock.advance(2.0)
        self.successResultOf(later)
