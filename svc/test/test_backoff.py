"""
Tests for L{svc.backoff}: the one backoff of the server processes and its
retry loop.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.task import Clock
from twisted.logger import capturedLogs
from twisted.trial.unittest import SynchronousTestCase

from svc.backoff import Backoff, retrying


class Transient(Exception):
    """An error worth another try; C{floor} plays a Retry-After."""

    def __init__(self, floor: float | None = None) -> None:
        super().__init__("try later")
        self.floor = floor


class Final(Exception):
    """An error no retry fixes."""


class BackoffTests(SynchronousTestCase):
    """L{Backoff.delay}."""

    def test_grows_by_the_factor_up_to_the_maximum(self) -> None:
        """The n-th failure waits initial * factor ** (n - 1), never more than the maximum."""
        backoff = Backoff(initial=10.0, maximum=100.0, factor=3.0)
        delays = [backoff.delay(n) for n in (1, 2, 3, 50, 10_000)]
        self.assertEqual(delays, [10.0, 30.0, 90.0, 100.0, 100.0])

    def test_jitter_takes_up_to_its_fraction_off(self) -> None:
        """A draw d removes jitter * d of the pause."""
        backoff = Backoff(initial=10.0, maximum=100.0, jitter=0.5)
        self.assertEqual(backoff.delay(2, 0.0), 20.0)
        self.assertEqual(backoff.delay(2, 0.5), 15.0)
        self.assertGreater(backoff.delay(2, 0.999999), 10.0)

    def test_floor(self) -> None:
        """A Retry-After longer than the pause is waited in full; a shorter one changes nothing."""
        backoff = Backoff(initial=1.0, maximum=5.0)
        self.assertEqual(backoff.delay(1, at_least=60.0), 60.0)
        self.assertEqual(backoff.delay(3, at_least=0.5), 4.0)

    def test_bad_values_refused(self) -> None:
        """Counts start at 1, draws are in [0, 1), the parameters are sane."""
        backoff = Backoff(initial=1.0, maximum=5.0)
        self.assertRaises(ValueError, backoff.delay, 0)
        self.assertRaises(ValueError, backoff.delay, 1, 1.0)
        self.assertRaises(ValueError, Backoff, initial=0.0, maximum=1.0)
        self.assertRaises(ValueError, Backoff, initial=2.0, maximum=1.0)
        self.assertRaises(ValueError, Backoff, initial=1.0, maximum=2.0, factor=0.5)
        self.assertRaises(ValueError, Backoff, initial=1.0, maximum=2.0, jitter=1.0)


class Calls:
    """A call failing with the queued errors, then answering."""

    def __init__(self, clock: Clock, *errors: Exception) -> None:
        self.clock = clock
        self.errors = list(errors)
        self.times: list[float] = []

    def __call__(self) -> Deferred[str]:
        self.times.append(self.clock.seconds())
        if self.errors:
            return fail(self.errors.pop(0))
        return succeed("answer")


class RetryingTests(SynchronousTestCase):
    """L{retrying}."""

    backoff = Backoff(initial=0.5, maximum=2.0)

    def run_calls(self, calls: Calls, give_up_after: float | None = None) -> Deferred[str]:
        return Deferred.fromCoroutine(
            retrying(
                calls.clock,
                "the thing is not there",
                calls,
                backoff=self.backoff,
                retryable=lambda error: isinstance(error, Transient),
                give_up_after=give_up_after,
                at_least=lambda error: error.floor if isinstance(error, Transient) else None,
            )
        )

    def test_retried_with_growing_pauses_until_answered(self) -> None:
        """Transient errors are retried after 0.5, 1, 2, 2 s; each retry is one warning."""
        clock = Clock()
        calls = Calls(clock, *[Transient() for _ in range(4)])
        with capturedLogs() as events:
            done = self.run_calls(calls)
            clock.pump([0.5, 1.0, 2.0, 2.0])
        self.assertEqual(self.successResultOf(done), "answer")
        self.assertEqual(calls.times, [0.0, 0.5, 1.5, 3.5, 5.5])
        self.assertEqual(len(events), 4)
        self.assertEqual(events[0]["what"], "the thing is not there")
        self.assertEqual(events[0]["log_level"].name, "warn")

    def test_floor_is_honoured(self) -> None:
        """An error asking for 7 s is not retried sooner."""
        clock = Clock()
        calls = Calls(clock, Transient(floor=7.0))
        done = self.run_calls(calls)
        clock.advance(6.9)
        self.assertNoResult(done)
        clock.advance(0.1)
        self.assertEqual(self.successResultOf(done), "answer")

    def test_gives_up_with_the_last_error(self) -> None:
        """A try that would start past give_up_after is not made: the last error is raised."""
        clock = Clock()
        calls = Calls(clock, *[Transient() for _ in range(10)])
        done = self.run_calls(calls, give_up_after=2.0)
        clock.pump([0.5, 1.0, 2.0, 2.0])
        self.failureResultOf(done, Transient)
        self.assertEqual(calls.times, [0.0, 0.5, 1.5])

    def test_final_errors_at_once(self) -> None:
        """An error that is not retryable is raised after one try."""
        clock = Clock()
        calls = Calls(clock, Final())
        done = self.run_calls(calls)
        self.failureResultOf(done, Final)
        clock.advance(100)
        self.assertEqual(calls.times, [0.0])
