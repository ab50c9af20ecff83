"""
Numbered schema migrations for the data plane's SQLite databases
(C{routes.db}, C{leases.db}): the version lives in C{PRAGMA user_version}, and
every migration not yet applied runs, in order, inside one transaction.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

import attrs


@attrs.frozen
class Migration:
    """
    One numbered step of a schema: after applying ``statements`` and then
    ``backfill`` (a function of the connection, for data SQL cannot derive
    alone; in the same transaction), ``PRAGMA user_version`` is ``version``.
    """

    version: int = attrs.field(validator=attrs.validators.ge(1))
    description: str
    statements: tuple[str, ...]
    backfill: Callable[[sqlite3.Connection], None] | None = None


class SchemaTooNew(Exception):
    """
    The database was written by a newer version of this code; opening it
    could damage it, so it is refused.
    """


def schema_version(connection: sqlite3.Connection) -> int:
    """
    The C{user_version} of the database.
    """
    row = connection.execute("PRAGMA user_version").fetchone()
    return int(row[0])


def apply_migrations(
    connection: sqlite3.Connection, migrations: tuple[Migration, ...], name: str
) -> int:
    """
    Bring the database ``name`` up to the last of ``migrations`` in one
    transaction and return the resulting version. ``connection`` must be in
    autocommit mode (C{isolation_level=None}).

    @raise SchemaTooNew: the file's version is beyond the last migration.
    """
    latest = migrations[-1].version if migrations else 0
    connection.execute("BEGIN IMMEDIATE")
    try:
        current = schema_version(connection)
        if current > latest:
            raise SchemaTooNew(f"{name} schema version {current} is newer than {latest}")
        for migration in migrations:
            if migration.version <= current:
                continue
            for statement in migration.statements:
                connection.execute(statement)
            if migration.backfill is not None:
                migration.backfill(connection)
            connection.execute(f"PRAGMA user_version = {migration.version:d}")
        connection.execute("COMMIT")
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    return max(current, latest)
