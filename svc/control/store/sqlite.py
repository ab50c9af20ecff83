"""
L{SQLiteControlStore}: the control-plane store in one SQLite file, the
embedded default (C{DATABASE_URL=sqlite:///abs/path}).

One connection, used only through the injected single-thread
L{svc.worker.IWorker} (a one-thread L{svc.worker.ThreadWorker} in
production, L{svc.testing.worker.ImmediateWorker} in tests), so transactions
of one process run one at a time in submission order. The file is in WAL
mode with C{synchronous=FULL}: a transaction that has committed (a
provisioning, a spent token) survives the process being killed and the
machine losing power. Write transactions start with C{BEGIN IMMEDIATE}, which
takes SQLite's write lock at once, so another process on the same file (an
operator command) cannot interleave; C{busy_timeout} makes it wait for the
lock rather than fail.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TypeVar

from twisted.internet.defer import Deferred

from svc.control.store.errors import Unavailable
from svc.control.store.migrations import migrate
from svc.control.store.migrations.sqlite import MIGRATIONS, PRELUDE
from svc.control.store.sql import Rows, Transaction
from svc.control.store.transactional import (
    RandomBytes,
    TransactionalStore,
    check_session_key,
)
from svc.control.store.values import to_micros
from svc.worker import IWorker

T = TypeVar("T")

#: How long a write waits for another process's write lock, in milliseconds.
BUSY_TIMEOUT_MS = 10_000

#: SQLite's primary result codes for a lock held elsewhere (SQLITE_BUSY,
#: SQLITE_LOCKED); extended codes carry them in their low byte.
_LOCK_RESULT_CODES = frozenset({5, 6})

#: The mode a new database file is created with (SQLite gives its C{-wal}
#: and C{-shm} files the same): it holds credential hashes and, with the
#: in-database CA, encrypted keys.
DATABASE_FILE_MODE = 0o600


def create_private(path: str) -> None:
    """
    Create the database file C{path} with mode L{DATABASE_FILE_MODE} if it
    does not exist yet (an existing file keeps its mode); C{":memory:"} is
    left alone.
    """
    if path == ":memory:":
        return
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, DATABASE_FILE_MODE)
    except FileExistsError:
        return
    os.close(descriptor)


def connect(path: str, busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> sqlite3.Connection:
    """
    Open C{path} (or C{":memory:"}) in autocommit mode with the store's
    pragmas: WAL, C{synchronous=FULL}, foreign keys, busy timeout.
    """
    connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        connection.execute(f"PRAGMA busy_timeout = {busy_timeout_ms:d}")
        connection.execute("PRAGMA journal_mode = WAL")
        connection.execute("PRAGMA synchronous = FULL")
        connection.execute("PRAGMA foreign_keys = ON")
    except BaseException:
        connection.close()
        raise
    return connection


def run_transaction(connection: sqlite3.Connection, transaction: Transaction[T], write: bool) -> T:
    """
    Drive C{transaction} to its end inside one SQLite transaction
    (C{BEGIN IMMEDIATE} if C{write}, else a deferred C{BEGIN}, which reads
    one snapshot); commit and return its result, or roll back and raise.
    Blocks: call it on the store's worker thread.

    @raise Unavailable: a lock another connection holds outlasted the busy
        timeout (the transaction was rolled back).
    """
    try:
        return _run_transaction(connection, transaction, write)
    except sqlite3.OperationalError as error:
        code = getattr(error, "sqlite_errorcode", None)
        if code is not None and code & 0xFF in _LOCK_RESULT_CODES:
            raise Unavailable(f"the SQLite database is locked: {error}") from error
        raise


def _run_transaction(connection: sqlite3.Connection, transaction: Transaction[T], write: bool) -> T:
    connection.execute("BEGIN IMMEDIATE" if write else "BEGIN")
    try:
        try:
            statement = next(transaction)
            while True:
                cursor = connection.execute(statement.text, statement.params)
                rows = tuple(tuple(row) for row in cursor.fetchall())
                statement = transaction.send(Rows(rows, cursor.rowcount))
        except StopIteration as stop:
            result: T = stop.value
        connection.execute("COMMIT")
    except BaseException:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        raise
    finally:
        transaction.close()
    return result


class SQLiteControlStore(TransactionalStore):
    """
    The L{svc.control.store.interface.ControlStore} in a SQLite file. Build
    it with L{open}.
    """

    def __init__(
        self,
        connection: sqlite3.Connection,
        worker: IWorker,
        random_bytes: RandomBytes = os.urandom,
        stop_worker: Callable[[], object] | None = None,
        *,
        session_key: bytes,
    ) -> None:
        super().__init__(session_key=session_key, random_bytes=random_bytes)
        self._connection = connection
        self._worker = worker
        self._stop_worker = stop_worker

    @classmethod
    def open(
        cls,
        path: Path | str,
        worker: IWorker,
        now: datetime,
        random_bytes: RandomBytes = os.urandom,
        stop_worker: Callable[[], object] | None = None,
        *,
        session_key: bytes,
    ) -> Deferred[SQLiteControlStore]:
        """
        Open (creating if needed, mode 0600) and migrate the database at C{path} on
        C{worker}; C{now} is recorded as the time of any migration applied.
        C{stop_worker}, if given, is called once L{close} has closed the
        connection (for a worker the store owns). C{session_key} keys the
        mount session ids (L{svc.sessions.session_key}).

        @raise ValueError: C{session_key} is too short (raised at once).
        @raise svc.control.store.errors.SchemaTooNew: the file was migrated
            by a newer svc.
        """
        check_session_key(session_key)
        now_us = to_micros(now)

        def blocking() -> sqlite3.Connection:
            create_private(str(path))
            connection = connect(str(path))
            try:
                run_transaction(connection, migrate(MIGRATIONS, PRELUDE, now_us), write=True)
            except BaseException:
                connection.close()
                raise
            return connection

        return worker.submit(blocking).addCallback(
            lambda connection: cls(
                connection, worker, random_bytes, stop_worker, session_key=session_key
            )
        )

    def _run(self, transaction: Transaction[T], write: bool) -> Deferred[T]:
        connection = self._connection
        return self._worker.submit(lambda: run_transaction(connection, transaction, write))

    def close(self) -> Deferred[None]:
        """
        Close the connection (on the worker, after the work queued before),
        then stop an owned worker.
        """
        closed = self._worker.submit(self._connection.close)
        stop = self._stop_worker
        if stop is not None:
            self._stop_worker = None

            def stopped(result: object) -> object:
                stop()
                return result

            closed.addBoth(stopped)
        return closed

    def dump(self) -> Deferred[str]:
        """The whole database as SQL text (C{iterdump}), for tests and operators."""
        connection = self._connection
        return self._worker.submit(lambda: "\n".join(connection.iterdump()))
