"""
The schema of a tenant's ``leases.db`` and the blocking code that reads and
writes it.

``leases.db`` is the durable record of the data-plane leases: the decisions
are made in memory by L{svc.store.lease_rules.LeaseState}, and every change is
written here (on the table's single worker thread) so that an operator can
inspect the live leases with C{sqlite3} and so that a restarted server can
recover write leases in flight. ``docs/specifications/leases-db.md`` describes
the same tables in prose.

The schema version is kept in ``PRAGMA user_version``; L{migrate} applies the
numbered migrations in L{MIGRATIONS} the file has not seen yet, in one
transaction, when the database is opened. A released migration is never
edited: a change is a new, higher-numbered migration.

Everything in this module blocks; call it only through the table's
L{svc.worker.IWorker}, from one thread.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterable
from pathlib import Path

from svc.store.lease_values import Lease, LeaseHolder, LeaseMode, LeaseReason
from svc.store.sqlite_migrations import (
    Migration,
    apply_migrations,
)

_SCHEMA_1 = (
    # One row per live lease, including orphans kept after a restart. A row
    # is written when a lease is granted, refreshed, upgraded, adopted or
    # asked to yield, and deleted when it is released or dropped.
    """
    CREATE TABLE leases (
        lease_id        TEXT PRIMARY KEY
                            CHECK (length(lease_id) = 32),
                                              -- 128 random bits, lowercase hex
        path            TEXT NOT NULL,        -- mount-relative path the lease covers
        mode            TEXT NOT NULL CHECK (mode IN ('read', 'write')),
        agent_id        TEXT NOT NULL,        -- holder: agent from the client cert
        connection_id   TEXT NOT NULL,        -- holder: the server's id of the TLS
                                              -- connection it was granted on
        session_id      TEXT,                 -- holder's session, NULL if none
        epoch           INTEGER NOT NULL CHECK (epoch >= 1),
                                              -- fencing token: larger for every
                                              -- later grant or upgrade
        granted_ms      INTEGER NOT NULL,     -- Unix ms of the grant (or upgrade)
        expires_ms      INTEGER NOT NULL,     -- Unix ms it expires unless refreshed
        revoke_reason   TEXT CHECK (revoke_reason IN
                            ('contention', 'manifest_put_contention')),
                                              -- set once the holder was asked to yield
        revoke_deadline_ms INTEGER,           -- when it will be dropped if not released
        CHECK ((revoke_reason IS NULL) = (revoke_deadline_ms IS NULL))
    ) STRICT, WITHOUT ROWID
    """,
    "CREATE INDEX leases_by_path ON leases (path)",
    "CREATE INDEX leases_by_connection ON leases (connection_id)",
    # Counters that must survive restarts. 'epoch' is the highest epoch ever
    # handed out, so that fencing tokens never repeat even after every lease
    # row is gone.
    """
    CREATE TABLE lease_counters (
        name  TEXT PRIMARY KEY,
        value INTEGER NOT NULL
    ) STRICT, WITHOUT ROWID
    """,
    "INSERT INTO lease_counters (name, value) VALUES ('epoch', 0)",
)


#: Every migration, in order; versions are 1, 2, 3, ... without gaps.
MIGRATIONS: tuple[Migration, ...] = (Migration(1, "leases and the epoch counter", _SCHEMA_1),)

#: The schema version this code reads and writes.
CURRENT_VERSION = MIGRATIONS[-1].version


def configure(connection: sqlite3.Connection) -> None:
    """
    Per-connection pragmas: WAL, C{synchronous=NORMAL} (a commit survives a
    process crash; the last commits may be lost to a power failure, which the
    restart rules tolerate because in-memory state is the authority), and a
    busy timeout so an operator's reader does not make a write fail.
    """
    connection.execute("PRAGMA journal_mode = WAL")
    connection.execute("PRAGMA synchronous = NORMAL")
    connection.execute("PRAGMA busy_timeout = 5000")


def migrate(connection: sqlite3.Connection, migrations: tuple[Migration, ...] = MIGRATIONS) -> int:
    """
    Bring leases.db up to the last of ``migrations`` (see
    L{svc.store.sqlite_migrations.apply_migrations}); the resulting version.
    """
    return apply_migrations(connection, migrations, "leases.db")


def _to_ms(seconds: float) -> int:
    return math.ceil(seconds * 1000)


def _row(lease: Lease) -> tuple[object, ...]:
    deadline = lease.revoke_deadline
    return (
        lease.lease_id,
        lease.path,
        lease.mode.value,
        lease.holder.agent_id,
        lease.holder.connection_id,
        lease.holder.session_id,
        lease.epoch,
        _to_ms(lease.granted_at),
        _to_ms(lease.expires_at),
        None if lease.revoke_reason is None else lease.revoke_reason.value,
        None if deadline is None else _to_ms(deadline),
    )


def _lease(row: tuple[object, ...]) -> Lease:
    lease_id, path, mode, agent, connection, session = row[:6]
    epoch, granted, expires, reason, deadline = row[6:]
    assert isinstance(granted, int) and isinstance(expires, int)
    assert isinstance(epoch, int)
    return Lease(
        lease_id=str(lease_id),
        path=str(path),
        mode=LeaseMode(str(mode)),
        holder=LeaseHolder(str(agent), str(connection), None if session is None else str(session)),
        epoch=epoch,
        granted_at=granted / 1000,
        expires_at=expires / 1000,
        revoke_reason=None if reason is None else LeaseReason(str(reason)),
        revoke_deadline=None if not isinstance(deadline, int) else deadline / 1000,
    )


_COLUMNS = (
    "lease_id, path, mode, agent_id, connection_id, session_id, epoch,"
    " granted_ms, expires_ms, revoke_reason, revoke_deadline_ms"
)


class LeaseDatabase:
    """
    An open ``leases.db``. Every method blocks; call them from the table's
    worker thread only.
    """

    def __init__(self, connection: sqlite3.Connection) -> None:
        self._connection = connection

    @classmethod
    def open(cls, path: Path) -> LeaseDatabase:
        """
        Open (creating if needed) and migrate the database at C{path}.

        @raise SchemaTooNew: the file is from a newer version.
        """
        connection = sqlite3.connect(str(path), isolation_level=None)
        try:
            configure(connection)
            migrate(connection)
        except BaseException:
            connection.close()
            raise
        return cls(connection)

    def load(self) -> tuple[tuple[Lease, ...], int]:
        """Every stored lease in grant (epoch) order, and the epoch counter."""
        rows = self._connection.execute(
            f"SELECT {_COLUMNS} FROM leases ORDER BY epoch, lease_id"  # noqa: S608
        ).fetchall()
        (epoch,) = self._connection.execute(
            "SELECT value FROM lease_counters WHERE name = 'epoch'"
        ).fetchone()
        return tuple(_lease(tuple(row)) for row in rows), int(epoch)

    def write(self, stored: Iterable[Lease], dropped: Iterable[str], epoch: int) -> None:
        """
        In one transaction: upsert C{stored}, delete the C{dropped} lease ids
        and raise the epoch counter to C{epoch}.
        """
        connection = self._connection
        connection.execute("BEGIN IMMEDIATE")
        try:
            connection.executemany(
                f"INSERT OR REPLACE INTO leases ({_COLUMNS})"  # noqa: S608
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [_row(lease) for lease in stored],
            )
            connection.executemany(
                "DELETE FROM leases WHERE lease_id = ?", [(key,) for key in dropped]
            )
            connection.execute(
                "UPDATE lease_counters SET value = max(value, ?) WHERE name = 'epoch'", (epoch,)
            )
            connection.execute("COMMIT")
        except BaseException:
            connection.execute("ROLLBACK")
            raise

    def close(self) -> None:
        """Close the connection."""
        self._connection.close()
