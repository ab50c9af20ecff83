"""
L{svc.testing.hypothesis_profile}: the tests' Hypothesis settings carry no
timing-based check.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from twisted.trial.unittest import SynchronousTestCase


class UntimedProfileTests(SynchronousTestCase):
    """Loading a test package loads the untimed profile."""

    def test_no_deadline_and_no_slowness_check(self) -> None:
        """The default settings have no deadline and skip the C{too_slow} health check."""
        current = settings()
        self.assertIsNone(current.deadline)
        self.assertIn(HealthCheck.too_slow, current.suppress_health_check)
