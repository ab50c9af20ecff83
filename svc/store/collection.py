"""
Everything that deletes a tenant's chunks: the periodic GC sweep, the prompt
reclaim of collectable chunks, and the purge of an agent's disk
(``docs/specifications/storage-engine.md``, "Garbage collection",
"Reclaim", "Purge").

Each runs holding the tenant's commit gate exclusively
(L{svc.store.commit_gate}), so no manifest change is between its check of
the chunk store and its commit while chunks are deleted; and each tells the
tenant's L{svc.store.recent_chunks.RecentChunks} which chunks may be gone.
Every deletion from the chunk store is one batch reported to the
L{svc.store.observer.StoreObserver} (C{svc_chunk_batch_*} with
C{operation="delete"}).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from svc.store.chunks import ChunkDeleteResult, IChunkStore
from svc.store.commit_gate import CommitGate
from svc.store.footprint import FootprintPolicy
from svc.store.gc import PurgeReport, SweepReport, split_by_age, unreferenced
from svc.store.manifests import ManifestStore
from svc.store.observer import NoObserver, StoreObserver
from svc.store.reclaim import (
    MIN_RETRY_SECONDS,
    RECLAIM_BATCH,
    ReclaimOutcome,
    ReclaimSchedule,
    ScheduleClock,
)

T = TypeVar("T")

_NS_PER_SECOND = 1_000_000_000
_MS_PER_SECOND = 1000

#: Below any real timestamp: with it, "rows since" means every row.
_EVERY_ROW_MS = -(2**62)


class ForgetsChunks(Protocol):
    """What the collection tells the tenant's memory of stored chunks."""

    def forget(self, chunk_hash: str) -> None:
        """C{chunk_hash} may be gone."""

    def deleted(self) -> None:
        """Any chunk may be gone."""


class Collection:
    """
    The deletions of one tenant's chunks. Built by
    L{svc.store.tenant.TenantStorage}.

    @param grants: the tenant's agent grants now (read on the reactor).
    @param policy: the footprint limits (L{svc.store.footprint}).
    @param chunk_grace_seconds: how long an upload stays charged and
        protected, and how old an unrecorded chunk must be to be swept.
    @param journal_retention_seconds: how long journal rows are kept at most.
    @param margin_seconds: a collectable chunk written or touched less than
        this long ago is left for a later pass (a concurrent upload of the
        same content touches it: see L{reclaim_pass}).
    @param batch: the most chunks one reclaim pass deletes
        (L{RECLAIM_BATCH}).
    @param observer: told of every batched deletion.
    """

    _log = Logger()

    def __init__(
        self,
        tenant_id: str,
        chunks: IChunkStore,
        manifests: ManifestStore,
        gate: CommitGate,
        recent: ForgetsChunks,
        clock: ScheduleClock,
        clock_seconds: Callable[[], float],
        grants: Callable[[], Mapping[str, int]],
        policy: FootprintPolicy,
        *,
        chunk_grace_seconds: float,
        journal_retention_seconds: float,
        margin_seconds: float,
        batch: int = RECLAIM_BATCH,
        observer: StoreObserver | None = None,
    ) -> None:
        self.tenant_id = tenant_id
        self._observer: StoreObserver = observer if observer is not None else NoObserver()
        self._chunks = chunks
        self._manifests = manifests
        self._gate = gate
        self._recent = recent
        self._seconds = clock_seconds
        self._grants = grants
        self._policy = policy
        self._grace = chunk_grace_seconds
        self._retention = journal_retention_seconds
        self._margin = margin_seconds
        self._batch = batch
        self.schedule = ReclaimSchedule(
            self._gated_reclaim, clock, retry_seconds=max(margin_seconds, MIN_RETRY_SECONDS)
        )
        manifests.notify_collectable(self.schedule.request)

    def _deleting(self, work: Coroutine[Any, Any, T]) -> Deferred[T]:
        """Run ``work`` holding the commit gate alone."""

        async def gated() -> T:
            await self._gate.acquire_exclusive()
            try:
                return await work
            finally:
                self._gate.release_exclusive()

        return Deferred.fromCoroutine(gated())

    async def _delete(
        self, hashes: Sequence[str], modified_before_ns: int | None = None
    ) -> ChunkDeleteResult:
        """
        Delete C{hashes} from the chunk store as one batch, reported to the
        observer: its duration and size, and each item's result (C{deleted},
        C{missing}, C{error}; a chunk kept for being too young has no
        result). An empty batch deletes and reports nothing; a batch that
        fails as a whole counts every item as C{error}.
        """
        if not hashes:
            return ChunkDeleteResult((), (), (), (), 0)
        observer = self._observer
        started = self._seconds()
        try:
            result = await self._chunks.delete(hashes, modified_before_ns=modified_before_ns)
        except Exception:
            observer.observe_chunk_batch("delete", self._seconds() - started, len(hashes))
            observer.count_chunk_batch_items("delete", "error", len(hashes))
            raise
        observer.observe_chunk_batch("delete", self._seconds() - started, len(hashes))
        for outcome, items in (
            ("deleted", len(result.deleted)),
            ("missing", len(result.missing)),
            ("error", len(result.errors)),
        ):
            if items:
                observer.count_chunk_batch_items("delete", outcome, items)
        return result

    # Reclaim

    def _gated_reclaim(self) -> Deferred[ReclaimOutcome]:
        return self._deleting(self.reclaim_pass())

    async def reclaim_pass(self) -> ReclaimOutcome:
        """
        Delete up to C{batch} collectable chunks, oldest first, each unless
        its file was written or touched since C{margin_seconds} before the
        pass began; stop charging those gone. The caller holds the
        commit gate exclusively.

        Why the margin is safe: a collectable chunk is named by nothing, and
        a manifest change cannot start naming it meanwhile (the gate). An
        upload of the same content charges itself first (which removes the
        row), then touches the file: a touch that reaches the file before
        the deletion makes it too young to delete.
        """
        started = self._seconds()
        cutoff_ns = round((started - self._margin) * _NS_PER_SECOND)
        rows = await self._manifests.collectable_chunks(self._batch)
        if not rows:
            return ReclaimOutcome()
        result = await self._delete([h for h, _ in rows], modified_before_ns=cutoff_ns)
        for chunk_hash in result.deleted:
            self._recent.forget(chunk_hash)
        await self._manifests.forget_collectable([*result.deleted, *result.missing])
        if result.deleted:
            self._log.debug(
                "reclaimed {count} chunk(s), {bytes_freed} bytes in {tenant}",
                count=len(result.deleted),
                bytes_freed=result.bytes_freed,
                tenant=self.tenant_id,
            )
        return ReclaimOutcome(
            deleted=result.deleted,
            bytes_freed=result.bytes_freed,
            kept=len(result.kept) + len(result.errors),
            # Another full batch may wait, unless this one moved nothing
            # (it would read the same rows again at once).
            more=len(rows) == self._batch and bool(result.deleted or result.missing),
        )

    # Sweep

    def _journal_cutoff_ms(self, now: float) -> int:
        return round((now - self._retention) * _MS_PER_SECOND)

    def sweep(self, *, dry_run: bool = False) -> Deferred[SweepReport]:
        """
        One GC sweep: expire uploads older than the grace period, prune
        journal rows older than the retention and every agent's retained
        bytes past its cap; then delete the chunks that nothing references
        (no live file, journal row or charged upload) and that are older
        than the grace period, and reclaim every collectable chunk. With
        ``dry_run``, change nothing and count what the first deletion would
        take.
        """

        async def sweeping() -> SweepReport:
            now = self._seconds()
            grace_cutoff_ns = round((now - self._grace) * _NS_PER_SECOND)
            grace_cutoff_ms = grace_cutoff_ns // 1_000_000
            journal_cutoff_ms = self._journal_cutoff_ms(now)
            if dry_run:
                referenced = await self._referenced(journal_cutoff_ms)
                referenced |= await self._manifests.upload_hashes(since_ms=grace_cutoff_ms)
            else:
                await self._manifests.expire(
                    grace_cutoff_ms, journal_cutoff_ms, self._grants(), self._policy
                )
                referenced = await self._referenced(_EVERY_ROW_MS)
                referenced |= await self._manifests.upload_hashes()
            stored = await self._chunks.list_chunks()
            old, young = split_by_age(unreferenced(stored, referenced), grace_cutoff_ns)
            if dry_run:
                return SweepReport(
                    self.tenant_id, len(old), sum(c.size for c in old), True, len(young)
                )
            try:
                result = await self._delete(
                    [c.hash for c in old], modified_before_ns=grace_cutoff_ns
                )
            finally:
                self._recent.deleted()
            await self._manifests.forget_collectable(result.deleted)
            count, freed = len(result.deleted), result.bytes_freed
            spared = {c.hash for c in young} | set(result.kept)
            while True:
                reclaimed = await self.reclaim_pass()
                count += len(reclaimed.deleted)
                freed += reclaimed.bytes_freed
                spared.difference_update(reclaimed.deleted)
                if not reclaimed.more:
                    break
            if reclaimed.kept:
                self.schedule.request(max(self._margin, MIN_RETRY_SECONDS))
            return SweepReport(self.tenant_id, count, freed, False, len(spared))

        return self._deleting(sweeping())

    async def _referenced(self, journal_cutoff_ms: int) -> frozenset[str]:
        """Hashes a live file or a journal row at or after the cutoff references."""
        live = await self._manifests.live_hashes()
        journaled = await self._manifests.journal_hashes_since(journal_cutoff_ms)
        return live | journaled

    # Purge

    def purge(self, agent_id: str) -> Deferred[PurgeReport]:
        """
        Erase the agent's whole subtree, its journal rows and footprint
        rows, and the chunks they named that nothing else references (no
        live file, retained journal row or charged upload).
        """

        async def purging() -> PurgeReport:
            purged = await self._manifests.purge_subtree(agent_id)
            referenced = await self._referenced(self._journal_cutoff_ms(self._seconds()))
            referenced |= await self._manifests.upload_hashes()
            garbage = sorted(purged.hashes - referenced)
            try:
                result = await self._delete(garbage)
            finally:
                self._recent.deleted()
            await self._manifests.forget_collectable(result.deleted)
            return PurgeReport(self.tenant_id, agent_id, purged.count, result.bytes_freed)

        return self._deleting(purging())

    def close(self) -> Deferred[None]:
        """Run no more reclaim passes; fires once one in progress ended."""
        return self.schedule.stop()
