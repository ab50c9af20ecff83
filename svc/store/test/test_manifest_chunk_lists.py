"""
Tests for L{svc.store.manifests.ManifestStore.chunk_lists}: the chunk lists
of several files of one directory in one read, as a C{list} with C{chunks}
needs them.
"""

from __future__ import annotations

from svc.store.manifest_values import FileChunks, FileKind
from svc.store.test.routes_support import ALICE, StoreTestCase, chunk


class ChunkListsTests(StoreTestCase):
    """The chunk lists of a directory's files, by name."""

    def setUp(self) -> None:
        super().setUp()
        self.mkdirs("/alice", "/alice/d")

    def test_files_by_name_with_inode_and_version(self) -> None:
        """
        Each regular file named gets its chunk list in file order (repeats
        kept), with the inode and version the listing shows.
        """
        self.write("/alice/a", [chunk(1), chunk(2, 7), chunk(1)])
        self.write("/alice/b", [])
        self.write("/alice/b", [chunk(3)], expected_version=1)
        lists = self.ok(self.store.chunk_lists("/alice", ["a", "b"]))
        listed = {entry.name: entry.attributes for entry in self.ok(self.store.list_dir("/alice"))}
        self.assertEqual(
            lists,
            {
                "a": FileChunks(listed["a"].inode, 1, (chunk(1), chunk(2, 7), chunk(1))),
                "b": FileChunks(listed["b"].inode, 2, (chunk(3),)),
            },
        )

    def test_only_regular_files_named(self) -> None:
        """
        Directories, symlinks, special files, absent names and files not
        named are left out; an empty file has an empty list.
        """
        self.write("/alice/f", [chunk(1)])
        self.write("/alice/empty", [])
        self.write("/alice/other", [chunk(2)])
        self.ok(self.store.symlink("/alice/l", "f", uid=0, gid=0, writer=ALICE))
        self.ok(
            self.store.mknod(
                "/alice/p", kind=FileKind.FIFO, mode=0o600, rdev=0, uid=0, gid=0, writer=ALICE
            )
        )
        names = ["f", "empty", "d", "l", "p", "missing"]
        lists = self.ok(self.store.chunk_lists("/alice", names))
        found = {name: listed.chunks for name, listed in lists.items()}
        self.assertEqual(found, {"f": (chunk(1),), "empty": ()})

    def test_longer_lists_left_out(self) -> None:
        """With C{max_chunks}, a file whose list has more entries is left out."""
        self.write("/alice/short", [chunk(1), chunk(1)])
        self.write("/alice/long", [chunk(1), chunk(2), chunk(3)])
        lists = self.ok(self.store.chunk_lists("/alice", ["short", "long"], max_chunks=2))
        self.assertEqual(list(lists), ["short"])
        every = self.ok(self.store.chunk_lists("/alice", ["short", "long"]))
        self.assertEqual(sorted(every), ["long", "short"])

    def test_names_of_the_directory_only(self) -> None:
        """
        The names are entries of the directory given: a file of the same
        name elsewhere is not read; the root's entries are top-level names.
        """
        self.write("/alice/d/f", [chunk(1)])
        self.assertEqual(self.ok(self.store.chunk_lists("/alice", ["f"])), {})
        below = self.ok(self.store.chunk_lists("/alice/d", ["f"]))
        self.assertEqual(list(below), ["f"])
        self.write("/top", [chunk(2)])
        self.assertEqual(self.ok(self.store.chunk_lists("/", ["top"]))["top"].chunks, (chunk(2),))

    def test_many_names(self) -> None:
        """More names than one query takes are read in batches."""
        names = [f"f{index:04}" for index in range(1200)]
        for index, name in enumerate(names):
            self.write(f"/alice/{name}", [chunk(index, 1)])
        lists = self.ok(self.store.chunk_lists("/alice", names))
        self.assertEqual(len(lists), 1200)
        self.assertEqual(lists["f1199"].chunks, (chunk(1199, 1),))

    def test_hard_links_share_a_list(self) -> None:
        """Two names of one inode give the same list, inode and version."""
        self.write("/alice/f", [chunk(1)])
        self.ok(self.store.link("/alice/f", "/alice/g", writer=ALICE))
        lists = self.ok(self.store.chunk_lists("/alice", ["f", "g"]))
        self.assertEqual(lists["f"], lists["g"])
