"""
Tests for L{svc.mount.fs.MountFS}: files written in pieces and read back,
sparse files, incremental write-back, deduplication, truncation.
"""

from __future__ import annotations

import errno
import os

from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from svc.chunking import chunk_bytes
from svc.mount.core.attributes import AttributeChanges, Attributes
from svc.mount.core.file_size_limit import MAX_FILE_BYTES
from svc.mount.core.fs_context import FSSettings
from svc.mount.core.spill_writes import SpillWrite, WriteGrant
from svc.mount.test.test_fs_support import CALLER, FSFixture, pseudo_random

MiB = 1 << 20


class WriteReadTests(SynchronousTestCase):
    """Content written through one mount is read back through another."""

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        self.mount = self.fixture.mount()

    def test_pieces_then_fresh_mount(self) -> None:
        """A file written in 64 KiB pieces reads back identically from a fresh core."""
        data = pseudo_random("pieces", 3 * MiB + 12345)
        self.mount.write_file("notes.bin", data, piece=64 * 1024)
        fresh = self.fixture.mount(epoch=1)
        self.assertEqual(fresh.read_file("notes.bin", piece=100_000), data)
        self.assertEqual(fresh.lookup_path("notes.bin").attributes.size, len(data))

    def test_chunks_match_a_whole_cut(self) -> None:
        """The committed chunk list is exactly what cutting the whole content gives."""
        data = pseudo_random("whole", 9 * MiB)
        self.mount.write_file("f", data)
        manifest = self.mount.ok(self.mount.remote.manifest_get("/agent-1/f"))
        expected = [(ref.hash, ref.length) for ref in chunk_bytes(data)]
        self.assertEqual([(c.hash, c.size) for c in manifest.chunks], expected)


class IncrementalWriteBackTests(SynchronousTestCase):
    """A flush reads, cuts and sends only around what changed."""

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        self.mount = self.fixture.mount()

    def test_rewrite_middle_of_large_file(self) -> None:
        """Rewriting 1 MiB in the middle of a 64 MiB file sends at most 3 chunks."""
        data = bytearray(pseudo_random("large", 64 * MiB))
        self.mount.write_file("big", bytes(data), piece=8 * MiB)
        editor = self.fixture.mount()
        entry = editor.lookup_path("big")
        patch = pseudo_random("patch", MiB)
        opened = editor.ok(editor.fs.open(entry.ino, os.O_RDWR, CALLER))
        editor.ok(editor.fs.write(opened.fh, 30 * MiB + 777, patch, CALLER))
        editor.ok(editor.fs.release(opened.fh, CALLER))
        data[30 * MiB + 777 : 31 * MiB + 777] = patch
        sent = editor.count("chunk_put")
        self.assertGreaterEqual(sent, 1)
        self.assertLessEqual(sent, 3)
        self.assertLessEqual(editor.chunks.fetched, 4)
        [flush] = editor.events("flush")
        self.assertEqual(flush.get("chunks_new"), sent)
        manifest = self.mount.ok(self.mount.remote.manifest_get("/agent-1/big"))
        expected = [(ref.hash, ref.length) for ref in chunk_bytes(bytes(data))]
        self.assertEqual([(c.hash, c.size) for c in manifest.chunks], expected)
        self.assertEqual(self.fixture.mount().read_file("big", piece=16 * MiB), bytes(data))

    def test_same_content_twice_sends_nothing(self) -> None:
        """Writing content the disk already holds uploads no chunk the second time."""
        data = pseudo_random("twice", 6 * MiB)
        self.mount.write_file("a", data)
        first = self.mount.count("chunk_put")
        self.assertGreater(first, 0)
        self.mount.write_file("b", data)
        self.assertEqual(self.mount.count("chunk_put"), first)
        flush = self.mount.events("flush")[-1]
        self.assertEqual(flush.get("chunks_new"), 0)
        self.assertEqual(flush.get("chunks_reused"), len(chunk_bytes(data)))

    def test_sparse_file(self) -> None:
        """A few KiB at the end of a 256 MiB sparse file stay small locally and remotely."""
        parent, name = self.mount.parent_of("sparse")
        opened, entry = self.mount.ok(
            self.mount.fs.create(parent, name, 0o644, os.O_RDWR | os.O_CREAT, CALLER)
        )
        tail = pseudo_random("tail", 4096)
        self.mount.ok(self.mount.fs.write(opened.fh, 256 * MiB - 4096, tail, CALLER))
        head = pseudo_random("head", 4096)
        self.mount.ok(self.mount.fs.write(opened.fh, 0, head, CALLER))
        spill = self.mount.fs._ctx.files.state(entry.ino).spill  # type: ignore[union-attr]
        assert spill is not None
        self.assertLess(spill.allocated(), MiB)
        self.assertEqual(self.mount.ok(self.mount.fs.read(opened.fh, 4096, 10, CALLER)), bytes(10))
        self.mount.ok(self.mount.fs.release(opened.fh, CALLER))
        self.assertLessEqual(self.mount.count("chunk_put"), 3)
        manifest = self.mount.ok(self.mount.remote.manifest_get("/agent-1/sparse"))
        self.assertEqual(manifest.attributes.size, 256 * MiB)
        self.assertEqual(list(self.mount.spill_dir.glob("*.spill")), [])
        fresh = self.fixture.mount()
        entry = fresh.lookup_path("sparse")
        opened = fresh.ok(fresh.fs.open(entry.ino, os.O_RDONLY, CALLER))
        self.assertEqual(fresh.ok(fresh.fs.read(opened.fh, 0, 4096, CALLER)), head)
        self.assertEqual(fresh.ok(fresh.fs.read(opened.fh, 100 * MiB, 8, CALLER)), bytes(8))
        self.assertEqual(fresh.ok(fresh.fs.read(opened.fh, 256 * MiB - 4096, 8192, CALLER)), tail)

    def test_reads_see_own_writes(self) -> None:
        """Reads of a dirty open file see its writes over the original bytes."""
        data = pseudo_random("own", 2 * MiB)
        self.mount.write_file("f", data)
        entry = self.mount.lookup_path("f")
        opened = self.mount.ok(self.mount.fs.open(entry.ino, os.O_RDWR, CALLER))
        self.mount.ok(self.mount.fs.write(opened.fh, 100, b"XYZ", CALLER))
        got = self.mount.ok(self.mount.fs.read(opened.fh, 98, 7, CALLER))
        self.assertEqual(got, data[98:100] + b"XYZ" + data[103:105])
        self.assertEqual(self.mount.ok(self.mount.fs.getattr(entry.ino, CALLER)).size, 2 * MiB)
        self.mount.ok(self.mount.fs.release(opened.fh, CALLER))


class StartWriteTests(SynchronousTestCase):
    """
    C{start_write}: the bytes of a spill-file write are stored by the
    caller; they count, and the file's lock is free, only once finished.
    """

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        self.mount = self.fixture.mount()
        self.data = pseudo_random("start", 2 * MiB)
        self.entry = self.mount.write_file("f", self.data)
        fs = self.mount.fs
        self.fh = self.mount.ok(fs.open(self.entry.ino, os.O_RDWR, CALLER)).fh

    def start(self, offset: int, data: bytes) -> SpillWrite:
        started = self.mount.ok(self.mount.fs.start_write(self.fh, offset, data, CALLER))
        assert isinstance(started, SpillWrite)
        return started

    def test_bytes_count_once_finished(self) -> None:
        """Until finished, reads show the old bytes and a flush waits; then both see the write."""
        fs = self.mount.fs
        started = self.start(MiB, b"new bytes")
        started.store()
        self.assertEqual(self.mount.ok(fs.read(self.fh, MiB, 9, CALLER)), self.data[MiB : MiB + 9])
        flushed = fs.flush(self.fh, CALLER)
        self.assertNoResult(flushed)
        started.finish(True)
        self.mount.ok(flushed)
        self.assertEqual(self.mount.ok(fs.read(self.fh, MiB, 9, CALLER)), b"new bytes")
        self.mount.ok(fs.release(self.fh, CALLER))
        expected = self.data[:MiB] + b"new bytes" + self.data[MiB + 9 :]
        self.assertEqual(self.fixture.mount().read_file("f"), expected)

    def test_unstored_write_changes_nothing(self) -> None:
        """A write finished as not stored leaves the content and frees the lock."""
        fs = self.mount.fs
        started = self.start(MiB, b"lost")
        started.finish(False)
        started.finish(True)  # only the first finish counts
        self.assertEqual(self.mount.ok(fs.read(self.fh, MiB, 4, CALLER)), self.data[MiB : MiB + 4])
        self.mount.ok(fs.flush(self.fh, CALLER))
        self.mount.ok(fs.release(self.fh, CALLER))
        self.assertEqual(self.fixture.mount().read_file("f"), self.data)

    def test_second_write_waits_for_the_first(self) -> None:
        """A write started while another holds the lock starts once that one finishes."""
        fs = self.mount.fs
        first = self.start(MiB, b"first")
        second = fs.start_write(self.fh, MiB + 2, b"SECOND", CALLER)
        self.assertNoResult(second)
        first.store()
        first.finish(True)
        started = self.mount.ok(second)
        assert isinstance(started, SpillWrite)
        started.store()
        started.finish(True)
        self.assertEqual(self.mount.ok(fs.read(self.fh, MiB, 8, CALLER)), b"fiSECOND")
        self.mount.ok(fs.release(self.fh, CALLER))

    def test_small_first_write_is_done_at_once(self) -> None:
        """A small file's bytes are kept in memory: written at once, nothing to finish."""
        fs = self.mount.fs
        small = self.mount.write_file("small", b"abc")
        fh = self.mount.ok(fs.open(small.ino, os.O_RDWR, CALLER)).fh
        self.assertEqual(self.mount.ok(fs.start_write(fh, 1, b"XY", CALLER)), 2)
        self.assertEqual(self.mount.ok(fs.read(fh, 0, 3, CALLER)), b"aXY")
        self.mount.ok(fs.release(fh, CALLER))

    def test_refused_write_holds_nothing(self) -> None:
        """A write refused before it starts (read-only handle) leaves the lock free."""
        fs = self.mount.fs
        reader = self.mount.ok(fs.open(self.entry.ino, os.O_RDONLY, CALLER)).fh
        self.assertEqual(self.mount.errno(fs.start_write(reader, 0, b"x", CALLER)), errno.EBADF)
        self.mount.ok(fs.flush(self.fh, CALLER))
        self.mount.ok(fs.release(reader, CALLER))
        self.mount.ok(fs.release(self.fh, CALLER))


class WriteGrantTests(SynchronousTestCase):
    """
    After a stored write to a spill file the file's lock passes to a grant
    that lets the next write store without asking the reactor; anything
    else that needs the lock takes it back.
    """

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        self.mount = self.fixture.mount()
        self.data = pseudo_random("grant", 2 * MiB)
        self.entry = self.mount.write_file("f", self.data)
        self.fs = self.mount.fs
        self.fh = self.mount.ok(self.fs.open(self.entry.ino, os.O_RDWR, CALLER)).fh
        started = self.mount.ok(self.fs.start_write(self.fh, MiB, b"first", CALLER))
        assert isinstance(started, SpillWrite)
        started.store()
        started.finish(True)

    def take(self, fh: int | None = None) -> WriteGrant:
        grant = self.fs.take_write_grant(self.fh if fh is None else fh)
        assert grant is not None
        return grant

    def read(self, offset: int, length: int) -> bytes:
        data: bytes = self.mount.ok(self.fs.read(self.fh, offset, length, CALLER))
        return data

    def test_grants_chain_and_bytes_count_when_finished(self) -> None:
        """Each used grant leaves the next one; its bytes count once finished."""
        for offset, text in ((MiB + 5, b"second"), (MiB + 11, b"third")):
            grant = self.take()
            self.assertTrue(grant.usable)
            self.assertIsNone(self.fs.take_write_grant(self.fh))  # one taker at a time
            grant.store(offset, text)
            grant.finish(offset, text, True)
        self.assertEqual(self.read(MiB, 16), b"firstsecondthird")
        self.mount.ok(self.fs.release(self.fh, CALLER))
        expected = self.data[:MiB] + b"firstsecondthird" + self.data[MiB + 16 :]
        self.assertEqual(self.fixture.mount().read_file("f"), expected)

    def test_flush_takes_an_idle_grant_back(self) -> None:
        """A flush while a grant waits unused revokes it and goes ahead."""
        self.mount.ok(self.fs.flush(self.fh, CALLER))
        self.assertIsNone(self.fs.take_write_grant(self.fh))
        self.mount.ok(self.fs.release(self.fh, CALLER))
        self.assertEqual(self.fixture.mount().read_file("f")[MiB : MiB + 5], b"first")

    def test_flush_waits_for_a_grant_in_use(self) -> None:
        """A grant taken by a writer holds the lock until that write finishes."""
        grant = self.take()
        flushed = self.fs.flush(self.fh, CALLER)
        self.assertNoResult(flushed)
        grant.store(0, b"Z")
        grant.finish(0, b"Z", True)
        self.mount.ok(flushed)  # someone waited: the lock was released, no new grant
        self.assertIsNone(self.fs.take_write_grant(self.fh))
        self.mount.ok(self.fs.release(self.fh, CALLER))
        self.assertEqual(self.fixture.mount().read_file("f")[:1], b"Z")

    def test_path_change_makes_it_unusable(self) -> None:
        """After a rename the grant is not usable: given back, the next write checks anew."""
        self.mount.ok(self.fs.rename(1, b"f", 1, b"g", CALLER))
        grant = self.take()
        self.assertFalse(grant.usable)
        grant.give_back()
        started = self.mount.ok(self.fs.start_write(self.fh, 0, b"Y", CALLER))
        assert isinstance(started, SpillWrite)
        started.store()
        started.finish(True)
        self.assertEqual(self.read(0, 1), b"Y")
        self.mount.ok(self.fs.release(self.fh, CALLER))

    def test_other_files_created_leave_it_usable(self) -> None:
        """Files and directories created elsewhere change no existing path: still usable."""
        self.mount.ok(self.fs.mkdir(1, b"dir", 0o755, CALLER))
        self.mount.write_file("dir/other", b"x")
        grant = self.take()
        self.assertTrue(grant.usable)
        grant.give_back()
        self.mount.ok(self.fs.release(self.fh, CALLER))

    def test_another_name_makes_it_unusable(self) -> None:
        """A hard link may change the name the file's path is formed by: not usable."""
        self.mount.ok(self.fs.link(self.entry.ino, 1, b"a-link", CALLER))
        grant = self.take()
        self.assertFalse(grant.usable)
        grant.give_back()
        self.mount.ok(self.fs.release(self.fh, CALLER))

    def test_read_only_mount_makes_it_unusable(self) -> None:
        """A mount turned read-only: the grant is not usable and the write is refused."""
        self.fs.set_read_only("lease lost")
        grant = self.take()
        self.assertFalse(grant.usable)
        grant.give_back()
        self.assertEqual(
            self.mount.errno(self.fs.start_write(self.fh, 0, b"Y", CALLER)), errno.EROFS
        )

    def test_read_only_handle_cannot_use_it(self) -> None:
        """A grant taken through a handle not open for writing is not usable."""
        reader = self.mount.ok(self.fs.open(self.entry.ino, os.O_RDONLY, CALLER)).fh
        grant = self.take(reader)
        self.assertFalse(grant.usable)
        grant.give_back()
        self.mount.ok(self.fs.release(reader, CALLER))
        self.mount.ok(self.fs.release(self.fh, CALLER))

    def test_unstored_write_leaves_no_grant(self) -> None:
        """A grant whose write failed releases the lock and leaves no grant."""
        grant = self.take()
        grant.finish(0, b"lost", False)
        self.assertIsNone(self.fs.take_write_grant(self.fh))
        self.assertEqual(self.read(0, 4), self.data[:4])
        self.mount.ok(self.fs.release(self.fh, CALLER))


class FirstWriteGrantTests(SynchronousTestCase):
    """
    A new file's first write, and each later write a memory spill holds,
    can be stored through a grant without asking the reactor.
    """

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        self.mount = self.fixture.mount()
        self.fs = self.mount.fs

    def create(self, name: bytes = b"new") -> int:
        opened, _entry = self.mount.ok(
            self.fs.create(1, name, 0o644, os.O_WRONLY | os.O_CREAT, CALLER)
        )
        fh: int = opened.fh
        return fh

    def test_new_file_writes_through_grants_into_memory(self) -> None:
        """
        The create leaves a grant; each write through one leaves the next;
        the bytes are the file's once finished, and committed by the close.
        """
        fh = self.create()
        for offset, text in ((0, b"hello "), (6, b"world")):
            grant = self.fs.take_write_grant(fh)
            assert grant is not None
            self.assertTrue(grant.usable and grant.accepts(offset, len(text)))
            grant.store(offset, text)
            grant.finish(offset, text, True)
        self.assertEqual(self.mount.ok(self.fs.read(fh, 0, 100, CALLER)), b"hello world")
        self.mount.ok(self.fs.flush(fh, CALLER))
        self.mount.ok(self.fs.release(fh, CALLER))
        self.assertEqual(self.fixture.mount().read_file("new"), b"hello world")
        self.assertEqual(list(self.mount.spill_dir.glob("*")), [])

    def test_write_beyond_memory_goes_to_the_reactor(self) -> None:
        """
        A write a memory spill cannot hold is not accepted: the grant goes
        back and the reactor moves the bytes to a spill file.
        """
        fh = self.create()
        grant = self.fs.take_write_grant(fh)
        assert grant is not None
        big = pseudo_random("big", 2 * MiB)
        self.assertFalse(grant.accepts(0, len(big)))
        grant.give_back()
        self.assertEqual(self.mount.ok(self.fs.write(fh, 0, big, CALLER)), len(big))
        self.mount.ok(self.fs.release(fh, CALLER))
        self.assertEqual(self.fixture.mount().read_file("new"), big)

    def test_created_without_writing(self) -> None:
        """A file created and closed unwritten is committed empty; its grant is given back."""
        fh = self.create()
        self.mount.ok(self.fs.flush(fh, CALLER))
        self.assertIsNone(self.fs.take_write_grant(fh))
        self.mount.ok(self.fs.release(fh, CALLER))
        self.assertEqual(self.fixture.mount().read_file("new"), b"")

    def test_no_grant_when_memory_is_spent(self) -> None:
        """With no memory budget left, the first write starts on the reactor."""
        fixture = FSFixture(self)
        mount = fixture.mount(settings=FSSettings(memory_spill_bytes=0))
        opened, _entry = mount.ok(mount.fs.create(1, b"n", 0o644, os.O_WRONLY | os.O_CREAT, CALLER))
        self.assertIsNone(mount.fs.take_write_grant(opened.fh))
        self.assertEqual(mount.ok(mount.fs.write(opened.fh, 0, b"abc", CALLER)), 3)
        mount.ok(mount.fs.release(opened.fh, CALLER))
        self.assertEqual(fixture.mount().read_file("n"), b"abc")


class TruncateTests(SynchronousTestCase):
    """C{setattr} of the size truncates and extends, open or not."""

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        self.mount = self.fixture.mount()
        self.data = pseudo_random("trunc", 3 * MiB)
        self.entry = self.mount.write_file("f", self.data)

    def truncate(self, size: int) -> None:
        self.mount.ok(self.mount.fs.setattr(self.entry.ino, AttributeChanges(size=size), CALLER))

    def test_shrink_closed_file(self) -> None:
        """Truncating a closed file commits at once; the setattr line has the size bit."""
        self.truncate(1000)
        self.assertEqual(self.fixture.mount().read_file("f"), self.data[:1000])
        self.assertEqual(self.mount.events("setattr")[-1].get("setattr_fields"), 0x08)

    def test_extend_closed_file(self) -> None:
        """Extending a closed file adds zeros."""
        self.truncate(4 * MiB)
        self.assertEqual(self.fixture.mount().read_file("f"), self.data + bytes(MiB))

    def test_truncate_to_zero(self) -> None:
        """Truncating to zero empties the file with one setattr request."""
        puts = self.mount.count("manifest_put")
        self.truncate(0)
        self.assertEqual(self.mount.count("manifest_put"), puts)
        self.assertEqual(self.fixture.mount().read_file("f"), b"")

    def test_shrink_then_extend_open_file(self) -> None:
        """Bytes cut off by a truncation come back as zeros when the file grows again."""
        opened = self.mount.ok(self.mount.fs.open(self.entry.ino, os.O_RDWR, CALLER))
        self.mount.ok(self.mount.fs.write(opened.fh, 10, b"abc", CALLER))
        self.truncate(11)
        self.truncate(20)
        got = self.mount.ok(self.mount.fs.read(opened.fh, 0, 100, CALLER))
        self.assertEqual(got, self.data[:10] + b"a" + bytes(9))
        self.mount.ok(self.mount.fs.release(opened.fh, CALLER))
        self.assertEqual(self.fixture.mount().read_file("f"), self.data[:10] + b"a" + bytes(9))

    def test_open_with_o_trunc(self) -> None:
        """Opening with O_TRUNC empties the file."""
        opened = self.mount.ok(self.mount.fs.open(self.entry.ino, os.O_WRONLY | os.O_TRUNC, CALLER))
        self.mount.ok(self.mount.fs.write(opened.fh, 0, b"new", CALLER))
        self.mount.ok(self.mount.fs.release(opened.fh, CALLER))
        self.assertEqual(self.fixture.mount().read_file("f"), b"new")

    def test_beyond_the_largest_committable_file(self) -> None:
        """
        A truncate or write past MAX_FILE_BYTES (what one commit can name)
        fails EFBIG at once, on the reactor and on the FUSE thread's grant
        alike; the file keeps what it had, and up to the limit is allowed.
        """
        self.assertEqual(self.mount.errno(self._set_size(MAX_FILE_BYTES + 1)), errno.EFBIG)
        fs = self.mount.fs
        opened = self.mount.ok(fs.open(self.entry.ino, os.O_WRONLY, CALLER))
        self.assertEqual(
            self.mount.errno(fs.write(opened.fh, MAX_FILE_BYTES, b"x", CALLER)), errno.EFBIG
        )
        # A stored write (of the same byte) leaves a grant for the next one.
        started = self.mount.ok(fs.start_write(opened.fh, MiB, self.data[MiB : MiB + 1], CALLER))
        assert isinstance(started, SpillWrite)
        started.store()
        started.finish(True)
        grant = fs.take_write_grant(opened.fh)
        assert grant is not None
        self.assertFalse(grant.accepts(MAX_FILE_BYTES - 1, 2))
        self.assertTrue(grant.accepts(MAX_FILE_BYTES - 2, 2))
        grant.give_back()
        self.mount.ok(fs.release(opened.fh, CALLER))
        self.assertEqual(self.fixture.mount().read_file("f"), self.data)
        empty = self.mount.write_file("empty", b"")
        self.mount.ok(self._set_size(MAX_FILE_BYTES, empty.ino))  # all holes: 12000 zero chunks
        self.assertEqual(self.fixture.mount().lookup_path("empty").attributes.size, MAX_FILE_BYTES)

    def _set_size(self, size: int, ino: int | None = None) -> Deferred[Attributes]:
        changes = AttributeChanges(size=size)
        return self.mount.fs.setattr(self.entry.ino if ino is None else ino, changes, CALLER)

    def test_size_of_directory(self) -> None:
        """The size of a directory cannot be set (EISDIR)."""
        root = self.mount.lookup_path("")
        changed = self.mount.fs.setattr(root.ino, AttributeChanges(size=0), CALLER)
        self.assertEqual(self.mount.errno(changed), errno.EISDIR)


class OpenFileTests(SynchronousTestCase):
    """Handles, repeated flushes, the kernel cache hint and read audit lines."""

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        self.mount = self.fixture.mount()

    def test_flush_twice_on_one_handle(self) -> None:
        """Writes after a flush are committed by the next one, on top of the first."""
        parent, name = self.mount.parent_of("log")
        opened, _ = self.mount.ok(self.mount.fs.create(parent, name, 0o600, os.O_RDWR, CALLER))
        self.mount.ok(self.mount.fs.write(opened.fh, 0, b"first ", CALLER))
        self.mount.ok(self.mount.fs.flush(opened.fh, CALLER))
        self.mount.ok(self.mount.fs.write(opened.fh, 6, b"second", CALLER))
        self.assertEqual(
            self.mount.ok(self.mount.fs.read(opened.fh, 0, 64, CALLER)), b"first second"
        )
        self.mount.ok(self.mount.fs.fsync(opened.fh, False, CALLER))
        self.mount.ok(self.mount.fs.flush(opened.fh, CALLER))
        self.mount.ok(self.mount.fs.release(opened.fh, CALLER))
        versions = [line.get("version_new") for line in self.mount.events("flush")]
        self.assertEqual(versions, [2, 3])
        self.assertEqual(self.fixture.mount().read_file("log"), b"first second")
        self.assertEqual(self.mount.fs.open_handles, 0)

    def test_keep_cache_when_version_unchanged(self) -> None:
        """The kernel may keep its cache when a file is reopened at the same version."""
        self.mount.write_file("f", b"abc")
        entry = self.mount.lookup_path("f")
        first = self.mount.ok(self.mount.fs.open(entry.ino, os.O_RDONLY, CALLER))
        second = self.mount.ok(self.mount.fs.open(entry.ino, os.O_RDONLY, CALLER))
        self.assertTrue(first.keep_cache)
        self.assertTrue(second.keep_cache)
        fresh = self.fixture.mount()
        ino = fresh.lookup_path("f").ino
        self.assertFalse(fresh.ok(fresh.fs.open(ino, os.O_RDONLY, CALLER)).keep_cache)
        self.assertTrue(fresh.ok(fresh.fs.open(ino, os.O_RDONLY, CALLER)).keep_cache)

    def test_open_and_read_lines(self) -> None:
        """Read-only opens log the size, reads size and offset; writing needs a writable fh."""
        self.mount.write_file("f", b"0123456789")
        entry = self.mount.lookup_path("f")
        opened = self.mount.ok(self.mount.fs.open(entry.ino, os.O_RDONLY, CALLER))
        self.assertEqual(self.mount.ok(self.mount.fs.read(opened.fh, 4, 100, CALLER)), b"456789")
        written = self.mount.fs.write(opened.fh, 0, b"x", CALLER)
        self.assertEqual(self.mount.errno(written), errno.EBADF)
        self.assertEqual(self.mount.errno(self.mount.fs.read(999, 0, 1, CALLER)), errno.EBADF)
        self.mount.ok(self.mount.fs.release(opened.fh, CALLER))
        opens = self.mount.events("open")
        self.assertEqual([(e.path, e.size) for e in opens], [("/f", 10)])
        read = self.mount.events("read")[0]
        self.assertEqual((read.path, read.size, read.offset, read.command), ("/f", 6, 4, "editor"))
        root = self.mount.lookup_path("")
        self.assertEqual(
            self.mount.errno(self.mount.fs.open(root.ino, os.O_RDONLY, CALLER)), errno.EISDIR
        )

    def test_unlinked_open_file(self) -> None:
        """An open file unlinked before its flush commits nothing and stays readable."""
        parent, name = self.mount.parent_of("tmp")
        opened, _ = self.mount.ok(self.mount.fs.create(parent, name, 0o600, os.O_RDWR, CALLER))
        self.mount.ok(self.mount.fs.write(opened.fh, 0, b"scratch", CALLER))
        self.mount.ok(self.mount.fs.unlink(parent, name, CALLER))
        self.assertEqual(self.mount.ok(self.mount.fs.read(opened.fh, 0, 7, CALLER)), b"scratch")
        puts = self.mount.count("manifest_put")
        self.mount.ok(self.mount.fs.release(opened.fh, CALLER))
        self.assertEqual(self.mount.count("manifest_put"), puts)
        self.assertEqual(self.fixture.mount().names(""), [])
        self.assertEqual(list(self.mount.spill_dir.glob("*.spill")), [])
