"""
System tests of data-plane operations against a real C{twist svc-dataplane}
process, driven by the real client over loopback TLS:

  - a write/read round trip (chunks, manifest), also from a new connection;
  - the audit lines of a few operations, field by field against
    C{docs/specifications/audit-log.md}, and the metrics they move;
    C{promtool check metrics} on the real C{/metrics};
  - isolation: another tenant's agent (even with the same agent id) and
    another agent of the same tenant cannot read, list, stat or learn the
    existence of an agent's data: every answer equals the answer about
    something that does not exist;
  - confinement: escaping paths are EACCES, audited and counted.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from typing import Any, cast

from blake3 import blake3
from twisted.internet import reactor
from twisted.internet.task import deferLater
from twisted.trial.unittest import TestCase

from svc.dataplane_client.client import DataPlaneClient, Reply
from svc.dataplane_client.errors import RemoteError
from svc.metrics import op_label
from svc.testing.pki import AgentCredentials
from svc.wire.errno import WireErrno
from svc.wire.ops import Op
from tests.dataplane_harness import (
    DataPlaneProcess,
    async_test,
    class_server,
    connect_agent,
    metric_sample,
    promtool_check,
    serial_of,
    standard_server,
    subject_of,
)

_reactor: Any = reactor

ENVELOPE = [
    "ts",
    "event",
    "path",
    "allowed",
    "command",
    "size",
    "offset",
    "agent_id",
    "tenant_id",
    "cert_serial",
    "cert_subject",
]
TS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
KNOWN_LINT = 'svc_journal_rows_total non-counter metrics should not have "_total" suffix'
OUTSIDE = "path outside agent subtree"


def chunk(label: str, size: int = 4096) -> tuple[str, bytes]:
    """Bytes no other test stores (random) and their chunk hash."""
    data = label.encode() + os.urandom(size)
    return blake3(data).hexdigest(), data


def absent_hash() -> str:
    """The hash of content nobody stored."""
    return blake3(os.urandom(64)).hexdigest()


class DataSystemCase(TestCase):
    """Shared set-up: this class's server process and client helpers."""

    def setUp(self) -> None:
        self.server: DataPlaneProcess = class_server(self, standard_server)
        self.pki = self.server.pki

    async def connect(self, credentials: AgentCredentials) -> DataPlaneClient:
        """An admitted client for C{credentials}, closed after the test."""
        client = await connect_agent(_reactor, self.server, credentials)
        self.addCleanup(client.close)
        return client

    async def put_file(
        self, client: DataPlaneClient, path: str, chunks: list[tuple[str, bytes]]
    ) -> dict[str, Any]:
        """Upload C{chunks} and commit them as a new file at C{path}."""
        for chunk_hash, data in chunks:
            reply = await client.call("chunk_put", {"hash": chunk_hash}, data)
            self.assertEqual(dict(reply.payload), {"hash": chunk_hash, "size": len(data)})
        reply = await client.call(
            "manifest_put",
            {
                "path": path,
                "expected_version": 0,
                "chunks": [[h, len(d)] for h, d in chunks],
                "size": sum(len(d) for _, d in chunks),
                "mode": 0o644,
                "mtime_ns": 1_700_000_000_000_000_000,
            },
        )
        return dict(reply.payload)

    def metrics(self) -> str:
        return self.server.metrics_text()


class OperationsTests(DataSystemCase):
    """
    Writes and reads through the real server, with their audit lines and metrics.
    """

    @async_test
    async def test_round_trip(self) -> None:
        """chunk_put, manifest_put, manifest_get, chunk_get return the bytes, on any connection."""
        credentials = self.pki.agent("tenant-a", "rt-1")
        client = await self.connect(credentials)
        chunks = [chunk("one", 70_000), chunk("two", 1000)]
        size = sum(len(data) for _, data in chunks)
        put = await self.put_file(client, "/rt-1/file.bin", chunks)
        self.assertEqual((put["version"], put["size"], put["created"]), (1, size, True))

        reader = await self.connect(credentials)
        got = await reader.call("manifest_get", {"path": "/rt-1/file.bin"})
        self.assertEqual(got.payload["chunks"], [[h, len(d)] for h, d in chunks])
        self.assertEqual((got.payload["size"], got.payload["version"]), (size, 1))
        self.assertEqual(got.payload["kind"], "file")
        self.assertEqual(got.payload["last_writer_agent_id"], "rt-1")
        for chunk_hash, data in chunks:
            fetched = await reader.call("chunk_get", {"hash": chunk_hash})
            self.assertEqual(fetched.raw, data)
            self.assertEqual(dict(fetched.payload), {"hash": chunk_hash, "size": len(data)})
        listing = await reader.call("list", {"path": "/rt-1"})
        self.assertEqual([e["name"] for e in entries(listing)], ["file.bin"])

    @async_test
    async def test_audit_lines_match_spec(self) -> None:
        """Each operation's audit line has exactly the spec's keys in order, and the cert fields."""
        credentials = self.pki.agent("tenant-b", "aud-1")
        client = await self.connect(credentials)
        chunk_hash, data = chunk("audit")
        put = await self.put_file(client, "/aud-1/f", [(chunk_hash, data)])
        await client.call("manifest_get", {"path": "/aud-1/f"})
        await client.call("head_file", {"path": "/aud-1/f"})
        await client.call("chunk_get", {"hash": chunk_hash})
        await client.call("chunk_has", {"hashes": [chunk_hash, absent_hash()]})
        await client.call("list", {"path": "/aud-1"})
        with self.assertRaises(RemoteError):
            await client.call("manifest_get", {"path": "/aud-1/missing"})

        expected = [
            ("chunk_put", "", True, len(data), {"hash": chunk_hash}),
            ("manifest_put", "/aud-1/f", True, len(data), {"version": put["version"]}),
            ("manifest_get", "/aud-1/f", True, len(data), {"version": put["version"]}),
            ("head_file", "/aud-1/f", True, len(data), {}),
            ("chunk_get", "", True, len(data), {"hash": chunk_hash}),
            ("chunk_has", "", True, None, {"count": 2}),
            ("list_entries", "/aud-1", True, None, {}),
            ("manifest_get", "/aud-1/missing", False, None, {}),
        ]
        records = self.server.wait_for_audit(
            lambda r: r.get("agent_id") == "aud-1", count=len(expected)
        )
        identity = {
            "agent_id": "aud-1",
            "tenant_id": "tenant-b",
            "cert_serial": serial_of(credentials),
            "cert_subject": subject_of(credentials),
        }
        self.assertEqual(len(records), len(expected))
        for record, (event, path, allowed, size, extra) in zip(records, expected, strict=True):
            self.assertEqual(list(record), ENVELOPE + list(extra), event)
            self.assertRegex(record["ts"], TS)
            self.assertEqual(
                record,
                {
                    "ts": record["ts"],
                    "event": event,
                    "path": path,
                    "allowed": allowed,
                    "command": "svc-server",
                    "size": size,
                    "offset": None,
                    **identity,
                    **extra,
                },
            )

    @async_test
    async def test_metrics_follow_operations(self) -> None:
        """Durations, bytes and chunk states move by what the operations did."""
        client = await self.connect(self.pki.agent("tenant-a", "met-1"))
        chunk_hash, data = chunk("metrics", 5000)
        before = self.metrics()
        await self.put_file(client, "/met-1/f", [(chunk_hash, data)])
        await client.call("chunk_put", {"hash": chunk_hash}, data)
        await client.call("chunk_get", {"hash": chunk_hash})
        await client.call("head_file", {"path": "/met-1/f"})
        after = self.metrics()

        def delta(name: str, **labels: str) -> float:
            return (metric_sample(after, name, **labels) or 0.0) - (
                metric_sample(before, name, **labels) or 0.0
            )

        duration = "svc_dataplane_op_duration_seconds_count"
        self.assertEqual(delta(duration, op="chunk_put"), 2)
        self.assertEqual(delta(duration, op="manifest_put"), 1)
        self.assertEqual(delta(duration, op="chunk_get"), 1)
        self.assertEqual(delta(duration, op="stat"), 1)
        self.assertEqual(
            delta("svc_dataplane_bytes_total", direction="in", op="chunk_put"), 2 * len(data)
        )
        self.assertEqual(
            delta("svc_dataplane_bytes_total", direction="out", op="chunk_get"), len(data)
        )
        self.assertEqual(delta("svc_chunks_total", state="cached"), 1)
        self.assertEqual(delta("svc_chunks_total", state="deduped"), 1)
        self.assertEqual(delta("svc_chunks_total", state="fetched"), 1)
        self.assertEqual(
            delta("svc_journal_writes_total", op="put", allocation_id="tenant-a/met-1"), 1
        )

    @async_test
    async def test_journal_rows_and_deletion_batches(self) -> None:
        """
        svc_journal_rows_total follows an agent's journal within about a
        second; a purge deletes its chunks as one delete batch, counted by
        result, and its journal series goes.
        """
        client = await self.connect(self.pki.agent("tenant-a", "jr-1"))
        await self.put_file(client, "/jr-1/a", [chunk("journal-a", 3000)])
        await self.put_file(client, "/jr-1/b", [chunk("journal-b", 3000)])
        rows = {"allocation_id": "tenant-a/jr-1"}
        # The disk's own directory, then the two files.
        self.assertEqual(await self.metric_becomes("svc_journal_rows_total", 3.0, **rows), 3.0)
        before = self.metrics()
        purged = self.server.https(
            "POST",
            "/control/purge-agent",
            {"owner": "user-1", "tenant": "tenant-a", "agent_id": "jr-1"},
            context=self.pki.control_ssl_context(),
        )
        self.assertEqual(purged.status, 200, purged.body)
        after = self.metrics()
        delete = {"operation": "delete"}
        for name, labels, grew in (
            ("svc_chunk_batch_size_count", delete, 1.0),
            ("svc_chunk_batch_size_sum", delete, 2.0),
            ("svc_chunk_batch_duration_seconds_count", delete, 1.0),
            ("svc_chunk_batch_items_total", {**delete, "result": "deleted"}, 2.0),
        ):
            self.assertEqual(
                (metric_sample(after, name, **labels) or 0.0)
                - (metric_sample(before, name, **labels) or 0.0),
                grew,
                name,
            )
        self.assertIsNone(await self.metric_becomes("svc_journal_rows_total", None, **rows))

    async def metric_becomes(
        self, name: str, value: float | None, timeout: float = 10.0, **labels: str
    ) -> float | None:
        """The sample once it equals C{value} (L{None}: absent), or its last value."""
        deadline = _reactor.seconds() + timeout
        while True:
            found = metric_sample(self.metrics(), name, **labels)
            if found == value or _reactor.seconds() > deadline:
                return found
            await deferLater(_reactor, 0.2, lambda: None)

    @async_test
    async def test_promtool_accepts_real_metrics(self) -> None:
        """promtool parses the server's /metrics; its only lint finding is the spec's gauge name."""
        client = await self.connect(self.pki.agent("tenant-a", "prom-1"))
        await self.put_file(client, "/prom-1/f", [chunk("prom")])
        await client.call("chunk_has", {"hashes": [absent_hash()]})
        answer = self.server.https("GET", "/metrics")
        self.assertEqual(answer.status, 200)
        self.assertTrue(answer.headers["Content-Type"].startswith("text/plain"))
        checked = promtool_check(answer.body.decode("utf-8"))
        if checked is None:
            if os.environ.get("CI") == "true":
                self.fail("promtool is required under CI=true")
            self.skipTest("promtool not installed")
        status, output = checked
        problems = {line.strip() for line in output.splitlines() if line.strip()}
        self.assertIn(status, (0, 3), output)  # 1 would be a parse error; 3 lint only
        self.assertEqual(problems - {KNOWN_LINT}, set(), output)
        self.assertEqual(status == 3, bool(problems), output)


def entries(reply: Reply) -> list[dict[str, Any]]:
    """The C{entries} array of a C{list} or C{journal_query} reply."""
    found: list[dict[str, Any]] = cast(list[dict[str, Any]], reply.payload["entries"])
    return found


def normalized(answer: tuple[Any, ...], name: str) -> tuple[Any, ...]:
    """An answer with the probed path or hash replaced by a placeholder."""
    return tuple(a.replace(name, "<name>") if isinstance(a, str) else a for a in answer)


async def answer(client: DataPlaneClient, op: str, payload: dict[str, Any]) -> tuple[Any, ...]:
    """
    What the server said: C{("ok", payload, raw length)} or
    C{("error", errno, message, details)}.
    """
    try:
        reply = await client.call(op, payload)
    except RemoteError as e:
        return ("error", e.errno, e.message, dict(e.details))
    return ("ok", dict(reply.payload), len(reply.raw))


class IsolationTests(DataSystemCase):
    """
    Nobody learns anything about another agent's data.
    """

    async def owner_with_data(self, agent_id: str) -> tuple[DataPlaneClient, str]:
        """An agent (tenant-a) with a file, a directory and a symlink; its chunk hash."""
        owner = await self.connect(self.pki.agent("tenant-a", agent_id))
        chunk_hash, data = chunk("secret")
        await self.put_file(owner, f"/{agent_id}/secret", [(chunk_hash, data)])
        await owner.call("dir_create", {"path": f"/{agent_id}/dir", "mode": 0o755})
        await owner.call("symlink", {"path": f"/{agent_id}/link", "target": "secret"})
        return owner, chunk_hash

    def probes(
        self, root: str, chunk_hash: str
    ) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
        """Each read op: C{(op, about the owner's data, about nothing)}."""
        missing = absent_hash()
        return [
            ("list", {"path": f"{root}/dir"}, {"path": f"{root}/nodir"}),
            ("head_file", {"path": f"{root}/secret"}, {"path": f"{root}/nosuch"}),
            ("manifest_get", {"path": f"{root}/secret"}, {"path": f"{root}/nosuch"}),
            ("readlink", {"path": f"{root}/link"}, {"path": f"{root}/nolink"}),
            ("chunk_get", {"hash": chunk_hash}, {"hash": missing}),
            ("chunk_has", {"hashes": [chunk_hash]}, {"hashes": [missing]}),
            ("journal_query", {"path": f"{root}/secret"}, {"path": f"{root}/nosuch"}),
        ]

    async def assertIsolated(self, owner_id: str, other: AgentCredentials) -> None:
        """Every read probe by C{other} answers as if the owner's data did not exist."""
        owner, chunk_hash = await self.owner_with_data(owner_id)
        intruder = await self.connect(other)
        root = f"/{owner_id}"
        for op, existing, nothing in self.probes(root, chunk_hash):
            # The data is there: its owner reads it.
            mine = await answer(owner, op, existing)
            self.assertEqual(mine[0], "ok", (op, mine))
            if op == "chunk_has":
                self.assertEqual(mine[1]["present"], [True])
            theirs = await answer(intruder, op, existing)
            baseline = await answer(intruder, op, nothing)
            [probed] = [v if isinstance(v, str) else v[0] for v in existing.values()]
            [absent] = [v if isinstance(v, str) else v[0] for v in nothing.values()]
            self.assertEqual(normalized(theirs, probed), normalized(baseline, absent), op)
            self.assertNotEqual(theirs, mine, op)
        # The intruder's own journal holds nothing but its own disk's creation.
        journal = await intruder.call("journal_query", {})
        rows = [(r["op"], r["path"]) for r in entries(journal)]
        self.assertEqual(len(rows), 1, rows)
        self.assertEqual(rows[0][0], "mkdir")

    @async_test
    async def test_other_tenant_same_agent_id(self) -> None:
        """An agent of another tenant with the same agent id sees its own empty disk only."""
        other = self.pki.agent("tenant-b", "iso-1")
        await self.assertIsolated("iso-1", other)
        intruder = await self.connect(other)
        listing = await intruder.call("list", {"path": "/iso-1"})
        self.assertEqual(listing.payload["entries"], [])

    @async_test
    async def test_same_tenant_other_agent(self) -> None:
        """Another agent of the same tenant is refused alike for existing and absent paths."""
        await self.assertIsolated("iso-2", self.pki.agent("tenant-a", "iso-2-peer"))
        peer = await self.connect(self.pki.agent("tenant-a", "iso-2-peer"))
        refused = await answer(peer, "list", {"path": "/iso-2"})
        self.assertEqual(refused, ("error", WireErrno.EACCES, OUTSIDE, {}))


class ConfinementTests(DataSystemCase):
    """
    Escaping paths through the real server: refused, audited, counted.
    """

    ESCAPING = [
        "/conf-2/x",
        "/conf-1/../conf-2/x",
        "/",
        "//conf-1/x",
        "/conf-1/./x",
        "/conf-1/",
        "/conf-1x/y",
        "conf-1/x",
        "/conf-1/a//b",
    ]
    OPS = {
        "list": ({}, "list"),
        "head_file": ({}, "stat"),
        "manifest_get": ({}, "manifest_get"),
        "readlink": ({}, "readlink"),
        "dir_create": ({"mode": 0o755}, "dir_create"),
        "manifest_delete": ({}, "manifest_delete"),
    }

    @async_test
    async def test_escaping_paths_denied_audited_counted(self) -> None:
        """Each escaping path on each op is EACCES, has its denial line and is counted."""
        client = await self.connect(self.pki.agent("tenant-a", "conf-1"))
        before = self.server.metrics_text()
        for op, (extra, _event) in self.OPS.items():
            for path in self.ESCAPING:
                got = await answer(client, op, {"path": path, **extra})
                self.assertEqual(got, ("error", WireErrno.EACCES, OUTSIDE, {}), (op, path))
        after = self.server.metrics_text()

        expected = Counter(
            (event, path) for _extra, event in self.OPS.values() for path in self.ESCAPING
        )
        records = self.server.wait_for_audit(
            lambda r: r.get("agent_id") == "conf-1" and not r["allowed"],
            count=sum(expected.values()),
        )
        self.assertEqual(Counter((r["event"], r["path"]) for r in records), expected)
        self.assertTrue(all(r["command"] == "svc-server" for r in records))
        for op in self.OPS:
            label = op_label(Op(op))
            counted = (metric_sample(after, "svc_agent_path_denied_total", op=label) or 0.0) - (
                metric_sample(before, "svc_agent_path_denied_total", op=label) or 0.0
            )
            self.assertEqual(counted, len(self.ESCAPING), op)
        # The agent's own disk still works.
        await client.call("dir_create", {"path": "/conf-1/ok", "mode": 0o755})
