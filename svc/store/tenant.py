"""
One tenant's storage: its chunk store, its C{routes.db} (manifests and
journal), its C{leases.db}, and the rules that tie them together.

The rules that need more than one store live here:

- B{No manifest names missing bytes.} A manifest change that references
  chunks first checks the chunk store holds them (L{MissingChunks}
  otherwise), and that check and the commit run holding the tenant's commit
  gate shared, which garbage collection and purge hold exclusively before
  deleting chunks (L{svc.store.commit_gate}). Commits do not wait for each
  other: their database work is ordered by the routes queue, where commits
  in flight together share one transaction.
  A chunk whose upload this storage completed since the last deletion (GC,
  purge; a chunk withdrawn as corrupt is forgotten) is known to be there
  and is not looked up again (L{RecentChunks}).
- B{Quotas and footprint.} A chunk upload is charged to its agent first
  (C{routes.db}, L{svc.store.footprint_rows.charge_upload}: refused past
  the agent's grant, held back while its collectable bytes are past their
  limit); one that stores new bytes also reserves them against the owner's
  account budget (L{OwnerAccount}). A manifest change is checked against
  the agent's grant inside its transaction, and prunes the agent's oldest
  journal rows past its retained cap in that transaction; what that leaves
  collectable is deleted soon after (L{svc.store.collection}).
- B{Journal notification.} Every change that appends a journal row wakes
  the L{TenantStorage.journal_changed} waiters once it has committed (the
  control plane's journal long-poll waits on them), and marks its disk's
  journal-row count for the metrics (L{svc.store.observer}), as do sweeps
  (which prune) and purges.
- B{Leases.} A manifest change from a writer that does not hold the path's
  write lease while someone else does (or from a fenced writer) is refused
  with L{WriteLeaseHeld} (ESTALE), and the holder is asked to yield.

Every operation returns the values the server needs for its audit lines and
metrics (sizes, versions, hashes, counts) so nothing is read twice.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol, TypeVar

import attrs
from twisted.internet.defer import Deferred, DeferredLock, fail, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure

from svc.store.chunks import (
    ChunkData,
    ChunkHasResult,
    ChunkPutResult,
    CorruptStoredChunk,
    IChunkStore,
)
from svc.store.collection import Collection
from svc.store.commit_gate import CommitGate
from svc.store.errors import InvalidArgument, MissingChunks, NotFound, WriteLeaseHeld
from svc.store.footprint import CollectionBacklog, FootprintPolicy
from svc.store.gc import PurgeReport, SweepReport
from svc.store.journal import JournalPage, JournalQuery, RevertResult
from svc.store.layout import TenantLocation
from svc.store.lease_values import LeaseHolder, PutVerdict
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
    chunk_name,
)
from svc.store.manifests import ManifestStore
from svc.store.observer import JournalRowsReporter, StoreObserver
from svc.store.quota import QuotaUsage, check_account
from svc.store.uploads_in_flight import UploadsInFlight

T = TypeVar("T")


RECENT_CHUNKS = 65536
"""Chunks whose completed upload a tenant storage remembers (L{RecentChunks})."""


def _defer(coroutine: Coroutine[Any, Any, T]) -> Deferred[T]:
    return Deferred.fromCoroutine(coroutine)


class TenantClock(Protocol):
    """What a tenant storage needs of the reactor's clock."""

    def seconds(self) -> float:
        """Now, in seconds since the epoch."""

    def callLater(
        self, delay: float, callable: Callable[..., object], *args: object, **kw: object
    ) -> Any:
        """Schedule a call."""


class OwnerAccount:
    """
    The account budget shared by every tenant of one owner, and the byte
    reservations of uploads in flight.

    Usage is the sum of the owner's chunk stores' totals (each chunk counted
    once per store). Uploads reserve their bytes before writing, under a
    lock, so two concurrent uploads cannot both squeeze under the budget.
    """

    def __init__(self, owner: str, budget_bytes: int | None) -> None:
        self.owner = owner
        self.budget_bytes = budget_bytes
        self._stores: list[IChunkStore] = []
        self._reserved = 0
        self._lock = DeferredLock()

    def add_store(self, store: IChunkStore) -> None:
        """
        Count ``store``'s bytes against this account.
        """
        self._stores.append(store)

    def used_bytes(self) -> Deferred[int]:
        """
        Bytes held by all of the owner's chunk stores now.
        """

        async def total() -> int:
            return sum([await store.total_bytes() for store in self._stores])

        return _defer(total())

    def reserve(self, size: int) -> Deferred[None]:
        """
        Reserve ``size`` bytes of new chunk data, or fail with
        L{svc.store.errors.QuotaExceeded}. Every successful reservation must
        be followed by L{release} once the upload has finished either way.
        Without a budget nothing can be refused: the reservation is counted
        (a budget set meanwhile sees it) with no lock and no usage sum.
        """
        if self.budget_bytes is None:
            self._reserved += size
            return succeed(None)

        async def reserving() -> None:
            await self._lock.acquire()
            try:
                used = await self.used_bytes()
                check_account(used + self._reserved, size, self.budget_bytes)
                self._reserved += size
            finally:
                self._lock.release()

        return _defer(reserving())

    def release(self, size: int) -> None:
        """
        Give back a reservation made by L{reserve}.
        """
        self._reserved -= size


class RecentChunks:
    """
    Chunks known to be stored without asking the chunk store: those whose
    upload completed (durably) since the last deletion. L{deleted} is
    called, still holding the commit gate, once a deletion has ended (however
    it ended); it forgets them all, including uploads that completed while
    it ran. Manifest changes wait for the commit gate, so none trusts a
    chunk a deletion may have removed. At most C{limit} are remembered (the
    oldest forgotten first). Forgetting is always safe: the chunk store is
    asked instead.
    """

    def __init__(self, limit: int = RECENT_CHUNKS) -> None:
        self._limit = limit
        self._stored: OrderedDict[str, None] = OrderedDict()

    def stored(self, chunk_hash: str) -> None:
        """An upload of C{chunk_hash} completed."""
        self._stored[chunk_hash] = None
        self._stored.move_to_end(chunk_hash)
        while len(self._stored) > self._limit:
            self._stored.popitem(last=False)

    def unknown(self, hashes: Sequence[str]) -> list[str]:
        """Those of C{hashes} not known to be stored."""
        return [h for h in hashes if h not in self._stored]

    def forget(self, chunk_hash: str) -> None:
        """
        C{chunk_hash} may be gone (withdrawn as corrupt, or deleted by a
        reclaim pass: it deletes only chunks nothing names, holding the
        commit gate, so the others it leaves are still stored).
        """
        self._stored.pop(chunk_hash, None)

    def deleted(self) -> None:
        """Chunks may have been deleted: nothing is known any more."""
        self._stored.clear()


@attrs.frozen
class RetentionPolicy:
    """
    How long unreferenced data is kept: an upload stays charged to its
    agent, and its chunk is not collected, for ``chunk_grace_seconds`` after
    its last C{chunk_put} (it may be about to be committed; an unrecorded
    chunk younger than that is not swept either); journal rows younger than
    ``journal_retention_seconds`` keep their chunks so the change can be
    reverted, within the bytes ``footprint`` lets each agent retain. A
    collectable chunk written or touched within ``reclaim_margin_seconds``
    is deleted by a later pass.
    """

    chunk_grace_seconds: float = 3600.0
    journal_retention_seconds: float = 7 * 24 * 3600.0
    footprint: FootprintPolicy = attrs.field(factory=FootprintPolicy)
    reclaim_margin_seconds: float = 0.5


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
        self._grants = grants
        self._retention = retention
        self._policy = retention.footprint
        self._seconds = clock.seconds
        self._gate = CommitGate()
        self._journal_waiters: list[Deferred[None]] = []
        self._recent = RecentChunks()
        self._uploading = UploadsInFlight()
        self.collection = Collection(
            location.tenant,
            chunks,
            manifests,
            self._gate,
            self._recent,
            clock,
            clock.seconds,
            lambda: self._grants,
            self._policy,
            chunk_grace_seconds=retention.chunk_grace_seconds,
            journal_retention_seconds=retention.journal_retention_seconds,
            margin_seconds=retention.reclaim_margin_seconds,
            observer=observer,
        )
        self._journal_rows: JournalRowsReporter | None = None
        if observer is not None:
            self._journal_rows = JournalRowsReporter(
                location, manifests.journal_rows_by_top, observer, clock
            )
            self._journal_rows.changed_all()

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
        return self._grants.get(agent_id)

    def set_grant(self, agent_id: str, grant_bytes: int | None) -> Deferred[None]:
        """
        Change the in-memory grant (the engine persists it) and bring the
        agent's retained bytes within the cap the new grant gives.
        """
        if grant_bytes is None:
            self._grants.pop(agent_id, None)
        else:
            self._grants[agent_id] = grant_bytes

        def enforced(collectable: int) -> None:
            if self._journal_rows is not None:
                self._journal_rows.changed(agent_id)

        return self.manifests.enforce_retained_cap(
            agent_id, self._policy.retained_cap(grant_bytes)
        ).addCallback(enforced)

    def retained_cap(self, path: str) -> int:
        """
        The bytes the agent whose disk holds ``path`` may keep only for its
        journal (L{FootprintPolicy.retained_cap}).
        """
        return self._policy.retained_cap(self._grants.get(top_of(path)))

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

        async def usage() -> QuotaUsage:
            footprint = await self.manifests.footprint(agent_id)
            # The account's usage moves when an upload is new to the tenant
            # store and not when it is not: shown without need, it would
            # tell agents what other agents stored (dataplane-ops.md 6).
            budget = self.account.budget_bytes
            account_used = None if budget is None else await self.account.used_bytes()
            grant = self.grant_for(agent_id)
            return QuotaUsage(
                used_bytes=footprint.live_bytes,
                grant_bytes=grant,
                account_used_bytes=account_used,
                budget_bytes=budget,
                uncommitted_bytes=footprint.uncommitted_bytes,
                retained_bytes=footprint.retained_bytes,
                collectable_bytes=footprint.collectable_bytes,
                retained_cap_bytes=self._policy.retained_cap(grant),
                footprint_bound_bytes=self._policy.bound(grant),
            )

        return _defer(usage())

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
        takes its charge back (L{UploadsInFlight}).
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
                    await self.manifests.uncharge_upload(agent_id, chunk_hash)
                raise
            self._uploading.stored(agent_id, chunk_hash)
            self._recent.stored(result.hash)
            return result

        return _defer(put())

    async def _charge(self, agent_id: str, chunk: ChunkRef) -> bool:
        grant = self._grants.get(agent_id)
        while True:
            try:
                return await self.manifests.charge_upload(
                    agent_id,
                    chunk,
                    grant_bytes=grant,
                    backlog_bytes=self._policy.backlog_limit(grant),
                )
            except CollectionBacklog:
                await self.collection.schedule.next_pass()

    async def _store(self, chunk: ChunkRef, data: bytes | memoryview) -> ChunkPutResult:
        if self.account.budget_bytes is None:
            # Unlimited account: nothing to reserve, and the store's own
            # put deduplicates, so skip the extra round trip.
            return await self.chunks.put(chunk.hash, data)
        present = await self.chunks.has([chunk.hash])
        if present.present:
            return await self.chunks.put(chunk.hash, data)
        await self.account.reserve(chunk.size)
        try:
            return await self.chunks.put(chunk.hash, data)
        finally:
            self.account.release(chunk.size)

    def chunk_get(self, chunk_hash: str) -> Deferred[ChunkData]:
        """
        The bytes of a chunk (hash-verified by the store), lent: see
        L{svc.store.chunks.ChunkData} for when to release them.
        """

        def withdrawn(failure: Failure) -> Failure:
            if isinstance(failure.value, CorruptStoredChunk | NotFound):
                self._recent.forget(chunk_hash)
            return failure

        return self.chunks.read(chunk_hash).addErrback(withdrawn)

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

    def _check_lease(self, path: str, holder: LeaseHolder | None) -> None:
        if holder is None:
            return
        verdict = self.leases.manifest_put_contention(path, holder)
        if verdict is PutVerdict.CONTENDED:
            raise WriteLeaseHeld(f"{path}: another holder has the write lease")
        if verdict is PutVerdict.FENCED:
            raise WriteLeaseHeld(f"{path}: this writer's lease was revoked")

    def _committing(self, work: Coroutine[Any, Any, T]) -> Deferred[T]:
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

        return _defer(gated())

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
        Fails with L{MissingChunks} when the store lacks a named chunk,
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
            self._check_lease(path, holder)
            hashes = self._recent.unknown(list(dict.fromkeys(map(chunk_name, chunks))))
            if hashes:
                has = await self.chunks.has(hashes)
                if has.absent:
                    raise MissingChunks(tuple(has.absent))
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
                quota_bytes=self._grants.get(top),
                atime_ns=atime_ns,
                retained_cap=self._policy.retained_cap(self._grants.get(top)),
            )
            if queued is not None:
                queued()
            return await committed

        return self._journaling(self._committing(put()), path)

    def manifest_delete(
        self, path: str, *, writer: Writer, holder: LeaseHolder | None = None
    ) -> Deferred[RemoveResult]:
        """
        Unlink the non-directory ``path``.
        """
        try:
            self._check_lease(path, holder)
        except WriteLeaseHeld:
            return fail()
        return self._journaling(
            self.manifests.delete(path, writer=writer, retained_cap=self.retained_cap(path)),
            path,
        )

    def dir_create(
        self, path: str, *, mode: int, uid: int, gid: int, writer: Writer
    ) -> Deferred[CreateResult]:
        """
        Create directory ``path``.
        """
        return self._journaling(
            self.manifests.mkdir(path, mode=mode, uid=uid, gid=gid, writer=writer), path
        )

    def dir_remove(self, path: str, *, writer: Writer) -> Deferred[RemoveResult]:
        """
        Remove the empty directory ``path``.
        """
        return self._journaling(self.manifests.rmdir(path, writer=writer), path)

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
        return self._journaling(
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
        return self._journaling(self.manifests.link(existing, new, writer=writer), new)

    def symlink(
        self, path: str, target: str, *, uid: int, gid: int, writer: Writer
    ) -> Deferred[CreateResult]:
        """
        Create symlink ``path`` pointing at ``target``.
        """
        return self._journaling(
            self.manifests.symlink(path, target, uid=uid, gid=gid, writer=writer), path
        )

    def mknod(
        self, path: str, *, kind: FileKind, mode: int, rdev: int, uid: int, gid: int, writer: Writer
    ) -> Deferred[CreateResult]:
        """
        Create a special file (or empty regular file) ``path``.
        """
        return self._journaling(
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
        return self._journaling(
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

        async def revert() -> RevertResult:
            entry = await self.manifests.journal_entry(seq)
            if entry is None:
                raise NotFound(f"journal entry {seq}")
            if not entry.concerns(path):
                raise NotFound(f"journal entry {seq} does not concern {path}")
            before = entry.state_before(path)
            needed = [c.hash for c in (before.chunks if before is not None else ())]
            present: frozenset[str] = frozenset()
            if needed:
                present = frozenset((await self.chunks.has(needed)).present)
            return await self.manifests.journal_revert(
                path,
                seq,
                writer=writer,
                missing_chunks=lambda hashes: [h for h in hashes if h not in present],
                retained_cap=self.retained_cap(path),
            )

        return self._journaling(self._committing(revert()), path)

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
        waiter: Deferred[None] = Deferred(self._forget_waiter)
        self._journal_waiters.append(waiter)
        return waiter

    def journal_waiting(self) -> int:
        """How many L{journal_changed} waiters are pending."""
        return len(self._journal_waiters)

    def _forget_waiter(self, waiter: Deferred[None]) -> None:
        try:
            self._journal_waiters.remove(waiter)
        except ValueError:
            pass

    def _journaling(self, change: Deferred[T], path: str) -> Deferred[T]:
        """
        Once C{change} (of C{path}) has committed with a journal row (its
        result's C{journal_seq} is not L{None}): wake the L{journal_changed}
        waiters and mark the disk of C{path} for the journal-row count.
        """

        def committed(result: T) -> T:
            if getattr(result, "journal_seq", None) is None:
                return result
            if self._journal_rows is not None:
                self._journal_rows.changed(top_of(path))
            if self._journal_waiters:
                waiters, self._journal_waiters = self._journal_waiters, []
                for waiter in waiters:
                    waiter.callback(None)
            return result

        return change.addCallback(committed)

    # Collection

    def sweep(self, *, dry_run: bool = False) -> Deferred[SweepReport]:
        """
        One GC sweep (L{Collection.sweep}); one that pruned may have
        emptied any disk's journal, so every disk's rows are counted again.
        """

        def swept(report: SweepReport) -> SweepReport:
            if self._journal_rows is not None and not dry_run:
                self._journal_rows.changed_all()
            return report

        return self.collection.sweep(dry_run=dry_run).addCallback(swept)

    def purge_agent(self, agent_id: str) -> Deferred[PurgeReport]:
        """
        Erase the agent's whole subtree, its journal rows, its footprint and
        the chunks no longer referenced anywhere in the tenant; forget its
        grant.
        """

        def purged(report: PurgeReport) -> PurgeReport:
            self._grants.pop(agent_id, None)
            if self._journal_rows is not None:
                self._journal_rows.changed(agent_id)
            return report

        return self.collection.purge(agent_id).addCallback(purged)

    def close(self) -> Deferred[None]:
        """
        Close the databases after the work already submitted.
        """

        async def closing() -> None:
            if self._journal_rows is not None:
                await self._journal_rows.close()
            await self.collection.close()
            await self.leases.close()
            await self.manifests.close()

        return _defer(closing())
