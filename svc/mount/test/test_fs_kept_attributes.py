"""
Tests for attribute changes kept for a file's write-back: a C{setattr} of
mode, owner or mtime on a file whose write-back is due anyway (changed
content, or pending) is not sent; the write-back's C{manifest_put} carries
it (``docs/specifications/mount-fs.md`` section 5).
"""

from __future__ import annotations

import errno
import os

from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane.service import location_of
from svc.mount.core.attributes import AttributeChanges
from svc.mount.fs import ROOT_INODE
from svc.mount.test.test_fs_create import close, create
from svc.mount.test.test_fs_support import AGENT, CALLER, FSFixture

MTIME = 1_700_000_000_000_000_000


class KeptAttributeTests(SynchronousTestCase):
    """setattr folded into the write-back that follows it."""

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        self.mount = self.fixture.mount()
        self.mount.ok(self.mount.fs.mkdir(ROOT_INODE, b"d", 0o755, CALLER))

    def setattr(self, path: str, changes: AttributeChanges) -> None:
        ino = self.mount.lookup_path(path).ino
        self.mount.ok(self.mount.fs.setattr(ino, changes, CALLER))

    def test_tar_extraction_costs_one_commit(self) -> None:
        """
        What tar does per file (write, set mtime, chown, chmod, close) sends
        one chunk_put and one manifest_put; a fresh mount sees every value.
        """
        opened = create(self.mount, "d/f")
        self.mount.ok(self.mount.fs.write(opened.fh, 0, b"content", CALLER))
        self.setattr("d/f", AttributeChanges(mtime_ns=MTIME))
        self.setattr("d/f", AttributeChanges(uid=0, gid=0))
        self.setattr("d/f", AttributeChanges(mode=0o755))
        seen = self.mount.lookup_path("d/f").attributes
        self.assertEqual((seen.mode, seen.uid, seen.gid, seen.mtime_ns), (0o755, 0, 0, MTIME))
        close(self.mount, opened)
        sent = {op: self.mount.count(op) for op in ("mknod", "setattr", "manifest_put")}
        self.assertEqual(sent, {"mknod": 0, "setattr": 0, "manifest_put": 1})
        fresh = self.fixture.mount()
        stored = fresh.lookup_path("d/f").attributes
        self.assertEqual((stored.mode, stored.uid, stored.gid), (0o755, 0, 0))
        self.assertEqual(stored.mtime_ns, MTIME)
        self.assertEqual(fresh.read_file("d/f"), b"content")

    def test_chmod_of_a_changed_committed_file_rides_on_its_commit(self) -> None:
        """An existing file being written keeps a chmod for its commit."""
        entry = self.mount.write_file("d/old", b"v1")
        opened = self.mount.ok(self.mount.fs.open(entry.ino, os.O_WRONLY, CALLER))
        self.mount.ok(self.mount.fs.write(opened.fh, 0, b"v2", CALLER))
        self.setattr("d/old", AttributeChanges(mode=0o600))
        self.assertEqual(self.mount.count("setattr"), 0)
        close(self.mount, opened)
        stored = self.fixture.mount().lookup_path("d/old").attributes
        self.assertEqual(stored.mode, 0o600)

    def test_a_file_with_nothing_to_write_back_sends_at_once(self) -> None:
        """A change to a file with nothing to write back goes out at once."""
        entry = self.mount.write_file("d/f", b"x")
        opened = self.mount.ok(self.mount.fs.open(entry.ino, os.O_WRONLY, CALLER))
        self.setattr("d/f", AttributeChanges(mode=0o600))  # nothing written: no write-back due
        self.assertEqual(self.mount.count("setattr"), 1)
        close(self.mount, opened)
        self.assertEqual(self.fixture.mount().lookup_path("d/f").attributes.mode, 0o600)

    def test_times_ride_on_the_commit(self) -> None:
        """
        atime and mtime set on a file being written (rsync's and unzip's
        utimensat) are committed with it: manifest_put carries both.
        """
        entry = self.mount.write_file("d/f", b"x")
        opened = self.mount.ok(self.mount.fs.open(entry.ino, os.O_WRONLY, CALLER))
        self.mount.ok(self.mount.fs.write(opened.fh, 0, b"y", CALLER))
        self.setattr("d/f", AttributeChanges(atime_ns=MTIME + 7, mtime_ns=MTIME))
        self.assertEqual(self.mount.count("setattr"), 0)
        close(self.mount, opened)
        stored = self.fixture.mount().lookup_path("d/f").attributes
        self.assertEqual((stored.atime_ns, stored.mtime_ns), (MTIME + 7, MTIME))

    def test_kept_change_is_committed_when_the_content_returns_to_the_base(self) -> None:
        """A file grown, chmod'ed and truncated back still commits the new mode."""
        entry = self.mount.write_file("d/f", b"base")
        opened = self.mount.ok(self.mount.fs.open(entry.ino, os.O_WRONLY, CALLER))
        self.mount.ok(self.mount.fs.write(opened.fh, 4, b"more", CALLER))
        self.setattr("d/f", AttributeChanges(mode=0o700))
        self.setattr("d/f", AttributeChanges(size=4))
        close(self.mount, opened)
        fresh = self.fixture.mount()
        self.assertEqual(fresh.lookup_path("d/f").attributes.mode, 0o700)
        self.assertEqual(fresh.read_file("d/f"), b"base")

    def test_discarded_write_back_forgets_kept_attributes(self) -> None:
        """When the write-back cannot commit, the mount shows the server's mode again."""
        engine = self.fixture.service.service.engine
        entry = self.mount.write_file("d/f", b"small")
        self.mount.ok(engine.set_agent_grant(location_of(AGENT), AGENT.agent_id, 10))
        opened = self.mount.ok(self.mount.fs.open(entry.ino, os.O_WRONLY, CALLER))
        self.mount.ok(self.mount.fs.write(opened.fh, 5, b"x" * 100, CALLER))
        self.setattr("d/f", AttributeChanges(mode=0o600))
        release = self.mount.fs.release(opened.fh, CALLER)
        self.assertEqual(self.mount.errno(release), errno.EDQUOT)
        attributes = self.mount.ok(self.mount.fs.getattr(entry.ino, CALLER))
        self.assertEqual((attributes.mode, attributes.size), (0o644, 5))
