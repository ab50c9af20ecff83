"""
The data plane's storage engine: opens each tenant's storage on first use and
owns what tenants share (the owner's account budget, the chunk I/O worker).

Layout (``docs/specifications/chunk-store.md``, ``routes-db.md``,
``leases-db.md``, ``storage-engine.md``)::

    <tenants_root>/<owner>/[<tenant>/]store/objects/...   chunks
    <tenants_root>/<owner>/account.json                   account budget
    <metadata_root>/<owner>/[<tenant>/]routes.db          manifests, journal
    <metadata_root>/<owner>/[<tenant>/]leases.db          leases
    <metadata_root>/<owner>/[<tenant>/]grants.json        agent grants

Threads: every SQLite database gets its own single-thread worker from
``new_worker`` (its single writer); chunk and small-file I/O run on the shared
``io_worker``.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Protocol, TypeVar

import attrs
from twisted.internet.defer import Deferred, DeferredLock
from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger

from svc.durable import make_directories
from svc.store.chunks import IChunkStore
from svc.store.chunkstore_fs import open_filesystem_chunk_store, read_buffer_pool
from svc.store.gc import SweepReport
from svc.store.layout import (
    TenantLocation,
    chunk_objects_dir,
    is_reserved_tenant_name,
    is_valid_id,
    leases_db_path,
    metadata_dir,
    owner_dir,
    routes_db_path,
)
from svc.store.lease_values import LeaseEvent, LeaseRevoke, LeaseTimings
from svc.store.leases import LeaseTable
from svc.store.manifests import ManifestStore
from svc.store.observer import StoreObserver
from svc.store.owner_account import OwnerAccount
from svc.store.quota_files import (
    read_account_budget,
    read_grants,
    write_account_budget,
    write_grant,
)
from svc.store.retention import RetentionPolicy
from svc.store.tenant import TenantStorage
from svc.worker import IWorker

T = TypeVar("T")

STORE_DIR = "store"


class EngineClock(Protocol):
    """
    What the engine needs of a reactor's clock.
    """

    def seconds(self) -> float:
        """Now, in seconds since the epoch."""

    def callLater(
        self, delay: float, callable: Callable[..., object], *args: object, **kw: object
    ) -> IDelayedCall:
        """Schedule a call."""


@attrs.frozen
class StorageRoots:
    """
    Where tenants' chunks and metadata live; metadata defaults to the tenants root.
    """

    tenants_root: Path
    metadata_root: Path

    @classmethod
    def single(cls, root: Path) -> StorageRoots:
        """
        Chunks and metadata under one root.
        """
        return cls(root, root)


def _defer(coroutine: Coroutine[Any, Any, T]) -> Deferred[T]:
    return Deferred.fromCoroutine(coroutine)


def scan_owner_tenants(tenants_root: Path, owner: str) -> list[TenantLocation]:
    """
    Every tenant of ``owner`` that has a chunk store on disk (blocking).
    """
    base = owner_dir(tenants_root, owner)
    found: list[TenantLocation] = []
    if (base / STORE_DIR).is_dir():
        found.append(TenantLocation.for_owner(owner))
    if base.is_dir():
        for entry in sorted(base.iterdir()):
            name = entry.name
            if (
                entry.is_dir()
                and name != owner
                and is_valid_id(name)
                and not is_reserved_tenant_name(name)
                and (entry / STORE_DIR).is_dir()
            ):
                found.append(TenantLocation(owner, name))
    return found


def scan_tenants(tenants_root: Path) -> list[TenantLocation]:
    """
    Every tenant of every owner that has a chunk store under
    ``tenants_root`` (blocking).
    """
    if not tenants_root.is_dir():
        return []
    found: list[TenantLocation] = []
    for entry in sorted(tenants_root.iterdir()):
        if entry.is_dir() and is_valid_id(entry.name):
            found.extend(scan_owner_tenants(tenants_root, entry.name))
    return found


class StorageEngine:
    """
    Opens and holds L{TenantStorage} per tenant location.
    """

    _log = Logger()

    def __init__(
        self,
        roots: StorageRoots,
        clock: EngineClock,
        new_worker: Callable[[str], IWorker],
        io_worker: IWorker,
        on_lease_revoke: Callable[[TenantLocation, LeaseRevoke], object],
        on_lease_event: Callable[[TenantLocation, LeaseEvent], object],
        retention: RetentionPolicy | None = None,
        lease_timings: LeaseTimings | None = None,
        observer: StoreObserver | None = None,
    ) -> None:
        """
        @param observer: every tenant's chunk deletions and journal rows
            are reported to it (the server's metrics, L{svc.store.observer});
            L{None}: not reported.
        """
        self.roots = roots
        self._clock = clock
        self._new_worker = new_worker
        self._io = io_worker
        self._on_lease_revoke = on_lease_revoke
        self._on_lease_event = on_lease_event
        self._retention = retention or RetentionPolicy()
        self._lease_timings = lease_timings
        self.observer = observer
        """Where every tenant's chunk deletions and journal rows are reported."""
        self._open_lock = DeferredLock()
        self._accounts: dict[str, OwnerAccount] = {}
        self._chunk_stores: dict[TenantLocation, IChunkStore] = {}
        self._tenants: dict[TenantLocation, TenantStorage] = {}
        self.read_buffers = read_buffer_pool()
        """The chunk read buffers every tenant's store shares (trim it now and then)."""

    def opened(self) -> list[TenantStorage]:
        """
        The tenants opened so far.
        """
        return list(self._tenants.values())

    def tenant(self, location: TenantLocation) -> Deferred[TenantStorage]:
        """
        The storage of ``location``, opened (and created) on first use.
        """
        existing = self._tenants.get(location)
        if existing is not None:
            return Deferred.fromCoroutine(_just(existing))
        return _defer(self._locked(self._open_tenant(location)))

    async def _locked(self, work: Coroutine[Any, Any, T]) -> T:
        await self._open_lock.acquire()
        try:
            return await work
        finally:
            self._open_lock.release()

    async def _account(self, owner: str) -> OwnerAccount:
        account = self._accounts.get(owner)
        if account is not None:
            return account
        base = owner_dir(self.roots.tenants_root, owner)
        budget = await self._io.submit(lambda: read_account_budget(base))
        account = OwnerAccount(owner, budget)
        self._accounts[owner] = account
        locations = await self._io.submit(
            lambda: scan_owner_tenants(self.roots.tenants_root, owner)
        )
        for location in locations:
            await self._chunk_store(location, account)
        return account

    async def _chunk_store(self, location: TenantLocation, account: OwnerAccount) -> IChunkStore:
        store = self._chunk_stores.get(location)
        if store is None:
            objects = chunk_objects_dir(self.roots.tenants_root, location)
            await self._io.submit(lambda: make_directories(objects))
            store = await open_filesystem_chunk_store(
                objects, self._io, read_buffers=self.read_buffers
            )
            self._chunk_stores[location] = store
            account.add_store(store)
        return store

    async def _open_tenant(self, location: TenantLocation) -> TenantStorage:
        existing = self._tenants.get(location)
        if existing is not None:
            return existing
        account = await self._account(location.owner)
        chunks = await self._chunk_store(location, account)
        meta = metadata_dir(self.roots.metadata_root, location)
        await self._io.submit(lambda: make_directories(meta))
        grants = await self._io.submit(lambda: read_grants(meta))
        name = "/".join(location.components)
        manifests = await ManifestStore.open(
            routes_db_path(self.roots.metadata_root, location),
            self._new_worker(f"routes:{name}"),
            self._clock,
        )
        leases = await LeaseTable.open(
            leases_db_path(self.roots.metadata_root, location),
            self._new_worker(f"leases:{name}"),
            self._clock,
            lambda revoke: self._on_lease_revoke(location, revoke),
            lambda event: self._on_lease_event(location, event),
            self._lease_timings,
        )
        storage = TenantStorage(
            location,
            chunks,
            manifests,
            leases,
            account,
            grants,
            self._retention,
            self._clock,
            self.observer,
        )
        self._tenants[location] = storage
        self._log.info("opened tenant storage {name}", name=name)
        return storage

    def set_agent_grant(
        self, location: TenantLocation, agent_id: str, grant_bytes: int | None
    ) -> Deferred[None]:
        """
        Persist and apply an agent's grant (C{None} lifts it).
        """

        async def setting() -> None:
            storage = await self.tenant(location)
            meta = metadata_dir(self.roots.metadata_root, location)
            await self._io.submit(lambda: write_grant(meta, agent_id, grant_bytes))
            await storage.set_grant(agent_id, grant_bytes)

        return _defer(setting())

    def set_account_budget(self, owner: str, budget_bytes: int | None) -> Deferred[None]:
        """
        Persist and apply an owner's account budget (C{None} lifts it).
        """

        async def setting() -> None:
            account = await self._locked(self._account(owner))
            base = owner_dir(self.roots.tenants_root, owner)
            await self._io.submit(lambda: write_account_budget(base, budget_bytes))
            account.budget_bytes = budget_bytes

        return _defer(setting())

    def account_usage(self, owner: str) -> Deferred[int]:
        """
        Bytes held by all of ``owner``'s chunk stores.
        """

        async def usage() -> int:
            account = await self._locked(self._account(owner))
            return await account.used_bytes()

        return _defer(usage())

    def sweepable(self) -> Deferred[list[TenantStorage]]:
        """
        Every tenant with a chunk store on this server, opened (a tenant no
        agent has used since the server started is opened now, so garbage
        collection reaches it too). A tenant that cannot be opened is
        logged and left out.
        """

        async def opening() -> list[TenantStorage]:
            root = self.roots.tenants_root
            locations = await self._io.submit(lambda: scan_tenants(root))
            tenants = {storage.location: storage for storage in self.opened()}
            for location in locations:
                if location in tenants:
                    continue
                try:
                    tenants[location] = await self.tenant(location)
                except Exception:
                    self._log.failure(
                        "cannot open tenant {name} for garbage collection",
                        name="/".join(location.components),
                    )
            return list(tenants.values())

        return _defer(opening())

    def sweep_all(self, *, dry_run: bool = False) -> Deferred[list[SweepReport]]:
        """
        One GC sweep of every opened tenant, one report each.
        """

        async def sweeping() -> list[SweepReport]:
            return [await tenant.sweep(dry_run=dry_run) for tenant in self.opened()]

        return _defer(sweeping())

    def close(self) -> Deferred[None]:
        """
        Close every tenant's databases.
        """

        async def closing() -> None:
            tenants, self._tenants = list(self._tenants.values()), {}
            for tenant in tenants:
                await tenant.close()

        return _defer(closing())


async def _just(value: T) -> T:
    return value
