"""
Tests for L{svc.mount.writeback.kept_write_backs}: when the files kept through a
data-plane outage are tried again, and the shutdown's last round.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from svc.mount.writeback.kept_write_backs import KeptWriteBacks, Try


class Files:
    """
    Kept files whose attempts record themselves and, while the data plane
    is C{down}, fail: kept again when there is room (as the release does)
    with L{Try.AGAIN}, discarded otherwise.
    """

    def __init__(self, kept: KeptWriteBacks) -> None:
        self.kept = kept
        self.down = True
        self.tried: list[tuple[int, Try]] = []
        self.hold: dict[int, Deferred[None]] = {}

    def keep(self, key: int) -> None:
        self.kept.keep(key, lambda how: self._attempt(key, how))

    async def _attempt(self, key: int, how: Try) -> bool:
        self.tried.append((key, how))
        if how is Try.GIVE_UP:
            return False
        held = self.hold.pop(key, None)
        if held is not None:
            await held
        if not self.down:
            return True
        if how is Try.AGAIN and self.kept.room():
            self.keep(key)
        return False


AGAIN, LAST, GIVE_UP = Try.AGAIN, Try.LAST, Try.GIVE_UP


class KeptWriteBacksTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.kept = KeptWriteBacks(self.clock, pause_initial=1.0, pause_max=8.0, limit=3)
        self.files = Files(self.kept)

    def test_nothing_is_tried_before_the_pause(self) -> None:
        """A kept file's first attempt waits for the pause."""
        self.files.keep(1)
        self.clock.advance(0.5)
        self.assertEqual(self.files.tried, [])
        self.clock.advance(0.5)
        self.assertEqual(self.files.tried, [(1, AGAIN)])
        self.assertIn(1, self.kept)

    def test_a_round_stops_at_the_first_file_kept_again(self) -> None:
        """While the data plane is out of reach, each round tries one file, the oldest."""
        for key in (1, 2, 3):
            self.files.keep(key)
        self.clock.advance(1.0)
        self.assertEqual(self.files.tried, [(1, AGAIN)])
        self.assertEqual(len(self.kept), 3)

    def test_the_pause_doubles_while_rounds_make_no_progress(self) -> None:
        """1, 2, 4, 8 and then 8 seconds (pause_max) between rounds."""
        self.files.keep(1)
        at = []
        for _ in range(5):
            before = len(self.files.tried)
            waited = 0.0
            while len(self.files.tried) == before:
                self.clock.advance(0.5)
                waited += 0.5
            at.append(waited)
        self.assertEqual(at, [1.0, 2.0, 4.0, 8.0, 8.0])

    def test_a_round_that_gets_through_writes_every_file_back(self) -> None:
        """Once the data plane answers, one round tries every file, and nothing stays."""
        for key in (1, 2, 3):
            self.files.keep(key)
        self.clock.advance(1.0)
        self.files.down = False
        self.clock.advance(2.0)
        self.assertEqual(self.files.tried, [(1, AGAIN), (2, AGAIN), (3, AGAIN), (1, AGAIN)])
        self.assertEqual(len(self.kept), 0)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_a_reconnection_runs_a_round_at_once(self) -> None:
        """C{now} does not wait for the pause, and the pause starts over."""
        self.files.keep(1)
        self.clock.advance(1.0)
        self.clock.advance(2.0)  # the pause is 4 s now
        self.kept.now()
        self.assertEqual(len(self.files.tried), 3)
        self.clock.advance(1.0)
        self.assertEqual(len(self.files.tried), 4, "the pause went back to 1 s")
        self.assertEqual(len(self.clock.getDelayedCalls()), 1, "one timer at a time")

    def test_a_reconnection_during_a_round_runs_another_after_it(self) -> None:
        """A failed attempt that overlapped a reconnection is tried again at once."""
        self.files.keep(1)
        self.files.hold[1] = Deferred()
        held = self.files.hold[1]
        self.clock.advance(1.0)
        self.kept.now()
        self.assertEqual(self.files.tried, [(1, AGAIN)])
        held.callback(None)  # failed: still down when its answer came
        self.assertEqual(self.files.tried, [(1, AGAIN), (1, AGAIN)])

    def test_last_round_tries_each_file_once_more(self) -> None:
        """
        At shutdown, with the data plane back, every file gets its last
        attempt, and none stays kept or scheduled.
        """
        for key in (1, 2):
            self.files.keep(key)
        self.files.down = False
        self.successResultOf(self.kept.last_round())
        self.assertEqual(self.files.tried, [(1, LAST), (2, LAST)])
        self.assertEqual(len(self.kept), 0)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertFalse(self.kept.room(), "nothing is kept after the last round began")

    def test_last_round_gives_up_after_the_first_out_of_reach(self) -> None:
        """
        Shutdown with the data plane out of reach: one last attempt, then
        the other files' changes are given up without trying (each attempt
        may wait a call's whole connection wait).
        """
        for key in (1, 2, 3):
            self.files.keep(key)
        self.successResultOf(self.kept.last_round())
        self.assertEqual(self.files.tried, [(1, LAST), (2, GIVE_UP), (3, GIVE_UP)])
        self.assertEqual(len(self.kept), 0)

    def test_last_round_waits_for_the_running_round(self) -> None:
        """The attempt running at shutdown ends first; what it kept gets its final attempt."""
        self.files.keep(1)
        self.files.hold[1] = Deferred()
        held = self.files.hold[1]
        self.clock.advance(1.0)
        done = self.kept.last_round()
        self.assertNoResult(done)
        held.callback(None)
        self.successResultOf(done)
        # The running attempt found no room (the last round began): the file is not kept.
        self.assertEqual(self.files.tried, [(1, AGAIN)])
        self.assertEqual(len(self.kept), 0)

    def test_room_is_bounded(self) -> None:
        """At most C{limit} files are kept."""
        for key in (1, 2):
            self.files.keep(key)
        self.assertTrue(self.kept.room())
        self.files.keep(3)
        self.assertFalse(self.kept.room())

    def test_a_file_being_tried_counts_as_kept(self) -> None:
        """While its attempt runs, the file is still I{in} the kept set."""
        self.files.keep(1)
        self.files.hold[1] = Deferred()
        held = self.files.hold[1]
        self.clock.advance(1.0)
        self.assertIn(1, self.kept)
        self.files.down = False
        held.callback(None)
        self.assertNotIn(1, self.kept)

    def test_a_failing_attempt_is_logged_and_dropped(self) -> None:
        """An attempt that raises is logged; the file is not kept, and the rest go on."""

        async def broken(how: Try) -> bool:
            raise RuntimeError("boom")

        self.kept.keep(7, broken)
        self.files.down = False
        self.files.keep(1)
        self.clock.advance(1.0)
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        self.assertEqual(self.files.tried, [(1, AGAIN)])
        self.assertEqual(len(self.kept), 0)
