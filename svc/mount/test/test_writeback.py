"""
Tests for write-back: L{svc.mount.writeback.uploads.rechunk} (the incremental cut
equals a whole cut), L{svc.mount.writeback.uploads.ChunkUploader} (batched
C{chunk_has}, only absent chunks sent) and L{svc.mount.writeback.commit} (missing
chunks re-sent, conflict copy names).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path

from blake3 import blake3
from twisted.internet.defer import Deferred, fail, succeed
from twisted.trial.unittest import SynchronousTestCase

from svc.chunking import chunk_bytes
from svc.dataplane_client.client import Reply
from svc.dataplane_client.errors import RemoteError
from svc.mount.chunks.chunk_memo import ChunkMemo
from svc.mount.core.errors import RemoteFailure
from svc.mount.core.extents import chunk_layout
from svc.mount.core.file_state import FileState
from svc.mount.core.spill import SpillDirectory
from svc.mount.remote.data_plane import Remote
from svc.mount.test.test_fs_support import AGENT, FSFixture, pseudo_random
from svc.mount.writeback.commit import CommitRequest, Committed, Conflict, commit, conflict_name
from svc.mount.writeback.uploads import ChunkUploader, rechunk, zero_chunk
from svc.testing.local_connection import LocalConnection
from svc.testing.worker import ImmediateWorker
from svc.wire.control import ErrorInfo
from svc.wire.errno import WireErrno

MiB = 1 << 20


class ChunkServer:
    """An in-memory caller answering C{chunk_has} and C{chunk_put} only."""

    def __init__(self, stored: Mapping[str, bytes] = {}) -> None:
        self.stored = dict(stored)
        self.calls: list[tuple[str, int]] = []

    def call(
        self,
        op: str,
        payload: Mapping[str, object],
        raw: bytes | memoryview = b"",
        *,
        timeout: float | None = None,
    ) -> Deferred[Reply]:
        if op == "chunk_has":
            hashes = list(payload["hashes"])  # type: ignore[call-overload]
            self.calls.append((op, len(hashes)))
            return succeed(Reply({"present": [h in self.stored for h in hashes]}))
        assert op == "chunk_put"
        name = str(payload["hash"])
        assert blake3(raw).hexdigest() == name
        self.calls.append((op, len(raw)))
        self.stored[name] = bytes(raw)
        return succeed(Reply({"hash": name, "size": len(raw)}))

    def count(self, op: str) -> int:
        return sum(1 for called, _ in self.calls if called == op)


class DictSource:
    """An L{svc.mount.remote.data_plane.IChunkSource} over a dict; counts fetches."""

    def __init__(self, chunks: dict[str, bytes]) -> None:
        self.chunks = chunks
        self.fetched = 0

    def fetch(self, chunk_hash: str, /) -> Deferred[bytes]:
        self.fetched += 1
        return succeed(self.chunks[chunk_hash])

    def put(self, chunk_hash: str, data: bytes | memoryview, /) -> None:
        self.chunks[chunk_hash] = bytes(data)

    def holds(self, chunk_hash: str, /) -> bool:
        return chunk_hash in self.chunks


class RechunkTests(SynchronousTestCase):
    """The incremental cut equals cutting the whole new content."""

    def state_of(self, content: bytes) -> tuple[FileState, DictSource]:
        refs = chunk_bytes(content)
        source = DictSource({ref.hash: content[ref.offset : ref.end] for ref in refs})
        state = FileState(
            1,
            1,
            chunk_layout([(ref.hash, ref.length) for ref in refs]),
            worker=ImmediateWorker(),
            spill_dir=SpillDirectory(Path(self.mktemp())),
            memo=ChunkMemo(source, budget=0),
            now_ns=lambda: 1,
        )
        self.addCleanup(state.close)
        return state, source

    def cut(self, state: FileState, server: ChunkServer) -> list[tuple[str, int]]:
        uploader = ChunkUploader(Remote(server), None)
        chunks = self.successResultOf(
            Deferred.fromCoroutine(rechunk(state.layout, state.read, ImmediateWorker(), uploader))
        )
        return [(ref.hash, ref.length) for ref in chunks]

    def test_random_edits(self) -> None:
        """Random writes, truncations and extensions cut like the whole content."""
        rng = random.Random(1)
        for round_number in range(4):
            model = bytearray(pseudo_random(f"base{round_number}", 24 * MiB))
            state, _ = self.state_of(bytes(model))
            for _ in range(3):
                choice = rng.random()
                if choice < 0.6:
                    offset = rng.randrange(len(model) + MiB)
                    data = pseudo_random(f"w{rng.random()}", rng.randrange(1, 2 * MiB))
                    self.successResultOf(Deferred.fromCoroutine(state.write(offset, data)))
                    if offset > len(model):
                        model.extend(bytes(offset - len(model)))
                    model[offset : offset + len(data)] = data
                else:
                    size = rng.randrange(30 * MiB)
                    self.successResultOf(Deferred.fromCoroutine(state.truncate(size)))
                    del model[size:]
                    model.extend(bytes(size - len(model)))
            server = ChunkServer()
            cut = self.cut(state, server)
            self.assertEqual(cut, [(ref.hash, ref.length) for ref in chunk_bytes(bytes(model))])
            base = {ref.hash for ref in state.layout.base}
            names = {name for name, _ in cut}
            self.assertLessEqual(names - base, set(server.stored))
            self.assertLessEqual(set(server.stored), names)

    def test_new_content_uploaded_exactly(self) -> None:
        """
        A new file cut chunk after chunk (the window advancing and dropping
        its consumed front) gives the whole cut, and every chunk uploaded
        holds exactly its bytes.
        """
        content = pseudo_random("new content", 70 * MiB + 12345)
        state, _ = self.state_of(b"")
        for offset in range(0, len(content), 4 * MiB):
            piece = content[offset : offset + 4 * MiB]
            self.successResultOf(Deferred.fromCoroutine(state.write(offset, piece)))
        server = ChunkServer()
        cut = self.cut(state, server)
        expected = chunk_bytes(content)
        self.assertEqual(cut, [(ref.hash, ref.length) for ref in expected])
        self.assertGreater(len(expected), 10)
        for ref in expected:
            self.assertEqual(server.stored[ref.hash], content[ref.offset : ref.end])

    def test_edit_of_the_byte_after_a_chunk(self) -> None:
        """Changing the byte just after a chunk re-cuts that chunk (the cutter reads it)."""
        content = bytearray(pseudo_random("boundary", 24 * MiB))
        state, _ = self.state_of(bytes(content))
        boundary = state.layout.base[1].offset
        flipped = bytes([content[boundary] ^ 0xFF])
        self.successResultOf(Deferred.fromCoroutine(state.write(boundary, flipped)))
        content[boundary : boundary + 1] = flipped
        cut = self.cut(state, ChunkServer())
        self.assertEqual(cut, [(ref.hash, ref.length) for ref in chunk_bytes(bytes(content))])

    def test_clean_content_reads_nothing(self) -> None:
        """An unchanged file is cut without reading or sending anything."""
        content = pseudo_random("clean", 20 * MiB)
        state, source = self.state_of(content)
        server = ChunkServer()
        self.assertEqual(len(self.cut(state, server)), len(chunk_bytes(content)))
        self.assertEqual((source.fetched, server.calls), (0, []))

    def test_holes_are_not_read(self) -> None:
        """A 64 MiB extension cuts as zeros without reading, sending one zero chunk."""
        state, _ = self.state_of(b"")
        self.successResultOf(Deferred.fromCoroutine(state.truncate(64 * MiB)))
        reads: list[tuple[int, int]] = []

        def read(offset: int, length: int) -> Deferred[bytes]:
            reads.append((offset, length))
            return state.read(offset, length)

        server = ChunkServer()
        uploader = ChunkUploader(Remote(server), None)
        chunks = self.successResultOf(
            Deferred.fromCoroutine(rechunk(state.layout, read, ImmediateWorker(), uploader))
        )
        expected = chunk_bytes(bytes(64 * MiB))
        self.assertEqual(
            [(c.hash, c.length) for c in chunks], [(c.hash, c.length) for c in expected]
        )
        self.assertEqual({c.hash for c in chunks}, {zero_chunk()})
        self.assertEqual(reads, [])
        self.assertEqual(server.count("chunk_put"), 1)


class UploaderTests(SynchronousTestCase):
    """Batches of C{chunk_has}; only absent chunks are sent, each once."""

    def test_batches(self) -> None:
        """Full batches are probed together; present and repeated chunks are not sent."""
        pieces = [pseudo_random(f"p{i}", 1000) for i in range(5)]
        names = [blake3(p).hexdigest() for p in pieces]
        server = ChunkServer({names[0]: pieces[0]})
        uploaded: list[str] = []
        uploader = ChunkUploader(
            Remote(server),
            "mount:x",
            on_uploaded=lambda h, d: uploaded.append(h),
            batch_bytes=2500,
            probe_min_bytes=0,
        )
        for name, piece in [*zip(names, pieces, strict=True), (names[1], pieces[1])]:
            self.successResultOf(Deferred.fromCoroutine(uploader.add(name, piece)))
        self.successResultOf(Deferred.fromCoroutine(uploader.finish()))
        self.successResultOf(Deferred.fromCoroutine(uploader.settle()))
        self.assertEqual(
            [c for c in server.calls if c[0] == "chunk_has"], [("chunk_has", 3), ("chunk_has", 2)]
        )
        self.assertEqual(server.count("chunk_put"), 4)
        self.assertEqual((uploader.uploaded, sorted(uploaded)), (4, sorted(names[1:])))

    def test_views_count_what_they_keep_alive(self) -> None:
        """
        A chunk given as a view of a larger read counts the whole read
        against the batch (so batches bound memory), and uploads exactly
        the bytes it shows.
        """
        window = pseudo_random("window", 4000)
        views = [memoryview(window)[:1000], memoryview(window)[1000:1500]]
        names = [blake3(view).hexdigest() for view in views]
        server = ChunkServer()
        uploader = ChunkUploader(Remote(server), None, batch_bytes=6000, probe_min_bytes=0)
        self.successResultOf(Deferred.fromCoroutine(uploader.add(names[0], views[0])))
        self.assertEqual(server.calls, [])  # 4000 held: below the batch
        self.successResultOf(Deferred.fromCoroutine(uploader.add(names[1], views[1])))
        self.assertEqual(server.calls[0], ("chunk_has", 2))  # 8000 held: sent
        self.successResultOf(Deferred.fromCoroutine(uploader.settle()))
        self.assertEqual(server.stored, {names[0]: window[:1000], names[1]: window[1000:1500]})

    def test_small_batches_are_sent_without_asking(self) -> None:
        """A batch below probe_min_bytes is uploaded without chunk_has."""
        piece = pseudo_random("small", 4096)
        name = blake3(piece).hexdigest()
        server = ChunkServer()
        uploader = ChunkUploader(Remote(server), None, probe_min_bytes=8192)
        self.successResultOf(Deferred.fromCoroutine(uploader.add(name, piece)))
        self.successResultOf(Deferred.fromCoroutine(uploader.finish()))
        self.successResultOf(Deferred.fromCoroutine(uploader.settle()))
        self.assertEqual(server.calls, [("chunk_put", 4096)])
        self.assertEqual(uploader.uploaded, 1)


class HeldCaller:
    """
    A caller that answers C{manifest_put} at once and holds every
    C{chunk_put} until released; records the order of requests.
    """

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.held: list[tuple[Deferred[Reply], Reply | Exception]] = []
        self.fail_put: Exception | None = None
        self.manifest_reply: Reply | Exception = Reply({"version": 1, "size": 1, "inode": 7})

    def call(
        self,
        op: str,
        payload: Mapping[str, object],
        raw: bytes | memoryview = b"",
        *,
        timeout: float | None = None,
    ) -> Deferred[Reply]:
        self.calls.append(op)
        if op == "chunk_put":
            answer: Deferred[Reply] = Deferred()
            outcome = self.fail_put or Reply({"hash": payload["hash"], "size": len(raw)})
            self.held.append((answer, outcome))
            return answer
        assert op == "manifest_put"
        if isinstance(self.manifest_reply, Exception):
            return fail(self.manifest_reply)
        return succeed(self.manifest_reply)

    def release(self) -> None:
        held, self.held = self.held, []
        for answer, outcome in held:
            if isinstance(outcome, Exception):
                answer.errback(outcome)
            else:
                answer.callback(outcome)


class CommitTests(SynchronousTestCase):
    """The compare-and-swap commit against a real data-plane service."""

    def test_missing_chunks_are_sent_again(self) -> None:
        """A chunk this connection cannot see is read back, uploaded, and the put retried."""
        fixture = FSFixture(self)
        data = pseudo_random("missing", 5000)
        name = blake3(data).hexdigest()
        other = Remote(LocalConnection(fixture.service.service, AGENT, "other"))
        self.successResultOf(other.chunk_put(name, data, session_id=None))
        connection = LocalConnection(fixture.service.service, AGENT, "mine")
        remote = Remote(connection)
        chunks = chunk_layout([(name, len(data))])
        request = CommitRequest(
            path="/agent-1/f",
            expected_version=0,
            base=(),
            chunks=chunks,
            size=len(data),
            mode=0o644,
            mtime_ns=1,
            uid=0,
            gid=0,
        )
        uploader = ChunkUploader(remote, None)
        outcome = self.successResultOf(
            Deferred.fromCoroutine(
                commit(
                    remote,
                    request,
                    session_id=None,
                    uploader=uploader,
                    read=lambda offset, length: succeed(data[offset : offset + length]),
                )
            )
        )
        assert isinstance(outcome, Committed)
        self.assertEqual((outcome.version, outcome.cas_retries), (1, 0))
        self.assertEqual(connection.calls, ["manifest_put", "chunk_put", "manifest_put"])

    def pipelined(self, caller: HeldCaller) -> Deferred[Committed | Conflict]:
        data = b"x"
        name = blake3(data).hexdigest()
        remote = Remote(caller)
        uploader = ChunkUploader(remote, None)
        self.successResultOf(Deferred.fromCoroutine(uploader.add(name, data)))
        self.successResultOf(Deferred.fromCoroutine(uploader.finish()))
        request = CommitRequest(
            path="/agent-1/f",
            expected_version=0,
            base=(),
            chunks=chunk_layout([(name, 1)]),
            size=1,
            mode=0o644,
            mtime_ns=1,
            uid=0,
            gid=0,
        )
        return Deferred.fromCoroutine(
            commit(
                remote,
                request,
                session_id=None,
                uploader=uploader,
                read=lambda offset, length: succeed(data[offset : offset + length]),
            )
        )

    def test_put_is_sent_behind_the_uploads(self) -> None:
        """manifest_put goes out before the chunk_put is answered; the commit waits for both."""
        caller = HeldCaller()
        committing = self.pipelined(caller)
        self.assertEqual(caller.calls, ["chunk_put", "manifest_put"])
        self.assertNoResult(committing)
        caller.release()
        self.assertEqual(self.successResultOf(committing), Committed(1, 0, 7))

    def test_failed_upload_is_the_error(self) -> None:
        """When an upload fails and the put is refused, the upload's error is raised."""
        caller = HeldCaller()
        caller.fail_put = RemoteError(ErrorInfo(WireErrno.EDQUOT, "over budget", {}))
        caller.manifest_reply = RemoteError(
            ErrorInfo(WireErrno.EINVAL, "missing", {"missing": [blake3(b"x").hexdigest()]})
        )
        committing = self.pipelined(caller)
        caller.release()
        failure = self.failureResultOf(committing, RemoteFailure)
        self.assertEqual(failure.value.wire, WireErrno.EDQUOT)
        self.assertEqual(caller.calls, ["chunk_put", "manifest_put"])

    def test_conflict_name(self) -> None:
        """Conflict copy names carry a session tag and UTC time and fit 255 bytes."""
        name = conflict_name("report.txt", "mount:abc", 0.0)
        tag = blake3(b"mount:abc").hexdigest()[:8]
        self.assertEqual(name, f"report.txt.conflict-{tag}-19700101T000000Z")
        self.assertEqual(
            conflict_name("a", None, 0.0, 2), "a.conflict-nosession-19700101T000000Z-2"
        )
        long = conflict_name("é" * 200, "s", 0.0)
        self.assertLessEqual(len(long.encode()), 255)
        self.assertTrue(long.endswith("19700101T000000Z"))
