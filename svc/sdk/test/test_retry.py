"""
Tests for L{svc.sdk.retry}.
"""

from __future__ import annotations

from datetime import UTC, datetime
from email.utils import format_datetime

from twisted.trial.unittest import SynchronousTestCase

from svc.sdk.errors import (
    Headers,
    InvalidResponse,
    RequestTimeout,
    SvcError,
    TransportError,
    VersionSkewError,
)
from svc.sdk.retry import (
    RETRYABLE_STATUSES,
    backoff,
    is_retryable,
    parse_retry_after,
    retry_after,
    retry_delay,
)

NOW = datetime(2026, 11, 22, 19, 0, 0, tzinfo=UTC).timestamp()


def failed(status: int | None, **headers: str) -> SvcError:
    pairs = tuple((name.replace("_", "-"), value) for name, value in headers.items())
    kind = SvcError if status is not None else TransportError
    return kind(
        operation="usage",
        method="GET",
        path="/v1/tenants/acme/usage",
        status=status,
        code=None,
        message="",
        request_id="r",
        headers=Headers(pairs),
    )


def clock() -> float:
    return NOW


class IsRetryableTests(SynchronousTestCase):
    """L{is_retryable}."""

    def test_statuses(self) -> None:
        """429, 500, 502, 503, 504 and nothing else, as ints or errors."""
        retryable = {s for s in range(100, 600) if is_retryable(s)}
        self.assertEqual(retryable, {429, 500, 502, 503, 504})
        self.assertEqual(RETRYABLE_STATUSES, retryable)
        self.assertTrue(is_retryable(failed(503)))
        self.assertFalse(is_retryable(failed(404)))
        self.assertFalse(is_retryable(failed(501)))

    def test_no_answer_is_retryable(self) -> None:
        """Transport failures and timeouts may succeed when tried again."""
        self.assertTrue(is_retryable(failed(None)))
        timeout = RequestTimeout(
            operation="usage",
            method="GET",
            path="/p",
            status=None,
            code=None,
            message="",
            request_id="r",
        )
        self.assertTrue(is_retryable(timeout))

    def test_skew_and_invalid_answers_are_not(self) -> None:
        """A version skew or a malformed 2xx does not change by retrying, whatever the status."""
        skew = VersionSkewError(
            operation="usage",
            method="GET",
            path="/p",
            server_version="2",
            client_major=1,
            status=503,
            request_id="r",
            headers=Headers(),
            body=b"",
            body_truncated=False,
        )
        invalid = InvalidResponse(
            operation="usage",
            method="GET",
            path="/p",
            status=200,
            code=None,
            message="",
            request_id="r",
        )
        self.assertEqual((is_retryable(skew), is_retryable(invalid)), (False, False))

    def test_bool_is_not_a_status(self) -> None:
        """True is refused rather than read as status 1."""
        self.assertRaises(TypeError, is_retryable, True)


class RetryAfterTests(SynchronousTestCase):
    """L{parse_retry_after} and L{retry_after}."""

    def test_delta_seconds(self) -> None:
        """Digits are seconds."""
        self.assertEqual(parse_retry_after("60", NOW), 60.0)
        self.assertEqual(parse_retry_after(" 0 ", NOW), 0.0)

    def test_http_date(self) -> None:
        """An HTTP-date is the time from now until then; a past date is 0."""
        later = format_datetime(datetime.fromtimestamp(NOW + 90, UTC), usegmt=True)
        self.assertEqual(parse_retry_after(later, NOW), 90.0)
        earlier = format_datetime(datetime.fromtimestamp(NOW - 90, UTC), usegmt=True)
        self.assertEqual(parse_retry_after(earlier, NOW), 0.0)

    def test_unreadable(self) -> None:
        """Anything else is None."""
        for value in ("-5", "1.5", "soon", "", "60s"):
            self.assertIsNone(parse_retry_after(value, NOW), value)

    def test_from_error_headers(self) -> None:
        """The header is found in any case; none without one."""
        self.assertEqual(retry_after(failed(503, retry_after="7"), now=clock), 7.0)
        self.assertIsNone(retry_after(failed(503), now=clock))


class RetryDelayTests(SynchronousTestCase):
    """L{backoff} and L{retry_delay}."""

    def test_backoff_doubles_to_the_cap(self) -> None:
        """base * 2 ** (attempt - 1), capped; huge attempts do not overflow."""
        self.assertEqual(
            [backoff(n, base=0.5, cap=30) for n in (1, 2, 3, 7, 8, 10_000)],
            [0.5, 1.0, 2.0, 30, 30, 30],
        )

    def test_attempt_counts_from_one(self) -> None:
        """Attempt 0, negative or a bool is refused."""
        for attempt in (0, -1, True):
            self.assertRaises(ValueError, backoff, attempt)

    def test_equal_jitter_without_retry_after(self) -> None:
        """Without Retry-After the delay lies between half the backoff and the backoff."""
        error = failed(503)
        self.assertEqual(retry_delay(error, 3, base=1, rng=lambda: 0.0, now=clock), 2.0)
        self.assertEqual(retry_delay(error, 3, base=1, rng=lambda: 0.5, now=clock), 3.0)

    def test_retry_after_is_a_floor(self) -> None:
        """A non-zero Retry-After is waited in full, plus jitter; it is not capped."""
        error = failed(429, Retry_After="120")
        self.assertEqual(retry_delay(error, 1, base=1, cap=10, rng=lambda: 0.0, now=clock), 120)
        self.assertEqual(retry_delay(error, 2, base=1, cap=10, rng=lambda: 0.5, now=clock), 121)

    def test_retry_after_date(self) -> None:
        """An HTTP-date Retry-After is honoured too."""
        later = format_datetime(datetime.fromtimestamp(NOW + 30, UTC), usegmt=True)
        error = failed(503, Retry_After=later)
        self.assertEqual(retry_delay(error, 1, base=1, rng=lambda: 0.0, now=clock), 30)

    def test_zero_retry_after_uses_backoff(self) -> None:
        """Retry-After: 0 (or unreadable) falls back to the backoff."""
        for value in ("0", "later"):
            error = failed(503, Retry_After=value)
            self.assertEqual(retry_delay(error, 2, base=1, rng=lambda: 0.0, now=clock), 1.0)

    def test_rng_out_of_range(self) -> None:
        """An rng returning 1 or more is refused."""
        self.assertRaises(ValueError, retry_delay, failed(503), 1, rng=lambda: 1.0)
