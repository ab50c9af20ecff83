"""
Tests for L{svc.control.store.postgres}: the contract on a throwaway
PostgreSQL database (see L{svc.testing.postgres}), then what only PostgreSQL
can show (concurrent migrators, lost connections, the schema matching
SQLite's).
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

import psycopg2
from twisted.internet import reactor
from twisted.internet.defer import Deferred, gatherResults
from twisted.trial.unittest import TestCase

from svc.control.store.errors import Unavailable
from svc.control.store.interface import ControlStore
from svc.control.store.migrations import migrate
from svc.control.store.migrations.postgres import MIGRATIONS as POSTGRES_MIGRATIONS
from svc.control.store.migrations.postgres import PRELUDE
from svc.control.store.migrations.sqlite import MIGRATIONS as SQLITE_MIGRATIONS
from svc.control.store.opening import open_store
from svc.control.store.postgres import PostgresControlStore
from svc.control.store.sql import Rows, Transaction, postgres_text
from svc.control.store.sqlite import SQLiteControlStore
from svc.control.store.test.contract import ControlStoreContractMixin
from svc.control.store.test.contract_support import NOW, SESSION_KEY, TTL, holder
from svc.testing.postgres import admin_execute, execute, postgres_server, schema_for_test
from svc.testing.worker import ImmediateWorker


class PostgresCase(TestCase):
    """A test with its own empty PostgreSQL schema, reached through C{self.url}."""

    url: str

    def setUp(self) -> None:
        self.url = schema_for_test(self)

    async def open_store(self) -> ControlStore:
        """A store on this test's database, closed in cleanup."""
        return await self.open_store_at(self.url)

    async def open_store_at(self, url: str) -> ControlStore:
        """A store on the database at C{url}, closed in cleanup."""
        store = await PostgresControlStore.open(
            url, reactor, NOW, pool_size=4, session_key=SESSION_KEY
        )
        self.addCleanup(store.close)
        return store


def run_blocking(url: str, transaction: Transaction[object]) -> None:
    """Drive C{transaction} to its end in one psycopg2 transaction on C{url}."""
    connection = psycopg2.connect(url, connect_timeout=5)
    try:
        with connection, connection.cursor() as cursor:
            try:
                statement = next(transaction)
                while True:
                    cursor.execute(postgres_text(statement), statement.params)
                    rows = tuple(cursor.fetchall()) if cursor.description is not None else ()
                    statement = transaction.send(Rows(rows, cursor.rowcount))
            except StopIteration:
                pass
    finally:
        connection.close()


class PostgresControlStoreTests(ControlStoreContractMixin, PostgresCase):
    """The contract, against PostgreSQL."""

    def setUp(self) -> Deferred[None]:  # type: ignore[override]  # trial waits for it
        PostgresCase.setUp(self)
        return ControlStoreContractMixin.setUp(self)

    async def open_store(self) -> ControlStore:
        return await PostgresCase.open_store(self)

    async def tamper(self, statement: str) -> None:
        execute(self.url, statement)

    async def open_previous_release(self, statements: Sequence[str]) -> ControlStore:
        url = schema_for_test(self)
        run_blocking(url, migrate(POSTGRES_MIGRATIONS[:1], PRELUDE, 0))
        for statement in statements:
            execute(url, statement)
        return await self.open_store_at(url)

    async def stored_text(self) -> str:
        tables = execute(
            self.url,
            "SELECT table_name FROM information_schema.tables"
            " WHERE table_schema = current_schema()",
        )
        return "\n".join(
            str(execute(self.url, f'SELECT t::text FROM "{name}" t')) for (name,) in tables
        )

    async def test_failed_transaction_is_rolled_back(self) -> None:
        """A statement failing half-way through leaves nothing of the transaction behind."""
        allocation = await self.provisioned()
        await self.store.acquire_mount(allocation.allocation_id, holder(serial="a1"), NOW, TTL)
        await self.tamper(
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql"
            " AS $$ BEGIN RAISE EXCEPTION 'refused'; END $$"
        )
        await self.tamper(
            "CREATE TRIGGER refuse BEFORE INSERT ON cert_revocations"
            " FOR EACH ROW EXECUTE FUNCTION refuse()"
        )
        await self.assertFailure(
            self.store.revoke_allocation(allocation.allocation_id, NOW), psycopg2.Error
        )
        self.assertEqual(await self.store.get_allocation(allocation.allocation_id), allocation)
        self.assertIsNotNone(await self.store.get_mount_lease(allocation.allocation_id))


class PostgresOpeningTests(PostgresCase):
    """Opening, migrating, reconnecting."""

    async def test_concurrent_openers_migrate_once(self) -> None:
        """Processes opening a fresh database together apply each migration exactly once."""
        await gatherResults([Deferred.fromCoroutine(self.open_store()) for _ in range(3)])
        rows = execute(self.url, "SELECT version FROM schema_migrations ORDER BY version")
        self.assertEqual([row[0] for row in rows], [m.version for m in SQLITE_MIGRATIONS])

    async def test_schema_matches_sqlite(self) -> None:
        """Both backends have the same tables, columns and named indexes."""
        await self.open_store()
        pg_columns = execute(
            self.url,
            "SELECT table_name, column_name FROM information_schema.columns"
            " WHERE table_schema = current_schema()",
        )
        pg_indexes = execute(
            self.url,
            "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()"
            " AND indexname NOT LIKE '%\\_pkey' AND indexname NOT LIKE '%\\_key'",
        )
        sqlite_store = await SQLiteControlStore.open(
            ":memory:", ImmediateWorker(), NOW, session_key=SESSION_KEY
        )
        self.addCleanup(sqlite_store.close)
        connection = sqlite_store._connection
        tables = [
            row[0]
            for row in connection.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'"
            ).fetchall()
        ]
        lite_columns = {
            (table, row[1])
            for table in tables
            for row in connection.execute(f'PRAGMA table_info("{table}")').fetchall()
        }
        lite_indexes = {
            row[0]
            for row in connection.execute(
                "SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"
            ).fetchall()
        }
        self.assertEqual({(str(t), str(c)) for t, c in pg_columns}, lite_columns)
        self.assertEqual({str(row[0]) for row in pg_indexes}, lite_indexes)

    async def test_open_store_with_postgres_url(self) -> None:
        """A postgres:// DATABASE_URL opens a migrated PostgreSQL store."""
        store = await open_store(
            self.url.replace("postgres://", "postgresql://", 1), reactor, session_key=SESSION_KEY
        )
        try:
            user = await store.put_user("alice", "Alice", NOW)
            self.assertEqual(await store.get_user("alice"), user)
        finally:
            await store.close()

    async def test_reconnects_after_connections_are_killed(self) -> None:
        """After the server drops every connection, the pool reconnects and works again."""
        store = await self.open_store()
        assert isinstance(store, PostgresControlStore)
        await store.put_user("alice", "Alice", NOW)
        recovered = []
        for connection in store._pool.every_connection:
            back: Deferred[None] = Deferred()
            connection.detector.addRecoveryHandler(lambda back=back: back.callback(None))
            recovered.append(back)
        pids = ", ".join(str(c.get_backend_pid()) for c in store._pool.every_connection)
        admin_execute(
            postgres_server(), f"SELECT pg_terminate_backend(pid) FROM unnest(ARRAY[{pids}]) pid"
        )
        await gatherResults(recovered)
        self.assertEqual((await store.get_user("alice")).display_name, "Alice")

    async def test_locked_table_unavailable(self) -> None:
        """A write waiting on another session's lock past the lock timeout fails Unavailable."""
        store = await PostgresControlStore.open(
            self.url, reactor, NOW, pool_size=1, session_key=SESSION_KEY, lock_timeout_ms=200
        )
        self.addCleanup(store.close)
        await store.put_user("alice", "Alice", NOW)
        other = psycopg2.connect(self.url, connect_timeout=5)
        self.addCleanup(other.close)
        with other.cursor() as cursor:
            cursor.execute("LOCK TABLE users IN ACCESS EXCLUSIVE MODE")
        failure = await self.assertFailure(store.put_user("alice", "Alice B", NOW), Unavailable)
        self.assertIn("lock", str(failure))
        other.rollback()
        self.assertEqual((await store.put_user("alice", "Alice B", NOW)).display_name, "Alice B")

    def test_short_session_key_refused(self) -> None:
        """A session key shorter than 16 bytes is refused at once, before connecting."""
        for key in (b"", b"k" * 15):
            self.assertRaises(ValueError, open_store, self.url, reactor, session_key=key)
            self.assertRaises(
                ValueError, PostgresControlStore.open, self.url, reactor, NOW, session_key=key
            )

    async def test_unreachable_server_fails_open(self) -> None:
        """Opening a database nobody serves fails instead of hanging."""
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        await self.assertFailure(
            PostgresControlStore.open(
                f"postgres://postgres@127.0.0.1:{port}/nothing",
                reactor,
                NOW,
                pool_size=1,
                session_key=SESSION_KEY,
            ),
            psycopg2.OperationalError,
        )
