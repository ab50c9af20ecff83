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
     replaces its in-memory deny-list, so a server that restarted with an
     empty one is repaired within a round);
  3. retries the quota updates still pending (C{PUT /control/quotas}): the
     routes queue an update after a grant or budget change and it is sent at
     once; one that fails stays queued, newest value per agent or account
     winning, until a round delivers it. The queue is in memory only.

A failure to reach a server, or of the database, is logged and retried next
round; rounds never overlap (a request that arrives during a round runs one
more round after it).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol

from twisted.application.service import Service
from twisted.internet.defer import Deferred, DeferredList, succeed
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from svc.control.dataplane_client import (
    ControlCertificateKeeper,
    ControlCertificateUnavailable,
    DataPlaneCallFailed,
    DataPlaneClient,
    DataPlaneTarget,
    QuotaUpdate,
    target_for,
)
from svc.control.store.interface import ControlStore
from svc.control.store.values import Server

DEFAULT_PUSH_INTERVAL_SECONDS = 60
"""The spec's revocation reconcile interval."""

_log = Logger()


class PushNotices(Protocol):
    """What the routes tell the push loop after a change is committed."""

    def revocations_changed(self) -> None:
        """A serial was revoked: push the active set to every server now."""

    def quota_changed(self, update: QuotaUpdate) -> None:
        """A grant or budget changed: send it to the tenant's server."""


class NoPushes:
    """L{PushNotices} that push nothing (a process without data-plane access)."""

    def revocations_changed(self) -> None:
        """Ignore."""

    def quota_changed(self, update: QuotaUpdate) -> None:
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
    """

    def __init__(
        self,
        store: ControlStore,
        clock: Any,
        client: DataPlaneClient,
        keeper: ControlCertificateKeeper | None,
        interval: float = DEFAULT_PUSH_INTERVAL_SECONDS,
        target_of: Callable[[Server], DataPlaneTarget] = target_for,
    ) -> None:
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
        self._pending: dict[tuple[str, ...], QuotaUpdate] = {}
        self._draining: Deferred[None] | None = None

    # PushNotices

    def revocations_changed(self) -> None:
        """Push the active revocation set now (ignored while stopped)."""
        if self.running:
            self._request(revocations=True, quotas=False)

    def quota_changed(self, update: QuotaUpdate) -> None:
        """Queue C{update} (replacing an older one for the same target) and try it now."""
        self._pending[update.key] = update
        if self.running:
            self._request(revocations=False, quotas=True)

    @property
    def pending_quotas(self) -> tuple[QuotaUpdate, ...]:
        """The quota updates not yet delivered."""
        return tuple(self._pending.values())

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

    async def _push_quotas(self) -> None:
        for key, update in list(self._pending.items()):
            try:
                placement = await self._store.get_placement(update.tenant)
            except Exception:
                _log.failure("quota push: database unavailable; retrying next round")
                return
            if placement is None:
                # No server holds the tenant yet: nothing to update.
                self._forget(key, update)
                continue
            target = self._target_of(placement.server)
            try:
                await self._client.put_quotas(target, update)
            except Exception as e:
                self._log_failure("quota push", target, e)
                continue
            self._forget(key, update)

    def _forget(self, key: tuple[str, ...], update: QuotaUpdate) -> None:
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
