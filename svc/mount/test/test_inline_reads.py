"""
Tests for L{svc.mount.chunks.inline_reads.InlineReads}: opens ask for a small
file's bytes while the bytes that came were mostly new to the mount.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from svc.mount.chunks.inline_reads import PROBE_EVERY, WINDOW, InlineReads


def asked(reads: InlineReads, opens: int) -> list[int]:
    """The C{inline_max} of C{opens} opens in a row."""
    return [reads.inline_max() for _ in range(opens)]


class InlineReadsTests(SynchronousTestCase):
    """When an open asks."""

    def test_asks_until_told_otherwise(self) -> None:
        """A fresh mount asks, and keeps asking while what came was new."""
        reads = InlineReads(4096)
        for _ in range(3 * WINDOW):
            self.assertEqual(reads.inline_max(), 4096)
            reads.came(already_held=False)

    def test_zero_never_asks(self) -> None:
        """C{max_bytes=0} turns it off."""
        self.assertEqual(asked(InlineReads(0), 2 * PROBE_EVERY), [0] * (2 * PROBE_EVERY))

    def test_mostly_held_stops_asking_but_probes(self) -> None:
        """
        Once more than half of the recent chunks were held already, opens
        stop asking, except one in every C{PROBE_EVERY}.
        """
        reads = InlineReads(4096)
        for _ in range(WINDOW):
            reads.came(already_held=True)
        self.assertEqual(asked(reads, PROBE_EVERY), [0] * (PROBE_EVERY - 1) + [4096])
        self.assertEqual(asked(reads, PROBE_EVERY), [0] * (PROBE_EVERY - 1) + [4096])

    def test_half_new_is_enough(self) -> None:
        """Exactly half new keeps asking; new chunks after held ones bring asking back."""
        reads = InlineReads(4096)
        for held in [False, True] * (WINDOW // 2):
            reads.came(already_held=held)
        self.assertEqual(reads.inline_max(), 4096)
        reads.came(already_held=True)  # the oldest, a new one, drops out of the window
        self.assertEqual(reads.inline_max(), 0)
        for _ in range(WINDOW // 2):
            reads.came(already_held=False)
        self.assertEqual(reads.inline_max(), 4096)
