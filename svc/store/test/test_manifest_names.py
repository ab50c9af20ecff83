"""
Tests for the namespace operations of L{svc.store.manifests.ManifestStore}:
mkdir, rmdir, unlink, listing, rename (of whole trees), hard links,
symlinks, special files, and directory bookkeeping.
"""

from __future__ import annotations

from svc.store.errors import (
    AlreadyExists,
    CrossSubtree,
    InvalidArgument,
    IsADirectory,
    NotADirectory,
    NotEmpty,
    NotFound,
    NotPermitted,
)
from svc.store.manifest_values import FileKind
from svc.store.test.routes_support import ALICE, BOB, StoreTestCase, chunk
from svc.wire.errno import WireErrno
from svc.wire.messages import MAX_PATH_BYTES


class DirectoryTests(StoreTestCase):
    """
    mkdir, rmdir, unlink and listing.
    """

    def setUp(self) -> None:
        super().setUp()
        self.mkdirs("/alice")

    def test_mkdir(self) -> None:
        """mkdir creates an empty directory with the given mode and owner."""
        result = self.ok(self.store.mkdir("/alice/d", mode=0o700, uid=5, gid=6, writer=ALICE))
        attributes = self.ok(self.store.get("/alice/d")).attributes
        self.assertEqual(result.attributes, attributes)
        self.assertEqual(
            (attributes.kind, attributes.mode, attributes.uid, attributes.gid),
            (FileKind.DIRECTORY, 0o700, 5, 6),
        )
        self.assertEqual(self.names("/alice/d"), [])

    def test_mkdir_errors(self) -> None:
        """mkdir: EEXIST for a taken name, ENOENT/ENOTDIR for a bad parent."""
        self.fails(self.store.mkdir("/alice", mode=0, uid=0, gid=0, writer=ALICE), AlreadyExists)
        self.fails(self.store.mkdir("/", mode=0, uid=0, gid=0, writer=ALICE), InvalidArgument)
        self.fails(self.store.mkdir("/nope/d", mode=0, uid=0, gid=0, writer=ALICE), NotFound)
        self.write("/alice/f", [])
        self.fails(
            self.store.mkdir("/alice/f/d", mode=0, uid=0, gid=0, writer=ALICE), NotADirectory
        )
        self.fails(self.store.mkdir("/alice/f", mode=0, uid=0, gid=0, writer=ALICE), AlreadyExists)

    def test_rmdir(self) -> None:
        """rmdir removes an empty directory and refuses everything else."""
        self.mkdirs("/alice/d", "/alice/d/e")
        self.write("/alice/f", [])
        self.assertEqual(
            self.fails(self.store.rmdir("/alice/d", writer=ALICE), NotEmpty).errno,
            WireErrno.ENOTEMPTY,
        )
        self.fails(self.store.rmdir("/alice/f", writer=ALICE), NotADirectory)
        self.fails(self.store.rmdir("/alice/x", writer=ALICE), NotFound)
        self.fails(self.store.rmdir("/", writer=ALICE), InvalidArgument)
        self.ok(self.store.rmdir("/alice/d/e", writer=ALICE))
        self.ok(self.store.rmdir("/alice/d", writer=ALICE))
        self.fails(self.store.get("/alice/d"), NotFound)
        self.assert_consistent()

    def test_delete(self) -> None:
        """delete unlinks a file and refuses directories (EISDIR) and missing names."""
        self.write("/alice/f", [chunk(1)])
        result = self.ok(self.store.delete("/alice/f", writer=ALICE))
        self.assertEqual((result.kind, result.nlink, result.size), (FileKind.FILE, 0, 1000))
        self.fails(self.store.get("/alice/f"), NotFound)
        self.fails(self.store.delete("/alice/f", writer=ALICE), NotFound)
        self.fails(self.store.delete("/alice", writer=ALICE), IsADirectory)
        self.fails(self.store.delete("/", writer=ALICE), IsADirectory)

    def test_list(self) -> None:
        """A listing gives each child once, by name, with its attributes."""
        self.mkdirs("/alice/b")
        self.write("/alice/c", [chunk(1, 7)])
        self.write("/alice/a", [])
        self.write("/alice/b/deep", [])
        entries = self.ok(self.store.list_dir("/alice"))
        self.assertEqual([e.name for e in entries], ["a", "b", "c"])
        self.assertEqual(entries[2].attributes, self.ok(self.store.get("/alice/c")).attributes)
        self.assertEqual(entries[2].attributes.size, 7)
        self.assertEqual(self.names("/"), ["alice"])

    def test_list_after_a_name_at_most_a_limit(self) -> None:
        """
        A listing from after a name (which need not exist), at most a
        limit, in byte order of names; a deeper name is never a child.
        """
        for name in ("a", "b", "c", "d", "\u00e9"):
            self.write(f"/alice/{name}", [])
        self.write("/alice/b-deep", [])
        self.mkdirs("/alice/m", "/alice/m/x")

        def names(after: str | None, limit: int | None) -> list[str]:
            entries = self.ok(self.store.list_dir("/alice", after=after, limit=limit))
            return [entry.name for entry in entries]

        self.assertEqual(names(None, 2), ["a", "b"])
        self.assertEqual(names("b", 2), ["b-deep", "c"])
        self.assertEqual(names("bb", None), ["c", "d", "m", "\u00e9"])
        self.assertEqual(names("d", 10), ["m", "\u00e9"])
        self.assertEqual(names("\u00e9", 10), [])
        self.assertEqual(names(None, 1) + names("a", None), names(None, None))

    def test_list_errors(self) -> None:
        """Listing a file is ENOTDIR, a missing name ENOENT."""
        self.write("/alice/f", [])
        self.fails(self.store.list_dir("/alice/f"), NotADirectory)
        self.fails(self.store.list_dir("/alice/x"), NotFound)

    def test_directory_nlink(self) -> None:
        """A directory's link count is 2 plus its subdirectories."""
        self.mkdirs("/alice/a", "/alice/b")
        self.write("/alice/f", [])
        self.assertEqual(self.ok(self.store.get("/alice")).attributes.nlink, 4)
        self.ok(self.store.rmdir("/alice/a", writer=ALICE))
        self.assertEqual(self.ok(self.store.get("/alice")).attributes.nlink, 3)
        self.assert_consistent()

    def test_parent_times_follow_entries(self) -> None:
        """Creating and removing entries sets the parent's mtime/ctime and bumps its version."""
        before = self.ok(self.store.get("/alice")).attributes
        self.clock.advance(1)
        self.write("/alice/f", [])
        after_create = self.ok(self.store.get("/alice")).attributes
        now = int(self.clock.seconds() * 1e9)
        self.assertEqual((after_create.mtime_ns, after_create.ctime_ns), (now, now))
        self.assertEqual(after_create.version, before.version + 1)
        self.clock.advance(1)
        self.ok(self.store.delete("/alice/f", writer=ALICE))
        after_delete = self.ok(self.store.get("/alice")).attributes
        self.assertEqual(after_delete.mtime_ns, int(self.clock.seconds() * 1e9))
        self.assertEqual(after_delete.version, before.version + 2)

    def test_content_write_leaves_parent(self) -> None:
        """Rewriting an existing file does not touch its directory."""
        self.write("/alice/f", [])
        before = self.ok(self.store.get("/alice")).attributes
        self.clock.advance(1)
        self.write("/alice/f", [chunk(1)], expected_version=1)
        self.assertEqual(self.ok(self.store.get("/alice")).attributes, before)


class RenameTests(StoreTestCase):
    """
    rename with POSIX semantics, in one transaction.
    """

    def setUp(self) -> None:
        super().setUp()
        self.mkdirs("/alice", "/bob")

    def test_file(self) -> None:
        """A renamed file keeps its inode, version and content under the new name."""
        put = self.write("/alice/a", [chunk(1)])
        result = self.ok(self.store.rename("/alice/a", "/alice/b", writer=ALICE))
        self.assertEqual((result.moved_names, result.replaced), (1, None))
        self.fails(self.store.get("/alice/a"), NotFound)
        moved = self.ok(self.store.get("/alice/b"))
        self.assertEqual((moved.attributes.inode, moved.version), (put.inode, 1))
        self.assertEqual(moved.chunks, (chunk(1),))
        self.assert_consistent()

    def test_over_existing_file(self) -> None:
        """Renaming onto a file replaces it and releases its chunks."""
        self.write("/alice/a", [chunk(1)])
        self.write("/alice/b", [chunk(2)])
        result = self.ok(self.store.rename("/alice/a", "/alice/b", writer=ALICE))
        assert result.replaced is not None
        self.assertEqual(result.replaced.released_hashes, {chunk(2).hash})
        self.assertEqual(self.ok(self.store.get("/alice/b")).chunks, (chunk(1),))
        self.assertEqual(self.names("/alice"), ["b"])
        self.assertEqual(self.ok(self.store.live_hashes()), {chunk(1).hash})
        self.assert_consistent()

    def test_directory_over_empty_directory(self) -> None:
        """A directory replaces an empty directory."""
        self.mkdirs("/alice/d", "/alice/e")
        self.write("/alice/d/f", [])
        self.ok(self.store.rename("/alice/d", "/alice/e", writer=ALICE))
        self.assertEqual(self.names("/alice/e"), ["f"])
        self.assertEqual(self.names("/alice"), ["e"])
        self.assert_consistent()

    def test_refusals(self) -> None:
        """ENOTEMPTY, ENOTDIR, EISDIR, EINVAL, ENOENT and EXDEV cases change nothing."""
        self.mkdirs("/alice/d", "/alice/full", "/alice/full/x")
        self.write("/alice/f", [])
        rows = self.ok(self.store.journal_row_count())
        rename = self.store.rename
        self.fails(rename("/alice/d", "/alice/full", writer=ALICE), NotEmpty)
        self.fails(rename("/alice/d", "/alice/f", writer=ALICE), NotADirectory)
        self.fails(rename("/alice/f", "/alice/d", writer=ALICE), IsADirectory)
        self.fails(rename("/alice/d", "/alice/d/sub", writer=ALICE), InvalidArgument)
        self.fails(rename("/alice", "/alice/d/sub", writer=ALICE), InvalidArgument)
        self.fails(rename("/alice/full/x", "/alice/full", writer=ALICE), NotEmpty)
        self.fails(rename("/alice/nope", "/alice/z", writer=ALICE), NotFound)
        self.fails(rename("/alice/f", "/alice/nope/z", writer=ALICE), NotFound)
        self.fails(rename("/alice/f", "/alice/f/z", writer=ALICE), NotADirectory)
        self.fails(rename("/", "/alice/z", writer=ALICE), InvalidArgument)
        crossed = self.fails(rename("/alice/f", "/bob/f", writer=ALICE), CrossSubtree)
        self.assertEqual(crossed.errno, WireErrno.EXDEV)
        self.fails(rename("/alice", "/carol", writer=ALICE), CrossSubtree)
        self.assertEqual(self.ok(self.store.journal_row_count()), rows)
        self.assertEqual(self.names("/alice"), ["d", "f", "full"])
        self.assert_consistent()

    def test_onto_itself(self) -> None:
        """Renaming a name onto itself, or onto another link of its inode, changes nothing."""
        self.write("/alice/f", [])
        self.ok(self.store.link("/alice/f", "/alice/g", writer=ALICE))
        rows = self.ok(self.store.journal_row_count())
        same = self.ok(self.store.rename("/alice/f", "/alice/f", writer=ALICE))
        self.assertEqual((same.moved_names, same.journal_seq), (0, None))
        linked = self.ok(self.store.rename("/alice/f", "/alice/g", writer=ALICE))
        self.assertEqual(linked.moved_names, 0)
        self.assertEqual(self.names("/alice"), ["f", "g"])
        self.assertEqual(self.ok(self.store.journal_row_count()), rows)

    def test_whole_tree(self) -> None:
        """Renaming a directory moves every descendant at once and nothing else."""
        self.mkdirs("/alice/d", "/alice/d/sub", "/alice/d/sub/deep", "/alice/d/%_x")
        self.mkdirs("/alice/d2", "/alice/d-x", "/alice/d0", "/alice/target")
        for path in ("/alice/d/a", "/alice/d/sub/b", "/alice/d/sub/deep/c", "/alice/d/%_x/q"):
            self.write(path, [chunk(path)])
        self.write("/alice/d2/keep", [])
        self.write("/alice/d-x/keep", [])
        self.write("/alice/d0/keep", [])
        result = self.ok(self.store.rename("/alice/d", "/alice/target/moved", writer=ALICE))
        self.assertEqual(result.moved_names, 8)
        self.assertEqual(self.names("/alice"), ["d-x", "d0", "d2", "target"])
        self.assertEqual(self.names("/alice/target/moved"), ["%_x", "a", "sub"])
        self.assertEqual(self.names("/alice/target/moved/sub"), ["b", "deep"])
        self.assertEqual(self.names("/alice/target/moved/sub/deep"), ["c"])
        self.assertEqual(self.names("/alice/target/moved/%_x"), ["q"])
        self.assertEqual(
            self.ok(self.store.get("/alice/target/moved/sub/deep/c")).chunks,
            (chunk("/alice/d/sub/deep/c"),),
        )
        for old in ("/alice/d", "/alice/d/sub", "/alice/d/sub/deep/c"):
            self.fails(self.store.get(old), NotFound)
        for kept in ("/alice/d2/keep", "/alice/d-x/keep", "/alice/d0/keep"):
            self.ok(self.store.get(kept))
        self.assert_consistent()

    def test_directory_nlink_moves(self) -> None:
        """Moving a directory between parents moves one link count with it."""
        self.mkdirs("/alice/a", "/alice/b", "/alice/a/d")
        self.ok(self.store.rename("/alice/a/d", "/alice/b/d", writer=ALICE))
        self.assertEqual(self.ok(self.store.get("/alice/a")).attributes.nlink, 2)
        self.assertEqual(self.ok(self.store.get("/alice/b")).attributes.nlink, 3)
        self.assert_consistent()

    def test_updates_both_parents(self) -> None:
        """A rename between directories sets both parents' mtime and the inode's ctime."""
        self.mkdirs("/alice/a", "/alice/b")
        self.write("/alice/a/f", [])
        self.clock.advance(2)
        now = int(self.clock.seconds() * 1e9)
        self.ok(self.store.rename("/alice/a/f", "/alice/b/f", writer=ALICE))
        for path in ("/alice/a", "/alice/b"):
            self.assertEqual(self.ok(self.store.get(path)).attributes.mtime_ns, now)
        moved = self.ok(self.store.get("/alice/b/f")).attributes
        self.assertEqual((moved.ctime_ns, moved.mtime_ns), (now, 123))

    def test_too_long_after_move(self) -> None:
        """A move that would make a descendant longer than the path limit is EINVAL."""
        self.mkdirs("/alice/d")
        path = "/alice/d"
        while len(path) + 201 <= MAX_PATH_BYTES:
            path += "/" + "n" * 200
            self.mkdirs(path)
        self.mkdirs("/alice/" + "l" * 250)
        self.fails(
            self.store.rename("/alice/d", "/alice/" + "l" * 250 + "/d", writer=ALICE),
            InvalidArgument,
        )
        self.ok(self.store.get(path))
        self.assert_consistent()


class LinkTests(StoreTestCase):
    """
    Hard links: several names, one inode.
    """

    def setUp(self) -> None:
        super().setUp()
        self.mkdirs("/alice", "/bob")
        self.write("/alice/a", [chunk(1)])
        self.ok(self.store.link("/alice/a", "/alice/b", writer=ALICE))

    def test_share_content_and_version(self) -> None:
        """A write through one name is a new version seen through the other."""
        a = self.ok(self.store.get("/alice/a"))
        b = self.ok(self.store.get("/alice/b"))
        self.assertEqual((a.attributes.inode, a.attributes.nlink), (b.attributes.inode, 2))
        self.write("/alice/b", [chunk(2)], expected_version=1, writer=BOB)
        a = self.ok(self.store.get("/alice/a"))
        self.assertEqual((a.version, a.chunks), (2, (chunk(2),)))
        self.assertEqual(a.last_writer.agent_id, "bob")
        self.fails(self.put_deferred("/alice/a", 1, [chunk(3)]), Exception)
        self.assert_consistent()

    def test_unlink_one_name(self) -> None:
        """Removing one name leaves the inode, with one link fewer."""
        result = self.ok(self.store.delete("/alice/a", writer=ALICE))
        self.assertEqual((result.nlink, result.released_hashes), (1, frozenset()))
        self.assertEqual(self.ok(self.store.get("/alice/b")).attributes.nlink, 1)
        self.assertEqual(self.ok(self.store.live_hashes()), {chunk(1).hash})
        self.assert_consistent()

    def test_refusals(self) -> None:
        """No links to directories (EPERM), onto taken names, to missing names or across disks."""
        self.mkdirs("/alice/d")
        denied = self.fails(self.store.link("/alice/d", "/alice/e", writer=ALICE), NotPermitted)
        self.assertEqual(denied.errno, WireErrno.EPERM)
        self.fails(self.store.link("/alice/a", "/alice/b", writer=ALICE), AlreadyExists)
        self.fails(self.store.link("/alice/x", "/alice/y", writer=ALICE), NotFound)
        self.fails(self.store.link("/alice/a", "/bob/a", writer=ALICE), CrossSubtree)
        self.fails(self.store.link("/alice/a", "/alice/nope/a", writer=ALICE), NotFound)
        self.assert_consistent()


class SpecialFileTests(StoreTestCase):
    """
    Symlinks and mknod.
    """

    def setUp(self) -> None:
        super().setUp()
        self.mkdirs("/alice")

    def test_symlink(self) -> None:
        """A symlink stores its target; its size is the target's UTF-8 length."""
        self.ok(self.store.symlink("/alice/l", "../é/x", uid=3, gid=4, writer=ALICE))
        self.assertEqual(self.ok(self.store.readlink("/alice/l")), "../é/x")
        attributes = self.ok(self.store.get("/alice/l")).attributes
        self.assertEqual(
            (attributes.kind, attributes.size, attributes.mode), (FileKind.SYMLINK, 7, 0o777)
        )
        self.assertEqual(attributes.symlink_target, "../é/x")

    def test_symlink_errors(self) -> None:
        """Taken names, empty or NUL targets and readlink of a non-symlink are refused."""
        self.write("/alice/f", [])
        self.fails(self.store.symlink("/alice/f", "x", uid=0, gid=0, writer=ALICE), AlreadyExists)
        self.fails(self.store.symlink("/alice/l", "", uid=0, gid=0, writer=ALICE), InvalidArgument)
        self.fails(
            self.store.symlink("/alice/l", "a\x00b", uid=0, gid=0, writer=ALICE), InvalidArgument
        )
        self.fails(self.store.readlink("/alice/f"), InvalidArgument)
        self.fails(self.store.readlink("/alice/none"), NotFound)

    def test_mknod(self) -> None:
        """mknod makes fifos, sockets, devices (with rdev) and empty files."""
        for name, kind, rdev in (
            ("fifo", FileKind.FIFO, 0),
            ("sock", FileKind.SOCKET, 0),
            ("chr", FileKind.CHAR_DEVICE, 0x0103),
            ("blk", FileKind.BLOCK_DEVICE, 0x0801),
            ("file", FileKind.FILE, 0),
        ):
            self.ok(
                self.store.mknod(
                    f"/alice/{name}", kind=kind, mode=0o600, rdev=rdev, uid=0, gid=0, writer=ALICE
                )
            )
            attributes = self.ok(self.store.get(f"/alice/{name}")).attributes
            self.assertEqual((attributes.kind, attributes.rdev, attributes.size), (kind, rdev, 0))
        self.write("/alice/file", [chunk(1)], expected_version=1)
        self.assert_consistent()

    def test_mknod_errors(self) -> None:
        """mknod refuses directories, symlinks, rdev on non-devices and taken names."""
        mknod = self.store.mknod
        for kind in (FileKind.DIRECTORY, FileKind.SYMLINK):
            self.fails(
                mknod("/alice/x", kind=kind, mode=0, rdev=0, uid=0, gid=0, writer=ALICE),
                InvalidArgument,
            )
        self.fails(
            mknod("/alice/x", kind=FileKind.FIFO, mode=0, rdev=1, uid=0, gid=0, writer=ALICE),
            InvalidArgument,
        )
        self.fails(
            mknod("/alice", kind=FileKind.FIFO, mode=0, rdev=0, uid=0, gid=0, writer=ALICE),
            AlreadyExists,
        )


class PathValidationTests(StoreTestCase):
    """
    Every operation checks that its paths are absolute and canonical.
    """

    BAD = (
        "",
        "alice",
        "/alice/",
        "//alice",
        "/alice//x",
        "/alice/./x",
        "/alice/../x",
        "/alice/.",
        "/alice/..",
        "/al\x00ice",
        "/\udcff",
        "/" + "x" * 256,
        "/a" * (MAX_PATH_BYTES // 2 + 1),
    )

    def test_bad_paths_refused(self) -> None:
        """Non-canonical, NUL-bearing, non-UTF-8 and overlong paths are EINVAL everywhere."""
        for path in self.BAD:
            self.fails(self.store.get(path), InvalidArgument)
            self.fails(self.store.mkdir(path, mode=0, uid=0, gid=0, writer=ALICE), InvalidArgument)
            self.fails(self.put_deferred(path, 0, []), InvalidArgument)
            self.fails(self.store.rename("/x", path, writer=ALICE), InvalidArgument)
        self.assertEqual(self.ok(self.store.journal_row_count()), 0)

    def test_limits_are_inclusive(self) -> None:
        """A 255-byte component and a path of the limit's length are accepted."""
        self.mkdirs("/alice")
        self.write("/alice/" + "é" * 127 + "x", [])
        self.fails(self.store.get("/alice/" + "é" * 128), InvalidArgument)
        longest = "/alice" + "/d" * ((MAX_PATH_BYTES - 6) // 2)
        self.assertEqual(len(longest), MAX_PATH_BYTES)
        self.fails(self.store.get(longest), NotFound)
        self.fails(self.store.get(longest + "x"), InvalidArgument)


class PurgeTests(StoreTestCase):
    """
    Erasing a whole agent disk.
    """

    def test_purge_erases_disk_and_history(self) -> None:
        """Every name, reference and journal row of the disk goes; other disks stay."""
        self.mkdirs("/alice", "/alice/d", "/bob")
        self.write("/alice/d/f", [chunk(1), chunk(2)])
        self.ok(self.store.link("/alice/d/f", "/alice/g", writer=ALICE))
        self.ok(self.store.symlink("/alice/l", "d/f", uid=0, gid=0, writer=ALICE))
        self.write("/bob/f", [chunk(2)], writer=BOB)
        result = self.ok(self.store.purge_subtree("alice"))
        self.assertEqual((result.count, result.hashes), (5, {chunk(1).hash, chunk(2).hash}))
        self.assertEqual(result.journal_rows, 5)
        self.fails(self.store.get("/alice"), NotFound)
        self.assertEqual(self.names("/"), ["bob"])
        self.assertEqual(self.ok(self.store.usage_by_top()), {"bob": 1000})
        self.assertEqual(self.ok(self.store.live_hashes()), {chunk(2).hash})
        self.assertEqual(self.ok(self.store.get("/")).attributes.nlink, 3)
        self.assertEqual(self.ok(self.store.journal_row_count()), 2)
        self.assert_consistent()

    def test_purge_missing_or_bad_top(self) -> None:
        """Purging an absent disk removes nothing; a path instead of a top is EINVAL."""
        result = self.ok(self.store.purge_subtree("nobody"))
        self.assertEqual((result.count, result.hashes, result.journal_rows), (0, frozenset(), 0))
        for bad in ("", "a/b", ".."):
            self.fails(self.store.purge_subtree(bad), InvalidArgument)
