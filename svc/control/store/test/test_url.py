"""
Tests for L{svc.control.store.url} and the URL handling of
L{svc.control.store.opening.open_store}.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from svc.config import ConfigError
from svc.control.store.opening import open_store
from svc.control.store.url import PostgresUrl, SQLiteUrl, parse_database_url
from svc.testing.control_store import TEST_SESSION_KEY


class ParseDatabaseUrlTests(SynchronousTestCase):
    """L{parse_database_url}."""

    def test_sqlite(self) -> None:
        """sqlite:/// with an absolute path names that file."""
        self.assertEqual(
            parse_database_url("sqlite:///var/lib/svc/control.db"),
            SQLiteUrl(PurePosixPath("/var/lib/svc/control.db")),
        )

    def test_postgres(self) -> None:
        """Both PostgreSQL schemes pass the URL to libpq as is, password masked for display."""
        for scheme in ("postgres", "postgresql"):
            url = f"{scheme}://svc:hunter2@db.internal:6432/control?sslmode=require"
            parsed = parse_database_url(url)
            assert isinstance(parsed, PostgresUrl)
            self.assertEqual(parsed.dsn, url)
            self.assertNotIn("hunter2", parsed.display)
            self.assertNotIn("hunter2", repr(parsed))
        plain = parse_database_url("postgres://postgres@127.0.0.1/control")
        assert isinstance(plain, PostgresUrl)
        self.assertEqual(plain.display, "postgres://postgres@127.0.0.1/control")

    def test_bad_urls(self) -> None:
        """Malformed URLs are ConfigErrors naming DATABASE_URL."""
        for bad in (
            "",
            "mysql://x/y",
            "sqlite://relative/path",
            "sqlite:///",
            "sqlite:///a/../b",
            "sqlite:///x.db?mode=ro",
            "postgres:///nohost",
            "postgres://host/",
            "postgres://host/a/b",
            "postgres://host:notaport/db",
            "postgres://host:0/db",
        ):
            error = self.assertRaises(ConfigError, parse_database_url, bad)
            self.assertEqual(error.variable, "DATABASE_URL")

    def test_open_store_refuses_at_once(self) -> None:
        """open_store raises the ConfigError synchronously, before touching anything."""
        self.assertRaises(ConfigError, open_store, "ftp://x", Clock(), session_key=TEST_SESSION_KEY)
