"""
Tests for L{svc.mount.writeback.shutdown_sync}: the write-back of every open handle
at shutdown.
"""

from __future__ import annotations

import errno

from twisted.internet.defer import Deferred, fail, succeed
from twisted.trial.unittest import SynchronousTestCase

from svc.audit.events import CallerProcess
from svc.mount.core.errors import FSError
from svc.mount.writeback.shutdown_sync import sync_all


class ShutdownFS:
    """
    A MountFS stand-in for L{sync_all}: fsync answers per handle, and the
    release write-backs settle, and the kept files' last attempts end, when
    the test says so.
    """

    def __init__(self, answers: dict[int, Exception | None]) -> None:
        self.answers = answers
        self.synced: list[int] = []
        self.settled: Deferred[None] = Deferred()
        self.last: Deferred[None] = succeed(None)
        self.last_asked = False
        self.stopped = False

    def fsync(self, fh: int, datasync: bool, caller: CallerProcess) -> Deferred[None]:
        self.synced.append(fh)
        answer = self.answers[fh]
        return fail(answer) if answer is not None else succeed(None)

    def write_backs_settled(self) -> Deferred[None]:
        return self.settled

    def last_write_backs(self) -> Deferred[None]:
        self.last_asked = True
        return self.last

    def stopping(self) -> None:
        self.stopped = True


class SyncAllTests(SynchronousTestCase):
    """
    Shutdown writes back every open handle and waits for releases in flight.
    """

    def test_released_handle_is_not_a_failure_and_release_is_awaited(self) -> None:
        """A handle closed meanwhile (EBADF) is skipped, and the result waits for its release."""
        fs = ShutdownFS({1: None, 2: FSError(errno.EBADF, "no open file 2"), 3: None})
        caller = CallerProcess("app", 1, 0, 0)
        result = sync_all(fs, {1: caller, 2: caller, 3: caller})  # type: ignore[arg-type]
        self.assertEqual(fs.synced, [1, 2, 3])
        self.assertNoResult(result)
        fs.settled.callback(None)
        self.assertEqual(self.successResultOf(result), 0)

    def test_real_failure_counted(self) -> None:
        """Any other write-back error is counted as a failure."""
        fs = ShutdownFS({1: FSError(errno.EIO, "data plane gone")})
        fs.settled.callback(None)
        caller = CallerProcess("app", 1, 0, 0)
        result = sync_all(fs, {1: caller})  # type: ignore[arg-type]
        self.assertEqual(self.successResultOf(result), 1)
        self.flushLoggedErrors()

    def test_kept_files_get_their_last_attempt_after_the_releases(self) -> None:
        """
        The files kept through an outage are tried a last time once the
        releases in flight ended (those may keep more), and shutdown waits
        for those attempts.
        """
        fs = ShutdownFS({1: None})
        fs.last = Deferred()
        caller = CallerProcess("app", 1, 0, 0)
        result = sync_all(fs, {1: caller})  # type: ignore[arg-type]
        self.assertTrue(fs.stopped, "told first")
        self.assertFalse(fs.last_asked)
        fs.settled.callback(None)
        self.assertTrue(fs.last_asked)
        self.assertNoResult(result)
        fs.last.callback(None)
        self.assertEqual(self.successResultOf(result), 0)
