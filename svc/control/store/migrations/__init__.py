"""
Numbered schema migrations of the control-plane database, one list per
backend (L{svc.control.store.migrations.sqlite},
L{svc.control.store.migrations.postgres}), and the one procedure that
applies them.

A migration is applied once, in order, inside the same transaction that
records it in C{schema_migrations}; opening a store runs L{migrate}, so a
database is always at the code's version or refused. A released migration
is never edited: a change is a new, higher-numbered migration in BOTH lists,
with the same number and meaning. ``docs/specifications/control-db.md``
describes the schema in prose.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from svc.control.store.errors import SchemaTooNew
from svc.control.store.sql import Rows, Sql, Transaction, as_opt_int


@attrs.frozen
class Migration:
    """
    One numbered step of the schema: after its ``statements``, the database
    is at ``version``.
    """

    version: int = attrs.field(validator=attrs.validators.ge(1))
    description: str
    statements: tuple[str, ...]


def check_sequence(migrations: Sequence[Migration]) -> None:
    """
    Refuse a migration list whose versions are not 1, 2, 3, ... in order.
    """
    for expected, migration in enumerate(migrations, start=1):
        if migration.version != expected:
            raise ValueError(f"migration {migration.version} is out of order (expected {expected})")


def migrate(
    migrations: Sequence[Migration], prelude: Sequence[Sql], now_us: int
) -> Transaction[int]:
    """
    The transaction that brings a database up to the last of C{migrations}
    and returns the resulting version. C{prelude} runs first: it creates
    C{schema_migrations} if missing (and on PostgreSQL takes a lock that
    serialises concurrent migrators).

    @raise SchemaTooNew: the database records a version beyond the last of
        C{migrations}.
    """
    check_sequence(migrations)
    known = migrations[-1].version if migrations else 0
    for statement in prelude:  # noqa: UP028 - a tuple cannot take send()
        yield statement
    rows: Rows = yield Sql("SELECT max(version) FROM schema_migrations")
    row = rows.one()
    current = (as_opt_int(row[0]) if row else None) or 0
    if current > known:
        raise SchemaTooNew(current, known)
    for migration in migrations[current:]:
        for text in migration.statements:
            yield Sql(text)
        yield Sql(
            "INSERT INTO schema_migrations (version, description, applied_us) VALUES (?, ?, ?)",
            (migration.version, migration.description, now_us),
        )
    return max(current, known)
