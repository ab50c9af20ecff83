"""
An agent's footprint on a real C{twist svc-dataplane} process, measured from
outside (the bytes of the files under its tenant's chunk store), with its
grant pushed as the control plane does (C{PUT /control/quotas}):

  - chunks uploaded and never committed stop at the grant (C{EDQUOT}), are
    reported as uncommitted, and are reclaimed by the GC loop once the
    chunk grace has passed, also by a restarted server no agent has used;
  - a file rewritten many times never takes more than C{4 * grant} on disk
    (the default retention factor 1), and old versions past the retained
    cap are deleted soon after.

Issue 34, item 7: before, an agent with a 256 KiB grant stored 27.6 MiB of
uploads it never committed, and a heavy rewriter filled the disk with old
versions kept for the journal.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Any

from blake3 import blake3
from twisted.internet import reactor
from twisted.internet.task import deferLater
from twisted.trial.unittest import TestCase

from svc.dataplane_client.client import DataPlaneClient
from svc.dataplane_client.errors import RemoteError
from svc.testing.pki import AgentCredentials
from svc.wire.errno import WireErrno
from tests.dataplane_harness import async_test, connect_agent, standard_server

_reactor: Any = reactor

KIB = 1024
GRANT = 256 * KIB
CHUNK = 16 * KIB
GRACE_SECONDS = 3
GC_INTERVAL_SECONDS = 1
ENVIRON = {
    "SVC_CHUNK_GRACE_SECONDS": str(GRACE_SECONDS),
    "SVC_GC_INTERVAL_SECONDS": str(GC_INTERVAL_SECONDS),
}
TENANT = "tenant-a"
AGENT = "agent-1"


def random_chunk(size: int = CHUNK) -> tuple[str, bytes]:
    """Bytes nobody else stores and their chunk hash."""
    data = os.urandom(size)
    return blake3(data).hexdigest(), data


class FootprintSystemTests(TestCase):
    """One server per test (each with its own owner's store)."""

    def setUp(self) -> None:
        self.workdir = Path(self.mktemp()).resolve()
        self.workdir.mkdir(parents=True)
        self.server = standard_server(self.workdir, ENVIRON)
        self.server.start()
        self.addCleanup(self.server.stop)

    def credentials(self, owner: str) -> AgentCredentials:
        return self.server.pki.agent(TENANT, AGENT, owner)

    def push_grant(self, owner: str, grant_bytes: int) -> None:
        """Set the agent's grant as the control plane does."""
        answer = self.server.https(
            "PUT",
            "/control/quotas",
            {"owner": owner, "tenant": TENANT, "agent_id": AGENT, "grant_bytes": grant_bytes},
            context=self.server.pki.control_ssl_context(),
        )
        self.assertEqual(answer.status, 204, answer)

    def footprint(self, owner: str) -> dict[str, int]:
        """The agent's footprint as C{GET /control/usage} reports it."""
        answer = self.server.https(
            "GET", f"/control/usage?owner={owner}", context=self.server.pki.control_ssl_context()
        )
        self.assertEqual(answer.status, 200, answer)
        parts: dict[str, int] = answer.json()["footprint"].get(AGENT, {})
        return parts

    def on_disk(self, owner: str) -> int:
        """Bytes of the chunk files under the tenant's chunk store, as the filesystem says."""
        objects = self.server.tenants_root / owner / TENANT / "store" / "objects"
        total = 0
        for path in objects.glob("*/*"):
            if path.name.startswith("."):
                continue
            try:
                status = path.stat()
            except FileNotFoundError:
                continue  # collected between the listing and the stat
            if stat.S_ISREG(status.st_mode):
                total += status.st_size
        return total

    async def connect(self, owner: str) -> DataPlaneClient:
        client = await connect_agent(_reactor, self.server, self.credentials(owner))
        self.addCleanup(client.close)
        return client

    async def wait_for(self, what: str, condition: Any, seconds: float = 30.0) -> None:
        deadline = time.monotonic() + seconds
        while not condition():
            if time.monotonic() > deadline:
                self.fail(f"{what}: not within {seconds} s")
            await deferLater(_reactor, 0.2, lambda: None)

    async def put(self, client: DataPlaneClient, path: str, version: int, count: int) -> int:
        """Upload C{count} new chunks and commit them as C{path}; the new version."""
        chunks = [random_chunk() for _ in range(count)]
        for chunk_hash, data in chunks:
            await client.call("chunk_put", {"hash": chunk_hash}, data)
        reply = await client.call(
            "manifest_put",
            {
                "path": path,
                "expected_version": version,
                "chunks": [[h, len(d)] for h, d in chunks],
                "size": sum(len(d) for _, d in chunks),
                "mode": 0o644,
                "mtime_ns": 1_700_000_000_000_000_000,
            },
        )
        new_version: int = reply.payload["version"]
        return new_version

    @async_test
    async def test_uncommitted_uploads_bounded_and_reclaimed(self) -> None:
        """
        Uploads never committed stop at the grant with EDQUOT, are reported
        as uncommitted, and once the grace has passed the GC loop deletes
        them, also after a restart before any agent connects again.
        """
        owner = "uploader"
        self.push_grant(owner, GRANT)
        client = await self.connect(owner)
        stored = refused = 0
        for _ in range(2 * GRANT // CHUNK):
            chunk_hash, data = random_chunk()
            try:
                await client.call("chunk_put", {"hash": chunk_hash}, data)
            except RemoteError as error:
                self.assertEqual(error.errno, WireErrno.EDQUOT)
                refused += 1
            else:
                stored += len(data)
        self.assertEqual((stored, refused), (GRANT, GRANT // CHUNK))
        self.assertEqual(self.on_disk(owner), GRANT)
        self.assertEqual(self.footprint(owner)["uncommitted_bytes"], GRANT)
        statfs = (await client.call("statfs", {})).payload
        self.assertEqual((statfs["used_bytes"], statfs["grant_bytes"]), (0, GRANT))
        await client.close()
        # A restarted server, which no agent uses, still reclaims them.
        self.server.stop()
        self.server.start()
        self.assertEqual(self.on_disk(owner), GRANT)
        await self.wait_for("uploads reclaimed", lambda: self.on_disk(owner) == 0)
        self.assertEqual(self.footprint(owner), {})
        client = await self.connect(owner)
        chunk_hash, data = random_chunk()
        await client.call("chunk_put", {"hash": chunk_hash}, data)

    @async_test
    async def test_rewrites_bounded(self) -> None:
        """
        A file rewritten sixty times with new content never takes more than
        (3 + 1) * grant on disk; its old versions past the retained cap are
        deleted soon after, the latest ones kept for reverts.
        """
        owner = "rewriter"
        self.push_grant(owner, GRANT)
        client = await self.connect(owner)
        version = 0
        peak = 0
        for _ in range(60):
            version = await self.put(client, f"/{AGENT}/f", version, 4)
            peak = max(peak, self.on_disk(owner))
        self.assertLessEqual(peak, 4 * GRANT)
        self.assertGreater(peak, GRANT)
        await self.wait_for(
            "collectable chunks reclaimed", lambda: self.footprint(owner)["collectable_bytes"] == 0
        )
        parts = self.footprint(owner)
        self.assertEqual((parts["used_bytes"], parts["uncommitted_bytes"]), (4 * CHUNK, 0))
        self.assertEqual(parts["retained_bytes"], GRANT)
        self.assertEqual(self.on_disk(owner), 4 * CHUNK + GRANT)
        # The four newest old versions (the cap's worth) can still be
        # reverted to, the oldest of them included; older rows are gone.
        entries = (
            await client.call("journal_query", {"path": f"/{AGENT}/f", "newest_first": True})
        ).payload["entries"]
        self.assertEqual([entry["new_version"] for entry in entries], [60, 59, 58, 57])
        reverted = await client.call(
            "journal_revert_path", {"path": f"/{AGENT}/f", "seq": entries[-1]["seq"]}
        )
        self.assertEqual(reverted.payload["size"], 4 * CHUNK)
