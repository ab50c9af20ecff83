"""
Tests for a C{manifest_put} that carries its new chunks in its raw segment
(C{inline}): each chunk is stored as the C{chunk_put} it stands for (line,
metrics, checks) before the put commits, and a bad segment commits nothing.
"""

from __future__ import annotations

from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane.test.test_service import expected, line
from svc.dataplane.test.test_service_support import ServiceFixture, blob, identity
from svc.policy import PathPolicy
from svc.testing.worker import ManualWorker
from svc.wire.errno import WireErrno
from svc.wire.messages import MAX_INLINE_CHUNKS


def put_request(name: str, chunks: list[tuple[str, bytes]], **extra: Any) -> dict[str, Any]:
    """The keys of a C{manifest_put} creating C{/agent-1/<name>} from C{chunks}."""
    return {
        "path": f"/agent-1/{name}",
        "expected_version": 0,
        "chunks": [[chunk_hash, len(data)] for chunk_hash, data in chunks],
        "size": sum(len(data) for _, data in chunks),
        "mode": 0o644,
        "mtime_ns": 1,
        **extra,
    }


class TwoChunksCase(SynchronousTestCase):
    """A data-plane service, one agent on it, and two chunks' names and bytes."""

    def setUp(self) -> None:
        self.fixture = ServiceFixture(self)
        self.agent = self.fixture.agent()
        self.addCleanup(self.fixture.close)
        self.first = blob("first", 3000)
        self.second = blob("second", 500)


class InlineChunkTests(TwoChunksCase):
    """C{manifest_put} with C{inline}."""

    def put(self, name: str, inline: list[tuple[str, bytes]], **extra: Any) -> dict[str, Any]:
        """Create C{name} from C{inline}'s chunks, all carried inline."""
        raw = b"".join(data for _, data in inline)
        hashes = [chunk_hash for chunk_hash, _ in inline]
        return self.agent.ok("manifest_put", raw, **put_request(name, inline, inline=hashes))

    def test_inline_chunks_are_stored_then_committed(self) -> None:
        """
        The file is committed from chunks never sent by C{chunk_put}; each
        chunk has the C{chunk_put} line, counter and byte count an upload
        would have, written before the put's own line.
        """
        reply = self.put("f", [self.first, self.second])
        lines = [line(event) for event in self.fixture.audit[-3:]]
        self.assertEqual((reply["version"], reply["size"], reply["created"]), (1, 3500, True))
        got = self.agent.ok("manifest_get", path="/agent-1/f")
        self.assertEqual(got["chunks"], [[self.first[0], 3000], [self.second[0], 500]])
        for chunk_hash, data in (self.first, self.second):
            self.assertEqual(bytes(self.agent.reply("chunk_get", hash=chunk_hash).raw), data)
        # The chunks are stored concurrently: their lines come in either order.
        chunk_lines = sorted(lines[:2], key=lambda fields: fields["size"])
        self.assertEqual(
            chunk_lines,
            [
                expected("chunk_put", "", size=500, hash=self.second[0]),
                expected("chunk_put", "", size=3000, hash=self.first[0]),
            ],
        )
        self.assertEqual(lines[2], expected("manifest_put", "/agent-1/f", size=3500, version=1))
        sample = self.fixture.sample
        self.assertEqual(sample("svc_chunks_total", state="cached"), 2.0)
        self.assertEqual(
            sample("svc_dataplane_bytes_total", direction="in", op="chunk_put"), 3500.0
        )
        self.assertEqual(sample("svc_dataplane_op_duration_seconds_count", op="manifest_put"), 1.0)
        self.assertIsNone(sample("svc_dataplane_op_duration_seconds_count", op="chunk_put"))

    def test_inline_content_already_stored_is_deduplicated(self) -> None:
        """A second file of the same content stores nothing new: the chunk counts as deduped."""
        self.put("a", [self.first])
        self.put("b", [self.first])
        self.assertEqual(self.fixture.sample("svc_chunks_total", state="cached"), 1.0)
        self.assertEqual(self.fixture.sample("svc_chunks_total", state="deduped"), 1.0)

    def test_only_some_chunks_inline(self) -> None:
        """Chunks uploaded before by C{chunk_put} and inline ones mix in one put."""
        self.agent.ok("chunk_put", self.first[1], hash=self.first[0])
        request = put_request("f", [self.first, self.second], inline=[self.second[0]])
        self.assertEqual(self.agent.ok("manifest_put", self.second[1], **request)["size"], 3500)

    def test_bytes_that_do_not_hash_commit_nothing(self) -> None:
        """
        Inline bytes that do not hash to their name are EINVAL, as the
        C{chunk_put} would be: the chunk's line and the put's line say so,
        and nothing is committed.
        """
        chunk_hash, data = self.first
        request = put_request("f", [self.first], inline=[chunk_hash])
        error = self.agent.error("manifest_put", data[:-1] + b"!", **request)
        self.assertEqual(error.errno, WireErrno.EINVAL)
        self.assertEqual(
            [line(event) for event in self.fixture.audit[-2:]],
            [
                expected("chunk_put", "", False, hash=chunk_hash),
                expected("manifest_put", "/agent-1/f", False),
            ],
        )
        self.assertEqual(self.agent.errno("head_file", path="/agent-1/f"), WireErrno.ENOENT)
        self.assertEqual(self.agent.ok("chunk_has", hashes=[chunk_hash]), {"present": [False]})

    def test_segment_must_be_exactly_the_inline_chunks(self) -> None:
        """
        A raw segment shorter or longer than the inline chunks, or bytes
        without C{inline}, are EINVAL before anything is stored.
        """
        chunk_hash, data = self.first
        with_inline = put_request("f", [self.first], inline=[chunk_hash])
        without = put_request("f", [self.first])
        for raw, request in (
            (data[:-1], with_inline),
            (data + b"x", with_inline),
            (data, without),
        ):
            self.assertEqual(self.agent.errno("manifest_put", raw, **request), WireErrno.EINVAL)
            self.assertEqual(
                line(self.fixture.last()), expected("manifest_put", "/agent-1/f", False)
            )
        self.assertEqual(self.fixture.events("chunk_put"), [])
        self.assertEqual(self.agent.ok("chunk_has", hashes=[chunk_hash]), {"present": [False]})

    def test_inline_names_must_be_distinct_chunks_of_the_file(self) -> None:
        """
        A name that is not one of C{chunks}, or repeats, is EINVAL; a
        non-hash is EINVAL; too many names, or a non-array, is EPROTO.
        """
        chunk_hash, data = self.first
        other, _ = blob("other")
        cases = [
            ([other], WireErrno.EINVAL),
            ([chunk_hash, chunk_hash], WireErrno.EINVAL),
            (["not-a-hash"], WireErrno.EINVAL),
            ([chunk_hash] * (MAX_INLINE_CHUNKS + 1), WireErrno.EPROTO),
            (chunk_hash, WireErrno.EPROTO),
        ]
        for inline, wanted in cases:
            request = put_request("f", [self.first], inline=inline)
            self.assertEqual(self.agent.errno("manifest_put", data, **request), wanted, inline)
        self.assertEqual(self.fixture.events("chunk_put"), [])

    def test_readonly_refuses_inline_chunks(self) -> None:
        """Under C{readonly} the inline chunk is refused as its C{chunk_put} would be."""
        self.fixture.policies[("tenant-a", "agent-1")] = PathPolicy(readonly=True)
        chunk_hash, data = self.first
        request = put_request("f", [self.first], inline=[chunk_hash])
        self.assertEqual(self.agent.errno("manifest_put", data, **request), WireErrno.EACCES)
        chunk_line = line(self.fixture.events("chunk_put")[-1])
        self.assertEqual((chunk_line["allowed"], chunk_line["hash"]), (False, chunk_hash))
        self.assertEqual(self.agent.ok("chunk_has", hashes=[chunk_hash]), {"present": [False]})

    def test_account_budget_refuses_inline_chunks(self) -> None:
        """An inline chunk past the account budget makes the put EDQUOT, committing nothing."""
        engine = self.fixture.service.engine
        self.successResultOf(engine.set_account_budget("user-1", 1000))
        chunk_hash, data = self.first
        request = put_request("f", [self.first], inline=[chunk_hash])
        self.assertEqual(self.agent.errno("manifest_put", data, **request), WireErrno.EDQUOT)
        self.assertEqual(self.agent.errno("head_file", path="/agent-1/f"), WireErrno.ENOENT)


class InlineOrderTests(SynchronousTestCase):
    """The put commits only once its inline chunks are stored."""

    def test_put_waits_for_its_inline_chunks(self) -> None:
        """
        While the chunk store's worker has not run, the put is unanswered
        and another connection does not see the file; once it runs, the
        put commits.
        """
        io = ManualWorker()
        fixture = ServiceFixture(self, io_worker=io)
        self.addCleanup(fixture.close)
        writer = fixture.agent()
        reader = fixture.agent(identity(), "reader")
        io.run()  # the engine's start-up
        chunk_hash, data = blob("c", 2000)
        request = put_request("f", [(chunk_hash, data)], inline=[chunk_hash])
        put = writer.request("manifest_put", data, **request)
        self.assertNoResult(put)
        looked = reader.request("head_file", path="/agent-1/f")
        io.run()
        self.assertEqual(self.successResultOf(put).payload["version"], 1)
        self.assertEqual(self.failureResultOf(looked).value.errno, WireErrno.ENOENT)
        self.assertEqual(reader.ok("head_file", path="/agent-1/f")["size"], 2000)


class InlineReadTests(TwoChunksCase):
    """C{manifest_get} with C{inline_max}: a small file's chunks come with its chunk list."""

    def setUp(self) -> None:
        super().setUp()
        for chunk_hash, data in (self.first, self.second):
            self.agent.ok("chunk_put", data, hash=chunk_hash)
        chunks = [self.first, self.second, self.first]
        self.agent.ok("manifest_put", **put_request("f", chunks))

    def test_small_file_comes_with_its_chunks(self) -> None:
        """
        Each distinct chunk once, in order of first use, its bytes in the
        raw segment; each read has the C{chunk_get} line, counter and byte
        count a fetch would have, after the C{manifest_get} line.
        """
        before = len(self.fixture.audit)
        reply = self.agent.reply("manifest_get", path="/agent-1/f", inline_max=6500)
        self.assertEqual(reply.payload["inline"], [self.first[0], self.second[0]])
        self.assertEqual(bytes(reply.raw), self.first[1] + self.second[1])
        self.assertEqual(reply.payload["size"], 6500)
        lines = [line(event) for event in self.fixture.audit[before:]]
        self.assertEqual(lines[0], expected("manifest_get", "/agent-1/f", size=6500, version=1))
        self.assertEqual(
            sorted(lines[1:], key=lambda fields: fields["size"]),
            [
                expected("chunk_get", "", size=500, hash=self.second[0]),
                expected("chunk_get", "", size=3000, hash=self.first[0]),
            ],
        )
        sample = self.fixture.sample
        self.assertEqual(sample("svc_chunks_total", state="fetched"), 2.0)
        self.assertEqual(
            sample("svc_dataplane_bytes_total", direction="out", op="chunk_get"), 3500.0
        )

    def test_larger_file_or_none_asked_carries_none(self) -> None:
        """A file over C{inline_max}, or no C{inline_max}, is the plain answer: no chunk read."""
        asked: list[dict[str, Any]] = [{"inline_max": 6499}, {}, {"inline_max": 0}]
        for extra in asked:
            reply = self.agent.reply("manifest_get", path="/agent-1/f", **extra)
            self.assertNotIn("inline", reply.payload)
            self.assertEqual(bytes(reply.raw), b"")
        self.assertEqual(self.fixture.events("chunk_get"), [])

    def test_directory_and_empty_file_carry_none(self) -> None:
        """Nothing to carry for a directory or an empty file."""
        self.agent.ok("dir_create", path="/agent-1/d", mode=0o755, mtime_ns=1)
        self.agent.ok("manifest_put", **put_request("empty", []))
        for path in ("/agent-1/d", "/agent-1/empty"):
            reply = self.agent.reply("manifest_get", path=path, inline_max=1 << 20)
            self.assertNotIn("inline", reply.payload)

    def test_unreadable_chunk_leaves_the_answer_plain(self) -> None:
        """
        A chunk the store cannot give (its file is gone) fails its own
        C{chunk_get} line; the C{manifest_get} still answers, without
        C{inline}, so the client fetches and meets the error itself.
        """
        (stored,) = [
            path for path in self.fixture.root.rglob(self.second[0] + "*") if path.is_file()
        ]
        stored.unlink()
        reply = self.agent.reply("manifest_get", path="/agent-1/f", inline_max=6500)
        self.assertNotIn("inline", reply.payload)
        self.assertEqual(bytes(reply.raw), b"")
        chunks = reply.payload["chunks"]
        assert isinstance(chunks, tuple)
        self.assertEqual(chunks[1], (self.second[0], 500))
        refused = [line(event) for event in self.fixture.events("chunk_get") if not event.allowed]
        self.assertEqual(refused, [expected("chunk_get", "", False, hash=self.second[0])])

    def test_inline_max_out_of_range(self) -> None:
        """C{inline_max} above 1 MiB or below 0 is EINVAL; not an integer, EPROTO or EINVAL."""
        for value in ((1 << 20) + 1, -1):
            self.assertEqual(
                self.agent.errno("manifest_get", path="/agent-1/f", inline_max=value),
                WireErrno.EINVAL,
            )
        self.assertIn(
            self.agent.errno("manifest_get", path="/agent-1/f", inline_max="64"),
            (WireErrno.EPROTO, WireErrno.EINVAL),
        )
