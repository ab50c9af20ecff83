"""
Tests for the close of an empty file (``docs/specifications/mount-consistency.md``
section 2.5, "An empty file's close"): a file that is empty at its close (new,
or truncated to nothing), with no attribute change kept and no other handle
open, leaves its commit to the handle's next close with content, an
C{fsync}, or its release. The shell's C{>} (open, C{dup2}, close, write,
close) and C{touch} then commit once, and the data plane never holds the
emptied file between the old content and the new.
"""

from __future__ import annotations

import errno
import os

from twisted.trial.unittest import SynchronousTestCase

from svc.mount.core.attributes import AttributeChanges, OpenResult
from svc.mount.core.inodes import ROOT_INODE
from svc.mount.fs import FSSettings
from svc.mount.test.test_fs_support import CALLER, FSFixture, Mount


def create(mount: Mount, name: str) -> OpenResult:
    """Create C{name} in the (listed, so complete) root for writing: its handle."""
    mount.names("")
    opened, _entry = mount.ok(
        mount.fs.create(ROOT_INODE, name.encode(), 0o644, os.O_WRONLY, CALLER)
    )
    return opened


def truncating_open(mount: Mount, name: str) -> OpenResult:
    """
    C{open(name, O_WRONLY | O_TRUNC)} as the kernel sends it without atomic
    C{O_TRUNC}: an open for writing, then a C{setattr} of size 0.
    """
    ino = mount.lookup_path(name).ino
    opened = mount.ok(mount.fs.open(ino, os.O_WRONLY, CALLER))
    mount.ok(mount.fs.setattr(ino, AttributeChanges(size=0), CALLER))
    return opened


class EmptyCloseTests(SynchronousTestCase):
    """A close that would commit an empty file leaves the commit to a later one."""

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        self.mount = self.fixture.mount()
        self.fs = self.mount.fs

    def server(self) -> Mount:
        """A second mount: what the data plane holds."""
        return self.fixture.mount()

    def test_a_new_file_closed_empty_is_committed_at_its_release(self) -> None:
        """Nothing is sent at the close; the release commits the empty file, once."""
        opened = create(self.mount, "new")
        self.mount.ok(self.fs.flush(opened.fh, CALLER))
        self.assertEqual(self.mount.count("manifest_put"), 0)
        self.assertEqual(self.server().names(""), [])
        self.assertEqual(self.mount.names(""), ["new"], "this mount has it meanwhile")
        self.mount.ok(self.fs.release(opened.fh, CALLER))
        self.assertEqual(self.mount.count("manifest_put"), 1)
        self.assertEqual(self.server().lookup_path("new").attributes.size, 0)
        self.assertEqual(len(self.mount.events("flush")), 1)

    def test_shell_redirection_commits_once(self) -> None:
        """
        C{echo hi > new}: the close of the descriptor the shell duplicated
        sends nothing; the close after the write commits the content.
        """
        opened = create(self.mount, "new")
        self.mount.ok(self.fs.flush(opened.fh, CALLER))
        self.mount.ok(self.fs.write(opened.fh, 0, b"hi\n", CALLER))
        self.mount.ok(self.fs.flush(opened.fh, CALLER))
        self.mount.ok(self.fs.release(opened.fh, CALLER))
        self.assertEqual(self.mount.count("manifest_put"), 1)
        self.assertEqual(self.server().read_file("new"), b"hi\n")

    def test_touch_commits_once_with_its_times(self) -> None:
        """C{touch new}: create, close of the duplicate, C{futimens}, close: one commit."""
        opened = create(self.mount, "new")
        ino = self.mount.lookup_path("new").ino
        self.mount.ok(self.fs.flush(opened.fh, CALLER))
        when = 1_700_000_000_123_456_789
        self.mount.ok(self.fs.setattr(ino, AttributeChanges(mtime_ns=when, atime_ns=when), CALLER))
        self.mount.ok(self.fs.flush(opened.fh, CALLER))
        self.mount.ok(self.fs.release(opened.fh, CALLER))
        self.assertEqual(self.mount.count("manifest_put"), 1)
        self.assertEqual(self.mount.count("setattr"), 0)
        self.assertEqual(self.server().lookup_path("new").attributes.mtime_ns, when)

    def test_a_rewrite_goes_from_the_old_content_to_the_new(self) -> None:
        """
        C{echo new > f} over an existing file: the close after the
        truncation sends nothing, so the data plane keeps the old content
        until the new one is committed, one version later.
        """
        self.mount.write_file("f", b"old content")
        before = self.mount.lookup_path("f").attributes.version
        puts = self.mount.count("manifest_put")
        opened = truncating_open(self.mount, "f")
        self.mount.ok(self.fs.flush(opened.fh, CALLER))
        self.assertEqual(self.mount.count("manifest_put"), puts)
        self.assertEqual(self.server().read_file("f"), b"old content")
        self.mount.ok(self.fs.write(opened.fh, 0, b"new\n", CALLER))
        self.mount.ok(self.fs.flush(opened.fh, CALLER))
        self.mount.ok(self.fs.release(opened.fh, CALLER))
        self.assertEqual(self.mount.count("manifest_put"), puts + 1)
        self.assertEqual(self.server().read_file("f"), b"new\n")
        self.assertEqual(self.server().lookup_path("f").attributes.version, before + 1)

    def test_a_truncation_left_empty_is_committed_at_the_release(self) -> None:
        """C{: > f}: the emptied file reaches the data plane at the last close."""
        self.mount.write_file("f", b"old content")
        opened = truncating_open(self.mount, "f")
        self.mount.ok(self.fs.flush(opened.fh, CALLER))
        self.assertEqual(self.server().read_file("f"), b"old content")
        self.mount.ok(self.fs.release(opened.fh, CALLER))
        self.assertEqual(self.server().read_file("f"), b"")

    def test_the_fuse_thread_answers_the_close_of_an_emptied_file(self) -> None:
        """
        The first empty close is recorded in the outbox by the reactor
        (``mount-outbox.md`` section 8); with the file's lock free, later
        ones need no reactor round trip.
        """
        self.mount.write_file("f", b"old content")
        opened = truncating_open(self.mount, "f")
        self.assertFalse(self.fs.nothing_to_flush(opened.fh), "not recorded yet")
        self.mount.ok(self.fs.flush(opened.fh, CALLER))
        self.assertEqual(self.mount.outbox.backlog().entries, 1)
        self.assertTrue(self.fs.nothing_to_flush(opened.fh))

    def test_the_fuse_thread_answers_the_close_of_a_new_file(self) -> None:
        """
        A new file's lock is held for the write grant its first write may
        take: with the grant untaken, a close after the first (which the
        reactor records) needs no reactor round trip.
        """
        opened = create(self.mount, "new")
        self.mount.ok(self.fs.flush(opened.fh, CALLER))
        self.assertTrue(self.fs.nothing_to_flush(opened.fh))
        self.mount.ok(self.fs.write(opened.fh, 0, b"x", CALLER))
        self.assertFalse(self.fs.nothing_to_flush(opened.fh), "written: the reactor commits")

    def test_fsync_commits_the_empty_file(self) -> None:
        """C{fsync} is the durability point, empty or not."""
        opened = create(self.mount, "new")
        self.mount.ok(self.fs.fsync(opened.fh, False, CALLER))
        self.assertEqual(self.server().lookup_path("new").attributes.size, 0)
        self.mount.ok(self.fs.release(opened.fh, CALLER))
        self.assertEqual(self.mount.count("manifest_put"), 1)

    def test_with_another_handle_open_the_close_commits(self) -> None:
        """
        Another open of the file (a logger's, say) may stay open for long:
        the close of the truncating handle commits the empty file then.
        """
        self.mount.write_file("f", b"old content")
        ino = self.mount.lookup_path("f").ino
        other = self.mount.ok(self.fs.open(ino, os.O_WRONLY, CALLER))
        opened = truncating_open(self.mount, "f")
        self.assertFalse(self.fs.nothing_to_flush(opened.fh))
        self.mount.ok(self.fs.flush(opened.fh, CALLER))
        self.assertEqual(self.server().read_file("f"), b"")
        self.mount.ok(self.fs.release(opened.fh, CALLER))
        self.mount.ok(self.fs.release(other.fh, CALLER))

    def test_a_kept_attribute_change_is_committed_at_the_close(self) -> None:
        """A C{chmod} kept for the commit makes the close commit, empty or not."""
        opened = create(self.mount, "new")
        ino = self.mount.lookup_path("new").ino
        self.mount.ok(self.fs.setattr(ino, AttributeChanges(mode=0o600), CALLER))
        self.mount.ok(self.fs.flush(opened.fh, CALLER))
        self.assertEqual(self.server().lookup_path("new").attributes.mode, 0o600)
        self.mount.ok(self.fs.release(opened.fh, CALLER))

    def test_durable_close_commits_the_empty_file_at_the_close(self) -> None:
        """With C{durable_close}, every close of a changed file waits for its commit."""
        mount = self.fixture.mount(settings=FSSettings(durable_close=True))
        opened = create(mount, "new")
        self.assertFalse(mount.fs.nothing_to_flush(opened.fh))
        mount.ok(mount.fs.flush(opened.fh, CALLER))
        self.assertEqual(self.server().lookup_path("new").attributes.size, 0)
        mount.ok(mount.fs.release(opened.fh, CALLER))
        self.assertEqual(mount.count("manifest_put"), 1)

    def test_while_the_connection_is_down_the_close_commits(self) -> None:
        """
        During an outage every close of a changed file waits for its commit
        (section 2.5), an empty one's too, so the program hears the outcome.
        """
        mount = self.fixture.mount(connected=lambda: False)
        opened = create(mount, "new")
        self.assertFalse(mount.fs.nothing_to_flush(opened.fh))
        mount.ok(mount.fs.flush(opened.fh, CALLER))
        self.assertEqual(self.server().lookup_path("new").attributes.size, 0)
        mount.ok(mount.fs.release(opened.fh, CALLER))

    def test_a_read_only_mount_reports_the_close(self) -> None:
        """On a mount turned read-only, the close of a new empty file fails as before."""
        opened = create(self.mount, "new")
        self.fs.set_read_only("lease lost")
        self.assertEqual(self.mount.errno(self.fs.flush(opened.fh, CALLER)), errno.EROFS)
        self.assertEqual(self.mount.errno(self.fs.release(opened.fh, CALLER)), errno.EROFS)
