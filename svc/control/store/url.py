"""
Parsing C{DATABASE_URL}: which database the control plane keeps its state
in. Pure.

  - C{sqlite:///abs/path/control.db}: an embedded SQLite file (three
    slashes, then an absolute path; the directory must exist);
  - C{postgres://user[:password]@host[:port]/dbname[?libpq-params]} (or
    C{postgresql://}): a PostgreSQL database; the URL goes to libpq as is.

Anything else is a L{ConfigError} naming C{DATABASE_URL}.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from urllib.parse import urlsplit, urlunsplit

import attrs

from svc.config import ConfigError

VARIABLE = "DATABASE_URL"


@attrs.frozen
class SQLiteUrl:
    """A SQLite database file."""

    path: PurePosixPath


@attrs.frozen
class PostgresUrl:
    """
    A PostgreSQL database. ``dsn`` may hold a password, so it stays out of
    C{repr}; ``display`` is the URL with any password masked, for logs.
    """

    dsn: str = attrs.field(repr=False)
    display: str


DatabaseUrl = SQLiteUrl | PostgresUrl


def parse_database_url(value: str) -> DatabaseUrl:
    """
    The database named by C{value}.

    @raise ConfigError: C{value} is not a URL of a form listed above.
    """
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError as error:
        raise ConfigError(VARIABLE, f"is not a valid URL: {error}") from None
    scheme = parts.scheme.lower()
    if scheme == "sqlite":
        if parts.netloc or parts.query or parts.fragment:
            raise ConfigError(
                VARIABLE, "a SQLite URL is sqlite:///absolute/path with no host or query"
            )
        path = PurePosixPath(parts.path)
        if not path.is_absolute() or path == PurePosixPath("/") or ".." in path.parts:
            raise ConfigError(VARIABLE, "a SQLite URL needs an absolute file path")
        return SQLiteUrl(path)
    if scheme in ("postgres", "postgresql"):
        database = parts.path.lstrip("/")
        if not parts.hostname:
            raise ConfigError(VARIABLE, "a PostgreSQL URL needs a host")
        if not database or "/" in database:
            raise ConfigError(VARIABLE, "a PostgreSQL URL needs exactly one database name")
        if parts.fragment:
            raise ConfigError(VARIABLE, "a PostgreSQL URL has no fragment")
        if port is not None and port == 0:
            raise ConfigError(VARIABLE, "port 0 is not a PostgreSQL port")
        return PostgresUrl(value.strip(), _masked(value.strip()))
    shown = scheme or "(none)"
    raise ConfigError(VARIABLE, f"unsupported scheme {shown}; use sqlite:/// or postgres://")


def _masked(value: str) -> str:
    parts = urlsplit(value)
    if parts.password is None:
        return value
    host = parts.netloc.rpartition("@")[2]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
