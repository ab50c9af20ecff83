"""
Tests for L{svc.mount.writeback.write_behind}: a new file's settled prefix is cut and
uploaded while it is written, exactly as the write-back would cut it; any
change to a cut chunk (or the byte after it) drops it; the write-back
reuses what is left and the committed content is unchanged.
"""

from __future__ import annotations

import os
from pathlib import Path

from twisted.internet.defer import Deferred, fail
from twisted.trial.unittest import SynchronousTestCase

from svc.chunking import MAX_CHUNK_SIZE, ChunkRef, chunk_bytes
from svc.mount.chunks.chunk_memo import ChunkMemo
from svc.mount.core.attributes import OpenResult
from svc.mount.core.file_state import FileState
from svc.mount.core.fs_context import FSSettings
from svc.mount.core.spill import SpillDirectory
from svc.mount.remote.data_plane import Remote
from svc.mount.test.test_fs_support import CALLER, FSFixture, Mount, pseudo_random
from svc.mount.test.test_writeback import ChunkServer, DictSource
from svc.mount.writeback.uploads import ChunkUploader, Reader, rechunk
from svc.mount.writeback.write_behind import FIRST_LOOK, Slots, WriteBehind
from svc.testing.worker import ImmediateWorker

MiB = 1 << 20
LEAD = 1 * MiB


def refs(chunks: tuple[ChunkRef, ...] | list[ChunkRef]) -> list[tuple[int, int, str]]:
    return [(ref.offset, ref.length, ref.hash) for ref in chunks]


class WriteBehindTests(SynchronousTestCase):
    """One file's write-behind over an in-memory chunk server."""

    def setUp(self) -> None:
        self.server = ChunkServer()
        self.slots = Slots(1)
        self.state = self.new_state()

    def new_state(self) -> FileState:
        state = FileState(
            1,
            0,
            (),
            worker=ImmediateWorker(),
            spill_dir=SpillDirectory(Path(self.mktemp())),
            memo=ChunkMemo(DictSource({}), budget=0),
            now_ns=lambda: 1,
        )
        self.addCleanup(state.close)
        return state

    def attach(self, state: FileState, read: Reader | None = None, origin: int = 0) -> WriteBehind:
        uploader = ChunkUploader(Remote(self.server), None, batch_bytes=8 * MiB)
        self.cut_ends: list[int] = []
        behind = WriteBehind(
            read or state.read,
            lambda: state.size,
            ImmediateWorker(),
            uploader,
            self.slots,
            lead=LEAD,
            origin=origin,
            cut=self.cut_ends.append,
        )
        state.write_behind = behind
        return behind

    def write(self, state: FileState, offset: int, data: bytes) -> None:
        self.successResultOf(Deferred.fromCoroutine(state.write(offset, data)))
        if state.write_behind is not None:
            state.write_behind.poke()

    def write_sequentially(self, state: FileState, data: bytes, piece: int = MiB) -> None:
        for offset in range(0, len(data), piece):
            self.write(state, offset, data[offset : offset + piece])

    def write_back(
        self, state: FileState, behind: WriteBehind, read: Reader | None = None
    ) -> tuple[list[ChunkRef], int]:
        sent = self.successResultOf(Deferred.fromCoroutine(behind.stop()))
        uploader = ChunkUploader(Remote(self.server), None)
        chunks = self.successResultOf(
            Deferred.fromCoroutine(
                rechunk(state.layout, read or state.read, ImmediateWorker(), uploader, behind.at)
            )
        )
        self.successResultOf(Deferred.fromCoroutine(uploader.finish()))
        self.successResultOf(Deferred.fromCoroutine(uploader.settle()))
        return list(chunks), sent

    def assert_recut(
        self, behind: WriteBehind, before: tuple[ChunkRef, ...], content: bytes
    ) -> None:
        """Chunk 1 of C{before} was dropped; what is cut now is a whole cut of C{content}."""
        now = refs(behind.chunks)
        self.assertEqual(now[:1], refs(before[:1]))
        self.assertNotIn(refs(before[1:2])[0], now)
        self.assertEqual(now, refs(chunk_bytes(content))[: len(now)])

    def test_prefix_is_cut_and_uploaded_while_writing(self) -> None:
        """Sequential writes cut and upload the chunks of a whole cut, ahead of the write-back."""
        data = pseudo_random("sequential", 56 * MiB)
        behind = self.attach(self.state)
        self.write_sequentially(self.state, data)
        expected = refs(chunk_bytes(data))
        cut = refs(behind.chunks)
        self.assertGreater(len(cut), 2)
        self.assertEqual(cut, expected[: len(cut)])
        self.assertLessEqual(cut[-1][0] + MAX_CHUNK_SIZE + LEAD, len(data))
        sent = self.successResultOf(Deferred.fromCoroutine(behind.stop()))
        self.assertEqual(sent, len(cut))
        self.assertEqual(set(self.server.stored), {name for _, _, name in cut})
        # Each cut said where its chunk ended (the spill's pages before it may go).
        self.assertEqual(self.cut_ends, [offset + length for offset, length, _ in cut])

    def test_long_chunks_cut_from_the_whole_window(self) -> None:
        """
        A cut first reads FIRST_LOOK bytes; a chunk with no boundary in them
        (here a run of zeros: a maximum-size chunk, then one over FIRST_LOOK)
        is cut from the whole window, as a whole cut would. Chunks ending
        within the first look cost one read of FIRST_LOOK bytes.
        """
        data = (
            bytes(MAX_CHUNK_SIZE + 3 * MiB)
            + pseudo_random("after zeros", 9 * MiB)
            + bytes(FIRST_LOOK + MiB)
            + pseudo_random("tail", 60 * MiB)
        )
        lengths: list[int] = []

        def read(offset: int, length: int) -> Deferred[bytes]:
            lengths.append(length)
            return self.state.read(offset, length)

        behind = self.attach(self.state, read)
        self.write_sequentially(self.state, data)
        cut = refs(behind.chunks)
        expected = refs(chunk_bytes(data))
        self.assertGreater(len(cut), 6)
        self.assertEqual(cut, expected[: len(cut)])
        self.assertIn(MAX_CHUNK_SIZE, [length for _, length, _ in cut])
        self.assertTrue(any(FIRST_LOOK < length < MAX_CHUNK_SIZE for _, length, _ in cut))
        whole_reads = lengths.count(MAX_CHUNK_SIZE)
        self.assertGreaterEqual(whole_reads, 2)
        self.assertLess(whole_reads, len(cut))
        self.assertEqual(set(lengths), {FIRST_LOOK, MAX_CHUNK_SIZE})

    def test_cuts_chain_from_the_origin_and_read_nothing_before_it(self) -> None:
        """
        With an origin (an append's first cut), chunks chain from there,
        each as a cut of the bytes from the origin on; nothing before the
        origin is read. A write wholly before the origin keeps them; one
        across it stops the task.
        """
        origin = 5 * MiB + 123
        data = pseudo_random("origin", 48 * MiB)
        reads: list[int] = []

        def read(offset: int, length: int) -> Deferred[bytes]:
            reads.append(offset)
            return self.state.read(offset, length)

        behind = self.attach(self.state, read, origin=origin)
        for offset in range(0, len(data), MiB):
            self.write(self.state, origin + offset, data[offset : offset + MiB])
        cut = behind.chunks
        self.assertGreater(len(cut), 2)
        expected = [
            (offset + origin, length, name) for offset, length, name in refs(chunk_bytes(data))
        ]
        self.assertEqual(refs(cut), expected[: len(cut)])
        self.assertGreaterEqual(min(reads), origin)
        self.write(self.state, 0, b"header")
        self.assertEqual(behind.chunks, cut)
        self.write(self.state, origin - 1, b"xx")
        self.assertEqual(behind.chunks, ())
        self.write(self.state, origin + len(data), pseudo_random("more", 32 * MiB))
        self.assertEqual(behind.chunks, ())

    def test_write_back_reuses_the_cut_and_reads_only_the_tail(self) -> None:
        """The write-back's chunk list equals a whole cut; it reads only past the cut prefix."""
        data = pseudo_random("tail", 56 * MiB)
        behind = self.attach(self.state)
        self.write_sequentially(self.state, data)
        frontier = behind.frontier
        tail_reads: list[tuple[int, int]] = []

        def read(offset: int, length: int) -> Deferred[bytes]:
            tail_reads.append((offset, length))
            return self.state.read(offset, length)

        chunks, _ = self.write_back(self.state, behind, read)
        self.assertEqual(refs(chunks), refs(chunk_bytes(data)))
        self.assertTrue(tail_reads)
        self.assertGreaterEqual(min(offset for offset, _ in tail_reads), frontier)

    def test_overwrite_drops_the_touched_chunk_and_later_ones(self) -> None:
        """A write inside a cut chunk drops it and every later chunk; the content is still right."""
        content = bytearray(pseudo_random("overwrite", 56 * MiB))
        behind = self.attach(self.state)
        self.write_sequentially(self.state, bytes(content))
        before = behind.chunks
        self.assertGreaterEqual(len(before), 3)
        inside = before[1].offset + 10
        self.write(self.state, inside, b"changed")
        content[inside : inside + 7] = b"changed"
        self.assert_recut(behind, before, bytes(content))
        chunks, _ = self.write_back(self.state, behind)
        self.assertEqual(refs(chunks), refs(chunk_bytes(bytes(content))))

    def test_the_byte_after_a_chunk_drops_it(self) -> None:
        """Changing the byte just after a cut chunk drops that chunk (the cutter reads it)."""
        content = bytearray(pseudo_random("after", 56 * MiB))
        behind = self.attach(self.state)
        self.write_sequentially(self.state, bytes(content))
        before = behind.chunks
        boundary = before[1].end
        flipped = bytes([content[boundary] ^ 0xFF])
        self.write(self.state, boundary, flipped)
        content[boundary : boundary + 1] = flipped
        self.assert_recut(behind, before, bytes(content))
        chunks, _ = self.write_back(self.state, behind)
        self.assertEqual(refs(chunks), refs(chunk_bytes(bytes(content))))

    def test_truncation_drops_chunks_reaching_the_new_end(self) -> None:
        """Truncating into a cut chunk drops it and what follows; the cut fits the new content."""
        content = pseudo_random("truncate", 56 * MiB)
        behind = self.attach(self.state)
        self.write_sequentially(self.state, content)
        before = behind.chunks
        size = before[1].end  # the byte after chunk 1 is gone
        self.successResultOf(Deferred.fromCoroutine(self.state.truncate(size)))
        self.assertEqual(refs(behind.chunks), refs(before[:1]))
        chunks, _ = self.write_back(self.state, behind)
        self.assertEqual(refs(chunks), refs(chunk_bytes(content[:size])))

    def test_write_into_the_window_being_cut_discards_the_cut(self) -> None:
        """A write landing in the window while it is read drops that cut."""
        content = bytearray(pseudo_random("window", 40 * MiB))
        pending: list[tuple[Deferred[bytes], int, int]] = []

        def slow(offset: int, length: int) -> Deferred[bytes]:
            waiter: Deferred[bytes] = Deferred()
            pending.append((waiter, offset, length))
            return waiter

        behind = self.attach(self.state, read=slow)
        self.write_sequentially(self.state, bytes(content))
        [(waiter, offset, length)] = pending
        self.assertEqual(offset, 0)
        stale = self.successResultOf(self.state.read(offset, length))
        self.write(self.state, 5, b"new")
        content[5:8] = b"new"
        pending.clear()
        waiter.callback(stale)
        self.assertEqual(behind.chunks, ())
        # It cuts again from the same place, from the current bytes.
        [(again, offset, length)] = pending
        again.callback(self.successResultOf(self.state.read(offset, length)))
        pending.clear()
        self.assertEqual(refs(behind.chunks)[:1], refs(chunk_bytes(bytes(content)))[:1])

    def test_failed_upload_leaves_nothing_to_reuse(self) -> None:
        """When an upload fails, the write-back reuses none of the cut chunks and cuts all."""

        class FailingServer(ChunkServer):
            def call(self, op, payload, raw=b"", *, timeout=None):  # type: ignore[no-untyped-def]
                if op == "chunk_put":
                    return fail(OSError("connection lost"))
                return super().call(op, payload, raw, timeout=timeout)

        self.server = FailingServer()
        content = pseudo_random("failing", 56 * MiB)
        behind = self.attach(self.state)
        self.write_sequentially(self.state, content)
        self.successResultOf(Deferred.fromCoroutine(behind.stop()))
        self.assertEqual(behind.chunks, ())
        self.assertIsNone(behind.at(0))

    def test_one_slot_runs_one_file(self) -> None:
        """With one slot, a second file waits until the first file's task ends."""
        pending: list[Deferred[bytes]] = []

        def slow(offset: int, length: int) -> Deferred[bytes]:
            waiter: Deferred[bytes] = Deferred()
            pending.append(waiter)
            return waiter

        first = self.attach(self.state, read=slow)
        other = self.new_state()
        second = self.attach(other)
        self.write_sequentially(self.state, pseudo_random("one", 40 * MiB))
        self.write_sequentially(other, pseudo_random("two", 40 * MiB))
        self.assertEqual((len(pending), second.chunks), (1, ()))
        first.cancel()
        pending[0].callback(bytes(MAX_CHUNK_SIZE))
        self.assertEqual(self.slots.free, 1)
        self.write(other, 40 * MiB, b"more")
        self.assertNotEqual(second.chunks, ())


class MountWriteBehindTests(SynchronousTestCase):
    """Write-behind through L{svc.mount.fs.MountFS}."""

    def setUp(self) -> None:
        self.fixture = FSFixture(self)

    def write_unclosed(self, mount: Mount, path: str, data: bytes) -> int:
        parent, name = mount.parent_of(path)
        opened, _ = mount.ok(mount.fs.create(parent, name, 0o644, os.O_WRONLY, CALLER))
        for offset in range(0, len(data), MiB):
            mount.ok(mount.fs.write(opened.fh, offset, data[offset : offset + MiB], CALLER))
        fh: int = opened.fh
        return fh

    def open_existing(self, mount: Mount, path: str, data: bytes) -> tuple[OpenResult, int]:
        """Commit C{data} at C{path}, open it for writing; the handle and the puts so far."""
        mount.write_file(path, data, piece=8 * MiB)
        puts = mount.count("chunk_put")
        entry = mount.lookup_path(path)
        return mount.ok(mount.fs.open(entry.ino, os.O_WRONLY, CALLER)), puts

    def test_big_new_file_uploads_before_close(self) -> None:
        """
        A 64 MiB new file has chunks stored before its close, and the spill
        file's pages before each cut are released; the commit is a whole cut.
        """
        released: list[int] = []
        release_pages = FileState.release_pages

        def recording(state: FileState, end: int) -> None:
            released.append(end)
            release_pages(state, end)

        self.patch(FileState, "release_pages", recording)
        mount = self.fixture.mount()
        data = pseudo_random("mounted", 64 * MiB)
        fh = self.write_unclosed(mount, "big", data)
        before = mount.count("chunk_put")
        self.assertGreater(before, 0)
        self.assertEqual(
            released, [r.offset + r.length for r in chunk_bytes(data)][: len(released)]
        )
        self.assertGreater(len(released), 0)
        mount.ok(mount.fs.release(fh, CALLER))
        manifest = mount.ok(mount.remote.manifest_get("/agent-1/big"))
        expected = chunk_bytes(data)
        self.assertEqual(
            [(c.hash, c.size) for c in manifest.chunks], [(r.hash, r.length) for r in expected]
        )
        [flush] = mount.events("flush")
        self.assertEqual(flush.get("chunks_new"), len({r.hash for r in expected}))
        self.assertEqual(mount.count("chunk_put"), len({r.hash for r in expected}))
        fresh = self.fixture.mount()
        self.assertEqual(fresh.read_file("big"), data)

    def test_off_when_no_slots(self) -> None:
        """C{write_behind_files=0}: nothing is sent before the write-back."""
        mount = self.fixture.mount(settings=FSSettings(write_behind_files=0))
        fh = self.write_unclosed(mount, "big", pseudo_random("off", 48 * MiB))
        self.assertEqual(mount.count("chunk_put"), 0)
        mount.ok(mount.fs.release(fh, CALLER))
        self.assertGreater(mount.count("chunk_put"), 0)

    def test_append_to_an_existing_file_uploads_before_close(self) -> None:
        """
        Appending to an existing file cuts from its last chunk while it is
        written; the commit is a whole cut and the unchanged prefix is
        reused, not sent again.
        """
        mount = self.fixture.mount()
        old = pseudo_random("old", 48 * MiB)
        opened, puts = self.open_existing(mount, "old", old)
        more = pseudo_random("appended", 64 * MiB)
        for offset in range(0, len(more), MiB):
            piece = more[offset : offset + MiB]
            mount.ok(mount.fs.write(opened.fh, len(old) + offset, piece, CALLER))
        self.assertGreater(mount.count("chunk_put"), puts)
        mount.ok(mount.fs.release(opened.fh, CALLER))
        expected = chunk_bytes(old + more)
        manifest = mount.ok(mount.remote.manifest_get("/agent-1/old"))
        self.assertEqual(
            [(c.hash, c.size) for c in manifest.chunks], [(r.hash, r.length) for r in expected]
        )
        [_, flush] = mount.events("flush")
        unchanged = {r.hash for r in chunk_bytes(old)[:-1]}
        reused = flush.get("chunks_reused")
        assert isinstance(reused, int)
        self.assertGreaterEqual(reused, len(unchanged))
        self.assertEqual(self.fixture.mount().read_file("old"), old + more)

    def test_write_behind_resumes_after_a_commit(self) -> None:
        """A file fsync'd once keeps uploading ahead as it grows, until its close."""
        mount = self.fixture.mount()
        first = pseudo_random("first", 40 * MiB)
        fh = self.write_unclosed(mount, "log", first)
        mount.ok(mount.fs.fsync(fh, False, CALLER))
        puts = mount.count("chunk_put")
        more = pseudo_random("second", 64 * MiB)
        for offset in range(0, len(more), MiB):
            piece = more[offset : offset + MiB]
            mount.ok(mount.fs.write(fh, len(first) + offset, piece, CALLER))
        self.assertGreater(mount.count("chunk_put"), puts)
        mount.ok(mount.fs.release(fh, CALLER))
        manifest = mount.ok(mount.remote.manifest_get("/agent-1/log"))
        self.assertEqual(
            [(c.hash, c.size) for c in manifest.chunks],
            [(r.hash, r.length) for r in chunk_bytes(first + more)],
        )
        self.assertEqual(self.fixture.mount().read_file("log"), first + more)

    def test_edit_inside_an_existing_file_does_not_start_it(self) -> None:
        """
        An edit inside an existing file, even one that also grows it, sends
        nothing before the write-back: its unchanged bytes are never read here.
        """
        mount = self.fixture.mount()
        old = pseudo_random("old", 48 * MiB)
        opened, puts = self.open_existing(mount, "old", old)
        mount.ok(mount.fs.write(opened.fh, 8 * MiB, pseudo_random("edit", MiB), CALLER))
        for offset in range(48 * MiB, 112 * MiB, MiB):
            mount.ok(mount.fs.write(opened.fh, offset, pseudo_random(f"x{offset}", MiB), CALLER))
        self.assertEqual(mount.count("chunk_put"), puts)
        mount.ok(mount.fs.release(opened.fh, CALLER))
        self.assertGreater(mount.count("chunk_put"), puts)
