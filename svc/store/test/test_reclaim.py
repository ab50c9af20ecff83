"""
Tests for L{svc.store.reclaim.ReclaimSchedule} (when reclaim passes run)
and L{svc.store.uploads_in_flight.UploadsInFlight} (when a failed upload
takes its charge back).
"""

from __future__ import annotations

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from svc.store.reclaim import ReclaimOutcome, ReclaimSchedule, ReclaimStopped
from svc.store.uploads_in_flight import UploadsInFlight

_NOTHING = ReclaimOutcome()


class _Passes:
    """A pass function whose passes the test ends by hand."""

    def __init__(self) -> None:
        self.started: list[Deferred[ReclaimOutcome]] = []

    def __call__(self) -> Deferred[ReclaimOutcome]:
        running: Deferred[ReclaimOutcome] = Deferred()
        self.started.append(running)
        return running

    def end(self, outcome: ReclaimOutcome | Exception = _NOTHING) -> None:
        running = self.started[-1]
        if isinstance(outcome, Exception):
            running.errback(outcome)
        else:
            running.callback(outcome)


class ReclaimScheduleTests(SynchronousTestCase):
    """
    Passes run on the next turn after a request, one at a time, again while
    there is more, later while chunks are too young.
    """

    def setUp(self) -> None:
        self.clock = Clock()
        self.passes = _Passes()
        self.schedule = ReclaimSchedule(
            self.passes, self.clock, retry_seconds=0.5, max_retry_seconds=2.0
        )

    def test_requests_coalesce(self) -> None:
        """Requests before the pass starts make one pass; one during it, one more after."""
        self.schedule.request()
        self.schedule.request()
        self.assertEqual(self.passes.started, [])
        self.clock.advance(0)
        self.assertEqual(len(self.passes.started), 1)
        self.schedule.request()
        self.schedule.request()
        self.passes.end()
        self.clock.advance(0)
        self.assertEqual(len(self.passes.started), 2)
        self.passes.end()
        self.clock.advance(10)
        self.assertEqual((len(self.passes.started), self.schedule.passes), (2, 2))

    def test_next_pass_is_one_started_after(self) -> None:
        """A waiter is served by a pass that starts after it asked, not the one running."""
        self.schedule.request()
        self.clock.advance(0)
        waiting = self.schedule.next_pass()
        self.passes.end()
        self.assertNoResult(waiting)
        self.clock.advance(0)
        self.passes.end()
        self.successResultOf(waiting)

    def test_more_runs_at_once_young_later(self) -> None:
        """A full batch runs again at once; chunks too young wait, longer while nothing goes."""
        self.schedule.request()
        self.clock.advance(0)
        self.passes.end(ReclaimOutcome(deleted=("a",), more=True))
        self.clock.advance(0)
        self.assertEqual(len(self.passes.started), 2)
        self.passes.end(ReclaimOutcome(kept=1))
        self.clock.advance(0.4)
        self.assertEqual(len(self.passes.started), 2)
        self.clock.advance(0.1)
        self.assertEqual(len(self.passes.started), 3)
        self.passes.end(ReclaimOutcome(kept=1))
        self.clock.advance(0.9)
        self.assertEqual(len(self.passes.started), 3)
        self.clock.advance(0.1)
        self.assertEqual(len(self.passes.started), 4)
        self.passes.end(ReclaimOutcome(kept=1))
        self.clock.advance(2)
        self.assertEqual(len(self.passes.started), 5)
        self.passes.end(ReclaimOutcome(kept=1))
        self.clock.advance(1.9)
        self.assertEqual(len(self.passes.started), 5)
        self.clock.advance(0.1)
        self.assertEqual(len(self.passes.started), 6)
        self.passes.end(ReclaimOutcome(deleted=("b",), kept=1))
        self.clock.advance(0.5)
        self.assertEqual(len(self.passes.started), 7)

    def test_waiter_waits_for_the_retry(self) -> None:
        """A waiter arriving while a retry is due waits for it rather than forcing a pass."""
        self.schedule.request()
        self.clock.advance(0)
        self.passes.end(ReclaimOutcome(kept=1))
        waiting = self.schedule.next_pass()
        self.clock.advance(0.4)
        self.assertEqual(len(self.passes.started), 1)
        self.clock.advance(0.1)
        self.passes.end()
        self.successResultOf(waiting)

    def test_failure_reaches_waiters(self) -> None:
        """A pass that fails fails its waiters with its error; the next request runs again."""
        waiting = self.schedule.next_pass()
        self.clock.advance(0)
        self.passes.end(RuntimeError("disk"))
        self.failureResultOf(waiting, RuntimeError)
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        self.schedule.request()
        self.clock.advance(0)
        self.assertEqual(len(self.passes.started), 2)

    def test_stop(self) -> None:
        """Stopping waits for the pass in progress, fails waiters, and runs nothing more."""
        self.schedule.request()
        self.clock.advance(0)
        waiting = self.schedule.next_pass()
        stopped = self.schedule.stop()
        self.failureResultOf(waiting, ReclaimStopped)
        self.assertNoResult(stopped)
        self.passes.end(ReclaimOutcome(more=True))
        self.successResultOf(stopped)
        self.failureResultOf(self.schedule.next_pass(), ReclaimStopped)
        self.schedule.request()
        self.clock.advance(10)
        self.assertEqual(len(self.passes.started), 1)
        self.assertEqual(self.clock.getDelayedCalls(), [])


class UploadsInFlightTests(SynchronousTestCase):
    """
    A failed upload takes its charge back only if no other upload of the
    same chunk by the same agent overlapped it.
    """

    def test_alone(self) -> None:
        """An upload that failed alone may take its charge back."""
        uploads = UploadsInFlight()
        uploads.started("a1", "h")
        self.assertTrue(uploads.failed("a1", "h"))
        self.assertEqual(len(uploads), 0)

    def test_overlapping_in_flight(self) -> None:
        """Another upload still in flight keeps the charge, whoever fails last."""
        uploads = UploadsInFlight()
        uploads.started("a1", "h")
        uploads.started("a1", "h")
        self.assertFalse(uploads.failed("a1", "h"))
        self.assertTrue(uploads.failed("a1", "h"))

    def test_overlapping_stored(self) -> None:
        """An overlapping upload that stored the chunk keeps the charge."""
        uploads = UploadsInFlight()
        uploads.started("a1", "h")
        uploads.started("a1", "h")
        uploads.stored("a1", "h")
        self.assertFalse(uploads.failed("a1", "h"))
        self.assertEqual(len(uploads), 0)

    def test_other_agents_and_chunks_apart(self) -> None:
        """Other agents' uploads and other chunks do not count."""
        uploads = UploadsInFlight()
        uploads.started("a1", "h")
        uploads.started("a2", "h")
        uploads.started("a1", "g")
        uploads.stored("a2", "h")
        self.assertTrue(uploads.failed("a1", "h"))
