"""
Tests for L{svc.mount.fs.MountFS.known_attributes},
L{svc.mount.fs.MountFS.known_lookup}, L{svc.mount.fs.MountFS.known_open} and
L{svc.mount.fs.MountFS.release_here}: the answers a FUSE thread gives
without the reactor, and the ones it leaves to it.
"""

from __future__ import annotations

import errno
import os

import attrs
from twisted.trial.unittest import SynchronousTestCase

from svc.audit.events import AuditEvent
from svc.mount.core.errors import FSError
from svc.mount.fs import ROOT_INODE
from svc.mount.ops import file_closes
from svc.mount.test.test_fs_support import CALLER, FSFixture, Mount
from svc.policy import PathPolicy


class KnownAttributesTests(SynchronousTestCase):
    """What the inode table can answer alone, and what it cannot."""

    def setUp(self) -> None:
        self.fixture = FSFixture(self)

    def test_directory_after_a_create_in_it(self) -> None:
        """
        A directory's attributes after a create in it (the kernel asks
        before its next lookup there) are getattr's, with no request.
        """
        mount = self.fixture.mount()
        directory = mount.ok(mount.fs.mkdir(ROOT_INODE, b"d", 0o755, CALLER))
        mount.write_file("d/f", b"data")
        requests = len(mount.connection.calls)
        known = mount.fs.known_attributes(directory.ino)
        self.assertEqual(len(mount.connection.calls), requests)
        self.assertIsNotNone(known)
        self.assertEqual(known, mount.ok(mount.fs.getattr(directory.ino, CALLER)))

    def test_closed_file(self) -> None:
        """A file no handle holds is answered from the table: its committed size."""
        mount = self.fixture.mount()
        entry = mount.write_file("f", b"12345")
        known = mount.fs.known_attributes(entry.ino)
        assert known is not None
        self.assertEqual(known.size, 5)
        self.assertEqual(known, mount.ok(mount.fs.getattr(entry.ino, CALLER)))

    def test_open_file_is_left_to_the_reactor(self) -> None:
        """While a handle is open its size and mtime are the open state's: no answer."""
        mount = self.fixture.mount()
        entry = mount.write_file("f", b"12345")
        opened = mount.ok(mount.fs.open(entry.ino, os.O_WRONLY, CALLER))
        mount.ok(mount.fs.write(opened.fh, 5, b"678", CALLER))
        self.assertIsNone(mount.fs.known_attributes(entry.ino))
        self.assertEqual(mount.ok(mount.fs.getattr(entry.ino, CALLER)).size, 8)
        mount.ok(mount.fs.flush(opened.fh, CALLER))
        mount.ok(mount.fs.release(opened.fh, CALLER))
        known = mount.fs.known_attributes(entry.ino)
        assert known is not None
        self.assertEqual(known.size, 8)

    def test_stale_is_left_to_the_reactor(self) -> None:
        """Stale attributes are not answered; the reactor's getattr fetches them."""
        mount = self.fixture.mount()
        directory = mount.ok(mount.fs.mkdir(ROOT_INODE, b"d", 0o755, CALLER))
        mount.write_file("d/f", b"data")
        mount.fs._ctx.table.require(directory.ino).stale = True  # as after an outside change
        self.assertIsNone(mount.fs.known_attributes(directory.ino))
        fetched = mount.ok(mount.fs.getattr(directory.ino, CALLER))
        self.assertEqual(mount.fs.known_attributes(directory.ino), fetched)

    def test_directory_after_a_removal_in_it(self) -> None:
        """
        After an unlink and an rmdir, the directory's attributes are computed
        from the data plane's answer: the server's own, with no request.
        """
        mount = self.fixture.mount()
        directory = mount.ok(mount.fs.mkdir(ROOT_INODE, b"d", 0o755, CALLER))
        mount.ok(mount.fs.mkdir(directory.ino, b"sub", 0o755, CALLER))
        mount.write_file("d/f", b"data")
        mount.ok(mount.fs.unlink(directory.ino, b"f", CALLER))
        mount.ok(mount.fs.rmdir(directory.ino, b"sub", CALLER))
        requests = len(mount.connection.calls)
        known = mount.fs.known_attributes(directory.ino)
        self.assertEqual(len(mount.connection.calls), requests)
        server = self.fixture.mount().lookup_path("d").attributes
        self.assertEqual(known, server)
        assert known is not None
        self.assertEqual(known.nlink, 2)

    def test_after_renames(self) -> None:
        """
        After renames within a directory and across, over a file, over an
        empty directory and of a directory, both directories' and the moved
        node's attributes are the server's, computed with no request.
        """
        mount = self.fixture.mount()
        fs = mount.fs
        for directory in ("a", "b", "a/d1", "b/d2"):
            parent, name = mount.parent_of(directory)
            mount.ok(fs.mkdir(parent, name, 0o755, CALLER))
        for path in ("a/f1", "a/f2", "a/f4", "b/x"):
            mount.write_file(path, path.encode())
        for source, destination in [
            ("a/f1", "a/g1"),  # within a directory
            ("a/g1", "a/f2"),  # over a file in it
            ("a/f2", "b/f3"),  # across
            ("a/f4", "b/x"),  # across, over a file
            ("a/d1", "b/d2"),  # a directory across, over an empty one
            ("b/d2", "a/d3"),  # a directory across
        ]:
            old_parent, old_name = mount.parent_of(source)
            new_parent, new_name = mount.parent_of(destination)
            mount.ok(fs.rename(old_parent, old_name, new_parent, new_name, CALLER))
            requests = len(mount.connection.calls)
            moved = fs._ctx.table.child(fs._ctx.table.require(new_parent), new_name.decode())
            assert moved is not None
            known = {
                "old parent": fs.known_attributes(old_parent),
                "new parent": fs.known_attributes(new_parent),
                "moved": fs.known_attributes(moved.ino),
            }
            self.assertEqual(len(mount.connection.calls), requests)
            fresh = self.fixture.mount()
            server = {
                "old parent": fresh.lookup_path(source.rpartition("/")[0]).attributes,
                "new parent": fresh.lookup_path(destination.rpartition("/")[0]).attributes,
                "moved": fresh.lookup_path(destination).attributes,
            }
            self.assertEqual(known, server, f"{source} -> {destination}")

    def test_unknown_inode_is_left_to_the_reactor(self) -> None:
        """An inode the table does not know: no answer (the reactor says ENOENT)."""
        mount = self.fixture.mount()
        self.assertIsNone(mount.fs.known_attributes(9999))
        self.assertEqual(mount.errno(mount.fs.getattr(9999, CALLER)), errno.ENOENT)

    def test_policy_refusal_is_left_to_the_reactor(self) -> None:
        """
        A file whose path the policy refuses now (the policy changed after
        it was looked up; renaming its directory into a denied place is
        refused) is not answered; the reactor refuses it.
        """
        mount = self.fixture.mount(policy=PathPolicy(deny=["locked/*"]))
        mount.ok(mount.fs.mkdir(ROOT_INODE, b"open", 0o755, CALLER))
        entry = mount.write_file("open/f", b"data")
        self.assertIsNotNone(mount.fs.known_attributes(entry.ino))
        moved = mount.fs.rename(ROOT_INODE, b"open", ROOT_INODE, b"locked", CALLER)
        self.assertEqual(mount.errno(moved), errno.EACCES)
        mount.fs._ctx.policy = PathPolicy(deny=["open/*"])
        self.assertIsNone(mount.fs.known_attributes(entry.ino))
        self.assertEqual(mount.errno(mount.fs.getattr(entry.ino, CALLER)), errno.EACCES)


def _without_ts(event: AuditEvent) -> AuditEvent:
    return attrs.evolve(event, ts=0.0)


class KnownLookupTests(SynchronousTestCase):
    """
    Lookups answered from the inode table give the reactor's answer and
    audit line; the rest are left to the reactor.
    """

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        self.mount = self.fixture.mount()
        self.directory = self.mount.ok(self.mount.fs.mkdir(ROOT_INODE, b"d", 0o755, CALLER))
        self.file = self.mount.write_file("d/f", b"12345")

    def _lines(self, mount: Mount) -> list[AuditEvent]:
        return [_without_ts(event) for event in mount.events("lookup")]

    def test_missing_name_in_a_wholly_known_directory(self) -> None:
        """
        A name a directory this mount created does not hold is ENOENT at
        once, with the reactor's audit line and no request.
        """
        mount = self.mount
        requests = len(mount.connection.calls)
        failure = self.assertRaises(
            FSError, mount.fs.known_lookup, self.directory.ino, b"next", CALLER
        )
        self.assertEqual(failure.errno, errno.ENOENT)
        self.assertEqual(len(mount.connection.calls), requests)
        fast = self._lines(mount)[-1]
        self.assertEqual(
            mount.errno(mount.fs.lookup(self.directory.ino, b"next", CALLER)), errno.ENOENT
        )
        self.assertEqual(self._lines(mount)[-1], fast)
        self.assertEqual((fast.path, fast.allowed, fast.size), ("/d/next", True, None))

    def test_known_child(self) -> None:
        """A known child is the reactor's entry and audit line, and counts as looked up."""
        mount = self.mount
        table = mount.fs._ctx.table
        node = table.require(self.file.ino)
        lookups = node.lookups
        entry = mount.fs.known_lookup(self.directory.ino, b"f", CALLER)
        self.assertEqual(node.lookups, lookups + 1)
        fast = self._lines(mount)[-1]
        self.assertEqual(entry, mount.ok(mount.fs.lookup(self.directory.ino, b"f", CALLER)))
        self.assertEqual(self._lines(mount)[-1], fast)
        self.assertEqual((fast.path, fast.allowed, fast.size), ("/d/f", True, 5))
        self.assertEqual(node.lookups, lookups + 2)

    def test_counted_lookup_keeps_an_unlinked_inode(self) -> None:
        """
        The lookup a FUSE thread counted keeps the inode after its name goes,
        until the kernel forgets it, as the reactor's count does.
        """
        mount = self.mount
        table = mount.fs._ctx.table
        mount.fs.forget([(self.file.ino, table.require(self.file.ino).lookups)])
        entry = mount.fs.known_lookup(self.directory.ino, b"f", CALLER)
        assert entry is not None
        mount.ok(mount.fs.unlink(self.directory.ino, b"f", CALLER))
        self.assertIsNotNone(table.get(entry.ino))
        mount.fs.forget([(entry.ino, 1)])
        self.assertIsNone(table.get(entry.ino))

    def test_left_to_the_reactor(self) -> None:
        """
        Dot names, a name in a directory not wholly known, a stale child,
        an open file and an unknown directory get no answer here, and
        write no line.
        """
        mount = self.mount
        fs = mount.fs
        lines = len(self._lines(mount))
        self.assertIsNone(fs.known_lookup(self.directory.ino, b"..", CALLER))
        self.assertIsNone(fs.known_lookup(9999, b"x", CALLER))
        other = self.fixture.mount()  # knows nothing of d: not wholly known
        other_directory = other.lookup_path("d")
        self.assertIsNone(other.fs.known_lookup(other_directory.ino, b"new", CALLER))
        opened = mount.ok(fs.open(self.file.ino, os.O_WRONLY, CALLER))
        self.assertIsNone(fs.known_lookup(self.directory.ino, b"f", CALLER))
        mount.ok(fs.release(opened.fh, CALLER))
        fs._ctx.table.require(self.file.ino).stale = True
        self.assertIsNone(fs.known_lookup(self.directory.ino, b"f", CALLER))
        self.assertEqual(len(self._lines(mount)), lines)

    def test_policy_refusal_is_left_to_the_reactor(self) -> None:
        """A refused name is not answered here; the reactor refuses and audits it."""
        mount = self.fixture.mount(policy=PathPolicy(deny=["d/secret*"]))
        directory = mount.lookup_path("d")
        mount.names("d")  # wholly known now
        lines = len(mount.events("lookup"))
        self.assertIsNone(mount.fs.known_lookup(directory.ino, b"secret.txt", CALLER))
        self.assertEqual(len(mount.events("lookup")), lines)
        refused = mount.fs.lookup(directory.ino, b"secret.txt", CALLER)
        self.assertEqual(mount.errno(refused), errno.EACCES)
        self.assertFalse(mount.events("lookup")[-1].allowed)


class KnownOpenTests(SynchronousTestCase):
    """
    Read-only opens answered without the reactor give its handle and audit
    line; the rest are left to it.
    """

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        self.mount = self.fixture.mount()
        self.mount.ok(self.mount.fs.mkdir(ROOT_INODE, b"d", 0o755, CALLER))
        self.file = self.mount.write_file("d/f", b"12345")

    def _lines(self, mount: Mount) -> list[AuditEvent]:
        return [_without_ts(event) for event in mount.events("open")]

    def test_closed_file_with_its_chunk_list(self) -> None:
        """
        A committed file no handle holds opens read-only with no request:
        its content reads back, and the audit line is the reactor's.
        """
        mount = self.mount
        fs = mount.fs
        requests = len(mount.connection.calls)
        opened = fs.known_open(self.file.ino, os.O_RDONLY, CALLER)
        assert opened is not None
        self.assertEqual(len(mount.connection.calls), requests)
        self.assertEqual(mount.ok(fs.read(opened.fh, 0, 100, CALLER)), b"12345")
        fast = self._lines(mount)[-1]
        mount.ok(fs.release(opened.fh, CALLER))
        again = mount.ok(fs.open(self.file.ino, os.O_RDONLY, CALLER))
        self.assertEqual(self._lines(mount)[-1], fast)
        self.assertEqual((fast.path, fast.allowed, fast.size), ("/d/f", True, 5))
        self.assertEqual(again.keep_cache, opened.keep_cache)
        mount.ok(fs.release(again.fh, CALLER))

    def test_shares_the_state_a_reactor_open_made_meanwhile(self) -> None:
        """
        A reactor open of an inode opened here uses the same open state, so
        a write through it is what the reader reads.
        """
        mount = self.mount
        fs = mount.fs
        reader = fs.known_open(self.file.ino, os.O_RDONLY, CALLER)
        assert reader is not None
        writer = mount.ok(fs.open(self.file.ino, os.O_WRONLY, CALLER))
        files = fs._ctx.files
        writing, reading = files.handle(writer.fh), files.handle(reader.fh)
        assert writing is not None and reading is not None
        self.assertIs(writing.state, reading.state)
        mount.ok(fs.write(writer.fh, 0, b"ABC", CALLER))
        self.assertEqual(mount.ok(fs.read(reader.fh, 0, 100, CALLER)), b"ABC45")
        for fh in (writer.fh, reader.fh):
            mount.ok(fs.flush(fh, CALLER))
            mount.ok(fs.release(fh, CALLER))
        self.assertEqual(self.fixture.mount().read_file("d/f"), b"ABC45")

    def test_left_to_the_reactor(self) -> None:
        """
        A write or truncating open, a file already open (a new file is, until
        its first commit), a stale file, one whose chunk list is not cached,
        a directory and an unknown inode get no answer here, and write no
        line.
        """
        mount = self.mount
        fs = mount.fs
        ino = self.file.ino
        lines = len(self._lines(mount))
        self.assertIsNone(fs.known_open(ino, os.O_WRONLY, CALLER))
        self.assertIsNone(fs.known_open(ino, os.O_RDWR, CALLER))
        self.assertIsNone(fs.known_open(ino, os.O_RDONLY | os.O_TRUNC, CALLER))
        self.assertIsNone(fs.known_open(9999, os.O_RDONLY, CALLER))
        self.assertIsNone(fs.known_open(mount.lookup_path("d").ino, os.O_RDONLY, CALLER))
        held = mount.ok(fs.open(ino, os.O_RDONLY, CALLER))
        self.assertIsNone(fs.known_open(ino, os.O_RDONLY, CALLER), "a state to share")
        mount.ok(fs.release(held.fh, CALLER))
        node = fs._ctx.table.require(ino)
        node.stale = True
        self.assertIsNone(fs.known_open(ino, os.O_RDONLY, CALLER))
        node.stale = False
        other = self.fixture.mount()  # looked up, its chunk list never fetched
        self.assertIsNone(other.fs.known_open(other.lookup_path("d/f").ino, os.O_RDONLY, CALLER))
        self.assertEqual(len(self._lines(mount)), lines + 1)  # the reactor's open above

    def test_policy_refusal_is_left_to_the_reactor(self) -> None:
        """A file the policy hides is not opened here; the reactor refuses and audits it."""
        mount = self.fixture.mount(policy=PathPolicy(deny=["d/f"]))
        ino = mount.lookup_path("d").ino
        mount.names("d")
        node = mount.fs._ctx.table.child(mount.fs._ctx.table.require(ino), "f")
        assert node is not None
        node.chunks, node.chunks_version = (), node.attributes.version  # as if fetched
        lines = len(mount.events("open"))
        self.assertIsNone(mount.fs.known_open(node.ino, os.O_RDONLY, CALLER))
        self.assertEqual(len(mount.events("open")), lines)
        refused = mount.fs.open(node.ino, os.O_RDONLY, CALLER)
        self.assertEqual(mount.errno(refused), errno.EACCES)
        self.assertFalse(mount.events("open")[-1].allowed)


class ReleaseHereTests(SynchronousTestCase):
    """
    Read-only handles released without the reactor, their clean states
    retired by a sweep shortly after; the releases left to the reactor.
    """

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        self.mount = self.fixture.mount()
        self.fs = self.mount.fs
        self.file = self.mount.write_file("f", b"12345")
        self.files = self.fs._ctx.files

    def sweep(self) -> None:
        self.fixture.service.clock.advance(file_closes.RELEASE_SWEEP_SECONDS)

    def test_reader_released_and_its_state_swept(self) -> None:
        """
        The last reader of a clean file: released here, one sweep posted for
        any number of such releases, the states retired when it runs; a
        fresh open afterwards is answered here again.
        """
        first = self.fs.known_open(self.file.ino, os.O_RDONLY, CALLER)
        other = self.mount.write_file("g", b"678")
        second = self.fs.known_open(other.ino, os.O_RDONLY, CALLER)
        assert first is not None and second is not None
        self.assertTrue(self.fs.release_here(first.fh), "the first: post a sweep")
        self.assertFalse(self.fs.release_here(second.fh), "a sweep is due already")
        self.assertIsNone(self.files.handle(first.fh))
        self.assertIsNotNone(self.files.state(self.file.ino), "retired by the sweep")
        self.fs.sweep_released()
        self.sweep()
        self.assertIsNone(self.files.state(self.file.ino))
        self.assertIsNone(self.files.state(other.ino))
        again = self.fs.known_open(self.file.ino, os.O_RDONLY, CALLER)
        assert again is not None
        self.assertTrue(self.fs.release_here(again.fh), "a new sweep after the last one")
        self.mount.ok(self.fs.write_backs_settled())

    def test_reopened_before_the_sweep(self) -> None:
        """A state opened again before the sweep is left to its new handle."""
        reader = self.fs.known_open(self.file.ino, os.O_RDONLY, CALLER)
        assert reader is not None
        self.assertTrue(self.fs.release_here(reader.fh))
        writer = self.mount.ok(self.fs.open(self.file.ino, os.O_RDWR, CALLER))
        self.fs.sweep_released()
        self.sweep()
        state = self.files.state(self.file.ino)
        assert state is not None
        self.assertEqual(state.handles, 1)
        self.mount.ok(self.fs.write(writer.fh, 0, b"AB", CALLER))
        self.mount.ok(self.fs.flush(writer.fh, CALLER))
        self.mount.ok(self.fs.release(writer.fh, CALLER))
        self.assertIsNone(self.files.state(self.file.ino))
        self.assertEqual(self.fixture.mount().read_file("f"), b"AB345")

    def test_left_to_the_reactor(self) -> None:
        """
        A writable handle, and the last reader of a file with a change to
        commit, are released by the reactor; a reader beside a writer is
        released here and posts no sweep (the writer's release retires it).
        """
        writer = self.mount.ok(self.fs.open(self.file.ino, os.O_RDWR, CALLER))
        reader = self.mount.ok(self.fs.open(self.file.ino, os.O_RDONLY, CALLER))
        self.assertIsNone(self.fs.release_here(writer.fh))
        self.assertIs(self.fs.release_here(reader.fh), False)
        self.mount.ok(self.fs.write(writer.fh, 0, b"AB", CALLER))
        last = self.mount.ok(self.fs.open(self.file.ino, os.O_RDONLY, CALLER))
        self.mount.ok(self.fs.release(writer.fh, CALLER))  # its commit waits for the reader
        self.assertIsNone(self.fs.release_here(last.fh), "a change to commit")
        self.assertIsNone(self.fs.release_here(12345))
        self.mount.ok(self.fs.release(last.fh, CALLER))
        self.assertEqual(self.fixture.mount().read_file("f"), b"AB345")
