"""
Log lines a peer can cause, written at a bounded rate.
"""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.logger import Logger, LogLevel, capturedLogs
from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane.rate_limited_log import RateLimitedLog


class RateLimitedLogTests(SynchronousTestCase):
    """At most C{burst} lines of a kind per interval; the rest counted."""

    def test_burst_then_suppressed_then_counted(self) -> None:
        """Beyond the burst lines are held back; the next interval's first line counts them."""
        clock = Clock()
        log = RateLimitedLog(clock.seconds, Logger(), burst=2, interval=10.0)
        with capturedLogs() as events:
            written = [log.emit("a", LogLevel.warn, "line {n}", n=n) for n in range(5)]
            clock.advance(10)
            log.emit("a", LogLevel.warn, "line {n}", n=5)
        self.assertEqual(written, [True, True, False, False, False])
        self.assertEqual([(e["n"], e["suppressed"]) for e in events], [(0, 0), (1, 0), (5, 3)])

    def test_kinds_are_counted_apart(self) -> None:
        """One kind using its burst does not hold back another."""
        clock = Clock()
        log = RateLimitedLog(clock.seconds, Logger(), burst=1, interval=10.0)
        self.assertTrue(log.emit("a", LogLevel.info, "x"))
        self.assertFalse(log.emit("a", LogLevel.info, "x"))
        self.assertTrue(log.emit("b", LogLevel.info, "y"))
