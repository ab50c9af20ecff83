"""
Tests for L{svc.mount.fs.MountFS} refusals: the path policy (deny, allow,
readonly) checked in the client, and read-only mode after the mount lease
is lost (set by the caller, or detected from a fenced session).
"""

from __future__ import annotations

import errno
import os
from typing import Any

from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from svc.mount.core.attributes import AttributeChanges
from svc.mount.fs import ROOT_INODE
from svc.mount.test.test_fs_support import CALLER, FSFixture
from svc.policy import PathPolicy


class PolicyTests(SynchronousTestCase):
    """Denied paths are EACCES, audited, and never reach the server."""

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        owner = self.fixture.mount()
        owner.ok(owner.fs.mkdir(ROOT_INODE, b"docs", 0o755, CALLER))
        owner.write_file("docs/a.md", b"readme")
        owner.write_file("secret.pem", b"key")
        owner.write_file("notes.txt", b"notes")

    def test_deny(self) -> None:
        """A denied name cannot be looked up or created, and is hidden from listings."""
        mount = self.fixture.mount(policy=PathPolicy(deny=["*.pem"]))
        self.assertEqual(
            mount.errno(mount.fs.lookup(ROOT_INODE, b"secret.pem", CALLER)), errno.EACCES
        )
        self.assertEqual(mount.names(""), ["docs", "notes.txt"])
        creates = mount.count("mknod")
        created = mount.fs.create(ROOT_INODE, b"new.pem", 0o644, os.O_WRONLY, CALLER)
        self.assertEqual(mount.errno(created), errno.EACCES)
        self.assertEqual(mount.count("mknod"), creates)
        lookup = mount.events("lookup")[0]
        self.assertEqual((lookup.path, lookup.allowed, lookup.size), ("/secret.pem", False, None))
        create = mount.events("create")[0]
        self.assertEqual((create.path, create.allowed), ("/new.pem", False))

    def test_allow(self) -> None:
        """With allow, directories leading to allowed paths can be listed; others refused."""
        mount = self.fixture.mount(policy=PathPolicy(allow=["docs/**"]))
        self.assertEqual(mount.names(""), ["docs"])
        self.assertEqual(mount.read_file("docs/a.md"), b"readme")
        self.assertEqual(
            mount.errno(mount.fs.lookup(ROOT_INODE, b"notes.txt", CALLER)), errno.EACCES
        )
        refused = mount.fs.mkdir(ROOT_INODE, b"x", 0o755, CALLER)
        self.assertEqual(mount.errno(refused), errno.EACCES)

    def test_directory_move(self) -> None:
        """A directory whose move would change a decision below it is EACCES, audited, not sent."""
        owner = self.fixture.mount()
        owner.ok(owner.fs.mkdir(ROOT_INODE, b"vault", 0o755, CALLER))
        owner.write_file("vault/master.pem", b"key")
        mount = self.fixture.mount(policy=PathPolicy(deny=["vault/master.pem"]))
        self.assertEqual(mount.names("vault"), [])
        renames = mount.count("manifest_rename")
        refused = mount.fs.rename(ROOT_INODE, b"vault", ROOT_INODE, b"v2", CALLER)
        self.assertEqual(mount.errno(refused), errno.EACCES)
        self.assertEqual(mount.count("manifest_rename"), renames)
        line = mount.events("rename")[-1]
        self.assertEqual(
            (line.path, dict(line.extra).get("to_path"), line.allowed), ("/vault", "/v2", False)
        )
        mount.ok(mount.fs.rename(ROOT_INODE, b"docs", ROOT_INODE, b"d2", CALLER))
        mount.ok(mount.fs.rename(ROOT_INODE, b"notes.txt", ROOT_INODE, b"vault2", CALLER))

    def test_readonly_policy(self) -> None:
        """Under readonly, reads work and every write is EACCES."""
        mount = self.fixture.mount(policy=PathPolicy(readonly=True))
        self.assertEqual(mount.read_file("notes.txt"), b"notes")
        entry = mount.lookup_path("notes.txt")
        fs = mount.fs
        refusals: list[Deferred[Any]] = [
            fs.open(entry.ino, os.O_RDWR, CALLER),
            fs.mkdir(ROOT_INODE, b"d", 0o755, CALLER),
            fs.unlink(ROOT_INODE, b"notes.txt", CALLER),
            fs.rename(ROOT_INODE, b"notes.txt", ROOT_INODE, b"n2", CALLER),
            fs.setattr(entry.ino, AttributeChanges(mode=0o600), CALLER),
            fs.symlink(ROOT_INODE, b"s", b"t", CALLER),
            fs.link(entry.ino, ROOT_INODE, b"l", CALLER),
        ]
        self.assertEqual([mount.errno(d) for d in refusals], [errno.EACCES] * len(refusals))
        for event in ("open", "mkdir", "unlink", "rename", "setattr", "symlink", "link"):
            self.assertEqual([e.allowed for e in mount.events(event)][-1:], [False], event)


class ReadOnlyModeTests(SynchronousTestCase):
    """After the mount lease is lost every write is EROFS."""

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        self.mount = self.fixture.mount()
        self.entry = self.mount.write_file("f", b"data")

    def test_set_read_only(self) -> None:
        """set_read_only refuses writes (EROFS, audited) but still serves reads."""
        opened = self.mount.ok(self.mount.fs.open(self.entry.ino, os.O_RDWR, CALLER))
        self.mount.ok(self.mount.fs.write(opened.fh, 0, b"DA", CALLER))
        self.mount.fs.set_read_only("mount lease lost")
        self.mount.fs.set_read_only("second reason")
        self.assertEqual(self.mount.fs.read_only, "mount lease lost")
        fs = self.mount.fs
        self.assertEqual(self.mount.errno(fs.write(opened.fh, 2, b"TA", CALLER)), errno.EROFS)
        self.assertEqual(self.mount.errno(fs.flush(opened.fh, CALLER)), errno.EROFS)
        self.assertEqual(self.mount.errno(fs.mkdir(ROOT_INODE, b"d", 0o755, CALLER)), errno.EROFS)
        self.assertEqual(
            self.mount.errno(fs.open(self.entry.ino, os.O_WRONLY, CALLER)), errno.EROFS
        )
        self.assertEqual(self.mount.errno(fs.release(opened.fh, CALLER)), errno.EROFS)
        self.assertEqual(self.mount.read_file("f"), b"data")
        self.assertEqual(self.fixture.mount().read_file("f"), b"data")
        self.assertFalse(self.mount.events("flush")[-1].allowed)
        self.assertEqual(list(self.mount.spill_dir.glob("*")), [])

    def test_fenced_session(self) -> None:
        """A newer mount session fences this one: the write is EROFS and the mount read-only."""
        newer = self.fixture.mount(epoch=2)
        newer.ok(newer.fs.mkdir(ROOT_INODE, b"by-newer", 0o755, CALLER))
        refused = self.mount.fs.mkdir(ROOT_INODE, b"by-older", 0o755, CALLER)
        self.assertEqual(self.mount.errno(refused), errno.EROFS)
        self.assertIn("fenced", self.mount.fs.read_only or "")
        self.assertEqual(self.mount.count("dir_create"), 1)
        again = self.mount.fs.mkdir(ROOT_INODE, b"again", 0o755, CALLER)
        self.assertEqual(self.mount.errno(again), errno.EROFS)
        self.assertEqual(self.mount.count("dir_create"), 1)
