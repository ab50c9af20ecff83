"""
Tests for C{close} (FUSE C{flush}) handing its commit off
(``docs/specifications/mount-consistency.md`` section 2.5): it returns once
the commit is sent, the answer is handled behind it, and the cases where it
waits instead.
"""

from __future__ import annotations

import errno
import os

from twisted.internet.defer import Deferred, fail, succeed
from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane.service import location_of
from svc.mount.core.attributes import AttributeChanges, OpenResult, QuotaReport
from svc.mount.core.inodes import ROOT_INODE
from svc.mount.fs import FSSettings
from svc.mount.test.test_fs_support import AGENT, CALLER, FSFixture, Mount
from svc.mount.writeback import close_hand_off


def create(mount: Mount, name: str, data: bytes) -> OpenResult:
    """Create C{name} in the root, write C{data}; its open handle."""
    opened, _entry = mount.ok(
        mount.fs.create(ROOT_INODE, name.encode(), 0o644, os.O_WRONLY, CALLER)
    )
    mount.ok(mount.fs.write(opened.fh, 0, data, CALLER))
    return opened


class HandOffTests(SynchronousTestCase):
    """A close returns once its commit is sent; later requests wait as needed."""

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        self.mount = self.fixture.mount()
        self.answers = self.mount.answers

    def test_close_returns_once_the_commit_is_sent(self) -> None:
        """
        The flush fires before the answer; the file's release and shutdown's
        wait do not; the answer then completes the flush line.
        """
        opened = create(self.mount, "f", b"content")
        self.answers.hold("manifest_put")
        self.mount.ok(self.mount.fs.flush(opened.fh, CALLER))
        self.assertEqual(self.answers.held, 1)
        self.assertEqual(self.fixture.mount().read_file("f"), b"content", "sent: on the server")
        self.assertEqual(self.mount.events("flush"), [])
        released = self.mount.fs.release(opened.fh, CALLER)
        settled = self.mount.fs.write_backs_settled()
        self.assertNoResult(released)
        self.assertNoResult(settled)
        self.answers.release()
        self.mount.ok(released)
        self.mount.ok(settled)
        [line] = self.mount.events("flush")
        self.assertTrue(line.allowed)
        self.assertIsInstance(line.get("version_new"), int)
        self.assertEqual(self.mount.read_file("f"), b"content")

    def test_fsync_waits_for_the_answer(self) -> None:
        """C{fsync} is the durability point: it fires only with the answer."""
        opened = create(self.mount, "f", b"content")
        self.answers.hold("manifest_put")
        synced = self.mount.fs.fsync(opened.fh, False, CALLER)
        self.assertNoResult(synced)
        self.answers.release()
        self.mount.ok(synced)

    def assert_close_waits(self, mount: Mount, name: str) -> None:
        """A close of a new file C{name} on C{mount} fires only with its commit's answer."""
        opened = create(mount, name, b"content")
        mount.answers.hold("manifest_put")
        flushed = mount.fs.flush(opened.fh, CALLER)
        self.assertNoResult(flushed)
        mount.answers.release()
        mount.ok(flushed)

    def test_durable_close_waits_for_the_answer(self) -> None:
        """With C{durable_close}, a close fires only with the answer."""
        self.assert_close_waits(self.fixture.mount(settings=FSSettings(durable_close=True)), "f")

    def test_a_close_waits_while_the_connection_is_down(self) -> None:
        """
        With the data plane's connection down, the close fires only with
        its commit's answer (here: once the held answer is let go), so the
        program hears whether the commit got through.
        """
        up = [False]
        mount = self.fixture.mount(connected=lambda: up[0])
        self.assert_close_waits(mount, "f")
        up[0] = True
        again = create(mount, "g", b"more")
        mount.answers.hold("manifest_put")
        mount.ok(mount.fs.flush(again.fh, CALLER))  # handed off again
        mount.answers.release()

    def test_a_large_file_waits(self) -> None:
        """A file over HAND_OFF_MAX_BYTES: the close waits for its commit."""
        self.patch(close_hand_off, "HAND_OFF_MAX_BYTES", 6)
        small = create(self.mount, "small", b"123456")
        large = create(self.mount, "large", b"1234567")
        self.answers.hold("manifest_put")
        self.mount.ok(self.mount.fs.flush(small.fh, CALLER))
        flushed = self.mount.fs.flush(large.fh, CALLER)
        self.assertNoResult(flushed)
        self.answers.release()
        self.mount.ok(flushed)

    def test_namespace_changes_wait_for_commits_in_flight(self) -> None:
        """
        A rename of the file waits for its commit's answer, and then acts
        on the server; creating another file does not wait.
        """
        opened = create(self.mount, "a", b"first")
        self.answers.hold("manifest_put")
        self.mount.ok(self.mount.fs.flush(opened.fh, CALLER))
        renamed = self.mount.fs.rename(ROOT_INODE, b"a", ROOT_INODE, b"b", CALLER)
        self.assertNoResult(renamed)
        other = create(self.mount, "c", b"other")
        self.answers.release()
        self.mount.ok(renamed)
        self.mount.ok(self.mount.fs.flush(other.fh, CALLER))
        for fh in (opened.fh, other.fh):
            self.mount.ok(self.mount.fs.release(fh, CALLER))
        fresh = self.fixture.mount()
        self.assertEqual(sorted(fresh.names("")), ["b", "c"])
        self.assertEqual(fresh.read_file("b"), b"first")

    def test_unlink_of_a_file_in_flight_removes_it_on_the_server(self) -> None:
        """A new file removed while its first commit is in flight is gone everywhere."""
        opened = create(self.mount, "a", b"first")
        self.answers.hold("manifest_put")
        self.mount.ok(self.mount.fs.flush(opened.fh, CALLER))
        removed = self.mount.fs.unlink(ROOT_INODE, b"a", CALLER)
        self.assertNoResult(removed)
        self.answers.release()
        self.mount.ok(removed)
        self.mount.ok(self.mount.fs.release(opened.fh, CALLER))
        self.assertEqual(self.fixture.mount().names(""), [])
        self.assertEqual(self.mount.names(""), [])

    def test_link_goes_behind_the_commit_in_flight(self) -> None:
        """
        A hard link to a new file whose first commit is in flight (git
        stores an object so: write a temporary file, close, link) is sent
        at once behind that commit, which creates the file, and answered
        after it: the new name is the same inode, with the content.
        """
        self.mount.names("")  # listed whole: a new file stays pending until its commit
        opened = create(self.mount, "a", b"object")
        ino = self.mount.lookup_path("a").ino
        self.answers.hold("manifest_put", "link")
        self.mount.ok(self.mount.fs.flush(opened.fh, CALLER))
        linked = self.mount.fs.link(ino, ROOT_INODE, b"b", CALLER)
        self.assertEqual(self.mount.connection.calls[-2:], ["manifest_put", "link"])
        self.assertEqual(self.mount.count("mknod"), 0, "the commit creates it")
        self.assertNoResult(linked)
        self.answers.release()
        entry = self.mount.ok(linked)
        self.assertEqual((entry.ino, entry.attributes.nlink), (ino, 2))
        self.mount.ok(self.mount.fs.release(opened.fh, CALLER))
        fresh = self.fixture.mount()
        self.assertEqual((fresh.read_file("a"), fresh.read_file("b")), (b"object", b"object"))
        self.assertEqual(fresh.lookup_path("a").ino, fresh.lookup_path("b").ino)

    def chmod_while_in_flight(self, changes: AttributeChanges) -> tuple[OpenResult, int]:
        """
        Create C{f}, close it with its commit held, change C{changes}: the
        handle and the file's inode, the setattr answered at once.
        """
        opened = create(self.mount, "f", b"content")
        ino = self.mount.lookup_path("f").ino
        self.answers.hold("manifest_put")
        self.mount.ok(self.mount.fs.flush(opened.fh, CALLER))
        setattrs = self.mount.count("setattr")
        self.mount.ok(self.mount.fs.setattr(ino, changes, CALLER))
        self.assertEqual(self.mount.count("setattr"), setattrs, "kept, not sent")
        self.assertEqual(self.answers.held, 1, "not waiting for the commit")
        return opened, ino

    def test_attributes_changed_while_the_commit_is_in_flight_are_kept(self) -> None:
        """
        A chmod after the close (pip's) does not wait for the commit in
        flight, which does not carry it; it stays kept, and the file's
        release commits it after the answer.
        """
        opened, ino = self.chmod_while_in_flight(AttributeChanges(mode=0o755))
        self.assertEqual(self.mount.ok(self.mount.fs.getattr(ino, CALLER)).mode, 0o755)
        released = self.mount.fs.release(opened.fh, CALLER)
        self.answers.release()
        self.mount.ok(released)
        self.assertEqual(self.mount.ok(self.mount.fs.getattr(ino, CALLER)).mode, 0o755)
        self.assertEqual(self.answers.held, 0)
        server = self.fixture.mount().lookup_path("f").attributes
        versions = [line.get("version_new") for line in self.mount.events("flush")]
        self.assertEqual(versions, [server.version - 1, server.version])
        self.assertEqual(server.mode, 0o755)

    def test_mtime_changed_while_the_commit_is_in_flight_is_kept(self) -> None:
        """The first commit's answer does not replace a later utime's mtime."""
        mtime = 1_500_000_000_123_456_789
        opened, ino = self.chmod_while_in_flight(AttributeChanges(mtime_ns=mtime))
        self.answers.release()
        self.assertEqual(self.mount.ok(self.mount.fs.getattr(ino, CALLER)).mtime_ns, mtime)
        self.mount.ok(self.mount.fs.release(opened.fh, CALLER))
        self.assertEqual(self.mount.ok(self.mount.fs.getattr(ino, CALLER)).mtime_ns, mtime)
        self.assertEqual(self.fixture.mount().lookup_path("f").attributes.mtime_ns, mtime)

    def test_times_changed_while_the_commit_is_in_flight_are_kept(self) -> None:
        """rsync's utimensat after the close (atime and mtime) waits for nothing either."""
        opened, ino = self.chmod_while_in_flight(AttributeChanges(atime_ns=1_000, mtime_ns=2_000))
        self.answers.release()
        self.mount.ok(self.mount.fs.release(opened.fh, CALLER))
        stored = self.fixture.mount().lookup_path("f").attributes
        self.assertEqual((stored.atime_ns, stored.mtime_ns), (1_000, 2_000))
        local = self.mount.ok(self.mount.fs.getattr(ino, CALLER))
        self.assertEqual((local.atime_ns, local.mtime_ns), (1_000, 2_000))

    def test_attributes_changed_during_the_last_release_commit_are_committed(self) -> None:
        """
        A chmod kept while the close's commit was in flight is committed
        by the release's write-back; a chown arriving while that second
        commit is in flight is kept too, and the release commits it as well
        before it lets the file go (it was discarded: the mount showed the
        new owner, then the server's old one).
        """
        opened, ino = self.chmod_while_in_flight(AttributeChanges(mode=0o600))
        released = self.mount.fs.release(opened.fh, CALLER)
        self.answers.release("manifest_put")  # the close's; the release's commit is held
        self.assertEqual(self.answers.held, 1, "the release's commit, with the mode")
        owner = AttributeChanges(uid=7, gid=8)
        self.mount.ok(self.mount.fs.setattr(ino, owner, CALLER))
        self.answers.release()
        self.mount.ok(released)
        self.mount.ok(self.mount.fs.write_backs_settled())
        for mount in (self.mount, self.fixture.mount()):
            stored = mount.ok(mount.fs.getattr(mount.lookup_path("f").ino, CALLER))
            self.assertEqual((stored.mode, stored.uid, stored.gid), (0o600, 7, 8))

    def test_truncate_while_the_last_release_writes_back_is_committed(self) -> None:
        """
        C{truncate(path)} right after the close: the kernel's release of the
        file is still writing it back (its commit unanswered), and the
        truncate waits for the file's lock behind it. The change is
        committed, not retired with the file's state uncommitted (which
        lost it: a later extension then read the old bytes back).
        """
        opened = create(self.mount, "f", b"a" * 100)
        self.answers.hold("manifest_put")
        self.mount.ok(self.mount.fs.flush(opened.fh, CALLER))
        released = self.mount.fs.release(opened.fh, CALLER)
        ino = self.mount.lookup_path("f").ino
        truncated = self.mount.fs.setattr(ino, AttributeChanges(size=10), CALLER)
        self.answers.release()
        self.mount.ok(released)
        self.assertEqual(self.mount.ok(truncated).size, 10)
        self.assertEqual(self.mount.read_file("f"), b"a" * 10)
        self.mount.ok(self.mount.fs.setattr(ino, AttributeChanges(size=50), CALLER))
        self.assertEqual(self.mount.read_file("f"), b"a" * 10 + bytes(40))
        self.assertEqual(self.fixture.mount().read_file("f"), b"a" * 10 + bytes(40))


class NothingToFlushTests(SynchronousTestCase):
    """When the FUSE thread may answer a flush itself."""

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        self.mount = self.fixture.mount()
        self.fs = self.mount.fs

    def test_a_clean_file(self) -> None:
        """A file opened and only read: nothing to flush."""
        entry = self.mount.write_file("f", b"content")
        opened = self.mount.ok(self.fs.open(entry.ino, os.O_RDONLY, CALLER))
        self.assertTrue(self.fs.nothing_to_flush(opened.fh))

    def test_written_pending_or_in_flight(self) -> None:
        """
        A write, a commit in flight: the reactor flushes. A new empty file's
        close waits (test_fs_empty_close), recorded in the outbox by the
        reactor once; the FUSE thread answers its later empty closes.
        """
        self.mount.names("")  # a listed directory: a new file in it is pending
        created, _entry = self.mount.ok(
            self.fs.create(ROOT_INODE, b"new", 0o644, os.O_WRONLY, CALLER)
        )
        self.assertFalse(self.fs.nothing_to_flush(created.fh), "pending, empty, not recorded")
        self.mount.ok(self.fs.flush(created.fh, CALLER))
        self.assertTrue(self.fs.nothing_to_flush(created.fh), "pending, empty, recorded")
        self.mount.ok(self.fs.write(created.fh, 0, b"x", CALLER))
        self.assertFalse(self.fs.nothing_to_flush(created.fh), "written")
        self.mount.answers.hold("manifest_put")
        self.mount.ok(self.fs.flush(created.fh, CALLER))
        self.assertFalse(self.fs.nothing_to_flush(created.fh), "in flight")
        self.mount.answers.release()
        self.assertTrue(self.fs.nothing_to_flush(created.fh), "committed")

    def test_unknown_handle(self) -> None:
        """A handle that is not open: the reactor answers (EBADF)."""
        self.assertFalse(self.fs.nothing_to_flush(12345))


class HandOffFailureTests(SynchronousTestCase):
    """
    A write-back that fails after its close returned. The mount takes no
    write leases here, so that another connection's commit can come
    between its open and its close (with leases, the other would wait for
    the mount's lease, and the mount would commit before yielding it).
    """

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        self.mount = self.fixture.mount(settings=FSSettings(write_leases=False))
        self.entry = self.mount.write_file("f", b"version one")
        self.opened = self.mount.ok(self.mount.fs.open(self.entry.ino, os.O_RDWR, CALLER))
        self.mount.ok(self.mount.fs.write(self.opened.fh, 0, b"MINE", CALLER))

    def test_conflict_is_audited_and_copied(self) -> None:
        """
        The close returned; the conflict found behind it keeps both
        versions and writes the flush line with the recovery fields.
        """
        theirs = self.fixture.session(1)
        other = self.fixture.service.agent()
        other.put_file("f", b"their version", expected_version=2, session_id=theirs)
        self.mount.ok(self.mount.fs.flush(self.opened.fh, CALLER))
        line = self.mount.events("flush")[-1]
        self.assertFalse(line.allowed)
        self.assertEqual(line.get("recovery_kind"), "cas_conflict")
        self.mount.ok(self.mount.fs.release(self.opened.fh, CALLER))
        fresh = self.fixture.mount()
        [copy] = [name for name in fresh.names("") if ".conflict-" in name]
        self.assertEqual(fresh.read_file(copy), b"MINEion one")
        self.assertEqual(fresh.read_file("f"), b"their version")

    def test_later_closes_wait_until_a_commit_succeeds(self) -> None:
        """After a failure behind a close, closes wait (and report) until one commits."""
        other = self.fixture.service.agent()
        other.put_file("f", b"their version", expected_version=2)
        self.mount.ok(self.mount.fs.flush(self.opened.fh, CALLER))
        self.mount.ok(self.mount.fs.release(self.opened.fh, CALLER))
        answers = self.mount.answers
        waiting = create(self.mount, "g", b"g")
        answers.hold("manifest_put")
        flushed = self.mount.fs.flush(waiting.fh, CALLER)
        self.assertNoResult(flushed)
        answers.release()
        self.mount.ok(flushed)
        handed = create(self.mount, "h", b"h")
        answers.hold("manifest_put")
        self.mount.ok(self.mount.fs.flush(handed.fh, CALLER))
        answers.release()


class QuotaTests(SynchronousTestCase):
    """A close hands off only with room to spare under the disk's quota."""

    def setUp(self) -> None:
        self.fixture = FSFixture(self)

    def flush_fires_at_once(self, quota: object) -> bool:
        mount = self.fixture.mount(quota=lambda: quota)  # type: ignore[arg-type,return-value]
        opened = create(mount, "f", b"content")
        mount.answers.hold("manifest_put")
        flushed = mount.fs.flush(opened.fh, CALLER)
        at_once = flushed.called
        mount.answers.release()
        mount.ok(flushed)
        return at_once

    def test_room_to_spare(self) -> None:
        """HAND_OFF_HEADROOM left after the file: the close hands off."""
        used = 1000
        room = QuotaReport(used + close_hand_off.HAND_OFF_HEADROOM + len(b"content"), used)
        self.assertTrue(self.flush_fires_at_once(succeed(room)))

    def test_no_quota(self) -> None:
        """A disk without a quota: the close hands off."""
        self.assertTrue(self.flush_fires_at_once(succeed(QuotaReport(None, 5))))

    def test_little_room(self) -> None:
        """Less than HAND_OFF_HEADROOM left: the close waits, to report EDQUOT."""
        used = 1000
        tight = QuotaReport(used + close_hand_off.HAND_OFF_HEADROOM + len(b"content") - 1, used)
        self.assertFalse(self.flush_fires_at_once(succeed(tight)))

    def test_nothing_to_commit_asks_nothing(self) -> None:
        """Closing a file with nothing to commit does not ask for the quota."""
        asked: list[None] = []

        def quota() -> Deferred[QuotaReport]:
            asked.append(None)
            return succeed(QuotaReport(None, 0))

        mount = self.fixture.mount(quota=quota)
        entry = mount.write_file("f", b"content")
        asked.clear()
        opened = mount.ok(mount.fs.open(entry.ino, os.O_RDONLY, CALLER))
        mount.ok(mount.fs.flush(opened.fh, CALLER))
        mount.ok(mount.fs.release(opened.fh, CALLER))
        self.assertEqual(asked, [])

    def test_quota_unknown(self) -> None:
        """The quota cannot be had: the close waits."""
        self.assertFalse(self.flush_fires_at_once(fail(OSError(errno.EIO, "no answer"))))


class ReaderCloseTests(SynchronousTestCase):
    """The close of a handle opened read-only commits nothing (as on NFS)."""

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        # Little room left under the quota: closes wait for their commits.
        self.mount = self.fixture.mount(quota=lambda: succeed(QuotaReport(1 << 20, 1 << 19)))
        entry = self.mount.write_file("f", b"version one")
        self.writer = self.mount.ok(self.mount.fs.open(entry.ino, os.O_RDWR, CALLER))
        self.mount.ok(self.mount.fs.write(self.writer.fh, 0, b"MINE", CALLER))
        self.reader = self.mount.ok(self.mount.fs.open(entry.ino, os.O_RDONLY, CALLER))

    def test_a_readers_close_leaves_the_writers_changes_to_the_writer(self) -> None:
        """
        A reader's close sends no commit and writes no flush line while a
        writer's changes are pending; the writer's close commits them.
        """
        lines = len(self.mount.events("flush"))
        self.mount.answers.hold("manifest_put", unsent=["manifest_put"])
        self.mount.ok(self.mount.fs.flush(self.reader.fh, CALLER))
        self.assertEqual(self.mount.answers.held, 0)
        self.assertEqual(len(self.mount.events("flush")), lines)
        self.assertTrue(self.mount.fs.nothing_to_flush(self.reader.fh), "answered off the reactor")
        self.assertFalse(self.mount.fs.nothing_to_flush(self.writer.fh))
        self.mount.answers.release()
        self.mount.ok(self.mount.fs.flush(self.writer.fh, CALLER))
        self.assertEqual(self.fixture.mount().read_file("f"), b"MINEion one")

    def test_a_readers_close_does_not_report_the_writers_failure(self) -> None:
        """
        The writer's commit fails (over the grant): a reader's close then
        succeeds (it used to fail EDQUOT), and the last release reports and
        discards the changes.
        """
        engine = self.fixture.service.service.engine
        self.mount.ok(engine.set_agent_grant(location_of(AGENT), AGENT.agent_id, 5))
        self.mount.ok(self.mount.fs.write(self.writer.fh, 11, b"x" * 100, CALLER))
        synced = self.mount.fs.fsync(self.writer.fh, False, CALLER)
        self.assertEqual(self.mount.errno(synced), errno.EDQUOT)
        self.mount.ok(self.mount.fs.release(self.writer.fh, CALLER))
        self.mount.ok(self.mount.fs.flush(self.reader.fh, CALLER))
        self.assertEqual(
            self.mount.errno(self.mount.fs.release(self.reader.fh, CALLER)), errno.EDQUOT
        )
        self.assertEqual(self.mount.read_file("f"), b"version one")
