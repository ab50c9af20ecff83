"""
Group commit for ``routes.db``: every unit of work for one database goes
through a L{TransactionQueue}, which runs the units queued at that moment on
the worker in one SQLite transaction, each inside its own savepoint, and
fires each unit's L{Deferred} only after the transaction has committed.

So each unit is atomic on its own (a failing unit rolls back to its
savepoint and nothing it wrote survives), every result a caller sees is
durable (C{synchronous=FULL}: the commit returned), units run in submission
order (a read sees every earlier write), and N writes in flight cost one
fsync instead of N.
"""

from __future__ import annotations

import sqlite3
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

import attrs
from twisted.internet.defer import Deferred, fail, succeed
from twisted.python.failure import Failure

from svc.worker import IWorker

T = TypeVar("T")

#: The most units one transaction takes, bounding the latency a long queue adds.
MAX_BATCH = 64


class StoreClosed(Exception):
    """The store was used after it was closed."""


@attrs.define
class _Unit:
    work: Callable[[sqlite3.Connection], Any]
    writes: bool
    deferred: Deferred[Any]


def run_batch(
    connection: sqlite3.Connection, units: list[tuple[Callable[[sqlite3.Connection], Any], bool]]
) -> list[tuple[bool, Any]]:
    """
    Run ``units`` (work, writes) and return per unit C{(True, result)} or
    C{(False, Failure)}. When any unit writes, the batch is one transaction,
    each writing unit in a savepoint, committed at the end; a failure to
    begin or commit raises and rolls everything back. Reads need neither:
    this connection is the database's only writer. Runs on the worker
    thread.
    """
    writes = any(unit_writes for _, unit_writes in units)
    if writes:
        connection.execute("BEGIN IMMEDIATE")
    outcomes: list[tuple[bool, Any]] = []
    try:
        for work, unit_writes in units:
            if unit_writes:
                connection.execute("SAVEPOINT unit")
            try:
                value = work(connection)
            except Exception:
                outcomes.append((False, Failure()))  # type: ignore[no-untyped-call]
                if unit_writes:
                    connection.execute("ROLLBACK TO unit")
            else:
                outcomes.append((True, value))
            if unit_writes:
                connection.execute("RELEASE unit")
        if writes:
            connection.execute("COMMIT")
    except BaseException:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        raise
    return outcomes


class TransactionQueue:
    """
    The only way work reaches one database connection after it is opened.
    """

    def __init__(
        self, connection: sqlite3.Connection, worker: IWorker, max_batch: int = MAX_BATCH
    ) -> None:
        self._connection = connection
        self._worker = worker
        self._max_batch = max_batch
        self._pending: deque[_Unit] = deque()
        self._running = False
        self._closing = False
        self._closed: Deferred[None] | None = None
        self._is_closed = False
        self._close_waiters: list[Deferred[None]] = []

    def submit(self, work: Callable[[sqlite3.Connection], T], *, writes: bool) -> Deferred[T]:
        """
        Queue ``work`` (run on the worker thread with the connection); its
        result arrives after the transaction holding it has committed.
        """
        if self._closing:
            return fail(StoreClosed())
        deferred: Deferred[T] = Deferred()
        self._pending.append(_Unit(work, writes, deferred))
        self._pump()
        return deferred

    def close(self) -> Deferred[None]:
        """
        Refuse new work, finish the queued work, then close the connection.
        """
        if self._is_closed:
            return succeed(None)
        waiter: Deferred[None] = Deferred()
        self._close_waiters.append(waiter)
        self._closing = True
        self._pump()
        return waiter

    def _pump(self) -> None:
        if self._running:
            return
        if not self._pending:
            if self._closing and self._closed is None:
                self._closed = self._worker.submit(self._connection.close)
                self._closed.addBoth(self._fire_close_waiters)
            return
        batch = [self._pending.popleft() for _ in range(min(self._max_batch, len(self._pending)))]
        self._running = True
        units = [(unit.work, unit.writes) for unit in batch]
        self._worker.submit(lambda: run_batch(self._connection, units)).addBoth(
            self._finished, batch
        )

    def _finished(self, outcome: list[tuple[bool, Any]] | Failure, batch: list[_Unit]) -> None:
        self._running = False
        if isinstance(outcome, Failure):
            for unit in batch:
                unit.deferred.errback(outcome)
        else:
            for unit, (ok, value) in zip(batch, outcome, strict=True):
                if ok:
                    unit.deferred.callback(value)
                else:
                    unit.deferred.errback(value)
        self._pump()

    def _fire_close_waiters(self, outcome: object) -> None:
        self._is_closed = True
        waiters, self._close_waiters = self._close_waiters, []
        for waiter in waiters:
            if isinstance(outcome, Failure):
                waiter.errback(outcome)
            else:
                waiter.callback(None)
