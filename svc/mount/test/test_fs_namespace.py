"""
Tests for L{svc.mount.fs.MountFS} namespace operations: lookups and the
names cache, directories, renames, hard links, symlinks, device nodes,
attributes, inode numbers and their audit lines.
"""

from __future__ import annotations

import errno
import os
import stat

from twisted.internet.defer import succeed
from twisted.trial.unittest import SynchronousTestCase

from svc.mount.core.attributes import AttributeChanges, FileKind, QuotaReport
from svc.mount.fs import ROOT_INODE
from svc.mount.ops.listings import LOOKUP_PAGES
from svc.mount.test.test_fs_support import AGENT, CALLER, FSFixture
from svc.wire.messages import MAX_LIST_LIMIT, MAX_PATH_BYTES

DEEP_NAME = b"d" * 250
"""A directory name; each level adds 251 bytes to a data-plane path."""

LEVELS = (MAX_PATH_BYTES - len(f"/{AGENT.agent_id}")) // (len(DEEP_NAME) + 1)
"""The deepest chain of such directories whose data-plane path fits the limit."""


class LookupTests(SynchronousTestCase):
    """Lookups answer from the names cache where it is complete."""

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        self.mount = self.fixture.mount()

    def test_root_is_inode_one(self) -> None:
        """The disk root is FUSE inode 1 and a directory."""
        attributes = self.mount.ok(self.mount.fs.getattr(ROOT_INODE, CALLER))
        self.assertEqual(attributes.kind, FileKind.DIR)
        self.assertEqual(stat.S_IFMT(attributes.st_mode), stat.S_IFDIR)

    def test_lookup_hit_and_miss_audit(self) -> None:
        """A hit logs lookup with its size; a miss is ENOENT, logged without size."""
        self.mount.write_file("f", b"12345")
        fresh = self.fixture.mount()
        entry = fresh.ok(fresh.fs.lookup(ROOT_INODE, b"f", CALLER))
        self.assertEqual(entry.attributes.size, 5)
        missing = fresh.fs.lookup(ROOT_INODE, b"nope", CALLER)
        self.assertEqual(fresh.errno(missing), errno.ENOENT)
        hit, miss = fresh.events("lookup")
        self.assertEqual((hit.path, hit.size, hit.allowed, hit.command), ("/f", 5, True, "editor"))
        self.assertEqual((hit.agent_pid, hit.uid, hit.gid), (4242, 1000, 1000))
        self.assertEqual((miss.path, miss.size, miss.allowed), ("/nope", None, True))

    def test_complete_directory_answers_misses_locally(self) -> None:
        """After a listing, a missing name costs no request."""
        self.mount.write_file("f", b"x")
        fresh = self.fixture.mount()
        self.assertEqual(fresh.names(""), ["f"])
        heads = fresh.count("head_file")
        self.assertEqual(fresh.errno(fresh.fs.lookup(ROOT_INODE, b"g", CALLER)), errno.ENOENT)
        fresh.ok(fresh.fs.lookup(ROOT_INODE, b"f", CALLER))
        self.assertEqual(fresh.count("head_file"), heads)

    def test_a_lookup_in_an_unlisted_directory_lists_it_once(self) -> None:
        """
        On a fresh mount, looking up names in a directory it has not listed
        costs one C{list} for the directory and no C{head_file}: every other
        name, present or missing, is answered from that listing.
        """
        self.mount.ok(self.mount.fs.mkdir(ROOT_INODE, b"d", 0o755, CALLER))
        for name in ("a", "b", "c"):
            self.mount.write_file(f"d/{name}", name.encode())
        fresh = self.fixture.mount()
        directory = fresh.lookup_path("d")
        lists, heads = fresh.count("list"), fresh.count("head_file")
        for looked_up in (b"a", b"b", b"c"):
            entry = fresh.ok(fresh.fs.lookup(directory.ino, looked_up, CALLER))
            self.assertEqual(entry.attributes.size, 1)
        self.assertEqual(fresh.errno(fresh.fs.lookup(directory.ino, b"z", CALLER)), errno.ENOENT)
        self.assertEqual((fresh.count("list") - lists, fresh.count("head_file")), (1, heads))
        self.assertEqual(
            [e.path for e in fresh.events("lookup")][-4:], ["/d/a", "/d/b", "/d/c", "/d/z"]
        )

    def test_a_directory_too_large_to_list_for_a_lookup_is_asked_name_by_name(self) -> None:
        """
        A directory longer than the pages a lookup reads is not listed for
        lookups: each name is asked for with C{head_file}, and the listing
        is not tried again.
        """
        self.mount.ok(self.mount.fs.mkdir(ROOT_INODE, b"many", 0o755, CALLER))
        directory = self.mount.lookup_path("many")
        for index in range(LOOKUP_PAGES * MAX_LIST_LIMIT + 1):
            self.mount.ok(self.mount.fs.mknod(directory.ino, b"n%04d" % index, 0o100644, 0, CALLER))
        fresh = self.fixture.mount()
        many = fresh.lookup_path("many")
        lists, heads = fresh.count("list"), fresh.count("head_file")
        fresh.ok(fresh.fs.lookup(many.ino, b"n0001", CALLER))
        fresh.ok(fresh.fs.lookup(many.ino, b"n0002", CALLER))
        self.assertEqual(fresh.errno(fresh.fs.lookup(many.ino, b"none", CALLER)), errno.ENOENT)
        self.assertEqual(fresh.count("list") - lists, LOOKUP_PAGES)
        self.assertEqual(fresh.count("head_file") - heads, 3)

    def test_bad_names(self) -> None:
        """Names too long are ENAMETOOLONG; non-UTF-8 names EINVAL."""
        too_long = self.mount.fs.lookup(ROOT_INODE, b"x" * 256, CALLER)
        self.assertEqual(self.mount.errno(too_long), errno.ENAMETOOLONG)
        latin = self.mount.fs.mkdir(ROOT_INODE, b"caf\xe9", 0o755, CALLER)
        self.assertEqual(self.mount.errno(latin), errno.EINVAL)
        self.assertEqual(self.mount.events("mkdir")[-1].path, "/caf\udce9")

    def test_a_data_plane_path_too_long_is_refused_at_once(self) -> None:
        """
        mkdir, create and symlink of a name whose data-plane path would pass
        the limit (16,384 bytes) fail ENAMETOOLONG before anything is sent; the same
        names one level up are made.
        """
        fs = self.mount.fs
        parent = ROOT_INODE
        for _ in range(LEVELS):
            parent = self.mount.ok(fs.mkdir(parent, DEEP_NAME, 0o755, CALLER)).ino
        sent = len(self.mount.connection.calls)
        long_name = b"f" * 100
        for refused in (
            fs.mkdir(parent, long_name, 0o755, CALLER),
            fs.create(parent, long_name, 0o644, os.O_WRONLY | os.O_CREAT, CALLER),
            fs.symlink(parent, long_name, b"target", CALLER),
        ):
            self.assertEqual(self.mount.errno(refused), errno.ENAMETOOLONG)
        self.assertEqual(len(self.mount.connection.calls), sent)
        self.mount.ok(fs.mkdir(ROOT_INODE, long_name, 0o755, CALLER))

    def test_statfs_reports_quota(self) -> None:
        """statfs takes capacity and usage from the quota callable."""
        mount = self.fixture.mount()
        mount.fs._ctx.quota = lambda: succeed(QuotaReport(40960, 8192))
        stats = mount.ok(mount.fs.statfs(CALLER))
        self.assertEqual((stats.blocks, stats.blocks_free, stats.name_max), (10, 8, 255))


class DirectoryTests(SynchronousTestCase):
    """mkdir, rmdir, readdir and their errors."""

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        self.mount = self.fixture.mount()

    def test_mkdir_readdir(self) -> None:
        """Created names are listed in byte order, each with a readdir_entry line."""
        made = self.mount.ok(self.mount.fs.mkdir(ROOT_INODE, b"d", 0o40750, CALLER))
        self.assertEqual(made.attributes.mode, 0o750)
        self.assertEqual((made.attributes.uid, made.attributes.gid), (1000, 1000))
        self.mount.write_file("d/b", b"bb")
        self.mount.write_file("d/a", b"a")
        self.assertEqual(self.mount.names("d"), ["a", "b"])
        self.assertEqual(self.fixture.mount().names("d"), ["a", "b"])
        entries = self.mount.events("readdir_entry")
        self.assertEqual([(e.path, e.size) for e in entries], [("/d/a", 1), ("/d/b", 2)])
        mkdir = self.mount.events("mkdir")[0]
        self.assertEqual((mkdir.get("mode"), mkdir.session_id), (0o750, self.fixture.session()))
        self.assertEqual(len(self.mount.events("opendir")), 1)

    def test_readdir_pages(self) -> None:
        """A directory longer than one list page is read whole, resumable by offset."""
        self.mount.ok(self.mount.fs.mkdir(ROOT_INODE, b"many", 0o755, CALLER))
        directory = self.mount.lookup_path("many")
        for index in range(1005):
            self.mount.ok(self.mount.fs.mknod(directory.ino, b"n%04d" % index, 0o100644, 0, CALLER))
        fresh = self.fixture.mount()
        entry = fresh.lookup_path("many")
        lists = fresh.count("list")
        names = fresh.names("many")
        self.assertEqual(len(names), 1005)
        self.assertEqual(fresh.count("list") - lists, 2)
        fh = fresh.ok(fresh.fs.opendir(entry.ino, CALLER))
        page = fresh.fs.readdir(fh, 1002, CALLER, limit=3)  # after . and ..
        self.assertEqual([e.name for e in page], [b"n1000", b"n1001", b"n1002"])
        self.assertEqual(page[-1].next_offset, 1005)

    def test_a_listing_starts_with_dot_and_dot_dot(self) -> None:
        """
        readdir gives C{.} (the directory) and C{..} (its parent) first, at
        offsets 1 and 2, with no readdir_entry line for either.
        """
        fs = self.mount.fs
        made = self.mount.ok(fs.mkdir(ROOT_INODE, b"d", 0o755, CALLER))
        self.mount.write_file("d/f", b"x")
        fh = self.mount.ok(fs.opendir(made.ino, CALLER))
        page = fs.readdir(fh, 0, CALLER)
        self.assertEqual(
            [(e.name, e.entry.ino, e.next_offset) for e in page[:2]],
            [(b".", made.ino, 1), (b"..", ROOT_INODE, 2)],
        )
        self.assertEqual([e.name for e in page[2:]], [b"f"])
        self.assertEqual([e.path for e in self.mount.events("readdir_entry")], ["/d/f"])
        fs.releasedir(fh)

    def test_errors(self) -> None:
        """EEXIST, ENOTEMPTY, ENOTDIR, EISDIR and ENOENT as POSIX says."""
        fs = self.mount.fs
        self.mount.ok(fs.mkdir(ROOT_INODE, b"d", 0o755, CALLER))
        self.mount.write_file("d/f", b"x")
        directory = self.mount.lookup_path("d")
        self.assertEqual(self.mount.errno(fs.mkdir(ROOT_INODE, b"d", 0o755, CALLER)), errno.EEXIST)
        self.assertEqual(self.mount.errno(fs.rmdir(ROOT_INODE, b"d", CALLER)), errno.ENOTEMPTY)
        self.assertEqual(self.mount.errno(fs.rmdir(directory.ino, b"f", CALLER)), errno.ENOTDIR)
        self.assertEqual(self.mount.errno(fs.unlink(ROOT_INODE, b"d", CALLER)), errno.EISDIR)
        self.assertEqual(self.mount.errno(fs.unlink(ROOT_INODE, b"zz", CALLER)), errno.ENOENT)
        file_entry = self.mount.lookup_path("d/f")
        self.assertEqual(self.mount.errno(fs.opendir(file_entry.ino, CALLER)), errno.ENOTDIR)
        rmdir = self.mount.events("rmdir")[0]
        self.assertEqual((rmdir.path, rmdir.allowed), ("/d", False))

    def test_rmdir_and_unlink(self) -> None:
        """Removed names disappear from listings and lookups."""
        fs = self.mount.fs
        self.mount.ok(fs.mkdir(ROOT_INODE, b"d", 0o755, CALLER))
        self.mount.write_file("f", b"x")
        self.mount.ok(fs.rmdir(ROOT_INODE, b"d", CALLER))
        self.mount.ok(fs.unlink(ROOT_INODE, b"f", CALLER))
        self.assertEqual(self.mount.names(""), [])
        self.assertEqual(self.fixture.mount().names(""), [])
        self.assertEqual([e.allowed for e in self.mount.events("unlink")], [True])


class RenameTests(SynchronousTestCase):
    """Renames of files and directories, over existing targets."""

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        self.mount = self.fixture.mount()

    def test_over_existing_file(self) -> None:
        """A rename replaces the target; the moved inode keeps its number."""
        self.mount.write_file("a", b"new")
        self.mount.write_file("b", b"old")
        moved = self.mount.lookup_path("a")
        self.mount.ok(self.mount.fs.rename(ROOT_INODE, b"a", ROOT_INODE, b"b", CALLER))
        self.assertEqual(self.mount.lookup_path("b").ino, moved.ino)
        self.assertEqual(self.mount.read_file("b"), b"new")
        self.assertEqual(self.mount.names(""), ["b"])
        self.assertEqual(self.fixture.mount().read_file("b"), b"new")
        line = self.mount.events("rename")[0]
        self.assertEqual((line.path, line.get("to_path")), ("/a", "/b"))

    def test_directory_rename(self) -> None:
        """Renaming a directory moves its subtree; inode numbers stay."""
        fs = self.mount.fs
        self.mount.ok(fs.mkdir(ROOT_INODE, b"src", 0o755, CALLER))
        self.mount.ok(fs.mkdir(ROOT_INODE, b"dst", 0o755, CALLER))
        self.mount.ok(fs.mkdir(self.mount.lookup_path("src").ino, b"sub", 0o755, CALLER))
        inner = self.mount.write_file("src/sub/f", b"inside")
        source = self.mount.lookup_path("src")
        dst = self.mount.lookup_path("dst")
        self.mount.ok(fs.rename(ROOT_INODE, b"src", dst.ino, b"moved", CALLER))
        self.assertEqual(self.mount.lookup_path("dst/moved").ino, source.ino)
        self.assertEqual(self.mount.lookup_path("dst/moved/sub/f").ino, inner.ino)
        self.assertEqual(self.mount.read_file("dst/moved/sub/f"), b"inside")
        self.assertEqual(self.mount.names(""), ["dst"])
        self.assertEqual(self.fixture.mount().read_file("dst/moved/sub/f"), b"inside")

    def test_rename_dirty_open_file(self) -> None:
        """An open file renamed before its flush is committed at its new name."""
        parent, name = self.mount.parent_of("draft")
        opened, _ = self.mount.ok(self.mount.fs.create(parent, name, 0o644, 0o1, CALLER))
        self.mount.ok(self.mount.fs.write(opened.fh, 0, b"text", CALLER))
        self.mount.ok(self.mount.fs.rename(ROOT_INODE, b"draft", ROOT_INODE, b"final", CALLER))
        self.mount.ok(self.mount.fs.release(opened.fh, CALLER))
        self.assertEqual(self.fixture.mount().read_file("final"), b"text")
        self.assertEqual(self.mount.events("flush")[0].path, "/final")

    def test_over_non_empty_directory(self) -> None:
        """A directory cannot replace a non-empty one (ENOTEMPTY)."""
        fs = self.mount.fs
        self.mount.ok(fs.mkdir(ROOT_INODE, b"a", 0o755, CALLER))
        self.mount.ok(fs.mkdir(ROOT_INODE, b"b", 0o755, CALLER))
        self.mount.write_file("b/f", b"x")
        renamed = fs.rename(ROOT_INODE, b"a", ROOT_INODE, b"b", CALLER)
        self.assertEqual(self.mount.errno(renamed), errno.ENOTEMPTY)
        self.assertFalse(self.mount.events("rename")[0].allowed)


class LinkTests(SynchronousTestCase):
    """Hard links, symlinks and device nodes."""

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        self.mount = self.fixture.mount()

    def test_hard_link_counts(self) -> None:
        """Two names share one inode and count two links; unlinking one leaves one."""
        first = self.mount.write_file("a", b"shared")
        linked = self.mount.ok(self.mount.fs.link(first.ino, ROOT_INODE, b"b", CALLER))
        self.assertEqual(linked.ino, first.ino)
        self.assertEqual(linked.attributes.nlink, 2)
        line = self.mount.events("link")[0]
        self.assertEqual((line.path, line.get("to_path")), ("/a", "/b"))
        self.mount.ok(self.mount.fs.unlink(ROOT_INODE, b"a", CALLER))
        self.assertEqual(self.mount.ok(self.mount.fs.getattr(first.ino, CALLER)).nlink, 1)
        self.assertEqual(self.mount.read_file("b"), b"shared")
        fresh = self.fixture.mount()
        self.assertEqual(fresh.lookup_path("b").attributes.nlink, 1)

    def test_link_to_directory(self) -> None:
        """A hard link to a directory is EPERM."""
        self.mount.ok(self.mount.fs.mkdir(ROOT_INODE, b"d", 0o755, CALLER))
        directory = self.mount.lookup_path("d")
        linked = self.mount.fs.link(directory.ino, ROOT_INODE, b"e", CALLER)
        self.assertEqual(self.mount.errno(linked), errno.EPERM)

    def test_symlink_readlink(self) -> None:
        """A symlink's target reads back, here and (through readlink) on a fresh mount."""
        made = self.mount.ok(self.mount.fs.symlink(ROOT_INODE, b"s", b"../elsewhere", CALLER))
        self.assertEqual(made.attributes.kind, FileKind.SYMLINK)
        self.assertEqual(self.mount.ok(self.mount.fs.readlink(made.ino, CALLER)), b"../elsewhere")
        fresh = self.fixture.mount()
        self.assertEqual(fresh.names(""), ["s"])
        entry = fresh.lookup_path("s")
        self.assertEqual(fresh.ok(fresh.fs.readlink(entry.ino, CALLER)), b"../elsewhere")
        self.assertEqual(len(self.mount.events("symlink")), 1)
        self.assertEqual(len(fresh.events("readlink")), 1)
        file_entry = self.mount.write_file("f", b"x")
        self.assertEqual(
            self.mount.errno(self.mount.fs.readlink(file_entry.ino, CALLER)), errno.EINVAL
        )

    def test_mknod(self) -> None:
        """mknod makes FIFOs and empty files, audited as create; directories are refused."""
        fifo = self.mount.ok(self.mount.fs.mknod(ROOT_INODE, b"p", stat.S_IFIFO | 0o600, 0, CALLER))
        self.assertEqual(fifo.attributes.kind, FileKind.FIFO)
        self.assertEqual(stat.S_IFMT(fifo.attributes.st_mode), stat.S_IFIFO)
        plain = self.mount.ok(
            self.mount.fs.mknod(ROOT_INODE, b"f", stat.S_IFREG | 0o644, 0, CALLER)
        )
        self.assertEqual((plain.attributes.kind, plain.attributes.size), (FileKind.FILE, 0))
        bad = self.mount.fs.mknod(ROOT_INODE, b"d", stat.S_IFDIR | 0o755, 0, CALLER)
        self.assertEqual(self.mount.errno(bad), errno.EINVAL)
        created = self.mount.events("create")
        self.assertEqual(
            [(e.path, e.get("mode"), e.allowed) for e in created],
            [("/p", 0o600, True), ("/f", 0o644, True), ("/d", 0o755, False)],
        )


class AttributeTests(SynchronousTestCase):
    """setattr of mode, owner and times; inode numbers and forget."""

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        self.mount = self.fixture.mount()

    def test_chmod_chown_utimes(self) -> None:
        """Mode, owner and times change on the server; setattr_fields has their bits."""
        entry = self.mount.write_file("f", b"x")
        changes = AttributeChanges(mode=0o600, uid=7, gid=8, mtime_ns=10**18, atime_ns=2 * 10**18)
        attributes = self.mount.ok(self.mount.fs.setattr(entry.ino, changes, CALLER))
        self.assertEqual((attributes.mode, attributes.uid, attributes.gid), (0o600, 7, 8))
        self.assertEqual((attributes.mtime_ns, attributes.atime_ns), (10**18, 2 * 10**18))
        fresh = self.fixture.mount().lookup_path("f").attributes
        self.assertEqual((fresh.mode, fresh.uid, fresh.mtime_ns), (0o600, 7, 10**18))
        self.assertEqual(self.mount.events("setattr")[0].get("setattr_fields"), 0x37)

    def test_nodes_made_in_a_set_group_id_directory_take_its_group(self) -> None:
        """
        As on a local disk: a file, directory, symlink or FIFO made in a
        set-group-ID directory belongs to the directory's group, not the
        caller's, and a new directory there is set-group-ID itself. Elsewhere
        the caller's group.
        """
        fs = self.mount.fs
        shared = self.mount.ok(fs.mkdir(ROOT_INODE, b"shared", 0o775, CALLER))
        changes = AttributeChanges(mode=0o2775, gid=50)
        self.mount.ok(fs.setattr(shared.ino, changes, CALLER))
        opened, made = self.mount.ok(fs.create(shared.ino, b"file", 0o664, 0o1, CALLER))
        self.mount.ok(fs.release(opened.fh, CALLER))
        self.mount.ok(fs.mkdir(shared.ino, b"sub", 0o755, CALLER))
        self.mount.ok(fs.symlink(shared.ino, b"link", b"file", CALLER))
        self.mount.ok(fs.mknod(shared.ino, b"fifo", stat.S_IFIFO | 0o644, 0, CALLER))
        self.mount.ok(fs.mkdir(ROOT_INODE, b"plain", 0o755, CALLER))
        expected = {
            "shared/file": (0o664, 50),
            "shared/sub": (0o2755, 50),
            "shared/link": (None, 50),
            "shared/fifo": (0o644, 50),
            "plain": (0o755, CALLER.gid),
        }
        self.assertEqual(made.attributes.gid, 50, "the pending file too")
        for mount in (self.mount, self.fixture.mount()):
            for path, (mode, gid) in expected.items():
                attributes = mount.lookup_path(path).attributes
                self.assertEqual(attributes.gid, gid, path)
                self.assertEqual(attributes.uid, CALLER.uid, path)
                if mode is not None:
                    self.assertEqual(attributes.mode, mode, path)

    def test_mtime_of_dirty_file_survives_flush(self) -> None:
        """An mtime set on a dirty open file is the one committed."""
        entry = self.mount.write_file("f", b"x")
        opened = self.mount.ok(self.mount.fs.open(entry.ino, 0o2, CALLER))
        self.mount.ok(self.mount.fs.write(opened.fh, 0, b"y", CALLER))
        self.mount.ok(self.mount.fs.setattr(entry.ino, AttributeChanges(mtime_ns=123), CALLER))
        self.mount.ok(self.mount.fs.release(opened.fh, CALLER))
        self.assertEqual(self.fixture.mount().lookup_path("f").attributes.mtime_ns, 123)

    def test_inode_numbers_stable(self) -> None:
        """Inode numbers survive renames and lookups; unlinked ones are forgotten."""
        entry = self.mount.write_file("a", b"x")
        self.mount.ok(self.mount.fs.rename(ROOT_INODE, b"a", ROOT_INODE, b"b", CALLER))
        self.mount.ok(self.mount.fs.rename(ROOT_INODE, b"b", ROOT_INODE, b"c", CALLER))
        again = self.mount.lookup_path("c")
        self.assertEqual(again.ino, entry.ino)
        self.mount.ok(self.mount.fs.unlink(ROOT_INODE, b"c", CALLER))
        table = self.mount.fs._ctx.table
        self.assertIsNotNone(table.get(entry.ino))
        node = table.get(entry.ino)
        assert node is not None
        self.mount.fs.forget([(entry.ino, node.lookups)])
        self.assertIsNone(table.get(entry.ino))
        other = self.mount.write_file("d", b"y")
        self.assertNotEqual(other.ino, entry.ino)
