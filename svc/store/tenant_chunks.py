"""
One tenant storage's chunk uploads and reads.

An upload (``docs/specifications/storage-engine.md``, "When EDQUOT is
returned", "Uncommitted uploads") is charged to its agent first
(C{routes.db}, L{svc.store.footprint_rows.charge_upload}), waiting for the
next reclaim pass while the agent's collectable bytes are past their limit;
one that stores bytes new to the chunk store reserves them against the
owner's account (L{svc.store.owner_account.OwnerAccount}); an upload that
fails takes its charge back when no other upload of the chunk by the agent
needs it (L{svc.store.uploads_in_flight}); a stored chunk is remembered as
present (L{svc.store.recent_chunks.RecentChunks}). A read that finds a
chunk corrupt or missing forgets it there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from twisted.internet.defer import Deferred, fail
from twisted.python.failure import Failure

from svc.store.chunks import ChunkData, ChunkPutResult, CorruptStoredChunk, IChunkStore
from svc.store.errors import InvalidArgument, NotFound
from svc.store.footprint import CollectionBacklog, FootprintPolicy
from svc.store.manifest_values import ChunkRef
from svc.store.manifests import ManifestStore
from svc.store.owner_account import OwnerAccount
from svc.store.recent_chunks import RecentChunks
from svc.store.uploads_in_flight import UploadsInFlight


class TenantChunks:
    """
    The chunk uploads and reads of one tenant. Built by
    L{svc.store.tenant.TenantStorage}.

    @param grants: the tenant's agent grants now (read on the reactor).
    @param policy: the footprint limits (L{svc.store.footprint}).
    @param next_reclaim: fires once a reclaim pass that starts after the
        call has finished (L{svc.store.reclaim.ReclaimSchedule.next_pass}).
    @param recent: told of every chunk stored, and of every chunk a read
        found gone.
    """

    def __init__(
        self,
        chunks: IChunkStore,
        manifests: ManifestStore,
        account: OwnerAccount,
        grants: Callable[[], Mapping[str, int]],
        policy: FootprintPolicy,
        next_reclaim: Callable[[], Deferred[None]],
        recent: RecentChunks,
    ) -> None:
        self._chunks = chunks
        self._manifests = manifests
        self._account = account
        self._grants = grants
        self._policy = policy
        self._next_reclaim = next_reclaim
        self._recent = recent
        self._uploading = UploadsInFlight()

    def put(
        self, agent_id: str, chunk_hash: str, data: bytes | memoryview
    ) -> Deferred[ChunkPutResult]:
        """
        Store a chunk uploaded by ``agent_id``
        (L{svc.store.tenant.TenantStorage.chunk_put}).
        """

        try:
            chunk = ChunkRef(chunk_hash, len(data))
        except InvalidArgument:
            return fail()

        async def put() -> ChunkPutResult:
            self._uploading.started(agent_id, chunk_hash)
            try:
                recorded = await self._charge(agent_id, chunk)
            except BaseException:
                self._uploading.failed(agent_id, chunk_hash)
                raise
            try:
                result = await self._store(chunk, data)
            except BaseException:
                if self._uploading.failed(agent_id, chunk_hash) and recorded:
                    # Queued now: an upload starting later charges afresh.
                    await self._manifests.uncharge_upload(agent_id, chunk_hash)
                raise
            self._uploading.stored(agent_id, chunk_hash)
            self._recent.stored(result.hash)
            return result

        return Deferred.fromCoroutine(put())

    async def _charge(self, agent_id: str, chunk: ChunkRef) -> bool:
        grant = self._grants().get(agent_id)
        while True:
            try:
                return await self._manifests.charge_upload(
                    agent_id,
                    chunk,
                    grant_bytes=grant,
                    backlog_bytes=self._policy.backlog_limit(grant),
                )
            except CollectionBacklog:
                await self._next_reclaim()

    async def _store(self, chunk: ChunkRef, data: bytes | memoryview) -> ChunkPutResult:
        if self._account.budget_bytes is None:
            # Unlimited account: nothing to reserve, and the store's own
            # put deduplicates, so skip the extra round trip.
            return await self._chunks.put(chunk.hash, data)
        present = await self._chunks.has([chunk.hash])
        if present.present:
            return await self._chunks.put(chunk.hash, data)
        await self._account.reserve(chunk.size)
        try:
            return await self._chunks.put(chunk.hash, data)
        finally:
            self._account.release(chunk.size)

    def get(self, chunk_hash: str) -> Deferred[ChunkData]:
        """
        The bytes of a chunk (L{svc.store.tenant.TenantStorage.chunk_get}).
        """

        def withdrawn(failure: Failure) -> Failure:
            if isinstance(failure.value, CorruptStoredChunk | NotFound):
                self._recent.forget(chunk_hash)
            return failure

        return self._chunks.read(chunk_hash).addErrback(withdrawn)
