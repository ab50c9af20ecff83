"""
What the storage engine reports as it works, for the server's metrics
(``docs/specifications/metrics.md``): the batched chunk deletions of garbage
collection, reclaim and purge (C{svc_chunk_batch_*{operation="delete"}}),
and the rows each agent's journal holds (C{svc_journal_rows_total}).

L{StoreObserver} is the seam: the data plane gives its
L{svc.metrics.DataPlaneMetrics} (whose methods have these names); the store
imports no metrics. L{JournalRowsReporter} keeps one tenant's journal-row
series current: a journaled change marks its agent's disk (its C{top}), and
one count of the marked disks runs at most every L{JOURNAL_ROWS_DELAY}
seconds on the tenant's database worker.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, Protocol

from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger

from svc.store.layout import TenantLocation

JOURNAL_ROWS_DELAY = 1.0
"""Seconds from a journaled change to the count that reports it (changes
meanwhile share that count)."""

_log = Logger()


class StoreObserver(Protocol):
    """What the engine tells the server's metrics."""

    def observe_chunk_batch(self, operation: str, seconds: float, size: int) -> None:
        """One batched chunk C{operation} (here C{delete}) of C{size} hashes took C{seconds}."""

    def count_chunk_batch_items(self, operation: str, result: str, n: int = 1) -> None:
        """C{n} items of a batch ended with C{result} (C{deleted}, C{missing}, C{error})."""

    def set_journal_rows(self, allocation_id: str, rows: int) -> None:
        """The journal of disk C{allocation_id} holds C{rows} rows (more than 0)."""

    def forget_allocation(self, allocation_id: str) -> None:
        """The journal of disk C{allocation_id} holds no row any more."""


class NoObserver:
    """A L{StoreObserver} that records nothing (tests, tools)."""

    def observe_chunk_batch(self, operation: str, seconds: float, size: int) -> None:
        """Ignore."""

    def count_chunk_batch_items(self, operation: str, result: str, n: int = 1) -> None:
        """Ignore."""

    def set_journal_rows(self, allocation_id: str, rows: int) -> None:
        """Ignore."""

    def forget_allocation(self, allocation_id: str) -> None:
        """Ignore."""


def allocation_label(location: TenantLocation, top: str) -> str:
    """
    The C{allocation_id} label of an agent's disk: C{<tenant>/<agent_id>}
    (C{top} is the disk's directory name, the agent id), as the data plane's
    journal metrics name it.
    """
    return f"{location.tenant}/{top}"


class ReporterClock(Protocol):
    """The part of a reactor the reporter uses."""

    def callLater(
        self, delay: float, callable: Callable[..., object], *args: object, **kw: object
    ) -> Any:
        """Schedule a call."""


CountRows = Callable[[Collection[str] | None], Deferred[dict[str, int]]]
"""Counts the journal rows of the given tops (L{None}: of every top with rows)."""


class JournalRowsReporter:
    """
    Reports one tenant's journal rows per agent disk to a L{StoreObserver}:
    a disk with rows has its series set to their number, a disk whose rows
    are all gone (pruned, purged) has its series removed.

    @param count: L{svc.store.manifests.ManifestStore.journal_rows_by_top}.
    """

    def __init__(
        self,
        location: TenantLocation,
        count: CountRows,
        observer: StoreObserver,
        clock: ReporterClock,
        delay: float = JOURNAL_ROWS_DELAY,
    ) -> None:
        self._location = location
        self._count = count
        self._observer = observer
        self._clock = clock
        self._delay = delay
        self._dirty: set[str] = set()
        self._all = False
        self._reported: set[str] = set()
        self._timer: Any = None
        self._running: Deferred[None] | None = None
        self._closed = False

    def changed(self, top: str) -> None:
        """The journal of disk C{top} may have gained or lost rows."""
        if top:
            self._dirty.add(top)
            self._schedule()

    def changed_all(self) -> None:
        """Any disk's journal may have changed (a sweep pruned, the tenant opened)."""
        self._all = True
        self._schedule()

    def close(self) -> Deferred[None]:
        """Count no more; fires once a count in progress has ended."""
        self._closed = True
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        return self._running if self._running is not None else succeed(None)

    def _schedule(self) -> None:
        if self._closed or self._timer is not None or self._running is not None:
            return
        self._timer = self._clock.callLater(self._delay, self._start)

    def _start(self) -> None:
        self._timer = None
        tops: set[str] | None = None if self._all else set(self._dirty)
        self._dirty.clear()
        self._all = False
        running = Deferred.fromCoroutine(self._report(tops))
        if not running.called:
            self._running = running

    async def _report(self, tops: set[str] | None) -> None:
        try:
            counted = await self._count(tops)
        except Exception:
            _log.failure(
                "counting the journal rows of {tenant} failed", tenant=self._location.tenant
            )
            counted = None
        finally:
            self._running = None
        if counted is not None:
            self._publish(tops, counted)
        if self._dirty or self._all:
            self._schedule()

    def _publish(self, tops: set[str] | None, counted: dict[str, int]) -> None:
        asked = set(self._reported) | set(counted) if tops is None else tops
        for top in sorted(asked):
            label = allocation_label(self._location, top)
            rows = counted.get(top, 0)
            if rows > 0:
                self._observer.set_journal_rows(label, rows)
                self._reported.add(top)
            elif top in self._reported:
                self._observer.forget_allocation(label)
                self._reported.discard(top)
