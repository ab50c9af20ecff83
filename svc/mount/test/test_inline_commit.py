"""
Tests for small write-backs sent in one request: L{ChunkUploader} holds a
small last batch back (C{inline_max_bytes}) and L{svc.mount.writeback.commit.commit}
carries it in the C{manifest_put}, against a real data-plane service; and a
server that ignores C{inline} still gets every chunk.
"""

from __future__ import annotations

from collections.abc import Mapping

from blake3 import blake3
from twisted.internet.defer import Deferred, succeed
from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane_client.client import Reply
from svc.mount.core.extents import chunk_layout
from svc.mount.remote.data_plane import Remote
from svc.mount.test.test_fs_support import AGENT, FSFixture, pseudo_random
from svc.mount.test.test_writeback import ChunkServer
from svc.mount.writeback.commit import CommitRequest, Committed, Conflict, commit
from svc.mount.writeback.uploads import ChunkUploader
from svc.testing.local_connection import LocalConnection


def added(uploader: ChunkUploader, *pieces: bytes) -> None:
    """Add C{pieces} to C{uploader} and finish it (nothing here waits)."""
    for piece in pieces:
        Deferred.fromCoroutine(uploader.add(blake3(piece).hexdigest(), piece))
    Deferred.fromCoroutine(uploader.finish())


class UploaderInlineTests(SynchronousTestCase):
    """What an uploader holds back for the commit, and what it counts."""

    def test_small_last_batch_is_held_for_the_commit(self) -> None:
        """
        A last batch within C{inline_max_bytes} is not uploaded: the commit
        takes it once, and it counts (and is cached) once stored.
        """
        pieces = [pseudo_random("a", 3000), pseudo_random("b", 1000)]
        server = ChunkServer()
        cached: list[str] = []
        uploader = ChunkUploader(
            Remote(server),
            None,
            on_uploaded=lambda name, data: cached.append(name),
            inline_max_bytes=4000,
        )
        added(uploader, *pieces)
        self.assertEqual(server.calls, [])
        inline = uploader.take_inline()
        self.assertEqual(inline, tuple((blake3(p).hexdigest(), p) for p in pieces))
        self.assertEqual(uploader.take_inline(), ())
        self.assertEqual(uploader.uploaded, 0)
        uploader.inline_stored(inline)
        self.assertEqual((uploader.uploaded, cached), (2, [name for name, _ in inline]))

    def test_a_batch_over_the_limit_is_uploaded(self) -> None:
        """One byte over C{inline_max_bytes}, the batch goes out by C{chunk_put} as before."""
        server = ChunkServer()
        uploader = ChunkUploader(Remote(server), None, inline_max_bytes=4000)
        added(uploader, pseudo_random("a", 3000), pseudo_random("b", 1001))
        self.assertEqual(server.count("chunk_put"), 2)
        self.assertEqual(uploader.take_inline(), ())

    def test_a_chunk_uploaded_again_counts_once(self) -> None:
        """A held chunk that had to be uploaded after all (L{ChunkUploader.put}) counts once."""
        piece = pseudo_random("a", 3000)
        uploader = ChunkUploader(Remote(ChunkServer()), None, inline_max_bytes=4000)
        added(uploader, piece)
        inline = uploader.take_inline()
        Deferred.fromCoroutine(uploader.put(blake3(piece).hexdigest(), piece))
        uploader.inline_stored(inline)
        self.assertEqual(uploader.uploaded, 1)


class IgnoringInline:
    """A caller standing for a server that does not know C{inline}: it drops it."""

    def __init__(self, inner: LocalConnection) -> None:
        self.inner = inner

    def call(
        self,
        op: str,
        payload: Mapping[str, object],
        raw: bytes | memoryview = b"",
        *,
        timeout: float | None = None,
    ) -> Deferred[Reply]:
        if op == "manifest_put":
            payload = {key: value for key, value in payload.items() if key != "inline"}
            raw = b""
        return self.inner.call(op, payload, raw, timeout=timeout)


class CommitInlineTests(SynchronousTestCase):
    """A small file's commit against the real data-plane service."""

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        self.data = pseudo_random("small file", 4096)
        self.connection = LocalConnection(self.fixture.service.service, AGENT, "mine")

    def commit(
        self, remote: Remote, expected_version: int = 0
    ) -> tuple[Committed | Conflict, ChunkUploader]:
        uploader = ChunkUploader(remote, None, inline_max_bytes=64 << 10)
        added(uploader, self.data)
        data = self.data
        request = CommitRequest(
            path="/agent-1/f",
            expected_version=expected_version,
            base=(),
            chunks=chunk_layout([(blake3(data).hexdigest(), len(data))]),
            size=len(data),
            mode=0o644,
            mtime_ns=1,
            uid=0,
            gid=0,
        )
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
        return outcome, uploader

    def read_back(self) -> bytes:
        """The file's bytes, read on a fresh connection (so only through the file)."""
        reader = Remote(LocalConnection(self.fixture.service.service, AGENT, "reader"))
        manifest = self.successResultOf(reader.manifest_get("/agent-1/f"))
        return b"".join(
            self.successResultOf(reader.chunk_get(chunk.hash)) for chunk in manifest.chunks
        )

    def test_small_file_is_one_request(self) -> None:
        """The chunk rides in the C{manifest_put}: one request, the chunk counted as new."""
        outcome, uploader = self.commit(Remote(self.connection))
        assert isinstance(outcome, Committed)
        self.assertEqual(outcome.version, 1)
        self.assertEqual(self.connection.calls, ["manifest_put"])
        self.assertEqual(uploader.uploaded, 1)
        self.assertEqual(self.read_back(), self.data)

    def test_server_ignoring_inline_gets_the_chunk_uploaded(self) -> None:
        """
        A server that drops C{inline} answers C{missing}: the chunk is read
        back, uploaded and the put retried; it counts once.
        """
        outcome, uploader = self.commit(Remote(IgnoringInline(self.connection)))
        assert isinstance(outcome, Committed)
        self.assertEqual(self.connection.calls, ["manifest_put", "chunk_put", "manifest_put"])
        self.assertEqual(uploader.uploaded, 1)
        self.assertEqual(self.read_back(), self.data)

    def test_lost_compare_and_swap_still_counts_the_stored_chunk(self) -> None:
        """
        A put refused on its version (here: the file is not there) stored
        its inline chunk all the same, and says so.
        """
        outcome, uploader = self.commit(Remote(self.connection), expected_version=4)
        self.assertIsInstance(outcome, Conflict)
        self.assertEqual(uploader.uploaded, 1)
