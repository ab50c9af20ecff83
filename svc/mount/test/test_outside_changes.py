"""
Changes someone else made, as the data plane's C{changed} push reports them:
the mount forgets what it cached for those paths (and only those), keeps
what a program has open, and ignores its own changes.
"""

from __future__ import annotations

import errno
import os

from twisted.trial.unittest import SynchronousTestCase

from svc.mount.remote.pushes import changed_pushes
from svc.mount.test.test_fs_support import AGENT, CALLER, FSFixture


class OutsideChangeTests(SynchronousTestCase):
    """
    A mount told that paths changed behind it.
    """

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        self.mount = self.fixture.mount()
        self.other = self.fixture.service.agent()
        self.theirs = self.fixture.service.session(AGENT, 1, nonce=b"\x02" * 8)
        self.mount.ok(self.mount.fs.mkdir(1, b"d", 0o755, CALLER))
        self.entry = self.mount.write_file("d/f", b"version one")

    def told(self, *paths: str, session_id: str | None = None) -> int:
        """Push a change of C{paths} (mount-relative) to the mount."""
        server_paths = [f"/agent-1/{path}" if path else "/agent-1" for path in paths]
        return self.mount.fs.outside_changed(server_paths, session_id or self.theirs)

    def test_changed_content_is_read_after_the_push(self) -> None:
        """A file rewritten elsewhere reads as the new version once the mount is told."""
        self.other.put_file("d/f", b"version two", expected_version=1, session_id=self.theirs)
        self.assertEqual(self.mount.read_file("d/f"), b"version one", "authoritative cache")
        self.assertEqual(self.told("d/f"), 1)
        self.assertEqual(self.mount.read_file("d/f"), b"version two")
        self.assertIn(self.entry.ino, self.mount.invalidated)
        directory = self.mount.lookup_path("d").ino
        self.assertIn((directory, b"f"), self.mount.invalidated_entries)

    def test_inode_number_is_kept(self) -> None:
        """The file keeps its FUSE inode number when the kernel still knows it."""
        self.other.put_file("d/f", b"version two", expected_version=1, session_id=self.theirs)
        self.told("d/f")
        self.assertEqual(self.mount.lookup_path("d/f").ino, self.entry.ino)

    def test_an_open_through_the_kernel_s_stale_entry_is_estale(self) -> None:
        """
        The kernel may still hold the entry the push made the mount forget
        (its invalidation is queued) and open that inode: C{ESTALE}, on
        which the kernel looks the path up again, not C{ENOENT} for a file
        that exists.
        """
        self.other.put_file("d/f", b"version two", expected_version=1, session_id=self.theirs)
        self.told("d/f")
        opened = self.mount.fs.open(self.entry.ino, os.O_RDONLY, CALLER)
        self.assertEqual(self.mount.errno(opened), errno.ESTALE)
        self.assertEqual(self.mount.read_file("d/f"), b"version two")

    def test_file_created_elsewhere_appears(self) -> None:
        """A name a complete listing lacked is found once its directory was named."""
        self.assertEqual(self.mount.names("d"), ["f"])
        self.other.put_file("d/g", b"new", expected_version=0, session_id=self.theirs)
        parent, _ = self.mount.parent_of("d/g")
        self.assertEqual(self.mount.errno(self.mount.fs.lookup(parent, b"g", CALLER)), errno.ENOENT)
        self.told("d/g")
        self.assertEqual(self.mount.read_file("d/g"), b"new")
        self.assertEqual(sorted(self.mount.names("d")), ["f", "g"])

    def test_file_removed_elsewhere_disappears(self) -> None:
        """A file deleted elsewhere is gone from lookups and listings after the push."""
        self.other.ok("manifest_delete", path="/agent-1/d/f", session_id=self.theirs)
        self.told("d/f")
        parent, _ = self.mount.parent_of("d/f")
        self.assertEqual(self.mount.errno(self.mount.fs.lookup(parent, b"f", CALLER)), errno.ENOENT)
        self.assertEqual(self.mount.names("d"), [])

    def test_open_changes_are_kept_as_a_conflict_copy(self) -> None:
        """
        A file open and written here keeps the program's bytes: its
        write-back conflicts. (The other connection held the write lease
        when the file was opened here, and gives it back after its change.)
        """
        granted = self.other.ok("lease_grant", path="/agent-1/d/f", mode="write")
        opened = self.mount.ok(self.mount.fs.open(self.entry.ino, os.O_RDWR, CALLER))
        self.mount.ok(self.mount.fs.write(opened.fh, 0, b"MINE", CALLER))
        self.other.put_file("d/f", b"their version", expected_version=1, session_id=self.theirs)
        self.other.ok("lease_release", lease_id=granted["lease_id"])
        self.told("d/f")
        self.assertEqual(
            self.mount.ok(self.mount.fs.getattr(self.entry.ino, CALLER)).size,
            len(b"version one"),
            "the open file's own size",
        )
        synced = self.mount.fs.fsync(opened.fh, False, CALLER)
        self.assertEqual(self.mount.errno(synced), errno.ESTALE)
        self.mount.ok(self.mount.fs.release(opened.fh, CALLER))
        [copy] = [name for name in self.mount.names("d") if ".conflict-" in name]
        self.assertEqual(self.mount.read_file(f"d/{copy}"), b"MINEion one")
        self.assertEqual(self.mount.read_file("d/f"), b"their version")

    def test_own_session_is_ignored(self) -> None:
        """A change carrying the mount's own session id is its own: nothing is dropped."""
        own = self.mount.fs._ctx.session_id
        before = self.mount.count("manifest_get")
        self.assertEqual(self.told("d/f", session_id=own), 0)
        self.mount.read_file("d/f")
        self.assertEqual(self.mount.count("manifest_get"), before)
        self.assertEqual(self.mount.invalidated, [])

    def test_unrelated_paths_are_ignored(self) -> None:
        """Paths outside the disk, or under a directory not cached, touch nothing."""
        touched = self.mount.fs.outside_changed(
            ["/agent-2/d/f", "/agent-10", "/agent-1/unknown/x"], self.theirs
        )
        self.assertEqual(touched, 0)
        self.assertEqual(self.mount.invalidated, [])

    def test_directory_stays_named(self) -> None:
        """A changed directory keeps its cached names but lists again."""
        self.other.put_file("d/h", b"h", expected_version=0, session_id=self.theirs)
        self.told("d")
        directory = self.mount.lookup_path("d").ino
        self.assertEqual(self.mount.lookup_path("d/f").ino, self.entry.ino)
        self.assertEqual(sorted(self.mount.names("d")), ["f", "h"])
        self.assertIn(directory, self.mount.invalidated)

    def test_disk_root(self) -> None:
        """The disk root itself can be named: it lists again."""
        self.other.put_file("top", b"t", expected_version=0, session_id=self.theirs)
        self.assertEqual(self.told(""), 1)
        self.assertEqual(sorted(self.mount.names("")), ["d", "top"])


class ChangedPushTests(SynchronousTestCase):
    """
    The push callback that feeds C{changed} pushes to the mount.
    """

    def test_changed_push_delivered(self) -> None:
        """A well-formed changed push reaches the receiver with its paths and session."""
        received: list[tuple[tuple[str, ...], str | None]] = []
        push = changed_pushes(lambda paths, session: received.append((paths, session)))
        push("changed", {"paths": ["/a/b", "/a/c"], "session_id": "mount:x"}, b"")
        push("changed", {"paths": ["/a/b"], "session_id": None}, b"")
        self.assertEqual(received, [(("/a/b", "/a/c"), "mount:x"), (("/a/b",), None)])

    def test_other_and_malformed_pushes_ignored(self) -> None:
        """Other pushes, and changed pushes of the wrong shape, never reach the receiver."""
        received: list[object] = []
        push = changed_pushes(lambda paths, session: received.append(paths))
        push("lease_revoke", {"lease_id": "ab"}, b"")
        payloads: list[dict[str, object]] = [
            {},
            {"paths": []},
            {"paths": "/a"},
            {"paths": ["/a", 3]},
            {"paths": ["/a"], "session_id": 5},
            {"paths": ["/a"] * 5000},
        ]
        for payload in payloads:
            push("changed", payload, b"")
        self.assertEqual(received, [])
