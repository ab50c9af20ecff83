"""
Tests for file creation in L{svc.mount.fs.MountFS}: a file created in a
complete directory stays on this mount (pending) until its first commit or
an operation that needs it on the data plane, and a create's effect on its
directory is computed rather than fetched again.
"""

from __future__ import annotations

import errno
import os

from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane.service import location_of
from svc.mount.core.attributes import AttributeChanges, OpenResult
from svc.mount.fs import ROOT_INODE
from svc.mount.test.test_fs_support import AGENT, CALLER, FSFixture, Mount


def create(mount: Mount, path: str) -> OpenResult:
    """Create C{path} for writing; its open handle."""
    parent, name = mount.parent_of(path)
    opened, _entry = mount.ok(mount.fs.create(parent, name, 0o640, os.O_WRONLY, CALLER))
    return opened


def close(mount: Mount, opened: OpenResult) -> None:
    """Flush and release C{opened}, as C{close(2)} does."""
    mount.ok(mount.fs.flush(opened.fh, CALLER))
    mount.ok(mount.fs.release(opened.fh, CALLER))


class PendingCreateTests(SynchronousTestCase):
    """A create in a complete directory sends nothing until the file is needed."""

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        self.mount = self.fixture.mount()
        self.mount.ok(self.mount.fs.mkdir(ROOT_INODE, b"d", 0o755, CALLER))

    def requests(self) -> list[str]:
        return list(self.mount.connection.calls)

    def test_a_create_given_up_leaves_nothing(self) -> None:
        """
        A create the program was told had failed (answered after the
        bridge's timeout) is given up: nothing is sent, the name is gone,
        and creating it again with O_EXCL works (it used to be created
        empty: EEXIST).
        """
        before = len(self.requests())
        opened = create(self.mount, "d/f")
        self.mount.ok(self.mount.fs.abandon_create(opened.fh, CALLER))
        self.assertEqual(self.requests()[before:], [])
        self.assertEqual(self.mount.names("d"), [])
        parent, name = self.mount.parent_of("d/f")
        again, _entry = self.mount.ok(
            self.mount.fs.create(parent, name, 0o640, os.O_WRONLY | os.O_EXCL, CALLER)
        )
        close(self.mount, again)
        self.assertEqual(self.fixture.mount().names("d"), ["f"])

    def test_a_create_given_up_that_another_opened_is_kept(self) -> None:
        """A file given up that another handle opened and wrote meanwhile stays."""
        opened = create(self.mount, "d/f")
        entry = self.mount.lookup_path("d/f")
        other = self.mount.ok(self.mount.fs.open(entry.ino, os.O_RDWR, CALLER))
        self.mount.ok(self.mount.fs.write(other.fh, 0, b"kept", CALLER))
        self.mount.ok(self.mount.fs.abandon_create(opened.fh, CALLER))
        close(self.mount, other)
        self.assertEqual(self.fixture.mount().read_file("d/f"), b"kept")

    def test_first_commit_creates_the_file(self) -> None:
        """
        create and write send nothing; the flush is one manifest_put, its
        chunk inline (the flush line counts it as new).
        """
        before = len(self.requests())
        opened = create(self.mount, "d/f")
        self.mount.ok(self.mount.fs.write(opened.fh, 0, b"hello", CALLER))
        self.assertEqual(self.requests()[before:], [])
        close(self.mount, opened)
        self.assertEqual(self.requests()[before:], ["manifest_put"])
        self.assertEqual(self.fixture.mount().read_file("d/f"), b"hello")
        created = self.mount.events("create")[-1]
        self.assertEqual((created.path, created.allowed), ("/d/f", True))
        flush = self.mount.events("flush")[-1]
        self.assertEqual((flush.get("version_new"), flush.get("chunks_new")), (1, 1))

    def test_visible_on_this_mount_before_commit(self) -> None:
        """Lookups, getattr and listings of this mount see the new file at once."""
        opened = create(self.mount, "d/new")
        entry = self.mount.lookup_path("d/new")
        self.assertEqual((entry.attributes.size, entry.attributes.mode), (0, 0o640))
        self.assertEqual(self.mount.names("d"), ["new"])
        self.assertEqual(self.fixture.mount().names("d"), [])
        close(self.mount, opened)
        self.assertEqual(self.fixture.mount().names("d"), ["new"])

    def test_empty_file_is_committed_on_close(self) -> None:
        """A file created and closed without writes exists, empty, on the data plane."""
        close(self.mount, create(self.mount, "d/empty"))
        other = self.fixture.mount()
        self.assertEqual(other.lookup_path("d/empty").attributes.size, 0)
        self.assertEqual(self.mount.count("mknod"), 0)

    def test_inode_number_kept_and_bound(self) -> None:
        """The FUSE inode number survives the commit and matches a later listing."""
        opened = create(self.mount, "d/f")
        before = self.mount.lookup_path("d/f").ino
        close(self.mount, opened)
        self.mount.fs._ctx.directory(self.mount.lookup_path("d").ino).complete = False
        self.assertEqual(self.mount.names("d"), ["f"])
        self.assertEqual(self.mount.lookup_path("d/f").ino, before)

    def test_fsync_commits(self) -> None:
        """fsync of a new file commits it while it stays open."""
        opened = create(self.mount, "d/f")
        self.mount.ok(self.mount.fs.write(opened.fh, 0, b"data", CALLER))
        self.mount.ok(self.mount.fs.fsync(opened.fh, False, CALLER))
        self.assertEqual(self.fixture.mount().read_file("d/f"), b"data")
        close(self.mount, opened)

    def test_unlink_before_commit_sends_nothing(self) -> None:
        """Unlinking a pending file is local; its later close commits nothing."""
        opened = create(self.mount, "d/tmp")
        self.mount.ok(self.mount.fs.write(opened.fh, 0, b"scratch", CALLER))
        before = len(self.requests())
        dir_ino = self.mount.lookup_path("d").ino
        self.mount.ok(self.mount.fs.unlink(dir_ino, b"tmp", CALLER))
        close(self.mount, opened)
        self.assertEqual(self.requests()[before:], [])
        self.assertEqual(self.mount.names("d"), [])
        self.assertEqual(self.mount.events("unlink")[-1].allowed, True)

    def test_rename_creates_it_first(self) -> None:
        """A rename of a pending file creates it (mknod), renames it, then commits there."""
        opened = create(self.mount, "d/draft")
        self.mount.ok(self.mount.fs.write(opened.fh, 0, b"text", CALLER))
        dir_ino = self.mount.lookup_path("d").ino
        self.mount.ok(self.mount.fs.rename(dir_ino, b"draft", dir_ino, b"final", CALLER))
        close(self.mount, opened)
        self.assertEqual(self.mount.count("mknod"), 1)
        self.assertEqual(self.fixture.mount().read_file("d/final"), b"text")
        self.assertEqual(self.fixture.mount().names("d"), ["final"])

    def test_rename_onto_pending_file(self) -> None:
        """A pending rename target is created first, so the data plane replaces it."""
        self.mount.write_file("d/src", b"source")
        opened = create(self.mount, "d/dst")
        dir_ino = self.mount.lookup_path("d").ino
        self.mount.ok(self.mount.fs.rename(dir_ino, b"src", dir_ino, b"dst", CALLER))
        close(self.mount, opened)
        self.assertEqual(self.fixture.mount().read_file("d/dst"), b"source")
        self.assertEqual(self.fixture.mount().names("d"), ["dst"])

    def test_link_creates_it_first(self) -> None:
        """A hard link to a pending file creates it first; both names share its content."""
        opened = create(self.mount, "d/a")
        self.mount.ok(self.mount.fs.write(opened.fh, 0, b"shared", CALLER))
        node = self.mount.lookup_path("d/a")
        dir_ino = self.mount.lookup_path("d").ino
        linked = self.mount.ok(self.mount.fs.link(node.ino, dir_ino, b"b", CALLER))
        self.assertEqual((linked.ino, linked.attributes.nlink), (node.ino, 2))
        close(self.mount, opened)
        other = self.fixture.mount()
        self.assertEqual((other.read_file("d/a"), other.read_file("d/b")), (b"shared", b"shared"))

    def test_chmod_rides_on_the_first_commit(self) -> None:
        """setattr of a pending file's mode is committed with its content: no mknod, no setattr."""
        opened = create(self.mount, "d/f")
        ino = self.mount.lookup_path("d/f").ino
        self.mount.ok(self.mount.fs.setattr(ino, AttributeChanges(mode=0o600), CALLER))
        self.assertEqual(self.mount.lookup_path("d/f").attributes.mode, 0o600)
        close(self.mount, opened)
        self.assertEqual(self.fixture.mount().lookup_path("d/f").attributes.mode, 0o600)
        self.assertEqual((self.mount.count("mknod"), self.mount.count("setattr")), (0, 0))

    def test_pending_name_is_taken(self) -> None:
        """mkdir, symlink and mknod over a pending name are EEXIST."""
        opened = create(self.mount, "d/x")
        dir_ino = self.mount.lookup_path("d").ino
        fs = self.mount.fs
        self.assertEqual(self.mount.errno(fs.mkdir(dir_ino, b"x", 0o755, CALLER)), errno.EEXIST)
        self.assertEqual(self.mount.errno(fs.symlink(dir_ino, b"x", b"t", CALLER)), errno.EEXIST)
        made = fs.mknod(dir_ino, b"x", 0o100644, 0, CALLER)
        self.assertEqual(self.mount.errno(made), errno.EEXIST)
        close(self.mount, opened)

    def test_directory_with_pending_file_is_not_empty(self) -> None:
        """rmdir of a directory holding a pending file is ENOTEMPTY, and so is replacing it."""
        opened = create(self.mount, "d/f")
        fs = self.mount.fs
        self.assertEqual(self.mount.errno(fs.rmdir(ROOT_INODE, b"d", CALLER)), errno.ENOTEMPTY)
        self.mount.ok(fs.mkdir(ROOT_INODE, b"e", 0o755, CALLER))
        replaced = fs.rename(ROOT_INODE, b"e", ROOT_INODE, b"d", CALLER)
        self.assertEqual(self.mount.errno(replaced), errno.ENOTEMPTY)
        close(self.mount, opened)
        self.assertEqual(self.fixture.mount().names("d"), ["f"])

    def test_failed_first_commit_in_read_only_mode_drops_the_name(self) -> None:
        """In read-only mode a new file that was never committed loses its name (kernel too)."""
        opened = create(self.mount, "d/lost")
        self.mount.ok(self.mount.fs.write(opened.fh, 0, b"bytes", CALLER))
        self.mount.fs.set_read_only("lease lost")
        self.assertEqual(self.mount.errno(self.mount.fs.flush(opened.fh, CALLER)), errno.EROFS)
        release = self.mount.fs.release(opened.fh, CALLER)
        self.assertEqual(self.mount.errno(release), errno.EROFS)
        self.assertEqual(self.mount.names("d"), [])
        self.assertEqual(self.fixture.mount().names("d"), [])
        dir_ino = self.mount.lookup_path("d").ino
        self.assertEqual(self.mount.invalidated_entries, [(dir_ino, b"lost")])

    def test_failed_first_commit_leaves_an_empty_file(self) -> None:
        """A new file whose content cannot be committed (over its grant) is created empty."""
        engine = self.fixture.service.service.engine
        self.mount.ok(engine.set_agent_grant(location_of(AGENT), AGENT.agent_id, 10))
        opened = create(self.mount, "d/big")
        self.mount.ok(self.mount.fs.write(opened.fh, 0, b"x" * 100, CALLER))
        self.assertEqual(
            self.mount.errno(self.mount.fs.fsync(opened.fh, False, CALLER)), errno.EDQUOT
        )
        release = self.mount.fs.release(opened.fh, CALLER)
        self.assertEqual(self.mount.errno(release), errno.EDQUOT)
        self.assertEqual(self.mount.names("d"), ["big"])
        other = self.fixture.mount()
        self.assertEqual(other.lookup_path("d/big").attributes.size, 0)
        big = self.mount.lookup_path("d/big")
        self.assertEqual(big.attributes.size, 0)
        self.assertEqual(self.mount.invalidated_entries, [])
        # The kernel cached the discarded size and pages: it is told to drop them.
        self.assertEqual(self.mount.invalidated, [big.ino])

    def test_discarded_changes_to_a_committed_file_leave_no_kernel_cache(self) -> None:
        """
        Changes to a committed file that cannot be committed are discarded at
        its last close; the kernel is told to forget the inode's size and
        pages, and the next open does not keep its cache.
        """
        engine = self.fixture.service.service.engine
        entry = self.mount.write_file("d/kept", b"committed")
        self.mount.ok(engine.set_agent_grant(location_of(AGENT), AGENT.agent_id, 20))
        opened = self.mount.ok(self.mount.fs.open(entry.ino, os.O_WRONLY, CALLER))
        self.mount.ok(self.mount.fs.write(opened.fh, 9, b"y" * 100, CALLER))
        release = self.mount.fs.release(opened.fh, CALLER)
        self.assertEqual(self.mount.errno(release), errno.EDQUOT)
        self.assertEqual(self.mount.invalidated, [entry.ino])
        self.assertEqual(self.mount.lookup_path("d/kept").attributes.size, 9)
        again = self.mount.ok(self.mount.fs.open(entry.ino, os.O_RDONLY, CALLER))
        self.assertFalse(again.keep_cache)
        self.assertEqual(self.mount.ok(self.mount.fs.read(again.fh, 0, 100, CALLER)), b"committed")
        self.mount.ok(self.mount.fs.release(again.fh, CALLER))

    def test_incomplete_directory_creates_at_once(self) -> None:
        """In a directory not listed in full, create sends mknod as before."""
        fresh = self.fixture.mount()
        opened = create(fresh, "d/f")
        self.assertEqual(fresh.count("mknod"), 1)
        close(fresh, opened)
        self.assertEqual(self.fixture.mount().names("d"), ["f"])

    def test_create_of_a_name_the_server_has_opens_it(self) -> None:
        """
        In a directory not listed in full, a create (without C{O_EXCL}) of
        a name the data plane has (the answer to an earlier create lost with
        the connection, say) opens that file, truncated with C{O_TRUNC}, as
        C{open(2)} would have; with C{O_EXCL} it is C{EEXIST}.
        """
        self.mount.write_file("d/f", b"there")
        fresh = self.fixture.mount()
        parent, name = fresh.parent_of("d/f")
        flags = os.O_WRONLY | os.O_CREAT
        excl = fresh.fs.create(parent, name, 0o640, flags | os.O_EXCL, CALLER)
        self.assertEqual(fresh.errno(excl), errno.EEXIST)
        opened, entry = fresh.ok(fresh.fs.create(parent, name, 0o640, flags | os.O_TRUNC, CALLER))
        self.assertEqual(entry.ino, fresh.lookup_path("d/f").ino)
        fresh.ok(fresh.fs.write(opened.fh, 0, b"new", CALLER))
        close(fresh, opened)
        self.assertEqual(self.fixture.mount().read_file("d/f"), b"new")
        opened, _ = fresh.ok(fresh.fs.create(parent, name, 0o640, flags, CALLER))
        close(fresh, opened)
        self.assertEqual(self.fixture.mount().read_file("d/f"), b"new")

    def test_conflicting_creation_is_saved_as_a_copy(self) -> None:
        """A name taken on the data plane meanwhile keeps that file; ours becomes a copy."""
        opened = create(self.mount, "d/f")
        self.mount.ok(self.mount.fs.write(opened.fh, 0, b"ours", CALLER))
        other = self.fixture.mount()
        other.write_file("d/f", b"theirs")
        synced = self.mount.fs.fsync(opened.fh, False, CALLER)
        self.assertEqual(self.mount.errno(synced), errno.ESTALE)
        self.mount.ok(self.mount.fs.release(opened.fh, CALLER))
        names = self.fixture.mount().names("d")
        self.assertEqual(len(names), 2)
        self.assertEqual(self.fixture.mount().read_file("d/f"), b"theirs")
        copy = next(name for name in names if name != "f")
        self.assertTrue(copy.startswith("f.conflict-"))
        self.assertEqual(self.fixture.mount().read_file(f"d/{copy}"), b"ours")


class DirectoryAttributeTests(SynchronousTestCase):
    """A create's effect on its directory is computed, not fetched."""

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        self.mount = self.fixture.mount()

    def test_parent_after_mkdir_symlink_mknod_link(self) -> None:
        """The directory's times, version and link count equal the server's, with no head_file."""
        fs = self.mount.fs
        self.mount.ok(fs.mkdir(ROOT_INODE, b"d", 0o755, CALLER))
        directory = self.mount.lookup_path("d")
        self.mount.ok(fs.mkdir(directory.ino, b"sub", 0o755, CALLER))
        self.mount.ok(fs.symlink(directory.ino, b"s", b"target", CALLER))
        node = self.mount.ok(fs.mknod(directory.ino, b"n", 0o100644, 0, CALLER))
        self.mount.ok(fs.link(node.ino, directory.ino, b"l", CALLER))
        heads = self.mount.count("head_file")
        local = self.mount.ok(fs.getattr(directory.ino, CALLER))
        self.assertEqual(self.mount.count("head_file"), heads)
        server = self.fixture.mount().lookup_path("d").attributes
        self.assertEqual(
            (local.mtime_ns, local.ctime_ns, local.version, local.nlink),
            (server.mtime_ns, server.ctime_ns, server.version, server.nlink),
        )

    def test_parent_after_pending_commit(self) -> None:
        """
        After a new file's first commit the directory's times, version and
        link count, and the file's ctime, equal the server's (its stamp, not
        the client's clock), and the kernel is told to forget the
        attributes of both that it may have cached while the commit was in
        flight (their attributes only: the pages stay).
        """
        fs = self.mount.fs
        self.mount.ok(fs.mkdir(ROOT_INODE, b"d", 0o755, CALLER))
        directory = self.mount.lookup_path("d")
        opened, entry = self.mount.ok(fs.create(directory.ino, b"f", 0o640, os.O_WRONLY, CALLER))
        close(self.mount, opened)
        self.assertEqual(self.mount.forgotten_attributes, [directory.ino, entry.ino])
        self.assertEqual(self.mount.invalidated, [])
        heads = self.mount.count("head_file")
        local = self.mount.ok(fs.getattr(directory.ino, CALLER))
        local_file = self.mount.ok(fs.getattr(entry.ino, CALLER))
        self.assertEqual(self.mount.count("head_file"), heads)
        fresh = self.fixture.mount()
        server = fresh.lookup_path("d").attributes
        server_file = fresh.lookup_path("d/f").attributes
        self.assertEqual(
            (local.mtime_ns, local.ctime_ns, local.version, local.nlink),
            (server.mtime_ns, server.ctime_ns, server.version, server.nlink),
        )
        self.assertEqual(local_file.ctime_ns, server_file.ctime_ns)

    def test_parent_after_a_first_commit_adopted_later(self) -> None:
        """
        A new file's first commit ran but its answer was lost; sent again,
        it finds its own version there and adopts it. The directory changed
        when the first ran, and may have changed since (here another
        connection created a file in it meanwhile): its attributes are
        asked for again, not computed from the adopted file's older ctime.
        """
        fs = self.mount.fs
        self.mount.ok(fs.mkdir(ROOT_INODE, b"d", 0o755, CALLER))
        directory = self.mount.lookup_path("d")
        opened, _ = self.mount.ok(fs.create(directory.ino, b"f", 0o640, os.O_WRONLY, CALLER))
        self.mount.ok(fs.write(opened.fh, 0, b"mine", CALLER))
        self.mount.answers.lose("manifest_put", ran=True)
        self.mount.answers.hold("manifest_put")  # the put sent again
        flushed = fs.flush(opened.fh, CALLER)
        self.fixture.service.clock.advance(1)
        self.fixture.service.agent().put_file("d/other", b"theirs")
        self.mount.answers.release()
        self.mount.ok(flushed)
        self.mount.ok(fs.release(opened.fh, CALLER))
        [line] = self.mount.events("flush")
        self.assertEqual(line.get("version_new"), 1)
        local = self.mount.ok(fs.getattr(directory.ino, CALLER))
        server = self.fixture.mount().lookup_path("d").attributes
        self.assertEqual(
            (local.mtime_ns, local.ctime_ns, local.version, local.nlink),
            (server.mtime_ns, server.ctime_ns, server.version, server.nlink),
        )

    def test_parent_after_a_first_commit_that_found_the_file_there(self) -> None:
        """
        A new file's first commit finds the name taken, with the same bytes
        (its own creation, answered on a connection that was lost; here
        another connection's): the compatible retry overwrites it, which
        does not change the directory, so the directory's attributes are
        asked for again instead of computed.
        """
        fs = self.mount.fs
        self.mount.ok(fs.mkdir(ROOT_INODE, b"d", 0o755, CALLER))
        directory = self.mount.lookup_path("d")
        opened, _ = self.mount.ok(fs.create(directory.ino, b"f", 0o640, os.O_WRONLY, CALLER))
        self.mount.ok(fs.write(opened.fh, 0, b"same", CALLER))
        self.fixture.service.agent().put_file("d/f", b"same")
        self.fixture.service.clock.advance(1)
        self.mount.ok(fs.flush(opened.fh, CALLER))
        self.mount.ok(fs.release(opened.fh, CALLER))
        [line] = self.mount.events("flush")
        self.assertEqual((line.get("cas_retries"), line.get("version_new")), (1, 2))
        local = self.mount.ok(fs.getattr(directory.ino, CALLER))
        server = self.fixture.mount().lookup_path("d").attributes
        self.assertEqual(
            (local.mtime_ns, local.ctime_ns, local.version, local.nlink),
            (server.mtime_ns, server.ctime_ns, server.version, server.nlink),
        )
