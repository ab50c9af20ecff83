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

One exception, asked for per unit: an I{early} unit's result is delivered as
soon as it has run, before its transaction commits. A batch with other
writes then takes two trips to the worker (the units, then the commit); a
batch whose writes are all early leaves its transaction open for the next
batch to commit, or for a commit of its own C{linger} seconds later (0.05
by default), so early work rides on the next commit instead of costing an
fsync. Only for work whose effect may be lost in a crash, or in a failed
commit, without harm to what the caller does next (an upload's charge:
L{svc.store.footprint_rows}).
"""

from __future__ import annotations

import sqlite3
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import attrs
from twisted.internet.defer import Deferred, fail, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure

from svc.worker import IWorker

T = TypeVar("T")

#: The most units one transaction takes, bounding the latency a long queue adds.
MAX_BATCH = 64

#: Seconds early work may stay uncommitted when no other work follows.
LINGER_SECONDS = 0.05

_log = Logger()


class StoreClosed(Exception):
    """The store was used after it was closed."""


@attrs.define
class _Unit:
    work: Callable[[sqlite3.Connection], Any]
    writes: bool
    deferred: Deferred[Any]
    early: bool = False


Outcome = tuple[bool, Any]


def run_units(
    connection: sqlite3.Connection, units: list[tuple[Callable[[sqlite3.Connection], Any], bool]]
) -> list[Outcome]:
    """
    Run ``units`` (work, writes) and return per unit C{(True, result)} or
    C{(False, Failure)}. When any unit writes, a transaction is begun (unless
    one is open already: early work left uncommitted) and left open
    (L{commit} ends it), each writing unit in a savepoint; a failure to
    begin raises and rolls everything back. Reads need neither:
    this connection is the database's only writer. Runs on the worker
    thread.
    """
    if any(unit_writes for _, unit_writes in units) and not connection.in_transaction:
        connection.execute("BEGIN IMMEDIATE")
    outcomes: list[Outcome] = []
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
    except BaseException:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        raise
    return outcomes


def commit(connection: sqlite3.Connection) -> None:
    """
    Commit the transaction L{run_units} left open, if any; a failure rolls
    it back and raises. Runs on the worker thread.
    """
    if not connection.in_transaction:
        return
    try:
        connection.execute("COMMIT")
    except BaseException:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        raise


def run_batch(
    connection: sqlite3.Connection, units: list[tuple[Callable[[sqlite3.Connection], Any], bool]]
) -> list[Outcome]:
    """
    L{run_units} then L{commit}: the whole batch in one transaction, each
    writing unit in a savepoint; a failure to begin or commit raises and
    rolls everything back. Runs on the worker thread.
    """
    outcomes = run_units(connection, units)
    commit(connection)
    return outcomes


def _deliver(unit: _Unit, outcome: Outcome) -> None:
    ok, value = outcome
    if ok:
        unit.deferred.callback(value)
    else:
        unit.deferred.errback(value)


class QueueClock(Protocol):
    """The part of a reactor the queue uses (to commit early work soon)."""

    def callLater(
        self, delay: float, callable: Callable[..., object], *args: object, **kw: object
    ) -> Any:
        """Schedule a call."""


class TransactionQueue:
    """
    The only way work reaches one database connection after it is opened.

    A batch whose writes are all early leaves its transaction open instead
    of committing it (its results are delivered at once): the next batch
    runs in the same transaction and commits it, or, if none comes within
    C{linger} seconds, a commit of its own does. So early work costs no
    fsync of its own when other work follows.
    """

    def __init__(
        self,
        connection: sqlite3.Connection,
        worker: IWorker,
        max_batch: int = MAX_BATCH,
        *,
        clock: QueueClock | None = None,
        linger: float = LINGER_SECONDS,
    ) -> None:
        self._connection = connection
        self._worker = worker
        self._max_batch = max_batch
        self._clock = clock
        self._linger = linger
        self._pending: deque[_Unit] = deque()
        self._running = False
        self._lingering = False
        self._flush_due = False
        self._flush_call: Any = None
        self._closing = False
        self._closed: Deferred[None] | None = None
        self._is_closed = False
        self._close_waiters: list[Deferred[None]] = []

    def submit(
        self, work: Callable[[sqlite3.Connection], T], *, writes: bool, early: bool = False
    ) -> Deferred[T]:
        """
        Queue ``work`` (run on the worker thread with the connection); its
        result arrives after the transaction holding it has committed, or
        with ``early`` as soon as it has run (see the module docstring).
        """
        if self._closing:
            return fail(StoreClosed())
        deferred: Deferred[T] = Deferred()
        self._pending.append(_Unit(work, writes, deferred, early))
        self._pump()
        return deferred

    def close(self) -> Deferred[None]:
        """
        Refuse new work, finish the queued work (committing early work left
        open), then close the connection.
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
        connection = self._connection
        if not self._pending:
            if self._lingering and (self._flush_due or self._closing or self._clock is None):
                self._running = True
                self._worker.submit(lambda: commit(connection)).addBoth(self._flushed)
            elif self._closing and self._closed is None:
                self._closed = self._worker.submit(connection.close)
                self._closed.addBoth(self._fire_close_waiters)
            return
        batch = [self._pending.popleft() for _ in range(min(self._max_batch, len(self._pending)))]
        self._running = True
        units = [(unit.work, unit.writes) for unit in batch]
        early = any(unit.early and unit.writes for unit in batch)
        durable = any(unit.writes and not unit.early for unit in batch)
        may_linger = self._clock is not None and not self._closing and not self._flush_due
        if not durable and (early or self._lingering) and may_linger:
            self._worker.submit(lambda: run_units(connection, units)).addBoth(self._ran_open, batch)
        elif early:
            self._worker.submit(lambda: run_units(connection, units)).addBoth(self._ran, batch)
        else:
            self._worker.submit(lambda: run_batch(connection, units)).addBoth(self._finished, batch)

    def _ran_open(self, outcome: list[Outcome] | Failure, batch: list[_Unit]) -> None:
        """
        A batch of early writes (and reads) has run: answer every unit and
        leave the transaction open for the next batch, or for a commit
        within C{linger} seconds.
        """
        if isinstance(outcome, Failure):
            self._committed_all()
            self._finished(outcome, batch)
            return
        self._running = False
        self._lingering = True
        if self._flush_call is None and self._clock is not None:
            self._flush_call = self._clock.callLater(self._linger, self._flush)
        for unit, result in zip(batch, outcome, strict=True):
            _deliver(unit, result)
        self._pump()

    def _flush(self) -> None:
        self._flush_call = None
        self._flush_due = True
        self._pump()

    def _flushed(self, outcome: Failure | None) -> None:
        self._running = False
        self._committed_all()
        if isinstance(outcome, Failure):
            _log.failure("routes.db: committing early work failed", outcome)
        self._pump()

    def _committed_all(self) -> None:
        """No transaction is open any more: nothing lingers."""
        self._lingering = False
        self._flush_due = False
        if self._flush_call is not None:
            self._flush_call.cancel()
            self._flush_call = None

    def _ran(self, outcome: list[Outcome] | Failure, batch: list[_Unit]) -> None:
        """The units of a batch with early units have run: answer those, then commit."""
        if isinstance(outcome, Failure):
            self._committed_all()
            self._finished(outcome, batch)
            return
        later: list[tuple[_Unit, Outcome]] = []
        for unit, result in zip(batch, outcome, strict=True):
            if unit.early:
                _deliver(unit, result)
            else:
                later.append((unit, result))

        def committed(done: Failure | None) -> None:
            self._running = False
            self._committed_all()
            for unit, result in later:
                _deliver(unit, (False, done) if isinstance(done, Failure) else result)
            self._pump()

        connection = self._connection
        self._worker.submit(lambda: commit(connection)).addBoth(committed)

    def _finished(self, outcome: list[Outcome] | Failure, batch: list[_Unit]) -> None:
        self._running = False
        self._committed_all()
        if isinstance(outcome, Failure):
            for unit in batch:
                unit.deferred.errback(outcome)
        else:
            for unit, result in zip(batch, outcome, strict=True):
                _deliver(unit, result)
        self._pump()

    def _fire_close_waiters(self, outcome: object) -> None:
        self._is_closed = True
        waiters, self._close_waiters = self._close_waiters, []
        for waiter in waiters:
            if isinstance(outcome, Failure):
                waiter.errback(outcome)
            else:
                waiter.callback(None)
