"""
Tests for L{svc.mount.control.start_retry.until_answered}: start-up calls tried
again while the control plane answers "later", for a bounded time.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from svc.mount.control.control_client import (
    ControlPlaneError,
    LeaseLive,
    RateLimited,
    Unauthorized,
    Unreachable,
)
from svc.mount.control.start_retry import refused_at_start, until_answered


class Calls:
    """A call that fails with the queued errors, then answers."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.times: list[float] = []

    def __call__(self, clock: Clock) -> Deferred[str]:
        self.times.append(clock.seconds())
        if self.errors:
            return fail(self.errors.pop(0))
        return succeed("answer")


def unreachable() -> Unreachable:
    return Unreachable(0, "unreachable", "connection refused")


class UntilAnsweredTests(SynchronousTestCase):
    """L{until_answered}."""

    def run_call(self, calls: Calls, wait: float = 60.0) -> tuple[Clock, Deferred[str]]:
        clock = Clock()
        done = Deferred.fromCoroutine(
            until_answered(clock, "enrollment", lambda: calls(clock), wait=wait)
        )
        return clock, done

    def test_tried_again_with_doubling_pauses_until_answered(self) -> None:
        """No answer twice, then an answer: tries at 0, 0.5 and 1.5 s."""
        calls = Calls(unreachable(), unreachable())
        clock, done = self.run_call(calls)
        clock.pump([0.5, 1.0])
        self.assertEqual(self.successResultOf(done), "answer")
        self.assertEqual(calls.times, [0.0, 0.5, 1.5])

    def test_retry_after_is_honoured(self) -> None:
        """A 429 asking for 7 s is not tried again sooner."""
        calls = Calls(RateLimited(429, "rate_limited", retry_after=7.0))
        clock, done = self.run_call(calls)
        clock.advance(6.9)
        self.assertNoResult(done)
        clock.advance(0.1)
        self.assertEqual(self.successResultOf(done), "answer")

    def test_gives_up_with_the_last_error_after_the_wait(self) -> None:
        """Past the wait the last refusal is raised, and nothing more is tried."""
        calls = Calls(*[unreachable() for _ in range(20)])
        clock, done = self.run_call(calls, wait=3.0)
        clock.pump([0.5, 1.0, 2.0, 4.0])
        self.failureResultOf(done, Unreachable)
        self.assertEqual(calls.times, [0.0, 0.5, 1.5])

    def test_other_errors_are_raised_at_once(self) -> None:
        """A refused token is final: no second try."""
        calls = Calls(Unauthorized(401, "invalid_token"))
        clock, done = self.run_call(calls)
        self.failureResultOf(done, Unauthorized)
        clock.advance(100)
        self.assertEqual(len(calls.times), 1)


class RefusedAtStartTests(SynchronousTestCase):
    """L{refused_at_start}: the variable a start-up refusal names."""

    def test_variables(self) -> None:
        """Each refusal names what to fix."""
        url = "https://control.example"
        cases = [
            ("enrollment", Unauthorized(401, "invalid_token"), "SVC_ENROLL_TOKEN"),
            ("enrollment", ControlPlaneError(404, "not_found"), "SVC_CONTROL_URL"),
            ("enrollment", unreachable(), "SVC_CONTROL_URL"),
            (
                "enrollment",
                Unreachable(0, "unreachable", "SSL: certificate verify failed"),
                "SVC_CA_FILE",
            ),
            ("mount lease", LeaseLive(409, "lease_live"), "SVC_MOUNT_FORCE"),
            ("mount lease", ControlPlaneError(400, "invalid_request"), "mount lease"),
        ]
        for step, error, variable in cases:
            refusal = refused_at_start(step, error, url)
            self.assertEqual(refusal.variable, variable, error)
            self.assertNotIn("\n", str(refusal))
