"""
The rules a tenant storage's manifest changes commit under
(``docs/specifications/storage-engine.md``, "Commit rules"): a change from a
writer that does not hold the path's write lease while someone else does (or
from a fenced writer) is refused (L{svc.store.errors.WriteLeaseHeld},
ESTALE); a change that names chunks first checks the chunk store holds them
(L{svc.store.errors.MissingChunks} otherwise), except those known to be
stored (L{svc.store.recent_chunks.RecentChunks}), and that check and its
commit run holding the tenant's commit gate shared
(L{svc.store.commit_gate}).
"""

from __future__ import annotations

from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from twisted.internet.defer import Deferred

from svc.store.chunks import IChunkStore
from svc.store.commit_gate import CommitGate
from svc.store.errors import MissingChunks, WriteLeaseHeld
from svc.store.lease_values import LeaseHolder, PutVerdict
from svc.store.leases import LeaseTable
from svc.store.manifest_values import ChunkRef, chunk_name
from svc.store.recent_chunks import RecentChunks

T = TypeVar("T")


class CommitRules:
    """
    The commit rules of one tenant. Built by
    L{svc.store.tenant.TenantStorage}.

    @param gate: the tenant's commit gate, which its deletions of chunks
        hold exclusively (L{svc.store.collection}).
    """

    def __init__(
        self, chunks: IChunkStore, leases: LeaseTable, gate: CommitGate, recent: RecentChunks
    ) -> None:
        self._chunks = chunks
        self._leases = leases
        self._gate = gate
        self._recent = recent

    def check_lease(self, path: str, holder: LeaseHolder | None) -> None:
        """
        Refuse a change of ``path`` by ``holder`` (L{None}: not a lease
        holder, never refused) while another holder has its write lease, or
        once ``holder``'s lease was revoked.

        @raise WriteLeaseHeld: refused.
        """
        if holder is None:
            return
        verdict = self._leases.manifest_put_contention(path, holder)
        if verdict is PutVerdict.CONTENDED:
            raise WriteLeaseHeld(f"{path}: another holder has the write lease")
        if verdict is PutVerdict.FENCED:
            raise WriteLeaseHeld(f"{path}: this writer's lease was revoked")

    async def check_chunks(self, chunks: Sequence[ChunkRef | tuple[str, int]]) -> None:
        """
        Check the chunk store holds every chunk of ``chunks`` not known to
        be stored; run holding the commit gate (L{committing}).

        @raise MissingChunks: it lacks some.
        """
        hashes = self._recent.unknown(list(dict.fromkeys(map(chunk_name, chunks))))
        if hashes:
            has = await self._chunks.has(hashes)
            if has.absent:
                raise MissingChunks(tuple(has.absent))

    def committing(self, work: Coroutine[Any, Any, T]) -> Deferred[T]:
        """
        Run ``work`` (a change naming chunks) holding the commit gate shared:
        beside other such changes, never beside a GC sweep or a purge.
        """

        async def gated() -> T:
            await self._gate.acquire_shared()
            try:
                return await work
            finally:
                self._gate.release_shared()

        return Deferred.fromCoroutine(gated())
