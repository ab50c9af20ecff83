"""
The data-plane server's periodic garbage collection.

L{GarbageCollectionLoop} sweeps every tenant with storage on this server
(those the engine has opened and those on disk it opens for the purpose, so
a restarted server collects tenants no agent has used since), every
C{interval} seconds of an injected clock. Sweeps never overlap: the
next one is scheduled only after the previous finished (a slow sweep delays
the next rather than piling up). Each tenant's sweep writes one
C{gc_swept_chunks} audit line (C{tenant_id}, C{count}, C{bytes_freed},
C{dry_run}, empty path). Tenants are swept one after the other; a tenant
whose sweep fails is logged and skipped, the others are still swept, and
the loop carries on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from twisted.application.service import Service
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from svc.audit.events import AuditEvent
from svc.audit.server_events import gc_swept_chunks_event
from svc.store.gc import SweepReport

DEFAULT_GC_INTERVAL = 3600.0
"""Seconds between sweeps unless configured otherwise."""


class SweepsTenant(Protocol):
    """What the loop needs of an opened tenant (L{svc.store.tenant.TenantStorage})."""

    @property
    def tenant_id(self) -> str:
        """The tenant's id."""

    def sweep(self, *, dry_run: bool = False) -> Deferred[SweepReport]:
        """One sweep of the tenant."""


class OpensTenants(Protocol):
    """What the loop needs of the engine (L{svc.store.engine.StorageEngine})."""

    def sweepable(self) -> Awaitable[Sequence[SweepsTenant]]:
        """Every tenant with storage on this server, opened."""


class SweepClock(Protocol):
    """The part of a reactor (or C{Clock}) the loop uses."""

    def seconds(self) -> float:
        """Now, in seconds since the epoch."""

    def callLater(
        self, delay: float, callable: Callable[..., object], *args: object, **kw: object
    ) -> Any:
        """Schedule a call."""


class GarbageCollectionLoop(Service):
    """
    Sweeps C{engine}'s tenants every C{interval} seconds (the first sweep
    one interval after start), emitting one audit line per tenant.

    @param dry_run: count what would be deleted without deleting it.
    """

    _log = Logger()

    def __init__(
        self,
        engine: OpensTenants,
        clock: SweepClock,
        emit: Callable[[AuditEvent], object],
        *,
        interval: float = DEFAULT_GC_INTERVAL,
        dry_run: bool = False,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"the GC interval must be positive, got {interval}")
        self._engine = engine
        self._clock = clock
        self._emit = emit
        self.interval = interval
        self.dry_run = dry_run
        self.sweeps = 0
        """Completed sweep cycles."""
        self._loop: LoopingCall | None = None
        self._in_progress = False
        self._waiters: list[Callable[[list[SweepReport]], object]] = []

    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]
        loop = LoopingCall(self._scheduled_sweep)
        loop.clock = self._clock  # type: ignore[assignment]
        self._loop = loop
        loop.start(self.interval, now=False)

    def stopService(self) -> Deferred[None]:
        """Stop scheduling; fires once a sweep in progress has finished."""
        super().stopService()  # type: ignore[no-untyped-call]
        loop, self._loop = self._loop, None
        if loop is not None and loop.running:
            loop.stop()
        if not self._in_progress:
            return succeed(None)
        finished: Deferred[None] = Deferred()
        self._waiters.append(lambda _: finished.callback(None))
        return finished

    def sweep_now(self) -> Deferred[list[SweepReport]]:
        """
        Run one sweep cycle now or, if one is in progress, wait for that
        one (never two at once). Fires with the per-tenant reports.
        """
        waiter: Deferred[list[SweepReport]] = Deferred()
        self._waiters.append(waiter.callback)
        if not self._in_progress:
            self._in_progress = True
            Deferred.fromCoroutine(self._sweep()).addBoth(self._finished)
        return waiter

    def _finished(self, result: list[SweepReport] | Failure) -> None:
        self._in_progress = False
        if isinstance(result, Failure):
            self._log.failure("GC sweep cycle failed", result)
            result = []
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter(result)

    def _scheduled_sweep(self) -> Deferred[None]:
        done: Deferred[None] = Deferred()
        self.sweep_now().addCallback(lambda _: done.callback(None))
        return done

    async def _sweep(self) -> list[SweepReport]:
        reports: list[SweepReport] = []
        for tenant in list(await self._engine.sweepable()):
            try:
                report = await tenant.sweep(dry_run=self.dry_run)
            except Exception:
                self._log.failure("GC sweep of tenant {tenant} failed", tenant=tenant.tenant_id)
                continue
            reports.append(report)
            self._emit(
                gc_swept_chunks_event(
                    ts=self._clock.seconds(),
                    tenant_id=report.tenant_id,
                    count=report.count,
                    bytes_freed=report.bytes_freed,
                    dry_run=report.dry_run,
                )
            )
            if report.count:
                self._log.info(
                    "GC {tenant}: {count} chunk(s), {bytes_freed} bytes{dry}",
                    tenant=report.tenant_id,
                    count=report.count,
                    bytes_freed=report.bytes_freed,
                    dry=" (dry run)" if report.dry_run else "",
                )
        self.sweeps += 1
        return reports
