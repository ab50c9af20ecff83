"""
The push loop from the control plane to its data-plane servers.

Every C{interval} seconds (about 60, the spec's revocation reconcile
interval) and right after a lease release or a revocation,
L{ControlPushLoop}:

  1. has the control certificate renewed when two thirds of its life have
     passed;
  2. prunes revocations of certificates that have expired (and ended admin
     sessions), reads the active set and C{PUT}s it whole to
     C{/control/cert-revocations} on every registered server (each server
     merges it into the deny-list it keeps on disk; a server also pulls the
     set with C{GET /control/cert-revocations} when it starts, so one that
     was down when a serial was revoked knows it before it admits anyone);
  3. sends the updates still pending: quotas (C{PUT /control/quotas}) and
     session fences (C{PUT /control/session-epochs}, queued at every mount
     lease grant so the server fences the agent's older sessions at once):
     the routes queue an update after a change and it is sent at once; one
     that fails stays queued, newest value per agent or account winning,
     until a round delivers it (after one failure a server gets no more
     updates that round, so a dead server costs one timeout per round). An
     update for a tenant no server holds yet is dropped;
  4. reads whole tenants' quotas (L{tenant_quotas}: the owner's account
     budget and every live agent grant) and queues them, for a tenant that
     was just placed (L{PushNotices.tenant_placed}, after an enrollment or
     renewal: the updates queued before its placement were dropped), for
     the tenants of a server that (re-)registered
     (L{PushNotices.server_registered}: it may have lost its disk) and, every
     C{reconcile_every} intervals, for every tenant this process knows to be
     placed, so a server that lost or never got a quota converges.

The queue and the set of known tenants are in memory. The set is rebuilt
from the database at start: the first quota round reads every placement
made (L{ControlStore.list_placements}) and sends each placed tenant's whole
quotas once, so a restart of the control plane (or of both planes) never
leaves a server without a tenant's budget and grants. Until that read
succeeds (it is retried every round) no other quota work is done.

A failure to reach a server, or of the database, is logged and retried next
round; rounds never overlap (a request that arrives during a round runs one
more round after it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

from twisted.application.service import Service
from twisted.internet.defer import Deferred, DeferredList, succeed
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from svc.control.dataplane_client import (
    AccountBudget,
    AgentGrant,
    ControlCertificateKeeper,
    ControlCertificateUnavailable,
    DataPlaneCallFailed,
    DataPlaneClient,
    DataPlaneRefused,
    DataPlaneTarget,
    QuotaUpdate,
    ServerUpdate,
    SessionFence,
    target_for,
)
from svc.control.store.errors import NotFound
from svc.control.store.interface import ControlStore
from svc.control.store.values import Allocation, Placement, Server, Tenant, User

DEFAULT_PUSH_INTERVAL_SECONDS = 60
"""The spec's revocation reconcile interval."""
DEFAULT_RECONCILE_ROUNDS = 10
"""Every known tenant's quotas are sent again every this many intervals."""

QuotaKey = tuple[str, ...]

_log = Logger()


class PushNotices(Protocol):
    """What the routes tell the push loop after a change is committed."""

    def revocations_changed(self) -> None:
        """A serial was revoked: push the active set to every server now."""

    def quota_changed(self, update: QuotaUpdate) -> None:
        """A grant or budget changed: send it to the tenant's server."""

    def session_granted(self, fence: SessionFence) -> None:
        """
        An agent's mount lease was granted at a new epoch: have the tenant's
        server fence the agent's older sessions now.
        """

    def tenant_placed(self, tenant_id: str) -> None:
        """
        An agent of C{tenant_id} enrolled or renewed, so the tenant has a
        server: make sure that server holds all of the tenant's quotas.
        """

    def server_registered(self, fqdn: str) -> None:
        """A server (re-)registered: it may have lost the quotas it held."""


def tenant_quotas(
    tenant: Tenant, owner: User, allocations: Iterable[Allocation]
) -> tuple[QuotaUpdate, ...]:
    """
    Every quota the server holding C{tenant} must have: the owner's account
    budget (also when there is none, which lifts a stale one), then the grant
    of each live agent allocation of the tenant, by agent id.

    @param allocations: the owner's allocations (others are ignored).
    @raise ValueError: C{owner} is not the tenant's owner.
    """
    if owner.user_id != tenant.owner_id:
        raise ValueError(f"{owner.user_id} does not own tenant {tenant.tenant_id}")
    grants = sorted(
        (
            AgentGrant(a.owner_id, a.tenant_id, a.agent_id, a.grant_bytes)
            for a in allocations
            if a.agent_id is not None
            and a.live
            and a.tenant_id == tenant.tenant_id
            and a.owner_id == tenant.owner_id
        ),
        key=lambda grant: grant.agent_id,
    )
    return (AccountBudget(tenant.owner_id, tenant.tenant_id, owner.budget_bytes), *grants)


def _refused(error: Exception) -> bool:
    """Whether a call failed with a 4xx answer (a refusal, not an outage)."""
    return isinstance(error, DataPlaneRefused) or (
        isinstance(error, DataPlaneCallFailed) and error.reason.startswith("HTTP 4")
    )


def unsuperseded(
    read: Iterable[QuotaUpdate],
    before: Mapping[QuotaKey, ServerUpdate],
    after: Mapping[QuotaKey, ServerUpdate],
) -> tuple[QuotaUpdate, ...]:
    """
    The updates read from the store that may be queued: those whose key had
    no new update queued while the store was read (C{before} and C{after}
    are the queue then and now). A change's update is queued after its
    commit, so one queued during the read is at least as new as the read.
    """
    return tuple(u for u in read if after.get(u.key) is before.get(u.key))


class NoPushes:
    """L{PushNotices} that push nothing (a process without data-plane access)."""

    def revocations_changed(self) -> None:
        """Ignore."""

    def quota_changed(self, update: QuotaUpdate) -> None:
        """Ignore."""

    def session_granted(self, fence: SessionFence) -> None:
        """Ignore."""

    def tenant_placed(self, tenant_id: str) -> None:
        """Ignore."""

    def server_registered(self, fqdn: str) -> None:
        """Ignore."""


class ControlPushLoop(Service):
    """
    The push loop as a service: started, it runs a round at once and every
    C{interval} seconds; stopped, it waits for the round in progress.

    @param store: where revocations, servers and placements are.
    @param clock: the reactor's time (a C{Clock} in tests).
    @param client: the data-plane calls.
    @param keeper: the control certificate; L{None} when this process has no
        agent CA, so it can reach no server and only prunes.
    @param target_of: where a registered server's HTTPS surface is.
    @param reconcile_every: every this many intervals (counted from the
        round at start) the quotas of every known tenant are sent again.
    """

    def __init__(
        self,
        store: ControlStore,
        clock: Any,
        client: DataPlaneClient,
        keeper: ControlCertificateKeeper | None,
        interval: float = DEFAULT_PUSH_INTERVAL_SECONDS,
        target_of: Callable[[Server], DataPlaneTarget] = target_for,
        reconcile_every: int = DEFAULT_RECONCILE_ROUNDS,
    ) -> None:
        if reconcile_every < 1:
            raise ValueError("reconcile_every must be at least 1")
        self._store = store
        self._clock: Any = clock
        self._client = client
        self._keeper = keeper
        self._interval = interval
        self._target_of = target_of
        self._loop = LoopingCall(self._tick)
        self._loop.clock = clock
        self._want_revocations = False
        self._want_quotas = False
        self._reconcile_every = reconcile_every
        self._reconcile_at: float | None = None
        self._pending: dict[QuotaKey, ServerUpdate] = {}
        self._syncs: set[str] = set()
        self._placed: dict[str, str | None] = {}
        self._tenants_read: set[str] = set()
        self._placements_loaded = False
        self._draining: Deferred[None] | None = None

    # PushNotices

    def revocations_changed(self) -> None:
        """Push the active revocation set now (ignored while stopped)."""
        if self.running:
            self._request(revocations=True, quotas=False)

    def quota_changed(self, update: QuotaUpdate) -> None:
        """Queue C{update} (replacing an older one for the same target) and try it now."""
        self._pending[update.key] = update
        self._quotas_due()

    def session_granted(self, fence: SessionFence) -> None:
        """Queue C{fence} (replacing an older one for the same agent) and send it now."""
        self._pending[fence.key] = fence
        self._quotas_due()

    def tenant_placed(self, tenant_id: str) -> None:
        """
        Send all of the tenant's quotas now unless this process already read
        them once (the tenant may just have been placed); after that the
        reconcile rounds do.
        """
        self._placed.setdefault(tenant_id, None)
        if tenant_id in self._tenants_read or tenant_id in self._syncs:
            return
        self._syncs.add(tenant_id)
        self._quotas_due()

    def server_registered(self, fqdn: str) -> None:
        """Send again all quotas of the known tenants placed on C{fqdn}."""
        tenants = {tenant for tenant, on in self._placed.items() if on == fqdn}
        if tenants:
            self._syncs |= tenants
            self._quotas_due()

    @property
    def pending_quotas(self) -> tuple[ServerUpdate, ...]:
        """The quota updates not yet delivered."""
        return tuple(self._pending.values())

    @property
    def placed_tenants(self) -> frozenset[str]:
        """The tenants known to be placed, whose quotas the reconcile rounds send."""
        return frozenset(self._placed)

    @property
    def idle(self) -> bool:
        """No round is running and no quota update or tenant read is waiting."""
        return self._draining is None and not self._pending and not self._syncs

    def _quotas_due(self) -> None:
        if self.running:
            self._request(revocations=False, quotas=True)

    # Service

    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]
        self._loop.start(self._interval, now=True)

    def stopService(self) -> Deferred[None]:
        super().stopService()  # type: ignore[no-untyped-call]
        if self._loop.running:
            self._loop.stop()
        return self._draining if self._draining is not None else succeed(None)

    # Rounds

    def _tick(self) -> None:
        now = self._clock.seconds()
        if self._reconcile_at is None:
            self._reconcile_at = now + self._interval * self._reconcile_every
        elif now >= self._reconcile_at:
            self._syncs.update(self._placed)
            self._reconcile_at = now + self._interval * self._reconcile_every
        self._request(revocations=True, quotas=True)

    def _request(self, *, revocations: bool, quotas: bool) -> None:
        self._want_revocations |= revocations
        self._want_quotas |= quotas
        if self._draining is not None:
            return  # the round in progress runs another one after it
        draining = Deferred.fromCoroutine(self._drain())
        draining.addErrback(lambda f: _log.failure("push round failed", f))
        if not draining.called:
            self._draining = draining

    async def _drain(self) -> None:
        try:
            while self._want_revocations or self._want_quotas:
                revocations, quotas = self._want_revocations, self._want_quotas
                self._want_revocations = self._want_quotas = False
                await self._renew_certificate()
                if revocations:
                    await self._push_revocations()
                if quotas:
                    await self._push_quotas()
        finally:
            self._draining = None

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self._clock.seconds(), UTC)

    async def _renew_certificate(self) -> None:
        if self._keeper is None or not self._keeper.due():
            return
        try:
            await self._keeper.refresh()
        except ControlCertificateUnavailable as e:
            _log.info("no control certificate yet: {reason}", reason=str(e))
        except Exception:
            _log.failure("control certificate renewal failed; retrying next round")

    async def _push_revocations(self) -> None:
        now = self._now()
        try:
            pruned = await self._store.prune_revocations(now)
            sessions = await self._store.prune_admin_sessions(now)
            active = await self._store.active_revocations(now)
            servers = await self._store.list_servers()
        except Exception:
            _log.failure("revocation push: database unavailable; retrying next round")
            return
        if pruned:
            _log.info("pruned {count} expired revocations", count=pruned)
        if sessions:
            _log.info("pruned {count} ended admin sessions", count=sessions)
        if self._keeper is None or not servers:
            return
        targets = [self._target_of(server) for server in servers]
        calls = [self._client.put_revocations(target, active, now) for target in targets]
        results = await DeferredList(calls, consumeErrors=True)
        for target, (ok, result) in zip(targets, results, strict=True):
            if ok or not isinstance(result, Failure):
                _log.debug(
                    "pushed {count} revocations to {fqdn}", count=len(active), fqdn=target.fqdn
                )
            else:
                self._log_failure("revocation push", target, result.value)

    async def _load_placements(self) -> bool:
        """
        Once per process: know every placed tenant and queue its whole
        quotas; L{False} (tried again next round) when the database fails.
        """
        if self._placements_loaded:
            return True
        try:
            placements = await self._store.list_placements()
        except Exception:
            _log.failure("quota push: cannot list placements; retrying next round")
            return False
        for placement in placements:
            self._placed[placement.tenant_id] = placement.server.fqdn
            if placement.tenant_id not in self._tenants_read:
                self._syncs.add(placement.tenant_id)
        self._placements_loaded = True
        _log.info("quota push: {count} placed tenants to send", count=len(placements))
        return True

    async def _push_quotas(self) -> None:
        if not await self._load_placements() or not await self._read_tenants():
            return
        placements: dict[str, Placement | None] = {}
        failed: set[str] = set()  # servers that failed once wait for the next round
        for key, update in list(self._pending.items()):
            try:
                if update.tenant not in placements:
                    placements[update.tenant] = await self._store.get_placement(update.tenant)
            except Exception:
                _log.failure("quota push: database unavailable; retrying next round")
                return
            placement = placements[update.tenant]
            if placement is None:
                # No server holds the tenant yet: its placement sends everything.
                self._forget(key, update)
                continue
            self._placed[update.tenant] = placement.server.fqdn
            if placement.server.fqdn in failed:
                continue
            target = self._target_of(placement.server)
            try:
                await self._client.put_update(target, update)
            except Exception as e:
                if isinstance(update, SessionFence) and _refused(e):
                    # A server that does not know the call (an older version)
                    # refuses it every time: retrying would only hold back
                    # its other updates. It still fences at the new holder's
                    # first write.
                    _log.warn(
                        "session fence push to {fqdn} refused ({reason}); dropped",
                        fqdn=target.fqdn,
                        reason=str(e),
                    )
                    self._forget(key, update)
                    continue
                self._log_failure("quota push", target, e)
                failed.add(placement.server.fqdn)
                continue
            self._forget(key, update)

    async def _read_tenants(self) -> bool:
        """
        Queue the whole quotas of every tenant waiting to be read; L{False}
        (the tenant left waiting) when the database fails.
        """
        while self._syncs:
            tenant_id = min(self._syncs)
            self._syncs.discard(tenant_id)
            before = dict(self._pending)
            try:
                read = await self._read_tenant(tenant_id)
            except NotFound:
                _log.warn("quota push: tenant {tenant} is not in the database", tenant=tenant_id)
                self._placed.pop(tenant_id, None)
                self._tenants_read.discard(tenant_id)
                continue
            except Exception:
                self._syncs.add(tenant_id)
                _log.failure("quota push: database unavailable; retrying next round")
                return False
            self._tenants_read.add(tenant_id)
            for update in unsuperseded(read, before, self._pending):
                self._pending[update.key] = update
            _log.debug(
                "queued {count} quota updates of tenant {tenant}", count=len(read), tenant=tenant_id
            )
        return True

    async def _read_tenant(self, tenant_id: str) -> tuple[QuotaUpdate, ...]:
        tenant = await self._store.get_tenant(tenant_id)
        owner = await self._store.get_user(tenant.owner_id)
        allocations = await self._store.list_allocations(owner.user_id)
        return tenant_quotas(tenant, owner, allocations)

    def _forget(self, key: QuotaKey, update: ServerUpdate) -> None:
        if self._pending.get(key) is update:
            del self._pending[key]

    def _log_failure(self, what: str, target: DataPlaneTarget, error: object) -> None:
        if isinstance(error, DataPlaneCallFailed):
            _log.warn(
                "{what} to {fqdn} failed: {reason}; retrying next round",
                what=what,
                fqdn=target.fqdn,
                reason=error.reason,
            )
        else:
            _log.error(
                "{what} to {fqdn} failed unexpectedly: {error!r}",
                what=what,
                fqdn=target.fqdn,
                error=error,
            )
