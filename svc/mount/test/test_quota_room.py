"""
Tests for write-time C{EDQUOT} (L{svc.mount.remote.quota_room}): the room's
estimate on its own, then through L{svc.mount.fs.MountFS} over a real
data-plane service whose agent grant is set.
"""

from __future__ import annotations

import errno
import os

from twisted.internet.defer import Deferred, fail, succeed
from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane.service import location_of
from svc.mount.core.attributes import AttributeChanges, QuotaReport
from svc.mount.core.errors import FSError, RemoteFailure
from svc.mount.core.inodes import ROOT_INODE
from svc.mount.remote.quota_room import QuotaRoom
from svc.mount.test.test_fs_support import AGENT, CALLER, FSFixture, Mount
from svc.wire.errno import WireErrno


class Reports:
    """A C{fetch} answering the reports queued, counting the asks."""

    def __init__(self, *reports: QuotaReport | Exception) -> None:
        self.reports = list(reports)
        self.asked = 0

    def __call__(self) -> Deferred[QuotaReport]:
        self.asked += 1
        report = self.reports.pop(0)
        return fail(report) if isinstance(report, Exception) else succeed(report)


class QuotaRoomTests(SynchronousTestCase):
    """The estimate: last report's usage, plus growth committed since, plus open growth."""

    def room(self, *reports: QuotaReport | Exception) -> tuple[QuotaRoom, Reports, list[str]]:
        fetch = Reports(*reports)
        waits: list[str] = []

        def settled() -> Deferred[None]:
            waits.append("settled")
            return succeed(None)

        return QuotaRoom(fetch, settled), fetch, waits

    def test_nothing_known_refuses_nothing(self) -> None:
        """Before a report, with no quota, or with no room at all for nothing, all fits."""
        room, _, _ = self.room(QuotaReport(None, 10))
        self.assertTrue(room.fits(1 << 40))
        self.successResultOf(room.refresh())
        self.assertTrue(room.fits(1 << 40))
        self.assertTrue(QuotaRoom(None, lambda: succeed(None)).fits(1 << 40))
        self.assertFalse(QuotaRoom(None, lambda: succeed(None)).enabled)

    def test_growth_open_and_committed_counts_until_the_next_report(self) -> None:
        """
        Open growth counts; committed growth keeps counting until a report
        asked for after the commit arrives (that report holds it).
        """
        room, _, _ = self.room(QuotaReport(100, 40), QuotaReport(100, 70))
        self.successResultOf(room.refresh())
        self.assertTrue(room.fits(60))
        room.grew(30)
        self.assertTrue(room.fits(30))
        self.assertFalse(room.fits(31))
        room.committed(30)
        self.assertFalse(room.fits(31), "committed, not in the report yet")
        self.successResultOf(room.refresh())
        self.assertTrue(room.fits(30))
        self.assertFalse(room.fits(31))

    def test_refused_only_after_a_fresh_look(self) -> None:
        """
        A write the estimate has no room for waits for the changes in flight,
        asks again, and goes ahead when the server shows room (a file was
        removed meanwhile); it is refused only when it shows none.
        """
        room, fetch, waits = self.room(
            QuotaReport(100, 90), QuotaReport(100, 10), QuotaReport(100, 95)
        )
        self.successResultOf(room.refresh())
        self.successResultOf(Deferred.fromCoroutine(room.check(50)))
        self.assertEqual((fetch.asked, waits), (2, ["settled"]))
        self.successResultOf(Deferred.fromCoroutine(room.check(50)))
        self.assertEqual(fetch.asked, 2, "the estimate had room: nothing asked")
        failure = self.failureResultOf(Deferred.fromCoroutine(room.check(91)), FSError)
        self.assertEqual(failure.value.errno, errno.EDQUOT)
        self.assertEqual(fetch.asked, 3)

    def test_no_answer_keeps_the_report_and_no_statfs_disables(self) -> None:
        """A failed look keeps the last report; a server without statfs ends the room."""
        unknown = RemoteFailure(errno.EIO, "statfs: lost", unknown=True)
        enosys = RemoteFailure(errno.ENOSYS, "statfs: unknown op", WireErrno.ENOSYS)
        room, _, _ = self.room(QuotaReport(100, 90), unknown, enosys)
        self.successResultOf(room.refresh())
        self.successResultOf(room.refresh())
        self.assertFalse(room.fits(11))
        self.successResultOf(room.refresh())
        self.assertFalse(room.enabled)
        self.assertTrue(room.fits(1 << 40))


GRANT = 64 * 1024


class WriteTimeQuotaTests(SynchronousTestCase):
    """Through the mount: the agent's grant refuses the write, not only the close."""

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        engine = self.fixture.service.service.engine
        self.successResultOf(engine.set_agent_grant(location_of(AGENT), AGENT.agent_id, GRANT))
        self.mount = self.mount_with_quota()

    def mount_with_quota(self) -> Mount:
        """A mount given a quota source (its room asks the real service)."""
        return self.fixture.mount(quota=lambda: succeed(QuotaReport(None, 0)))

    def create(self, name: str) -> int:
        opened, entry = self.mount.ok(
            self.mount.fs.create(ROOT_INODE, name.encode(), 0o644, os.O_RDWR, CALLER)
        )
        self.ino = entry.ino
        return opened.fh

    def write(self, fh: int, offset: int, data: bytes) -> Deferred[int]:
        return self.mount.fs.write(fh, offset, data, CALLER)

    def close(self, fh: int) -> None:
        self.mount.ok(self.mount.fs.flush(fh, CALLER))
        self.mount.ok(self.mount.fs.release(fh, CALLER))

    def test_a_write_past_the_grant_fails_and_the_bytes_before_it_are_kept(self) -> None:
        """
        Writes up to the grant succeed; the one past it fails EDQUOT (it used
        to succeed, and the close failed); the file closes with what fit.
        """
        fh = self.create("f")
        piece = b"x" * (16 * 1024)
        for index in range(4):
            self.assertEqual(self.mount.ok(self.write(fh, index * len(piece), piece)), len(piece))
        self.assertEqual(self.mount.errno(self.write(fh, GRANT, b"y")), errno.EDQUOT)
        self.close(fh)
        self.assertEqual(self.fixture.mount().read_file("f"), piece * 4)

    def test_growth_already_written_and_rewrites_of_committed_bytes_are_not_counted_again(
        self,
    ) -> None:
        """
        At a full grant, writing again over bytes already written, or over
        the committed content, adds no growth and is not refused.
        """
        self.mount.write_file("full", b"a" * GRANT)
        entry = self.mount.lookup_path("full")
        opened = self.mount.ok(self.mount.fs.open(entry.ino, os.O_RDWR, CALLER))
        self.assertEqual(self.mount.ok(self.write(opened.fh, 100, b"b" * 1000)), 1000)
        self.assertEqual(self.mount.errno(self.write(opened.fh, GRANT, b"c")), errno.EDQUOT)
        self.close(opened.fh)

    def test_room_freed_by_a_removal_is_seen_at_once(self) -> None:
        """
        A full disk, then a file removed: the next write, which the old
        estimate had no room for, asks again and goes ahead.
        """
        self.mount.write_file("full", b"a" * GRANT)
        fh = self.create("g")
        self.assertEqual(self.mount.errno(self.write(fh, 0, b"g" * 100)), errno.EDQUOT)
        self.mount.ok(self.mount.fs.unlink(ROOT_INODE, b"full", CALLER))
        self.assertEqual(self.mount.ok(self.write(fh, 0, b"g" * 100)), 100)
        self.close(fh)
        self.assertEqual(self.fixture.mount().read_file("g"), b"g" * 100)

    def test_the_fuse_threads_write_grant_leaves_a_write_without_room_to_the_reactor(
        self,
    ) -> None:
        """A write grant does not accept a write the estimate has no room for."""
        fh = self.create("f")
        self.mount.ok(self.write(fh, 0, b"x" * (GRANT - 10)))
        grant = self.mount.fs.take_write_grant(fh)
        assert grant is not None
        self.assertTrue(grant.accepts(GRANT - 10, 10))
        self.assertFalse(grant.accepts(GRANT - 10, 11))
        grant.give_back()
        self.close(fh)

    def test_a_truncate_gives_the_room_back(self) -> None:
        """Bytes written and truncated away no longer count."""
        fh = self.create("f")
        self.mount.ok(self.write(fh, 0, b"x" * GRANT))
        self.assertEqual(self.mount.errno(self.write(fh, GRANT, b"y")), errno.EDQUOT)
        self.mount.ok(self.mount.fs.setattr(self.ino, AttributeChanges(size=10), CALLER))
        self.assertEqual(self.mount.ok(self.write(fh, 10, b"y" * 100)), 100)
        self.close(fh)
