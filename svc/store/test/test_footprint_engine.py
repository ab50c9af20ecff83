"""
Tests for an agent's footprint through L{svc.store.tenant.TenantStorage}:
uploads charged to the grant, old versions pruned past the retained cap,
collectable chunks reclaimed soon after, and the bytes on disk within
C{(3 + r) * grant} whatever the agent does.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from svc.store.chunks import ChunkHashMismatch, ChunkPutResult
from svc.store.collection import Collection
from svc.store.commit_gate import CommitGate
from svc.store.errors import QuotaExceeded
from svc.store.footprint import Footprint, FootprintPolicy
from svc.store.manifest_values import ChunkRef, Writer
from svc.store.quota import QuotaUsage
from svc.store.recent_chunks import RecentChunks
from svc.store.tenant import TenantStorage
from svc.store.test.test_engine import ACME, GRACE, RETENTION, WRITER, EngineFixture, blob

KIB = 1024
GRANT = 64 * KIB
BOUND = 4 * GRANT


class _Agent:
    """One agent (a1) of a tenant with a grant, driven step by step."""

    def __init__(
        self,
        case: SynchronousTestCase,
        grant: int | None = GRANT,
        policy: FootprintPolicy | None = None,
        root: Path | None = None,
    ) -> None:
        self.case = case
        self.f = EngineFixture(case, root=root, footprint=policy)
        case.addCleanup(self.f.close)
        self.storage: TenantStorage = self.f.tenant()
        if root is None:
            self.f.mkdir(self.storage, "/a1")
        if grant is not None:
            self.f.ok(self.f.engine.set_agent_grant(ACME, "a1", grant))
        self.versions: dict[str, int] = {}
        self.counter = 0

    def part(self, size: int) -> tuple[str, bytes]:
        self.counter += 1
        return blob(f"part {self.counter}", size)

    def settle(self, deferred: Deferred[Any]) -> Any:
        """
        Its result (raising its failure), letting the clock run if an upload
        waits for a reclaim pass.
        """
        if not deferred.called:
            self.f.clock.advance(10)
        outcome: list[Any] = []
        deferred.addBoth(outcome.append)
        [result] = outcome
        if isinstance(result, Failure):
            result.raiseException()
        return result

    def upload(self, part: tuple[str, bytes]) -> ChunkPutResult:
        result: ChunkPutResult = self.settle(self.storage.chunk_put("a1", *part))
        return result

    def write(self, name: str, *sizes: int) -> None:
        parts = [self.part(size) for size in sizes]
        for part in parts:
            self.upload(part)
        path = f"/a1/{name}"
        result = self.f.ok(
            self.storage.manifest_put(
                path,
                expected_version=self.versions.get(path, 0),
                chunks=[ChunkRef(h, len(d)) for h, d in parts],
                size=sum(len(d) for _, d in parts),
                mode=0o644,
                mtime_ns=0,
                uid=0,
                gid=0,
                writer=WRITER,
            )
        )
        self.versions[path] = result.version

    def usage(self) -> QuotaUsage:
        usage: QuotaUsage = self.f.ok(self.storage.quota_usage("a1"))
        return usage

    def footprint(self) -> Footprint:
        footprint: Footprint = self.f.ok(self.storage.manifests.footprint("a1"))
        return footprint

    def on_disk(self) -> int:
        total: int = self.f.ok(self.storage.chunks.total_bytes())
        return total


class UploadFootprintTests(SynchronousTestCase):
    """
    Uploads not committed count against the grant until committed or expired.
    """

    def test_uncommitted_uploads_bounded_by_grant(self) -> None:
        """An agent cannot store more than its grant in chunks it never commits."""
        agent = _Agent(self)
        stored = 0
        for _ in range(GRANT // (8 * KIB) + 4):
            deferred = agent.storage.chunk_put("a1", *agent.part(8 * KIB))
            if deferred.called and not isinstance(deferred.result, ChunkPutResult):
                self.failureResultOf(deferred, QuotaExceeded)
                continue
            agent.settle(deferred)
            stored += 8 * KIB
        self.assertEqual(stored, GRANT)
        self.assertEqual(agent.on_disk(), GRANT)
        usage = agent.usage()
        self.assertEqual((usage.used_bytes, usage.uncommitted_bytes), (0, GRANT))

    def test_committing_moves_uploads_to_files(self) -> None:
        """
        A commit naming the uploads moves them to the files, and the room
        for uploads is back: a full disk's file can be rewritten, but the
        new version cannot be committed beside the old one.
        """
        agent = _Agent(self)
        agent.write("f", 32 * KIB, 32 * KIB)
        self.assertEqual(agent.footprint(), Footprint(GRANT, 0, 0, 0))
        agent.write("f", 16 * KIB, 48 * KIB)
        self.assertEqual(agent.footprint().live_bytes, GRANT)
        part = agent.part(1)
        agent.upload(part)
        self.assertEqual(agent.footprint().uncommitted_bytes, 1)
        beside = agent.storage.manifest_put(
            "/a1/g",
            expected_version=0,
            chunks=[ChunkRef(part[0], 1)],
            size=1,
            mode=0o644,
            mtime_ns=0,
            uid=0,
            gid=0,
            writer=WRITER,
        )
        self.failureResultOf(beside, QuotaExceeded)

    def test_failed_upload_takes_its_charge_back(self) -> None:
        """Bytes that do not match their hash store nothing and leave nothing charged."""
        agent = _Agent(self)
        chunk_hash, _ = agent.part(100)
        self.failureResultOf(
            agent.storage.chunk_put("a1", chunk_hash, b"x" * 100), ChunkHashMismatch
        )
        self.assertEqual(agent.footprint(), Footprint())
        self.assertEqual(agent.on_disk(), 0)

    def test_overlapping_upload_keeps_the_charge(self) -> None:
        """A failed upload of a chunk another upload of the agent stored does not uncharge it."""
        agent = _Agent(self)
        part = agent.part(100)
        good = agent.storage.chunk_put("a1", *part)
        bad = agent.storage.chunk_put("a1", part[0], b"y" * 100)
        agent.settle(good)
        self.failureResultOf(bad, ChunkHashMismatch)
        self.assertEqual(agent.footprint(), Footprint(0, 100, 0, 0))

    def test_expired_uploads_are_swept(self) -> None:
        """Past the grace period a sweep stops charging uploads and deletes their chunks."""
        agent = _Agent(self)
        agent.upload(agent.part(5000))
        agent.write("f", 1000)
        agent.f.clock.advance(GRACE + 1)
        report = agent.f.ok(agent.storage.sweep())
        self.assertEqual((report.count, report.bytes_freed), (1, 5000))
        self.assertEqual(agent.footprint(), Footprint(1000, 0, 0, 0))
        self.assertEqual(agent.on_disk(), 1000)

    def test_usage_reports_every_part(self) -> None:
        """The usage an agent is told has its footprint by part, its cap and its bound."""
        agent = _Agent(self)
        agent.write("f", 1000)
        agent.write("f", 2000)
        agent.upload(agent.part(300))
        self.assertEqual(
            agent.usage(),
            QuotaUsage(
                used_bytes=2000,
                grant_bytes=GRANT,
                account_used_bytes=None,
                budget_bytes=None,
                uncommitted_bytes=300,
                retained_bytes=1000,
                collectable_bytes=0,
                retained_cap_bytes=GRANT,
                footprint_bound_bytes=BOUND,
            ),
        )
        self.assertEqual(agent.usage().available_bytes, GRANT - 2000)


class RetainedFootprintTests(SynchronousTestCase):
    """
    Old versions are kept up to the retained cap; what is pruned past it is
    reclaimed soon after.
    """

    def test_rewrites_bounded(self) -> None:
        """A file rewritten a hundred times never takes more than (3 + r) * grant on disk."""
        agent = _Agent(self)
        peak = 0
        for _ in range(100):
            agent.write("f", 16 * KIB, 16 * KIB)
            peak = max(peak, agent.on_disk())
            footprint = agent.footprint()
            self.assertLessEqual(footprint.retained_bytes, GRANT)
            self.assertGreaterEqual(footprint.total_bytes, agent.on_disk())
        self.assertLessEqual(peak, BOUND)
        agent.f.clock.advance(10)
        self.assertEqual(agent.footprint().collectable_bytes, 0)
        self.assertLessEqual(agent.on_disk(), 2 * GRANT)

    def test_reclaim_follows_pruning(self) -> None:
        """Chunks a change pruned are deleted by the pass that follows, and stop counting."""
        agent = _Agent(self)
        for _ in range(4):
            agent.write("f", GRANT // 2)
        self.assertEqual(agent.footprint(), Footprint(GRANT // 2, 0, GRANT, GRANT // 2))
        agent.f.clock.advance(10)
        self.assertEqual(agent.footprint(), Footprint(GRANT // 2, 0, GRANT, 0))
        self.assertEqual(agent.on_disk(), GRANT * 3 // 2)

    def test_uploads_wait_for_reclaim(self) -> None:
        """An upload of new bytes waits while the agent's collectable bytes pass its grant."""
        agent = _Agent(self)
        for name in ("f", "g", "h"):
            agent.write(name, GRANT // 4)
        for name in ("f", "g", "h"):
            agent.f.ok(agent.storage.manifest_delete(f"/a1/{name}", writer=WRITER))
        agent.f.ok(agent.f.engine.set_agent_grant(ACME, "a1", GRANT // 2))
        self.assertEqual(agent.footprint().collectable_bytes, GRANT // 4)
        agent.f.ok(agent.f.engine.set_agent_grant(ACME, "a1", GRANT // 8))
        self.assertEqual(agent.footprint().collectable_bytes, GRANT * 3 // 4)
        held = agent.storage.chunk_put("a1", *agent.part(10))
        self.assertNoResult(held)
        agent.f.clock.advance(10)
        self.successResultOf(held)
        self.assertEqual(agent.footprint(), Footprint(0, 10, 0, 0))
        self.assertEqual(agent.on_disk(), 10)

    def test_reclaim_batches_make_progress(self) -> None:
        """
        A full batch of chunks too young to delete ends the pass (no pass
        reads the same rows again at once); once they are old enough, full
        batches follow each other until none is left.
        """
        agent = _Agent(self)
        storage = agent.storage
        agent.f.ok(storage.collection.close())  # its own passes would interfere
        for name in ("f", "g", "h"):
            agent.write(name, 100)
            agent.f.ok(storage.manifest_delete(f"/a1/{name}", writer=WRITER))
        collection = Collection(
            "acme",
            storage.chunks,
            storage.manifests,
            CommitGate(),
            RecentChunks(),
            agent.f.clock,
            agent.f.clock.seconds,
            dict,
            FootprintPolicy(),
            chunk_grace_seconds=GRACE,
            journal_retention_seconds=RETENTION,
            margin_seconds=5.0,
            batch=2,
        )
        agent.f.ok(collection.close())  # passes run by hand here
        agent.f.ok(agent.f.engine.set_agent_grant(ACME, "a1", 0))
        self.assertEqual(agent.footprint().collectable_bytes, 300)
        young = agent.f.ok(Deferred.fromCoroutine(collection.reclaim_pass()))
        self.assertEqual((young.deleted, young.kept, young.more), ((), 2, False))
        agent.f.clock.advance(10)
        first = agent.f.ok(Deferred.fromCoroutine(collection.reclaim_pass()))
        second = agent.f.ok(Deferred.fromCoroutine(collection.reclaim_pass()))
        self.assertEqual((len(first.deleted), first.more), (2, True))
        self.assertEqual((len(second.deleted), second.more), (1, False))
        self.assertEqual(agent.footprint().collectable_bytes, 0)

    def test_without_a_grant_the_default_applies(self) -> None:
        """An agent without a grant retains at most the server's default."""
        agent = _Agent(self, grant=None, policy=FootprintPolicy(ungranted_bytes=GRANT))
        for _ in range(10):
            agent.write("f", GRANT // 2)
        agent.f.clock.advance(10)
        self.assertEqual(agent.footprint(), Footprint(GRANT // 2, 0, GRANT, 0))
        self.assertIsNone(agent.usage().footprint_bound_bytes)

    def test_sweep_prunes_past_a_lowered_cap(self) -> None:
        """
        After a restart with a lower retention factor, the first sweep brings
        every agent within its new cap.
        """
        agent = _Agent(self)
        for _ in range(3):
            agent.write("f", GRANT // 4)
        self.assertEqual(agent.footprint(), Footprint(GRANT // 4, 0, GRANT // 2, 0))
        agent.f.close()
        again = _Agent(
            self,
            grant=None,
            policy=FootprintPolicy(retention_factor=Fraction(1, 4)),
            root=agent.f.root,
        )
        again.f.clock.advance(10)
        self.assertEqual(again.footprint(), Footprint(GRANT // 4, 0, GRANT // 2, 0))
        again.f.ok(again.storage.sweep())
        self.assertEqual(again.footprint(), Footprint(GRANT // 4, 0, GRANT // 4, 0))
        self.assertEqual(again.on_disk(), GRANT // 2)


class FootprintBoundTests(SynchronousTestCase):
    """
    Whatever an agent does, its bytes on disk stay within its bound and are
    all charged to it.
    """

    @settings(max_examples=25, deadline=None)
    @given(
        st.lists(
            st.tuples(
                st.sampled_from(["write", "upload", "delete", "truncate", "wait", "sweep"]),
                st.integers(min_value=0, max_value=2),
                st.integers(min_value=1, max_value=GRANT // 2),
            ),
            max_size=30,
        )
    )
    def test_bound_holds(self, steps: list[tuple[str, int, int]]) -> None:
        """After every step: disk <= charged <= (3 + r) * grant, each part within its limit."""
        agent = _Agent(self)
        try:
            for op, file_no, size in steps:
                path = f"/a1/f{file_no}"
                if op == "write":
                    try:
                        agent.write(f"f{file_no}", size)
                    except QuotaExceeded:
                        pass
                elif op == "upload":
                    agent.storage.chunk_put("a1", *agent.part(size)).addErrback(
                        lambda failure: failure.trap(QuotaExceeded)
                    )
                elif op == "delete" and path in agent.versions:
                    agent.f.ok(agent.storage.manifest_delete(path, writer=WRITER))
                    del agent.versions[path]
                elif op == "truncate" and path in agent.versions:
                    result = agent.f.ok(agent.storage.setattr(path, writer=WRITER, size=0))
                    agent.versions[path] = result.attributes.version
                elif op == "wait":
                    agent.f.clock.advance(size / 1000)
                elif op == "sweep":
                    agent.f.ok(agent.storage.sweep())
                footprint = agent.footprint()
                # Each bounded by the grant, not together (storage-engine.md:
                # a full disk's files can still be rewritten).
                self.assertLessEqual(footprint.live_bytes, GRANT)
                self.assertLessEqual(footprint.uncommitted_bytes, GRANT)
                self.assertLessEqual(footprint.retained_bytes, GRANT)
                self.assertLessEqual(agent.on_disk(), footprint.total_bytes)
                self.assertLessEqual(footprint.total_bytes, BOUND)
        finally:
            agent.f.close()

    def test_another_agent_is_not_slowed(self) -> None:
        """One agent's collectable backlog does not hold another agent's uploads."""
        agent = _Agent(self)
        agent.f.mkdir(agent.storage, "/a2")
        for _ in range(4):
            agent.write("f", GRANT // 4)
        agent.f.ok(agent.storage.manifest_delete("/a1/f", writer=WRITER))
        agent.f.ok(agent.f.engine.set_agent_grant(ACME, "a1", GRANT // 4))
        self.assertEqual(agent.footprint(), Footprint(0, 0, GRANT // 4, GRANT * 3 // 4))
        other = agent.storage.chunk_put("a2", *agent.part(10))
        self.successResultOf(other)
        held = agent.storage.chunk_put("a1", *agent.part(10))
        self.assertNoResult(held)
        agent.f.clock.advance(10)
        self.successResultOf(held)
        self.assertEqual(Writer("a2", None).agent_id, "a2")
