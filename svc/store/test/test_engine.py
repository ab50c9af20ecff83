"""
Tests for L{svc.store.engine} and L{svc.store.tenant}: the rules that span
the chunk store, the manifests and the leases.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, cast

from blake3 import blake3
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from svc.store.chunks import CorruptStoredChunk
from svc.store.chunkstore_fs import FilesystemChunkStore
from svc.store.engine import StorageEngine, StorageRoots
from svc.store.errors import (
    ChunksCollected,
    MissingChunks,
    NotFound,
    QuotaExceeded,
    StaleVersion,
    WriteLeaseHeld,
)
from svc.store.footprint import FootprintPolicy
from svc.store.gc import SweepReport
from svc.store.layout import TenantLocation, chunk_path
from svc.store.lease_values import LeaseEvent, LeaseHolder, LeaseMode, LeaseRevoke
from svc.store.manifest_paths import top_of
from svc.store.manifest_values import ChunkRef, Writer
from svc.store.owner_account import OwnerAccount
from svc.store.retention import RetentionPolicy
from svc.store.tenant import TenantStorage
from svc.testing.worker import ImmediateWorker, ManualWorker
from svc.wire.errno import WireErrno

ACME = TenantLocation.for_owner("acme")
ACME_LABS = TenantLocation("acme", "labs")
GRACE = 60.0
RETENTION = 3600.0
WRITER = Writer("a1", "mount:" + "ab" * 8)


def blob(label: str, size: int) -> tuple[str, bytes]:
    """Deterministic bytes of ``size`` and their chunk hash."""
    data = blake3(label.encode()).digest(length=size)
    return blake3(data).hexdigest(), data


class EngineFixture:
    """
    A storage engine on a temporary directory with inline workers and a
    L{Clock} set to the wall clock (chunk files carry real mtimes).
    """

    def __init__(
        self,
        case: SynchronousTestCase,
        root: Path | None = None,
        db_worker: Any = None,
        footprint: FootprintPolicy | None = None,
        observer: Any = None,
    ) -> None:
        self.case = case
        self.root = root or Path(case.mktemp())
        self.clock = Clock()
        self.clock.advance(time.time())
        self.revokes: list[tuple[TenantLocation, LeaseRevoke]] = []
        self.events: list[tuple[TenantLocation, LeaseEvent]] = []
        self.engine = StorageEngine(
            StorageRoots.single(self.root),
            self.clock,
            lambda name: db_worker or ImmediateWorker(),
            ImmediateWorker(),
            lambda loc, revoke: self.revokes.append((loc, revoke)),
            lambda loc, event: self.events.append((loc, event)),
            RetentionPolicy(
                chunk_grace_seconds=GRACE,
                journal_retention_seconds=RETENTION,
                footprint=footprint or FootprintPolicy(),
            ),
            observer=observer,
        )

    def tenant(self, location: TenantLocation = ACME) -> TenantStorage:
        return self.case.successResultOf(self.engine.tenant(location))

    def ok(self, d: Any) -> Any:
        return self.case.successResultOf(d)

    def put_file(
        self,
        storage: TenantStorage,
        path: str,
        parts: list[tuple[str, bytes]],
        expected_version: int = 0,
        writer: Writer = WRITER,
    ) -> Any:
        for chunk_hash, data in parts:
            self.ok(storage.chunk_put(top_of(path), chunk_hash, data))
        return storage.manifest_put(
            path,
            expected_version=expected_version,
            chunks=[ChunkRef(h, len(d)) for h, d in parts],
            size=sum(len(d) for _, d in parts),
            mode=0o644,
            mtime_ns=0,
            uid=0,
            gid=0,
            writer=writer,
        )

    def mkdir(self, storage: TenantStorage, path: str) -> None:
        self.ok(storage.dir_create(path, mode=0o755, uid=0, gid=0, writer=WRITER))

    def close(self) -> None:
        self.ok(self.engine.close())


class AccountBudgetTests(SynchronousTestCase):
    """
    The owner's account budget bounds new chunk bytes across all its tenants.
    """

    def setUp(self) -> None:
        self.f = EngineFixture(self)
        self.addCleanup(self.f.close)

    def test_budget_to_the_byte(self) -> None:
        """Filling the budget exactly succeeds; one more byte of new data is EDQUOT."""
        storage = self.f.tenant()
        self.f.ok(self.f.engine.set_account_budget("acme", 1000))
        h1, d1 = blob("one", 600)
        h2, d2 = blob("two", 400)
        h3, d3 = blob("three", 1)
        self.f.ok(storage.chunk_put("a1", h1, d1))
        self.f.ok(storage.chunk_put("a1", h2, d2))
        failure = self.failureResultOf(storage.chunk_put("a1", h3, d3), QuotaExceeded)
        self.assertEqual(failure.value.errno, WireErrno.EDQUOT)
        self.assertEqual(self.f.ok(storage.chunk_has([h3])).absent, (h3,))

    def test_dedup_costs_nothing(self) -> None:
        """Re-uploading a stored chunk at a full budget succeeds as deduplicated."""
        storage = self.f.tenant()
        h1, d1 = blob("one", 500)
        self.f.ok(storage.chunk_put("a1", h1, d1))
        self.f.ok(self.f.engine.set_account_budget("acme", 500))
        result = self.f.ok(storage.chunk_put("a1", h1, d1))
        self.assertTrue(result.deduped)

    def test_budget_spans_tenants(self) -> None:
        """Bytes in one tenant of the owner count against another tenant's uploads."""
        self.f.ok(self.f.engine.set_account_budget("acme", 1000))
        own = self.f.tenant(ACME)
        labs = self.f.tenant(ACME_LABS)
        h1, d1 = blob("one", 700)
        h2, d2 = blob("two", 301)
        self.f.ok(own.chunk_put("a1", h1, d1))
        self.failureResultOf(labs.chunk_put("a1", h2, d2), QuotaExceeded)
        self.assertEqual(self.f.ok(self.f.engine.account_usage("acme")), 700)

    def test_budget_persists(self) -> None:
        """A budget set once applies to an engine opened later on the same root."""
        self.f.ok(self.f.engine.set_account_budget("acme", 10))
        self.f.close()
        again = EngineFixture(self, self.f.root)
        self.addCleanup(again.close)
        h1, d1 = blob("one", 11)
        self.failureResultOf(again.tenant().chunk_put("a1", h1, d1), QuotaExceeded)

    def test_existing_tenant_counted_after_restart(self) -> None:
        """After a restart, a tenant not yet opened still counts against the account."""
        labs = self.f.tenant(ACME_LABS)
        h1, d1 = blob("one", 700)
        self.f.ok(labs.chunk_put("a1", h1, d1))
        self.f.ok(self.f.engine.set_account_budget("acme", 1000))
        self.f.close()
        again = EngineFixture(self, self.f.root)
        self.addCleanup(again.close)
        h2, d2 = blob("two", 301)
        self.failureResultOf(again.tenant(ACME).chunk_put("a1", h2, d2), QuotaExceeded)


class _SlowTotals:
    """A chunk store stand-in whose total is never reported (only L{total_bytes})."""

    def total_bytes(self) -> Deferred[int]:
        return Deferred()


class OwnerAccountReservationTests(SynchronousTestCase):
    """L{OwnerAccount.reserve}: the budget check, and none without a budget."""

    def test_without_a_budget_nothing_is_summed_or_waited_for(self) -> None:
        """
        With no budget a reservation is granted at once, without asking the
        stores for their totals (the upload path's cost), and still counts.
        """
        account = OwnerAccount("acme", None)
        account.add_store(cast(Any, _SlowTotals()))
        self.successResultOf(account.reserve(100))
        account.budget_bytes = 150
        checked = account.reserve(60)
        # With a budget, the totals are asked for (never answered here).
        self.assertNoResult(checked)

    def test_a_budget_set_later_sees_reservations_made_without_one(self) -> None:
        """Bytes reserved while there was no budget count once a budget applies."""
        account = OwnerAccount("acme", None)
        self.successResultOf(account.reserve(100))
        account.budget_bytes = 150
        self.failureResultOf(account.reserve(60), QuotaExceeded)
        account.release(100)
        self.successResultOf(account.reserve(60))


class ManifestRulesTests(SynchronousTestCase):
    """
    Manifest changes are checked against the chunk store, grants and leases.
    """

    def setUp(self) -> None:
        self.f = EngineFixture(self)
        self.addCleanup(self.f.close)
        self.storage = self.f.tenant()
        self.f.mkdir(self.storage, "/a1")

    def test_missing_chunk_refused(self) -> None:
        """A manifest naming a chunk the store lacks fails with the hash and writes nothing."""
        h1, d1 = blob("one", 10)
        self.f.ok(self.storage.chunk_put("a1", h1, d1))
        h2, _ = blob("two", 10)
        failure = self.failureResultOf(
            self.storage.manifest_put(
                "/a1/f",
                expected_version=0,
                chunks=[ChunkRef(h1, 10), ChunkRef(h2, 10)],
                size=20,
                mode=0o644,
                mtime_ns=0,
                uid=0,
                gid=0,
                writer=WRITER,
            ),
            MissingChunks,
        )
        self.assertEqual(failure.value.hashes, (h2,))
        self.failureResultOf(self.storage.manifest_get("/a1/f"), NotFound)

    def test_cas(self) -> None:
        """A put from a stale version is ESTALE carrying the current version and writer."""
        part = blob("one", 10)
        self.assertEqual(self.f.ok(self.f.put_file(self.storage, "/a1/f", [part])).version, 1)
        failure = self.failureResultOf(
            self.f.put_file(self.storage, "/a1/f", [part], expected_version=0), StaleVersion
        )
        self.assertEqual(failure.value.current_version, 1)
        self.assertEqual(failure.value.last_writer.agent_id, "a1")

    def test_grant_to_the_byte(self) -> None:
        """
        An agent's files may reach its grant exactly; a shared chunk counts
        once; a commit of one byte more fails with EDQUOT and changes nothing.
        """
        self.f.ok(self.f.engine.set_agent_grant(ACME, "a1", 100))
        p60 = blob("sixty", 60)
        p40 = blob("forty", 40)
        self.f.ok(self.f.put_file(self.storage, "/a1/f", [p60]))
        # The same chunk again in a second file costs nothing.
        self.f.ok(self.f.put_file(self.storage, "/a1/g", [p60, p40]))
        self.assertEqual(self.f.ok(self.storage.agent_usage("a1")), 100)
        one = blob("one byte", 1)
        failure = self.failureResultOf(self.f.put_file(self.storage, "/a1/h", [one]), QuotaExceeded)
        self.assertEqual(failure.value.errno, WireErrno.EDQUOT)
        self.assertEqual(self.f.ok(self.storage.agent_usage("a1")), 100)

    def test_uploads_to_the_byte(self) -> None:
        """
        Uploads not yet committed may reach the grant exactly (beside full
        files); the upload of one byte more fails with EDQUOT and stores nothing.
        """
        self.f.ok(self.f.engine.set_agent_grant(ACME, "a1", 100))
        self.f.ok(self.f.put_file(self.storage, "/a1/f", [blob("full", 100)]))
        self.f.ok(self.storage.chunk_put("a1", *blob("sixty", 60)))
        self.f.ok(self.storage.chunk_put("a1", *blob("forty", 40)))
        one = blob("one byte", 1)
        failure = self.failureResultOf(self.storage.chunk_put("a1", *one), QuotaExceeded)
        self.assertEqual(failure.value.errno, WireErrno.EDQUOT)
        self.assertFalse(self.f.ok(self.storage.chunks.has([one[0]])).present)

    def test_grant_allows_shrinking(self) -> None:
        """
        An agent over a lowered grant can still truncate and delete files,
        and once back under it write again; its files cannot grow before.
        """
        big = blob("big", 100)
        self.f.ok(self.f.put_file(self.storage, "/a1/f", [big]))
        self.f.ok(self.f.put_file(self.storage, "/a1/g", [blob("other", 30)]))
        self.f.ok(self.f.engine.set_agent_grant(ACME, "a1", 50))
        small = blob("small", 20)
        self.failureResultOf(self.f.put_file(self.storage, "/a1/h", [small]), QuotaExceeded)
        truncated = self.storage.setattr("/a1/f", writer=WRITER, size=0)
        self.assertEqual(self.f.ok(truncated).attributes.size, 0)
        # Past the retained cap at once: collectable, reclaimed soon after.
        self.f.clock.advance(1)
        result = self.f.ok(self.f.put_file(self.storage, "/a1/f", [small], expected_version=2))
        self.assertEqual(result.version, 3)
        self.f.ok(self.storage.manifest_delete("/a1/g", writer=WRITER))

    def test_write_lease_contention(self) -> None:
        """A put from a non-holder while another holds the write lease is ESTALE and revokes."""
        alice = LeaseHolder("a1", "conn-alice", WRITER.session_id)
        bob = LeaseHolder("a1", "conn-bob", None)
        grant = self.f.ok(self.storage.leases.grant("/a1/f", LeaseMode.WRITE, alice))
        self.assertEqual(grant.mode, LeaseMode.WRITE)
        part = blob("one", 10)
        self.f.ok(self.storage.chunk_put("a1", *part))
        d = self.storage.manifest_put(
            "/a1/f",
            expected_version=0,
            chunks=[ChunkRef(part[0], 10)],
            size=10,
            mode=0o644,
            mtime_ns=0,
            uid=0,
            gid=0,
            writer=WRITER,
            holder=bob,
        )
        failure = self.failureResultOf(d, WriteLeaseHeld)
        self.assertEqual(failure.value.errno, WireErrno.ESTALE)
        self.assertEqual(
            [(r.holder, str(r.reason)) for _, r in self.f.revokes],
            [(alice, "manifest_put_contention")],
        )


class CollectionTests(SynchronousTestCase):
    """
    Garbage collection and purge delete exactly what nothing needs.
    """

    def setUp(self) -> None:
        self.f = EngineFixture(self)
        self.addCleanup(self.f.close)
        self.storage = self.f.tenant()
        self.f.mkdir(self.storage, "/a1")
        self.f.mkdir(self.storage, "/a2")

    def sweep(self, dry_run: bool = False) -> SweepReport:
        report: SweepReport = self.f.ok(self.storage.sweep(dry_run=dry_run))
        return report

    def stored(self) -> set[str]:
        return {c.hash for c in self.f.ok(self.storage.chunks.list_chunks())}

    def test_grace_protects_fresh_uploads(self) -> None:
        """
        A chunk uploaded within the grace period survives a sweep (its
        upload is charged); so does a chunk stored without an upload on
        record (kept young).
        """
        h, d = blob("orphan", 10)
        self.f.ok(self.storage.chunk_put("a1", h, d))
        unrecorded = blob("unrecorded", 10)
        self.f.ok(self.storage.chunks.put(*unrecorded))
        report = self.sweep()
        self.assertEqual((report.count, report.kept_young), (0, 1))
        self.assertEqual({h, unrecorded[0]}, self.stored())

    def test_sweep_and_dry_run(self) -> None:
        """Old unreferenced chunks are counted by a dry run, then deleted; referenced ones stay."""
        kept = blob("kept", 10)
        self.f.ok(self.f.put_file(self.storage, "/a1/f", [kept]))
        h, d = blob("orphan", 25)
        self.f.ok(self.storage.chunk_put("a1", h, d))
        self.f.clock.advance(GRACE + 1)
        dry = self.sweep(dry_run=True)
        self.assertEqual((dry.count, dry.bytes_freed, dry.dry_run), (1, 25, True))
        self.assertIn(h, self.stored())
        real = self.sweep()
        self.assertEqual((real.count, real.bytes_freed, real.dry_run), (1, 25, False))
        self.assertEqual(self.stored(), {kept[0]})

    def test_journal_retention_keeps_old_versions(self) -> None:
        """Chunks of an overwritten version stay while the journal row is retained."""
        v1 = blob("v1", 10)
        v2 = blob("v2", 10)
        self.f.ok(self.f.put_file(self.storage, "/a1/f", [v1]))
        self.f.ok(self.f.put_file(self.storage, "/a1/f", [v2], expected_version=1))
        self.f.clock.advance(GRACE + 1)
        self.assertEqual(self.sweep().count, 0)
        self.assertIn(v1[0], self.stored())
        self.f.clock.advance(RETENTION)
        self.assertEqual(self.sweep().count, 1)
        self.assertEqual(self.stored(), {v2[0]})

    def test_revert_restores_exact_bytes(self) -> None:
        """Reverting a delete brings back the same chunks, readable byte for byte."""
        part = blob("precious", 64)
        self.f.ok(self.f.put_file(self.storage, "/a1/f", [part]))
        removed = self.f.ok(self.storage.manifest_delete("/a1/f", writer=WRITER))
        self.f.clock.advance(GRACE + 1)
        self.sweep()
        result = self.f.ok(self.storage.journal_revert("/a1/f", removed.journal_seq, writer=WRITER))
        self.assertIsNotNone(result.restored)
        manifest = self.f.ok(self.storage.manifest_get("/a1/f"))
        data = b"".join(self.f.ok(self.storage.chunk_get(c.hash)).data for c in manifest.chunks)
        self.assertEqual(data, part[1])

    def test_revert_refused_when_chunks_gone(self) -> None:
        """A revert needing a chunk the store no longer holds is ChunksCollected, no change."""
        part = blob("gone", 64)
        self.f.ok(self.f.put_file(self.storage, "/a1/f", [part]))
        removed = self.f.ok(self.storage.manifest_delete("/a1/f", writer=WRITER))
        self.f.ok(self.storage.chunks.delete([part[0]]))
        failure = self.failureResultOf(
            self.storage.journal_revert("/a1/f", removed.journal_seq, writer=WRITER),
            ChunksCollected,
        )
        self.assertEqual(failure.value.hashes, (part[0],))
        self.failureResultOf(self.storage.manifest_get("/a1/f"), NotFound)

    def test_revert_after_retention_is_not_found(self) -> None:
        """Past the retention window the journal row and its chunks are gone together."""
        part = blob("old", 64)
        self.f.ok(self.f.put_file(self.storage, "/a1/f", [part]))
        removed = self.f.ok(self.storage.manifest_delete("/a1/f", writer=WRITER))
        self.f.clock.advance(GRACE + RETENTION + 1)
        self.assertEqual(self.sweep().count, 1)
        self.failureResultOf(
            self.storage.journal_revert("/a1/f", removed.journal_seq, writer=WRITER), NotFound
        )

    def test_purge(self) -> None:
        """Purge removes the agent's subtree and only the chunks nobody else references."""
        shared = blob("shared", 30)
        mine = blob("mine", 20)
        self.f.ok(self.f.put_file(self.storage, "/a1/f", [shared, mine]))
        self.f.mkdir(self.storage, "/a1/d")
        self.f.ok(self.f.put_file(self.storage, "/a2/g", [shared], writer=Writer("a2", None)))
        report = self.f.ok(self.storage.purge_agent("a1"))
        self.assertEqual((report.count, report.bytes_freed), (3, 20))
        self.failureResultOf(self.storage.manifest_get("/a1"), NotFound)
        self.assertEqual(self.stored(), {shared[0]})
        self.assertEqual(self.f.ok(self.storage.manifest_get("/a2/g")).attributes.size, 30)


class CommitGateRuleTests(SynchronousTestCase):
    """
    Commits hold the tenant's commit gate shared, GC sweeps and purges
    exclusively (L{svc.store.commit_gate}); the database worker runs only
    when the test says so.
    """

    def setUp(self) -> None:
        self.database = ManualWorker()
        self.f = EngineFixture(self, db_worker=self.database)
        opened = self.f.engine.tenant(ACME)
        self.database.run()
        self.storage: TenantStorage = self.f.ok(opened)
        for name in ("a1", "a2", "a3", "a4"):
            made = self.storage.dir_create(f"/{name}", mode=0o755, uid=0, gid=0, writer=WRITER)
            self.database.run()
            self.f.ok(made)
        self.finished: list[str] = []

    def tearDown(self) -> None:
        closed = self.f.engine.close()
        self.database.run()
        self.f.ok(closed)

    def upload(self, name: str) -> None:
        uploaded = self.storage.chunk_put(name, *blob(name, 10))
        self.database.run()
        self.f.ok(uploaded)

    def put(self, name: str) -> None:
        part = blob(name, 10)
        done = self.storage.manifest_put(
            f"/{name}/f",
            expected_version=0,
            chunks=[ChunkRef(part[0], 10)],
            size=10,
            mode=0o644,
            mtime_ns=0,
            uid=0,
            gid=0,
            writer=Writer(name, None),
        )
        done.addCallback(lambda _: self.finished.append(name))

    def test_commits_share_a_transaction_and_a_sweep_waits_for_them(self) -> None:
        """
        Three agents' commits do not wait for each other: the first runs
        alone, the two behind it share the next transaction. A sweep asked
        for meanwhile starts only after all three; a commit asked for while
        the sweep waits queues behind it (a stream of commits cannot starve
        a sweep).
        """
        for name in ("a1", "a2", "a3", "a4"):
            self.upload(name)
        for name in ("a1", "a2", "a3"):
            self.put(name)
        swept = self.storage.sweep()
        swept.addCallback(lambda _: self.finished.append("sweep"))
        self.put("a4")
        self.database.run_one()
        self.assertEqual(self.finished, ["a1"])
        self.database.run_one()
        self.assertEqual(self.finished, ["a1", "a2", "a3"])
        self.database.run()
        self.assertEqual(self.finished, ["a1", "a2", "a3", "sweep", "a4"])


class RecentChunksTests(SynchronousTestCase):
    """
    A chunk whose upload completed since the last deletion is not looked up
    again by a manifest change; a deletion or a corrupt read forgets it.
    """

    def setUp(self) -> None:
        self.f = EngineFixture(self)
        self.addCleanup(self.f.close)
        self.storage = self.f.tenant()
        self.f.mkdir(self.storage, "/a1")
        self.asked: list[str] = []
        store = self.storage.chunks
        has = store.has

        def counting(hashes: Any) -> Any:
            self.asked.extend(hashes)
            return has(hashes)

        store.has = counting  # type: ignore[method-assign]

    def put(self, part: tuple[str, bytes]) -> Any:
        return self.storage.manifest_put(
            "/a1/f",
            expected_version=0,
            chunks=[ChunkRef(part[0], len(part[1]))],
            size=len(part[1]),
            mode=0o644,
            mtime_ns=0,
            uid=0,
            gid=0,
            writer=WRITER,
        )

    def test_just_uploaded_is_not_asked(self) -> None:
        """A manifest naming a chunk just uploaded commits without asking the chunk store."""
        part = blob("fresh", 10)
        self.f.ok(self.storage.chunk_put("a1", *part))
        self.f.ok(self.put(part))
        self.assertEqual(self.asked, [])

    def test_swept_chunk_is_missing(self) -> None:
        """A chunk a sweep deleted after its upload is asked about and refused."""
        part = blob("swept", 10)
        self.f.ok(self.storage.chunk_put("a1", *part))
        self.f.clock.advance(GRACE + 1)
        self.assertEqual(self.f.ok(self.storage.sweep()).count, 1)
        failure = self.failureResultOf(self.put(part), MissingChunks)
        self.assertEqual((failure.value.hashes, self.asked), ((part[0],), [part[0]]))

    def test_purged_chunk_is_missing(self) -> None:
        """A chunk a purge deleted after another upload of it is asked about and refused."""
        part = blob("purged", 10)
        self.f.ok(self.f.put_file(self.storage, "/a1/g", [part]))
        self.f.mkdir(self.storage, "/a2")
        self.f.ok(self.storage.purge_agent("a1"))
        failure = self.failureResultOf(
            self.storage.manifest_put(
                "/a2/f",
                expected_version=0,
                chunks=[ChunkRef(part[0], 10)],
                size=10,
                mode=0o644,
                mtime_ns=0,
                uid=0,
                gid=0,
                writer=Writer("a2", None),
            ),
            MissingChunks,
        )
        self.assertEqual(failure.value.hashes, (part[0],))

    def test_corrupt_chunk_is_asked_again(self) -> None:
        """A chunk withdrawn as corrupt by a read is asked about (and refused) again."""
        part = blob("corrupt", 10)
        self.f.ok(self.storage.chunk_put("a1", *part))
        store = cast(FilesystemChunkStore, self.storage.chunks)
        chunk_path(store.objects_dir, part[0]).write_bytes(b"x" * 10)
        self.failureResultOf(self.storage.chunk_get(part[0]), CorruptStoredChunk)
        self.failureResultOf(self.put(part), MissingChunks)
        self.assertEqual(self.asked, [part[0]])


class CollectionPropertyTests(SynchronousTestCase):
    """
    Whatever the history, a sweep keeps every chunk a live file or retained
    journal row needs and deletes every other old chunk.
    """

    @settings(max_examples=40, deadline=None)
    @given(
        st.lists(
            st.tuples(
                st.sampled_from(["put", "delete", "orphan", "age"]),
                st.integers(min_value=0, max_value=3),
                st.integers(min_value=0, max_value=5),
            ),
            max_size=25,
        )
    )
    def test_sweep_keeps_exactly_the_needed(self, steps: list[tuple[str, int, int]]) -> None:
        """After random puts, deletes, orphan uploads and ageing, a sweep is exact."""
        f = EngineFixture(self)
        try:
            storage = f.tenant()
            f.mkdir(storage, "/a1")
            versions: dict[int, int] = {}
            for op, file_no, content_no in steps:
                path = f"/a1/f{file_no}"
                if op == "put":
                    part = blob(f"c{content_no}", 8 + content_no)
                    result = f.ok(
                        f.put_file(storage, path, [part], expected_version=versions.get(file_no, 0))
                    )
                    versions[file_no] = result.version
                elif op == "delete" and file_no in versions:
                    f.ok(storage.manifest_delete(path, writer=WRITER))
                    del versions[file_no]
                elif op == "orphan":
                    f.ok(storage.chunk_put("a1", *blob(f"o{content_no}", 5)))
                elif op == "age":
                    f.clock.advance(GRACE * (content_no + 1) * 20)
            f.clock.advance(GRACE + 1)
            live = f.ok(storage.manifests.live_hashes())
            cutoff_ms = round((f.clock.seconds() - RETENTION) * 1000)
            journaled = f.ok(storage.manifests.journal_hashes_since(cutoff_ms))
            f.ok(storage.sweep())
            remaining = {c.hash for c in f.ok(storage.chunks.list_chunks())}
            self.assertTrue((live | journaled) <= remaining)
            self.assertEqual(remaining - (live | journaled), set())
        finally:
            f.close()
