"""
One tenant's storage: its chunk store, its C{routes.db} (manifests and
journal), its C{leases.db}, and the rules that tie them together.

The rules that need more than one store are applied here, each by a module
of its own:

- B{No manifest names missing bytes} (L{svc.store.commit_rules}). A
  manifest change that references chunks first checks the chunk store
  holds them (L{svc.store.errors.MissingChunks} otherwise), and that check
  and the commit run holding the tenant's commit gate shared, which garbage
  collection and purge hold exclusively before deleting chunks
  (L{svc.store.commit_gate}). Commits do not wait for each other: their
  database work is ordered by the routes queue, where commits in flight
  together share one transaction. A chunk whose upload this storage
  completed since the last deletion (GC, purge; a chunk withdrawn as
  corrupt is forgotten) is known to be there and is not looked up again
  (L{svc.store.recent_chunks}).
- B{Quotas and footprint} (L{svc.store.tenant_chunks},
  L{svc.store.agent_grants}). A chunk upload is charged to its agent first
  (C{routes.db}, L{svc.store.footprint_rows.charge_upload}: refused past
  the agent's grant, held back while its collectable bytes are past their
  limit); one that stores new bytes also reserves them against the owner's
  account budget (L{svc.store.owner_account}). A manifest change is
  checked against the agent's grant inside its transaction, and prunes the
  agent's oldest journal rows past its retained cap in that transaction;
  what that leaves collectable is deleted soon after
  (L{svc.store.collection}).
- B{Journal notification} (L{svc.store.journal_notices}). Every change
  that appends a journal row wakes the L{TenantStorage.journal_changed}
  waiters once it has committed (the control plane's journal long-poll
  waits on them), and marks its disk's journal-row count for the metrics
  (L{svc.store.observer}), as do sweeps (which prune) and purges.
- B{Leases} (L{svc.store.commit_rules}). A manifest change from a writer
  that does not hold the path's write lease while someone else does (or
  from a fenced writer) is refused with L{WriteLeaseHeld} (ESTALE), and
  the holder is asked to yield.

Every operation returns the values the server needs for its audit lines and
metrics (sizes, versions, hashes, counts) so nothing is read twice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from twisted.internet.defer import Deferred, fail
from twisted.logger import Logger

from svc.store import journal_reverts
from svc.store.agent_grants import AgentGrants
from svc.store.chunks import ChunkData, ChunkHasResult, ChunkPutResult, IChunkStore
from svc.store.collection import Collection
from svc.store.commit_gate import CommitGate
from svc.store.commit_rules import CommitRules
from svc.store.errors import WriteLeaseHeld
from svc.store.gc import PurgeReport, SweepReport
from svc.store.journal import JournalPage, JournalQuery, RevertResult
from svc.store.journal_notices import JournalNotices
from svc.store.layout import TenantLocation
from svc.store.lease_values import LeaseHolder
from svc.store.leases import LeaseTable
from svc.store.manifest_names import SubtreeMoveCheck
from svc.store.manifest_paths import top_of
from svc.store.manifest_values import (
    ChunkRef,
    CreateResult,
    DirectoryEntry,
    FileKind,
    Manifest,
    PutResult,
    RemoveResult,
    RenameResult,
    SetattrResult,
    Writer,
)
from svc.store.manifests import ManifestStore
from svc.store.observer import StoreObserver
from svc.store.owner_account import OwnerAccount
from svc.store.quota import QuotaUsage
from svc.store.recent_chunks import RecentChunks
from svc.store.retention import RetentionPolicy
from svc.store.tenant_chunks import TenantChunks


class TenantClock(Protocol):
    """What a tenant storage needs of the reactor's clock."""

    def seconds(self) -> float:
        """Now, in seconds since the epoch."""

    def callLater(
        self, delay: float, callable: Callable[..., object], *args: object, **kw: object
    ) -> Any:
        """Schedule a call."""


class TenantStorage:
    """
    The storage of one tenant. Build with L{svc.store.engine.StorageEngine}.

    Order: every namespace change other than L{manifest_put} (unlink,
    rmdir, mkdir, rename, link, symlink, mknod, setattr) has its database
    work queued before the method returns, and everything submitted later
    runs after it; L{manifest_put} says when through its C{queued}
    callback. A data-plane connection lets its next change start at that
    moment (L{svc.dataplane.request_order}), so keep such a method free of
    any wait before it submits its work.
    """

    _log = Logger()

    def __init__(
        self,
        location: TenantLocation,
        chunks: IChunkStore,
        manifests: ManifestStore,
        leases: LeaseTable,
        account: OwnerAccount,
        grants: dict[str, int],
        retention: RetentionPolicy,
        clock: TenantClock,
        observer: StoreObserver | None = None,
    ) -> None:
        """
        @param observer: told of chunk deletions and journal rows (the
            server's metrics); L{None}: nothing is reported.
        """
        self.location = location
        self.chunks = chunks
        self.manifests = manifests
        self.leases = leases
        self.account = account
        self._retention = retention
        self._policy = retention.footprint
        self._seconds = clock.seconds
        gate = CommitGate()
        self._recent = RecentChunks()
        self._rules = CommitRules(chunks, leases, gate, self._recent)
        self.collection = Collection(
            location.tenant,
            chunks,
            manifests,
            gate,
            self._recent,
            clock,
            clock.seconds,
            lambda: self._grants.by_agent,
            self._policy,
            chunk_grace_seconds=retention.chunk_grace_seconds,
            journal_retention_seconds=retention.journal_retention_seconds,
            margin_seconds=retention.reclaim_margin_seconds,
            observer=observer,
        )
        self._tenant_chunks = TenantChunks(
            chunks,
            manifests,
            account,
            lambda: self._grants.by_agent,
            self._policy,
            self.collection.schedule.next_pass,
            self._recent,
        )
        self._journal = JournalNotices(location, manifests, clock, observer)
        self._grants = AgentGrants(grants, self._policy, manifests, account, self._journal)

    @property
    def tenant_id(self) -> str:
        """
        The tenant's id.
        """
        return self.location.tenant

    # Quotas

    def grant_for(self, agent_id: str) -> int | None:
        """
        The agent's grant in bytes (C{None}: unlimited).
        """
        return self._grants.grant_for(agent_id)

    def set_grant(self, agent_id: str, grant_bytes: int | None) -> Deferred[None]:
        """
        Change the in-memory grant (the engine persists it) and bring the
        agent's retained bytes within the cap the new grant gives.
        """
        return self._grants.set_grant(agent_id, grant_bytes)

    def retained_cap(self, path: str) -> int:
        """
        The bytes the agent whose disk holds ``path`` may keep only for its
        journal (L{svc.store.footprint.FootprintPolicy.retained_cap}).
        """
        return self._grants.retained_cap(top_of(path))

    def agent_usage(self, agent_id: str) -> Deferred[int]:
        """
        Unique chunk bytes referenced by the agent's live files.
        """
        return self.manifests.subtree_usage(agent_id)

    def quota_usage(self, agent_id: str) -> Deferred[QuotaUsage]:
        """
        The agent's usage (its footprint, by part) and grant with its
        owner's account usage and budget. Cheap: two primary-key reads in
        C{routes.db} (queued behind the writes already submitted) and the
        chunk stores' running totals; nothing is scanned.
        """
        return self._grants.quota_usage(agent_id)

    # Chunks

    def chunk_put(
        self, agent_id: str, chunk_hash: str, data: bytes | memoryview
    ) -> Deferred[ChunkPutResult]:
        """
        Store a chunk uploaded by ``agent_id``: charge it to the agent first
        (L{svc.store.footprint_rows.charge_upload}: L{QuotaExceeded} past
        its grant; held back while its collectable bytes are past their
        limit, until a reclaim pass has run), then check the account budget
        for bytes new to the store. A chunk the store already holds costs
        the account nothing and is reported as deduplicated; it costs the
        agent nothing only if its own files name it. An upload that fails
        takes its charge back (L{svc.store.uploads_in_flight.UploadsInFlight}).
        """
        return self._tenant_chunks.put(agent_id, chunk_hash, data)

    def chunk_get(self, chunk_hash: str) -> Deferred[ChunkData]:
        """
        The bytes of a chunk (hash-verified by the store), lent: see
        L{svc.store.chunks.ChunkData} for when to release them.
        """
        return self._tenant_chunks.get(chunk_hash)

    def chunk_has(self, hashes: Sequence[str]) -> Deferred[ChunkHasResult]:
        """
        Which of ``hashes`` the store holds.
        """
        return self.chunks.has(hashes)

    # Reads

    def manifest_get(self, path: str) -> Deferred[Manifest]:
        """
        The manifest of ``path``.
        """
        return self.manifests.get(path)

    def list_dir(
        self, path: str, *, after: str | None = None, limit: int | None = None
    ) -> Deferred[tuple[DirectoryEntry, ...]]:
        """
        The entries of directory ``path`` by name: those after the name
        ``after``, at most ``limit`` (else all).
        """
        return self.manifests.list_dir(path, after=after, limit=limit)

    def readlink(self, path: str) -> Deferred[str]:
        """
        The target of symlink ``path``.
        """
        return self.manifests.readlink(path)

    # Writes

    def manifest_put(
        self,
        path: str,
        *,
        expected_version: int,
        chunks: Sequence[ChunkRef | tuple[str, int]],
        size: int,
        mode: int,
        mtime_ns: int,
        uid: int,
        gid: int,
        writer: Writer,
        holder: LeaseHolder | None = None,
        atime_ns: int | None = None,
        queued: Callable[[], object] | None = None,
    ) -> Deferred[PutResult]:
        """
        Compare-and-swap a file's content (and its atime, when given).
        Fails with L{svc.store.errors.MissingChunks} when the store lacks a named chunk,
        L{WriteLeaseHeld} on lease contention,
        L{svc.store.errors.StaleVersion} when the version moved on, and
        L{svc.store.errors.QuotaExceeded} past the agent's grant.

        @param queued: called once the put's checks have passed and its
            database work is queued: every change or read of this tenant's
            namespace submitted afterwards runs after it and sees its effect
            (in the same transaction or a later one). Not called when the
            put fails before then.
        """

        async def put() -> PutResult:
            self._rules.check_lease(path, holder)
            await self._rules.check_chunks(chunks)
            top = path.split("/")[1] if path.count("/") >= 1 else ""
            committed = self.manifests.put(
                path,
                expected_version=expected_version,
                chunks=chunks,
                size=size,
                mode=mode,
                mtime_ns=mtime_ns,
                uid=uid,
                gid=gid,
                writer=writer,
                quota_bytes=self._grants.grant_for(top),
                atime_ns=atime_ns,
                retained_cap=self._grants.retained_cap(top),
            )
            if queued is not None:
                queued()
            return await committed

        return self._journal.journaled(self._rules.committing(put()), path)

    def manifest_delete(
        self, path: str, *, writer: Writer, holder: LeaseHolder | None = None
    ) -> Deferred[RemoveResult]:
        """
        Unlink the non-directory ``path``.
        """
        try:
            self._rules.check_lease(path, holder)
        except WriteLeaseHeld:
            return fail()
        return self._journal.journaled(
            self.manifests.delete(path, writer=writer, retained_cap=self.retained_cap(path)),
            path,
        )

    def dir_create(
        self, path: str, *, mode: int, uid: int, gid: int, writer: Writer
    ) -> Deferred[CreateResult]:
        """
        Create directory ``path``.
        """
        return self._journal.journaled(
            self.manifests.mkdir(path, mode=mode, uid=uid, gid=gid, writer=writer), path
        )

    def dir_remove(self, path: str, *, writer: Writer) -> Deferred[RemoveResult]:
        """
        Remove the empty directory ``path``.
        """
        return self._journal.journaled(self.manifests.rmdir(path, writer=writer), path)

    def manifest_rename(
        self,
        source: str,
        destination: str,
        *,
        writer: Writer,
        subtree_check: SubtreeMoveCheck | None = None,
    ) -> Deferred[RenameResult]:
        """
        Move ``source`` (with its subtree) to ``destination`` atomically.
        When ``source`` is a directory, ``subtree_check`` (if given) is
        asked inside the rename's transaction, on the database worker, and
        may refuse the move (L{svc.store.errors.SubtreeMoveRefused}).
        """
        return self._journal.journaled(
            self.manifests.rename(
                source,
                destination,
                writer=writer,
                subtree_check=subtree_check,
                retained_cap=self.retained_cap(source),
            ),
            source,
        )

    def link(self, existing: str, new: str, *, writer: Writer) -> Deferred[CreateResult]:
        """
        Hard-link ``new`` to ``existing``.
        """
        return self._journal.journaled(self.manifests.link(existing, new, writer=writer), new)

    def symlink(
        self, path: str, target: str, *, uid: int, gid: int, writer: Writer
    ) -> Deferred[CreateResult]:
        """
        Create symlink ``path`` pointing at ``target``.
        """
        return self._journal.journaled(
            self.manifests.symlink(path, target, uid=uid, gid=gid, writer=writer), path
        )

    def mknod(
        self, path: str, *, kind: FileKind, mode: int, rdev: int, uid: int, gid: int, writer: Writer
    ) -> Deferred[CreateResult]:
        """
        Create a special file (or empty regular file) ``path``.
        """
        return self._journal.journaled(
            self.manifests.mknod(
                path, kind=kind, mode=mode, rdev=rdev, uid=uid, gid=gid, writer=writer
            ),
            path,
        )

    def setattr(
        self, path: str, *, writer: Writer, **changes: int | None
    ) -> Deferred[SetattrResult]:
        """
        Change attributes of ``path`` (mode, uid, gid, size to 0, mtime_ns, atime_ns).
        """
        return self._journal.journaled(
            self.manifests.setattr(
                path, writer=writer, retained_cap=self.retained_cap(path), **changes
            ),
            path,
        )

    # Journal

    def journal_query(self, query: JournalQuery) -> Deferred[JournalPage]:
        """
        One page of the tenant's journal.
        """
        return self.manifests.journal_query(query)

    def journal_revert(self, path: str, seq: int, *, writer: Writer) -> Deferred[RevertResult]:
        """
        Restore ``path`` to its state just before journal entry ``seq``;
        refuses with L{svc.store.errors.ChunksCollected} when GC already
        removed chunks it needs. Runs holding the commit gate so the chunk
        check and the restore see the same store.
        """

        reverting = journal_reverts.revert(
            self.manifests, self.chunks, path, seq, writer=writer, retained_cap=self.retained_cap
        )
        return self._journal.journaled(self._rules.committing(reverting), path)

    def journal_changed(self) -> Deferred[None]:
        """
        A L{Deferred} that fires (with L{None}) once the next change that
        appends a journal row has committed, so a reader can re-run its
        query and see the row. It fires after the change's commit gate is
        released, before the change's own caller sees the result.
        Cancelling it stops the wait and forgets it (it then fails with
        L{twisted.internet.defer.CancelledError}); a waiter that is neither
        fired nor cancelled is kept until the next journaled change.
        """
        return self._journal.wait()

    def journal_waiting(self) -> int:
        """How many L{journal_changed} waiters are pending."""
        return self._journal.waiting()

    # Collection

    def sweep(self, *, dry_run: bool = False) -> Deferred[SweepReport]:
        """
        One GC sweep (L{Collection.sweep}); one that pruned may have
        emptied any disk's journal, so every disk's rows are counted again.
        """

        def swept(report: SweepReport) -> SweepReport:
            if not dry_run:
                self._journal.changed_all()
            return report

        return self.collection.sweep(dry_run=dry_run).addCallback(swept)

    def purge_agent(self, agent_id: str) -> Deferred[PurgeReport]:
        """
        Erase the agent's whole subtree, its journal rows, its footprint and
        the chunks no longer referenced anywhere in the tenant; forget its
        grant.
        """

        def purged(report: PurgeReport) -> PurgeReport:
            self._grants.forget(agent_id)
            self._journal.changed(agent_id)
            return report

        return self.collection.purge(agent_id).addCallback(purged)

    def close(self) -> Deferred[None]:
        """
        Close the databases after the work already submitted.
        """

        async def closing() -> None:
            await self._journal.close()
            await self.collection.close()
            await self.leases.close()
            await self.manifests.close()

        return Deferred.fromCoroutine(closing())
