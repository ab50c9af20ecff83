"""
How store operations talk SQL without knowing which database runs them.

Each operation is written once, as a generator (a L{Transaction}) that yields
L{Sql} statements and is sent back each statement's L{Rows}; its return value
is the operation's result. A backend drives the generator inside one
database transaction: SQLite on its worker thread, PostgreSQL through
txpostgres on the reactor. The generator itself does no I/O, so it can be
read (and tested) as plain logic.

The statements use the SQL both databases share: C{?} placeholders (turned
into C{%s} for psycopg2), C{INSERT ... ON CONFLICT}, C{RETURNING}, integer
microsecond timestamps and booleans passed as parameters. A statement marked
C{lock=True} is a C{SELECT} whose rows must stay locked until the
transaction ends: PostgreSQL appends C{FOR UPDATE}; SQLite needs nothing,
since a write transaction there (C{BEGIN IMMEDIATE}) excludes every other
writer anyway.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TypeVar

import attrs

T = TypeVar("T")


@attrs.frozen
class Sql:
    """One statement of a transaction."""

    text: str
    params: tuple[object, ...] = ()
    lock: bool = False


@attrs.frozen
class Rows:
    """What a statement produced: its rows (if any) and its row count."""

    rows: tuple[tuple[object, ...], ...]
    rowcount: int

    def one(self) -> tuple[object, ...] | None:
        """The first row, or L{None}."""
        return self.rows[0] if self.rows else None

    def only(self) -> tuple[object, ...]:
        """The first row of a statement that always yields one (C{RETURNING})."""
        if not self.rows:
            raise AssertionError("the statement returned no row")
        return self.rows[0]


Transaction = Generator[Sql, Rows, T]
"""An operation: yields statements, is sent their results, returns ``T``."""


def as_int(value: object) -> int:
    """A column value that must be an integer."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer column, got {value!r}")
    return value


def as_opt_int(value: object) -> int | None:
    """A nullable integer column."""
    return None if value is None else as_int(value)


def as_str(value: object) -> str:
    """A column value that must be text."""
    if not isinstance(value, str):
        raise TypeError(f"expected a text column, got {value!r}")
    return value


def as_opt_str(value: object) -> str | None:
    """A nullable text column."""
    return None if value is None else as_str(value)


def as_bool(value: object) -> bool:
    """A boolean column (SQLite gives 0 or 1, PostgreSQL a L{bool})."""
    if isinstance(value, bool):
        return value
    return as_int(value) != 0


def as_bytes(value: object) -> bytes:
    """A binary column (SQLite gives L{bytes}, psycopg2 a L{memoryview})."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"expected a binary column, got {value!r}")


def postgres_text(statement: Sql) -> str:
    """
    The statement as psycopg2 wants it: C{%s} placeholders (and a literal
    C{%} doubled), C{FOR UPDATE} when it locks.
    """
    text = statement.text.replace("%", "%%").replace("?", "%s")
    if statement.lock:
        text += " FOR UPDATE"
    return text
