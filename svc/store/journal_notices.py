"""
Who is told that a tenant's journal changed: the waiters of
L{svc.store.tenant.TenantStorage.journal_changed} (the control plane's
journal long-poll waits on them), woken once a change that appended a
journal row has committed; and, when the server gave the engine a
L{svc.store.observer.StoreObserver}, the journal-row count of each agent
disk (L{svc.store.observer.JournalRowsReporter}), marked by those changes
and by sweeps (which prune), purges and grant changes.
"""

from __future__ import annotations

from typing import TypeVar

from twisted.internet.defer import Deferred, succeed

from svc.store.layout import TenantLocation
from svc.store.manifest_paths import top_of
from svc.store.manifests import ManifestStore
from svc.store.observer import JournalRowsReporter, ReporterClock, StoreObserver

T = TypeVar("T")


class JournalNotices:
    """
    The journal notices of one tenant. Built by
    L{svc.store.tenant.TenantStorage}.

    @param observer: told of every disk's journal rows; L{None}: nothing
        is counted.
    """

    def __init__(
        self,
        location: TenantLocation,
        manifests: ManifestStore,
        clock: ReporterClock,
        observer: StoreObserver | None,
    ) -> None:
        self._waiters: list[Deferred[None]] = []
        self._rows: JournalRowsReporter | None = None
        if observer is not None:
            self._rows = JournalRowsReporter(
                location, manifests.journal_rows_by_top, observer, clock
            )
            self._rows.changed_all()

    def wait(self) -> Deferred[None]:
        """
        Fires once the next journaled change has committed
        (L{svc.store.tenant.TenantStorage.journal_changed}).
        """
        waiter: Deferred[None] = Deferred(self._forget_waiter)
        self._waiters.append(waiter)
        return waiter

    def waiting(self) -> int:
        """How many L{wait} waiters are pending."""
        return len(self._waiters)

    def _forget_waiter(self, waiter: Deferred[None]) -> None:
        try:
            self._waiters.remove(waiter)
        except ValueError:
            pass

    def journaled(self, change: Deferred[T], path: str) -> Deferred[T]:
        """
        Once C{change} (of C{path}) has committed with a journal row (its
        result's C{journal_seq} is not L{None}): wake the L{wait} waiters
        and mark the disk of C{path} for the journal-row count.
        """

        def committed(result: T) -> T:
            if getattr(result, "journal_seq", None) is None:
                return result
            if self._rows is not None:
                self._rows.changed(top_of(path))
            if self._waiters:
                waiters, self._waiters = self._waiters, []
                for waiter in waiters:
                    waiter.callback(None)
            return result

        return change.addCallback(committed)

    def changed(self, top: str) -> None:
        """The journal of disk C{top} may have gained or lost rows."""
        if self._rows is not None:
            self._rows.changed(top)

    def changed_all(self) -> None:
        """Any disk's journal may have changed (a sweep pruned)."""
        if self._rows is not None:
            self._rows.changed_all()

    def close(self) -> Deferred[None]:
        """Count no more; fires once a count in progress has ended."""
        if self._rows is None:
            return succeed(None)
        return self._rows.close()
