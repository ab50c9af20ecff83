"""
L{open_store}: the control-plane store named by C{DATABASE_URL}, opened and
migrated.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Any

from twisted.internet.defer import Deferred

from svc.control.store.interface import ControlStore
from svc.control.store.postgres import DEFAULT_POOL_SIZE, PostgresControlStore
from svc.control.store.sqlite import SQLiteControlStore
from svc.control.store.transactional import RandomBytes, check_session_key
from svc.control.store.url import SQLiteUrl, parse_database_url
from svc.worker import IWorker, ThreadWorker


def open_store(
    database_url: str,
    reactor: Any,
    *,
    worker: IWorker | None = None,
    pool_size: int = DEFAULT_POOL_SIZE,
    random_bytes: RandomBytes = os.urandom,
    session_key: bytes,
) -> Deferred[ControlStore]:
    """
    Open the database C{database_url} names and bring its schema up to
    date. SQLite runs on C{worker} if given, else on a one-thread
    L{ThreadWorker} the store owns (stopped by C{close}); PostgreSQL uses a
    txpostgres pool of C{pool_size} connections on C{reactor}.
    C{session_key} keys the mount session ids the store mints: pass
    C{svc.sessions.session_key(SVC_CONTROL_PLANE_TOKEN)}, the key the data
    plane verifies them with.

    @raise svc.config.ConfigError: C{database_url} is malformed (raised at
        once, not through the L{Deferred}).
    @raise ValueError: C{session_key} is too short (raised at once).
    @return: fires with the store, or fails with
        L{svc.control.store.errors.SchemaTooNew} or the database's own
        connection error.
    """
    parsed = parse_database_url(database_url)
    check_session_key(session_key)
    now = datetime.fromtimestamp(reactor.seconds(), UTC)
    if isinstance(parsed, SQLiteUrl):
        stop = None
        if worker is None:
            owned = ThreadWorker(reactor, "svc-control-db", threads=1)
            worker, stop = owned, owned.stop
        opened: Deferred[ControlStore] = SQLiteControlStore.open(
            str(parsed.path), worker, now, random_bytes, stop_worker=stop, session_key=session_key
        ).addCallback(_as_store)
        if stop is not None:
            opened.addErrback(_stopping(stop))
        return opened
    return PostgresControlStore.open(
        parsed.dsn,
        reactor,
        now,
        pool_size=pool_size,
        random_bytes=random_bytes,
        session_key=session_key,
    ).addCallback(_as_store)


def _as_store(store: ControlStore) -> ControlStore:
    return store


def _stopping(stop: Any) -> Any:
    def stopped(failure: Any) -> Any:
        stop()
        return failure

    return stopped
