"""
Tests for the compare-and-swap resolution rule of L{svc.mount.fs.MountFS}
(``docs/specifications/mount-consistency.md``): compatible changes are
retried; incompatible ones keep the other writer's version at the path,
save ours as a conflict copy, fail the write-back with ESTALE (reported by
C{fsync} here; a close that handed its commit off is pinned in
L{svc.mount.test.test_fs_close}) and fill the C{recovery_*} audit fields.
"""

from __future__ import annotations

import errno
import os

from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane.test.test_service_support import LEASE_TIMINGS
from svc.mount.test.test_fs_support import CALLER, FSFixture


class ConflictTests(SynchronousTestCase):
    """
    Another writer changes a file while this mount has it open and dirty:
    it held the path's write lease when the mount opened the file (so the
    mount's was refused, L{svc.mount.test.test_fs_write_leases}), and
    gives it back after its change.
    """

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        self.mount = self.fixture.mount()
        self.entry = self.mount.write_file("f", b"version one")
        self.other = self.fixture.service.agent()
        granted = self.other.ok("lease_grant", path="/agent-1/f", mode="write")
        self.lease_id = granted["lease_id"]
        self.opened = self.mount.ok(self.mount.fs.open(self.entry.ino, os.O_RDWR, CALLER))
        self.mount.ok(self.mount.fs.write(self.opened.fh, 0, b"MINE", CALLER))

    def lease_given_back(self) -> None:
        self.other.ok("lease_release", lease_id=self.lease_id)

    def flush_errno(self) -> int:
        return self.mount.errno(self.mount.fs.fsync(self.opened.fh, False, CALLER))

    def copies(self) -> list[str]:
        return [name for name in self.fixture.mount().names("") if ".conflict-" in name]

    def test_incompatible_change(self) -> None:
        """A different content wins at the path; ours becomes a conflict copy; ESTALE."""
        theirs = self.fixture.session(1)
        self.other.put_file("f", b"their version", expected_version=2, session_id=theirs)
        self.lease_given_back()
        self.assertEqual(self.flush_errno(), errno.ESTALE)
        [copy] = self.copies()
        self.assertTrue(copy.startswith("f.conflict-"))
        fresh = self.fixture.mount()
        self.assertEqual(fresh.read_file("f"), b"their version")
        self.assertEqual(fresh.read_file(copy), b"MINEion one")
        line = self.mount.events("flush")[-1]
        self.assertFalse(line.allowed)
        self.assertEqual(line.size, len(b"version one"))
        self.assertEqual(line.get("recovery_kind"), "cas_conflict")
        self.assertEqual(line.get("recovery_your_version"), 2)
        self.assertEqual(line.get("recovery_current_version"), 3)
        self.assertEqual(line.get("recovery_last_writer_agent_id"), "agent-1")
        self.assertEqual(line.get("recovery_last_writer_session_id"), theirs)
        self.assertIsInstance(line.get("recovery_last_writer_at_unix_ms"), int)
        self.assertIn(copy, str(line.get("recovery_suggested_action")))
        self.assertEqual(line.get("cas_retries"), 0)
        self.assertIsNone(line.get("version_new"))
        self.assertEqual(self.mount.invalidated, [self.entry.ino])
        reread = self.mount.ok(self.mount.fs.read(self.opened.fh, 0, 100, CALLER))
        self.assertEqual(reread, b"their version")
        self.assertIn(copy, self.mount.names(""))
        flushes = len(self.mount.events("flush"))
        self.mount.ok(self.mount.fs.release(self.opened.fh, CALLER))
        self.assertEqual(len(self.mount.events("flush")), flushes)

    def test_compatible_change_is_retried(self) -> None:
        """A new version with the content we started from is overwritten after a retry."""
        self.other.put_file("f", b"version one", expected_version=2)
        self.lease_given_back()
        self.mount.ok(self.mount.fs.flush(self.opened.fh, CALLER))
        line = self.mount.events("flush")[-1]
        self.assertTrue(line.allowed)
        self.assertEqual((line.get("cas_retries"), line.get("version_new")), (1, 4))
        self.assertIsNone(line.get("recovery_kind"))
        self.assertEqual(self.fixture.mount().read_file("f"), b"MINEion one")
        self.assertEqual(self.copies(), [])

    def test_deleted_by_another_writer(self) -> None:
        """A file removed meanwhile is not recreated: ours is saved as a copy."""
        self.other.ok("manifest_delete", path="/agent-1/f")
        self.lease_given_back()
        self.assertEqual(self.flush_errno(), errno.ESTALE)
        [copy] = self.copies()
        self.assertEqual(self.fixture.mount().read_file(copy), b"MINEion one")
        line = self.mount.events("flush")[-1]
        self.assertEqual(line.get("recovery_current_version"), 0)
        self.assertNotIn("f", self.mount.names(""))

    def test_lease_held_elsewhere(self) -> None:
        """
        A write lease still held by another connection: the commit waits for
        it (the holder is asked to yield, and dropped at its revoke
        deadline), then commits; no conflict copy.
        """
        synced = self.mount.fs.fsync(self.opened.fh, False, CALLER)
        self.assertNoResult(synced)
        [revoke] = [push for push in self.other.sink.pushes if push[0] == "lease_revoke"]
        self.assertEqual(revoke[1]["lease_id"], self.lease_id)
        self.fixture.service.clock.advance(LEASE_TIMINGS.revoke_timeout)
        self.mount.ok(synced)
        line = self.mount.events("flush")[-1]
        self.assertTrue(line.allowed)
        self.assertEqual(line.get("cas_retries"), 1)
        self.assertEqual(self.copies(), [])
        self.assertEqual(self.fixture.mount().read_file("f"), b"MINEion one")

    def test_lease_given_back_while_waiting(self) -> None:
        """The holder yields when asked: the waiting commit goes through at once."""
        synced = self.mount.fs.fsync(self.opened.fh, False, CALLER)
        self.assertNoResult(synced)
        self.lease_given_back()
        self.mount.ok(synced)
        self.assertEqual(self.fixture.mount().read_file("f"), b"MINEion one")


class LostAnswerTests(SynchronousTestCase):
    """
    A commit whose answer was lost with the connection is sent once more:
    a first put that ran is then found and adopted, one that did not is
    made by the second.
    """

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        self.mount = self.fixture.mount()
        self.entry = self.mount.write_file("f", b"version one")
        self.version = self.fixture.mount().lookup_path("f").attributes.version
        self.opened = self.mount.ok(self.mount.fs.open(self.entry.ino, os.O_RDWR, CALLER))
        self.mount.ok(self.mount.fs.write(self.opened.fh, 0, b"MINE", CALLER))

    def assert_committed_once(self) -> None:
        """The new content is the next version (no second one), and the line says so."""
        fresh = self.fixture.mount()
        self.assertEqual(fresh.read_file("f"), b"MINEion one")
        self.assertEqual(fresh.lookup_path("f").attributes.version, self.version + 1)
        line = self.mount.events("flush")[-1]
        self.assertTrue(line.allowed)
        self.assertEqual((line.get("cas_retries"), line.get("version_new")), (0, self.version + 1))

    def test_put_that_ran_is_adopted(self) -> None:
        """The first put ran: the second is refused, and the version found is ours."""
        puts = self.mount.count("manifest_put")
        self.mount.answers.lose("manifest_put", ran=True)
        self.mount.ok(self.mount.fs.fsync(self.opened.fh, False, CALLER))
        self.assert_committed_once()
        self.assertEqual(self.mount.count("manifest_put") - puts, 2)

    def test_put_that_never_ran_is_sent_again(self) -> None:
        """The first put never reached the server: the second makes the version."""
        self.mount.answers.lose("manifest_put", ran=False)
        self.mount.ok(self.mount.fs.fsync(self.opened.fh, False, CALLER))
        self.assert_committed_once()

    def test_sent_again_once(self) -> None:
        """Both puts' answers lost: the write-back fails (EIO), the file stays dirty."""
        self.mount.answers.lose("manifest_put", ran=False, times=2)
        synced = self.mount.fs.fsync(self.opened.fh, False, CALLER)
        self.assertEqual(self.mount.errno(synced), errno.EIO)
        self.mount.ok(self.mount.fs.release(self.opened.fh, CALLER))
        self.assertEqual(self.fixture.mount().read_file("f"), b"MINEion one")
