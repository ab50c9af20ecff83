"""
L{PostgresControlStore}: the control-plane store in PostgreSQL
(C{DATABASE_URL=postgres://user@host:port/db}), through txpostgres.

txpostgres drives psycopg2's asynchronous connections on the reactor: no
threads. A pool of connections (default 4) runs transactions concurrently;
each transaction holds one connection from C{BEGIN} to C{COMMIT}. Every
connection has txpostgres's dead-connection detector: after the server
restarts or drops it, the operations that find it dead fail
L{svc.control.store.errors.Unavailable} (the caller answers 503) and the
connection reconnects in the background with backoff. A write waits at most
L{LOCK_TIMEOUT_MS} for a lock another session holds, then fails
L{svc.control.store.errors.Unavailable} too.

Isolation: write transactions run at READ COMMITTED and make themselves
atomic with row locks (C{SELECT ... FOR UPDATE} on the allocation, token or
server rows they decide on) and conditional updates, so they never fail with
serialisation errors; read-only transactions run at REPEATABLE READ, READ
ONLY, so they see one snapshot. ``docs/specifications/control-db.md`` lists
the locks of each operation.
"""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any, TypeVar

import psycopg2
from twisted.internet.defer import Deferred, FirstError, succeed
from twisted.internet.interfaces import IReactorCore
from twisted.logger import Logger
from txpostgres.reconnection import ConnectionDead, DeadConnectionDetector
from txpostgres.txpostgres import Connection, ConnectionPool, RollbackFailed

from svc.control.store.errors import Unavailable
from svc.control.store.migrations import migrate
from svc.control.store.migrations.postgres import MIGRATIONS, PRELUDE
from svc.control.store.sql import Rows, Transaction, postgres_text
from svc.control.store.transactional import (
    RandomBytes,
    TransactionalStore,
    check_session_key,
)
from svc.control.store.values import to_micros

T = TypeVar("T")

#: Connections in the pool unless told otherwise.
DEFAULT_POOL_SIZE = 4

#: How long a write waits for a row or table lock another session holds, in
#: milliseconds (as SQLite's busy timeout), before failing L{Unavailable}.
LOCK_TIMEOUT_MS = 10_000

#: SQLSTATEs of a transaction that lost to another one and may simply be
#: retried: lock_not_available, serialization_failure, deadlock_detected.
_TRANSIENT_SQLSTATES = frozenset({"55P03", "40001", "40P01"})

#: SQLSTATE prefixes of an error after which the session is gone.
_CONNECTION_GONE_SQLSTATES = ("08", "57P")

_log = Logger()

_READ_ONLY = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"


class _Connection(Connection):  # type: ignore[misc]
    """
    A txpostgres connection that reports a connection the server dropped as
    lost (to its dead-connection detector, which reconnects) instead of
    letting the error escape into the reactor as an unhandled one.
    """

    def doRead(self) -> object:
        try:
            result: object = super().doRead()
        except (psycopg2.OperationalError, psycopg2.InterfaceError) as error:
            _log.warn("PostgreSQL connection lost: {error}", error=error)
            return error
        return result

    def doWrite(self) -> object:
        try:
            result: object = super().doWrite()
        except (psycopg2.OperationalError, psycopg2.InterfaceError) as error:
            _log.warn("PostgreSQL connection lost: {error}", error=error)
            return error
        return result


class _Pool(ConnectionPool):  # type: ignore[misc]
    """
    txpostgres's pool with the reactor injected (it would otherwise import
    the global one) and a dead-connection detector on every connection.
    """

    def __init__(self, reactor: Any, dsn: str, size: int) -> None:
        self.reactor = reactor
        self.min = size
        super().__init__(None, dsn, connect_timeout=10)
        self.every_connection = tuple(self.connections)

    def connectionFactory(self, reactor: Any, cooperator: Any) -> Connection:
        detector = DeadConnectionDetector(deathChecker=_connection_died, reactor=reactor)
        return _Connection(reactor, cooperator, detector)


def _connection_died(failure: Any) -> bool:
    """
    Whether C{failure} means the connection is gone: txpostgres's own test,
    except that an error the server answered with a SQLSTATE (a lock
    timeout, a deadlock, a full disk) leaves the connection alive, unless
    the SQLSTATE says so itself (class 08, connection exception; 57P,
    the server shutting the session down).
    """
    error = failure.value
    pgcode: str | None = getattr(error, "pgcode", None)
    if pgcode is not None:
        return pgcode.startswith(_CONNECTION_GONE_SQLSTATES)
    return bool(failure.check(psycopg2.InterfaceError, psycopg2.OperationalError, RollbackFailed))


async def _drive(cursor: Any, transaction: Transaction[T], write: bool, lock_timeout_ms: int) -> T:
    """
    Run C{transaction}'s statements on txpostgres C{cursor}, inside the
    transaction C{runInteraction} has begun.
    """
    try:
        if write:
            await cursor.execute(f"SET LOCAL lock_timeout = {lock_timeout_ms:d}")
        else:
            await cursor.execute(_READ_ONLY)
        try:
            statement = next(transaction)
            while True:
                await cursor.execute(postgres_text(statement), statement.params)
                rows = (
                    tuple(tuple(row) for row in cursor.fetchall())
                    if cursor.description is not None
                    else ()
                )
                statement = transaction.send(Rows(rows, cursor.rowcount))
        except StopIteration as stop:
            result: T = stop.value
            return result
    finally:
        transaction.close()


class PostgresControlStore(TransactionalStore):
    """
    The L{svc.control.store.interface.ControlStore} in PostgreSQL. Build it
    with L{open}.
    """

    def __init__(
        self,
        pool: _Pool,
        random_bytes: RandomBytes = os.urandom,
        *,
        session_key: bytes,
        lock_timeout_ms: int = LOCK_TIMEOUT_MS,
    ) -> None:
        super().__init__(session_key=session_key, random_bytes=random_bytes)
        self._pool = pool
        self._lock_timeout_ms = lock_timeout_ms

    @classmethod
    def open(
        cls,
        dsn: str,
        reactor: IReactorCore,
        now: datetime,
        pool_size: int = DEFAULT_POOL_SIZE,
        random_bytes: RandomBytes = os.urandom,
        *,
        session_key: bytes,
        lock_timeout_ms: int = LOCK_TIMEOUT_MS,
    ) -> Deferred[PostgresControlStore]:
        """
        Connect C{pool_size} connections to C{dsn} (a libpq URL or key/value
        string) and migrate the database; C{now} is recorded as the time of
        any migration applied. Concurrent openers migrate one at a time.
        C{session_key} keys the mount session ids
        (L{svc.sessions.session_key}). A write waits C{lock_timeout_ms} at
        most for a lock.

        @raise ValueError: C{pool_size} below 1 or C{session_key} too short
            (raised at once).
        @raise svc.control.store.errors.SchemaTooNew: the database was
            migrated by a newer svc.
        """
        if pool_size < 1:
            raise ValueError("pool_size must be at least 1")
        check_session_key(session_key)
        pool = _Pool(reactor, dsn, pool_size)
        now_us = to_micros(now)

        async def opening() -> PostgresControlStore:
            try:
                try:
                    await pool.start()
                except FirstError as error:
                    error.subFailure.raiseException()
                store = cls(
                    pool, random_bytes, session_key=session_key, lock_timeout_ms=lock_timeout_ms
                )
                await store._run(migrate(MIGRATIONS, PRELUDE, now_us), write=True)
            except BaseException:
                _close_quietly(pool)
                raise
            return store

        return Deferred.fromCoroutine(opening())

    def _run(self, transaction: Transaction[T], write: bool) -> Deferred[T]:
        lock_timeout_ms = self._lock_timeout_ms

        def interaction(cursor: Any) -> Deferred[T]:
            return Deferred.fromCoroutine(_drive(cursor, transaction, write, lock_timeout_ms))

        result: Deferred[T] = self._pool.runInteraction(interaction)
        return result.addErrback(_unavailable_if_transient)

    def close(self) -> Deferred[None]:
        """
        Close every connection of the pool (call it once no operation is in
        flight).
        """
        _close_quietly(self._pool)
        return succeed(None)


def _unavailable_if_transient(failure: Any) -> Any:
    """
    L{Unavailable} for a failure that says nothing about the request: a lock
    held past the lock timeout, a lost serialisation or deadlock, a
    connection that is gone; any other failure unchanged.
    """
    error = failure.value
    if isinstance(error, ConnectionDead):
        raise Unavailable(f"the PostgreSQL connection is down: {error}") from error
    if isinstance(error, psycopg2.Error):
        pgcode = error.pgcode
        transient = (
            pgcode in _TRANSIENT_SQLSTATES
            or (pgcode is not None and pgcode.startswith(_CONNECTION_GONE_SQLSTATES))
            or (
                pgcode is None
                and isinstance(error, psycopg2.OperationalError | psycopg2.InterfaceError)
            )
        )
        if transient:
            raise Unavailable(f"PostgreSQL cannot serve now: {error}") from error
    return failure


def _close_quietly(pool: _Pool) -> None:
    for connection in pool.every_connection:
        if connection.detector is not None:
            connection.detector.reconnectable = None
        try:
            connection.close()
        except Exception:  # noqa: S110 - a connection that never opened has nothing to close
            pass
