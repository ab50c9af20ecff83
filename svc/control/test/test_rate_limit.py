"""
Tests for L{svc.control.rate_limit}: the per-key sliding window, its
Retry-After, and its bounded memory.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from svc.control.rate_limit import RateDecision, SlidingWindowLimiter
from svc.control.settings import RateLimit


class SlidingWindowLimiterTests(SynchronousTestCase):
    """At most count attempts per key in any window."""

    def test_allows_count_then_refuses(self) -> None:
        """count attempts pass; the next one in the window is refused with the wait."""
        limiter = SlidingWindowLimiter(3, 60)
        for moment in (0.0, 1.0, 2.0):
            self.assertEqual(limiter.attempt("k", moment), RateDecision(True, 0))
        self.assertEqual(limiter.attempt("k", 10.0), RateDecision(False, 50))

    def test_window_slides(self) -> None:
        """An attempt leaves the window exactly window seconds later."""
        limiter = SlidingWindowLimiter(2, 60)
        limiter.attempt("k", 0.0)
        limiter.attempt("k", 30.0)
        self.assertFalse(limiter.attempt("k", 59.9).allowed)
        self.assertTrue(limiter.attempt("k", 60.0).allowed)
        self.assertFalse(limiter.attempt("k", 61.0).allowed)
        self.assertTrue(limiter.attempt("k", 90.0).allowed)

    def test_refusals_are_not_counted(self) -> None:
        """Waiting Retry-After seconds after a refusal always gets through."""
        limiter = SlidingWindowLimiter(1, 60)
        limiter.attempt("k", 0.0)
        for moment in range(1, 60):
            self.assertFalse(limiter.attempt("k", float(moment)).allowed)
        self.assertTrue(limiter.attempt("k", 60.0).allowed)

    def test_retry_after_rounds_up_to_at_least_one(self) -> None:
        """Retry-After is a whole number of seconds, rounded up, never 0."""
        limiter = SlidingWindowLimiter(1, 60)
        limiter.attempt("k", 0.5)
        self.assertEqual(limiter.attempt("k", 1.0).retry_after, 60)
        self.assertEqual(limiter.attempt("k", 60.4).retry_after, 1)

    def test_keys_are_independent(self) -> None:
        """One key's attempts do not limit another."""
        limiter = SlidingWindowLimiter(1, 60)
        self.assertTrue(limiter.attempt("a", 0.0).allowed)
        self.assertTrue(limiter.attempt("b", 0.0).allowed)
        self.assertFalse(limiter.attempt("a", 0.0).allowed)

    def test_from_setting(self) -> None:
        """The limiter takes SVC_ENROLL_RATE_LIMIT's count and seconds."""
        limiter = SlidingWindowLimiter.from_setting(RateLimit(count=5, window_seconds=30))
        self.assertEqual((limiter.count, limiter.window_seconds), (5, 30))

    def test_bad_parameters(self) -> None:
        """Zero or negative limits are programming errors."""
        for args in ((0, 60), (1, 0), (1, -1)):
            with self.assertRaises(ValueError):
                SlidingWindowLimiter(*args)
        with self.assertRaises(ValueError):
            SlidingWindowLimiter(1, 60, max_keys=0)

    def test_max_keys_forgets_least_recent(self) -> None:
        """Beyond max_keys the least recently used key is forgotten (and let in again)."""
        limiter = SlidingWindowLimiter(1, 60, max_keys=2)
        limiter.attempt("a", 0.0)
        limiter.attempt("b", 0.0)
        limiter.attempt("a", 1.0)  # refused, but now the most recently used
        limiter.attempt("c", 1.0)
        self.assertEqual(len(limiter), 2)
        self.assertTrue(limiter.attempt("b", 2.0).allowed)
        self.assertFalse(limiter.attempt("c", 2.0).allowed)

    def test_stale_keys_dropped(self) -> None:
        """Keys whose attempts have left the window are dropped as new attempts arrive."""
        limiter = SlidingWindowLimiter(1, 60)
        for index in range(10):
            limiter.attempt(f"old-{index}", 0.0)
        for index in range(10):
            limiter.attempt(f"new-{index}", 100.0)
        self.assertEqual(len(limiter), 10)

    @given(
        st.integers(1, 5),
        st.integers(1, 100),
        st.lists(st.floats(0, 1000, allow_nan=False), max_size=40),
    )
    def test_never_more_than_count_in_a_window(
        self, count: int, window: int, moments: list[float]
    ) -> None:
        """Whatever the arrival times, no window holds more than count allowed attempts."""
        limiter = SlidingWindowLimiter(count, window)
        allowed = [t for t in sorted(moments) if limiter.attempt("k", t).allowed]
        for start in allowed:
            in_window = [t for t in allowed if start <= t < start + window]
            self.assertLessEqual(len(in_window), count)
