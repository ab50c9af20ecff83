"""
Tests for L{svc.control.store.sqlite}: the contract on a SQLite file, then
what only SQLite can show (pragmas, the file's bytes, two processes' worth
of connections on one file, the real single-thread worker).
"""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Sequence
from pathlib import Path

from twisted.internet import reactor
from twisted.internet.defer import gatherResults
from twisted.trial.unittest import SynchronousTestCase, TestCase

from svc.control.store.errors import Unavailable
from svc.control.store.interface import ControlStore
from svc.control.store.migrations import migrate
from svc.control.store.migrations.sqlite import MIGRATIONS, PRELUDE
from svc.control.store.opening import open_store
from svc.control.store.outcomes import EnrollGrant, EnrollRefusal, EnrollRefusalReason
from svc.control.store.sqlite import SQLiteControlStore, connect, run_transaction
from svc.control.store.test.contract import ControlStoreContractMixin
from svc.control.store.test.contract_support import (
    HOUR,
    NOW,
    SESSION_KEY,
    TTL,
    holder,
    token_hash,
)
from svc.testing.worker import ImmediateWorker
from svc.worker import ThreadWorker


class SQLiteControlStoreTests(ControlStoreContractMixin, TestCase):
    """The contract, against SQLite on an inline worker."""

    def _path(self) -> Path:
        if not hasattr(self, "_db_path"):
            directory = Path(self.mktemp())
            directory.mkdir()
            self._db_path = directory / "control.db"
        return self._db_path

    async def open_store(self) -> ControlStore:
        store = await SQLiteControlStore.open(
            self._path(), ImmediateWorker(), NOW, session_key=SESSION_KEY
        )
        self.addCleanup(store.close)
        return store

    async def open_previous_release(self, statements: Sequence[str]) -> ControlStore:
        directory = Path(self.mktemp())
        directory.mkdir()
        path = directory / "previous.db"
        connection = connect(str(path))
        try:
            run_transaction(connection, migrate(MIGRATIONS[:1], PRELUDE, 0), write=True)
            for statement in statements:
                connection.execute(statement)
        finally:
            connection.close()
        store = await SQLiteControlStore.open(path, ImmediateWorker(), NOW, session_key=SESSION_KEY)
        self.addCleanup(store.close)
        return store

    async def tamper(self, statement: str) -> None:
        connection = sqlite3.connect(self._path(), isolation_level=None)
        try:
            connection.execute(statement)
        finally:
            connection.close()

    async def stored_text(self) -> str:
        store = self.store
        assert isinstance(store, SQLiteControlStore)
        dump = await store.dump()
        raw = b"".join(
            path.read_bytes() for path in self._path().parent.iterdir() if path.is_file()
        )
        return dump + raw.decode("latin-1")

    def test_pragmas(self) -> None:
        """Connections use WAL, synchronous=FULL, foreign keys and a busy timeout."""
        connection = connect(str(self._path()))
        self.addCleanup(connection.close)
        values = [
            connection.execute(f"PRAGMA {name}").fetchone()[0]
            for name in ("journal_mode", "synchronous", "foreign_keys", "busy_timeout")
        ]
        self.assertEqual(values, ["wal", 2, 1, 10_000])

    async def test_failed_transaction_is_rolled_back(self) -> None:
        """A statement failing half-way through leaves nothing of the transaction behind."""
        allocation = await self.provisioned()
        await self.store.acquire_mount(allocation.allocation_id, holder(serial="a1"), NOW, TTL)
        await self.tamper(
            "CREATE TRIGGER refuse BEFORE INSERT ON cert_revocations"
            " BEGIN SELECT RAISE(ABORT, 'refused'); END"
        )
        await self.assertFailure(
            self.store.revoke_allocation(allocation.allocation_id, NOW), sqlite3.IntegrityError
        )
        self.assertEqual(await self.store.get_allocation(allocation.allocation_id), allocation)
        self.assertIsNotNone(await self.store.get_mount_lease(allocation.allocation_id))


class SQLiteSharedFileTests(TestCase):
    """Two stores (two connections, two worker threads) on one file."""

    async def test_concurrent_consumers_on_two_connections(self) -> None:
        """Consumers racing on separate connections and threads: exactly one grant."""
        directory = Path(self.mktemp())
        directory.mkdir()
        path = directory / "control.db"
        stores = []
        for name in ("one", "two"):
            worker = ThreadWorker(reactor, f"test-{name}", threads=1)
            store = await SQLiteControlStore.open(
                path, worker, NOW, stop_worker=worker.stop, session_key=SESSION_KEY
            )
            self.addCleanup(store.close)
            stores.append(store)
        done = await stores[0].provision(
            agent_id="agent-1", owner_id="alice", tenant_id="tenant-a", grant_bytes=1, now=NOW
        )
        await stores[0].create_enroll_token(
            done.allocation.allocation_id, token_hash("secret"), NOW, NOW + HOUR
        )
        outcomes = await gatherResults(
            [
                store.consume_enroll_token(token_hash("secret"), NOW)
                for store in stores
                for _ in range(3)
            ]
        )
        self.assertEqual(sum(isinstance(o, EnrollGrant) for o in outcomes), 1)
        self.assertEqual(
            [o for o in outcomes if not isinstance(o, EnrollGrant)],
            [EnrollRefusal(EnrollRefusalReason.CONSUMED)] * 5,
        )


class OpenStoreSQLiteTests(TestCase):
    """L{open_store} with a C{sqlite:///} URL."""

    async def test_open_store_owns_its_worker(self) -> None:
        """The URL opens a migrated SQLite store on its own thread, stopped by close."""
        directory = Path(self.mktemp()).absolute()
        directory.mkdir()
        store = await open_store(
            f"sqlite://{directory}/control.db", reactor, session_key=SESSION_KEY
        )
        try:
            user = await store.put_user("alice", "Alice", NOW)
            self.assertEqual(await store.get_user("alice"), user)
        finally:
            await store.close()
        self.assertTrue((directory / "control.db").exists())

    def test_short_session_key_refused(self) -> None:
        """A session key shorter than 16 bytes is refused at once, before any file is made."""
        directory = Path(self.mktemp()).absolute()
        directory.mkdir()
        for key in (b"", b"k" * 15):
            self.assertRaises(
                ValueError,
                open_store,
                f"sqlite://{directory}/control.db",
                reactor,
                worker=ImmediateWorker(),
                session_key=key,
            )
            self.assertRaises(
                ValueError,
                SQLiteControlStore.open,
                directory / "control.db",
                ImmediateWorker(),
                NOW,
                session_key=key,
            )
        self.assertEqual(list(directory.iterdir()), [])


class SQLiteFileTests(SynchronousTestCase):
    """The database file itself."""

    def test_created_private(self) -> None:
        """A new database file, and its -wal and -shm files, are mode 0600 whatever the umask."""
        directory = Path(self.mktemp())
        directory.mkdir()
        path = directory / "control.db"
        previous = os.umask(0o022)
        self.addCleanup(os.umask, previous)
        store = self.successResultOf(
            SQLiteControlStore.open(path, ImmediateWorker(), NOW, session_key=SESSION_KEY)
        )
        self.addCleanup(store.close)
        self.successResultOf(store.put_user("alice", "Alice", NOW))
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in directory.iterdir()}
        self.assertEqual(
            modes, {"control.db": 0o600, "control.db-wal": 0o600, "control.db-shm": 0o600}
        )

    def test_existing_file_keeps_its_mode(self) -> None:
        """An existing database file is opened as it is (its mode is the operator's)."""
        directory = Path(self.mktemp())
        directory.mkdir()
        path = directory / "control.db"
        path.touch(mode=0o640)
        path.chmod(0o640)
        store = self.successResultOf(
            SQLiteControlStore.open(path, ImmediateWorker(), NOW, session_key=SESSION_KEY)
        )
        self.addCleanup(store.close)
        self.assertEqual(stat.S_IMODE(path.stat().st_mode), 0o640)


class SQLiteLockTests(SynchronousTestCase):
    """A database another connection keeps locked."""

    def test_locked_database_unavailable(self) -> None:
        """A write meeting another connection's lock past the busy timeout fails Unavailable."""
        directory = Path(self.mktemp())
        directory.mkdir()
        path = directory / "control.db"
        opened = self.successResultOf(
            SQLiteControlStore.open(path, ImmediateWorker(), NOW, session_key=SESSION_KEY)
        )
        self.addCleanup(opened.close)
        impatient = SQLiteControlStore(
            connect(str(path), busy_timeout_ms=0), ImmediateWorker(), session_key=SESSION_KEY
        )
        self.addCleanup(impatient.close)
        holder_connection = sqlite3.connect(path, isolation_level=None)
        self.addCleanup(holder_connection.close)
        holder_connection.execute("BEGIN EXCLUSIVE")
        failure = self.failureResultOf(impatient.put_user("alice", "Alice", NOW), Unavailable)
        self.assertIn("locked", failure.getErrorMessage())
        holder_connection.execute("ROLLBACK")
        user = self.successResultOf(impatient.put_user("alice", "Alice", NOW))
        self.assertEqual(user.user_id, "alice")

    def test_other_operational_errors_unchanged(self) -> None:
        """An operational error that is not a lock (here: a read-only file) is not Unavailable."""
        directory = Path(self.mktemp())
        directory.mkdir()
        path = directory / "control.db"
        opened = self.successResultOf(
            SQLiteControlStore.open(path, ImmediateWorker(), NOW, session_key=SESSION_KEY)
        )
        self.addCleanup(opened.close)
        read_only = SQLiteControlStore(
            sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None),
            ImmediateWorker(),
            session_key=SESSION_KEY,
        )
        self.addCleanup(read_only.close)
        failure = self.failureResultOf(read_only.put_user("alice", "Alice", NOW))
        self.assertIsInstance(failure.value, sqlite3.OperationalError)
