"""
Tests for L{svc.store.routes_schema} (migrations and connection settings)
and the pure encodings and path arithmetic the schema relies on.
"""

from __future__ import annotations

import sqlite3

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from svc.store.manifest_paths import (
    child_path,
    descendant_range,
    is_inside,
    name_of,
    parent_of,
    top_of,
)
from svc.store.manifest_values import ChunkRef, decode_chunks, encode_chunks
from svc.store.manifests import ManifestStore
from svc.store.routes_schema import CURRENT_VERSION, MIGRATIONS, configure, migrate
from svc.store.sqlite_migrations import Migration, SchemaTooNew, schema_version
from svc.testing.worker import ImmediateWorker


class MigrationTests(SynchronousTestCase):
    """
    Numbered migrations applied in one transaction at open.
    """

    def connect(self) -> sqlite3.Connection:
        """An autocommit connection to a new temp database."""
        connection = sqlite3.connect(self.mktemp(), isolation_level=None)
        self.addCleanup(connection.close)
        return connection

    def test_numbered_without_gaps(self) -> None:
        """Migrations are numbered 1, 2, 3, ... in order."""
        self.assertEqual([m.version for m in MIGRATIONS], list(range(1, len(MIGRATIONS) + 1)))
        self.assertEqual(CURRENT_VERSION, len(MIGRATIONS))

    def test_fresh_database(self) -> None:
        """A new file gets every table and the current user_version."""
        connection = self.connect()
        self.assertEqual(migrate(connection), CURRENT_VERSION)
        self.assertEqual(schema_version(connection), CURRENT_VERSION)
        tables = {
            name
            for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
        self.assertTrue(
            {"inodes", "names", "chunk_refs", "subtree_usage", "journal"} <= tables, tables
        )

    def test_a_version_3_file_lists_from_the_name_ordered_index(self) -> None:
        """
        Version 4 replaces the parent index with a (parent, path) one, and a
        page of a listing is read from it without sorting the directory.
        """
        connection = self.connect()
        self.assertEqual(migrate(connection, MIGRATIONS[:3]), 3)
        self.assertEqual(migrate(connection), 4)
        indexes = {
            name
            for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type='index'")
        }
        self.assertIn("names_by_parent_path", indexes)
        self.assertNotIn("names_by_parent", indexes)
        plan = " ".join(
            str(row[-1])
            for row in connection.execute(
                "EXPLAIN QUERY PLAN SELECT path FROM names WHERE parent = ? AND path > ?"
                " ORDER BY path LIMIT 10",
                ("/a", "/a/b"),
            )
        )
        self.assertIn("names_by_parent_path", plan)
        self.assertNotIn("TEMP B-TREE", plan)

    def test_idempotent(self) -> None:
        """Migrating an up-to-date database changes nothing."""
        connection = self.connect()
        migrate(connection)
        before = connection.execute("SELECT count(*) FROM inodes").fetchone()
        self.assertEqual(migrate(connection), CURRENT_VERSION)
        self.assertEqual(connection.execute("SELECT count(*) FROM inodes").fetchone(), before)

    def test_failed_migration_rolls_back(self) -> None:
        """A migration that fails leaves the database at its previous version, untouched."""
        connection = self.connect()
        migrate(connection)
        broken = (
            *MIGRATIONS,
            Migration(CURRENT_VERSION + 1, "broken", ("CREATE TABLE extra (x INTEGER)", "NOT SQL")),
        )
        self.assertRaises(sqlite3.OperationalError, migrate, connection, broken)
        self.assertEqual(schema_version(connection), CURRENT_VERSION)
        self.assertIsNone(
            connection.execute("SELECT name FROM sqlite_master WHERE name = 'extra'").fetchone()
        )

    def test_newer_database_refused(self) -> None:
        """A database from newer code is refused, by migrate and by open."""
        path = self.mktemp()
        connection = sqlite3.connect(path, isolation_level=None)
        connection.execute(f"PRAGMA user_version = {CURRENT_VERSION + 1}")
        connection.close()
        connection = sqlite3.connect(path, isolation_level=None)
        self.addCleanup(connection.close)
        self.assertRaises(SchemaTooNew, migrate, connection)
        self.failureResultOf(ManifestStore.open(path, ImmediateWorker(), Clock()), SchemaTooNew)

    def test_connection_settings(self) -> None:
        """Connections use WAL, synchronous=FULL and foreign keys."""
        connection = self.connect()
        configure(connection)
        self.assertEqual(connection.execute("PRAGMA journal_mode").fetchone(), ("wal",))
        self.assertEqual(connection.execute("PRAGMA synchronous").fetchone(), (2,))
        self.assertEqual(connection.execute("PRAGMA foreign_keys").fetchone(), (1,))

    def test_constraints_enforced(self) -> None:
        """The DDL refuses an unknown kind and a name pointing at no inode."""
        connection = self.connect()
        configure(connection)
        migrate(connection)
        self.assertRaises(
            sqlite3.IntegrityError,
            connection.execute,
            "INSERT INTO inodes (kind, mode, uid, gid, size, mtime_ns, atime_ns, ctime_ns,"
            " version, nlink, writer_agent, written_ms)"
            " VALUES ('door', 0, 0, 0, 0, 0, 0, 0, 1, 1, '', 0)",
        )
        self.assertRaises(
            sqlite3.IntegrityError,
            connection.execute,
            "INSERT INTO names (path, parent, inode) VALUES ('/x', '/', 999)",
        )


_components = st.text(alphabet=st.sampled_from("ab/%_-0.\u00e9"), min_size=1, max_size=4).filter(
    lambda name: "/" not in name and name not in (".", "..")
)
_paths = st.lists(_components, min_size=1, max_size=4).map(lambda parts: "/" + "/".join(parts))


class EncodingTests(SynchronousTestCase):
    """
    Chunk-list encoding and path arithmetic.
    """

    @settings(max_examples=50, database=None)
    @given(
        st.lists(
            st.builds(
                ChunkRef,
                st.binary(min_size=32, max_size=32).map(bytes.hex),
                st.integers(1, 16 * 1024 * 1024),
            ),
            max_size=5,
        )
    )
    def test_chunk_list_round_trip(self, chunks: list[ChunkRef]) -> None:
        """A chunk list decodes to itself and takes 40 bytes per chunk."""
        blob = encode_chunks(chunks)
        self.assertEqual(len(blob), 40 * len(chunks))
        self.assertEqual(decode_chunks(blob), tuple(chunks))

    def test_chunk_list_layout(self) -> None:
        """Each record is the raw digest then the size as u64 big-endian."""
        blob = encode_chunks([ChunkRef("01" * 32, 258)])
        self.assertEqual(blob, bytes([1] * 32) + (258).to_bytes(8, "big"))
        self.assertRaises(ValueError, decode_chunks, blob[:-1])

    @settings(max_examples=200, database=None)
    @given(_paths, _paths)
    def test_descendant_range(self, path: str, directory: str) -> None:
        """The binary range of a directory holds exactly the paths strictly below it."""
        low, high = descendant_range(directory)
        inside = low.encode() <= path.encode() < high.encode()
        self.assertEqual(inside, path.startswith(directory + "/"))
        self.assertEqual(inside, is_inside(path, directory))

    def test_root_range(self) -> None:
        """Everything but the root lies below the root."""
        low, high = descendant_range("/")
        self.assertTrue(low <= "/a" < high and low <= "/\u00e9/x" < high)
        self.assertFalse(low <= "/" < high)

    def test_path_parts(self) -> None:
        """parent, name, top and child agree with each other."""
        self.assertEqual(
            (parent_of("/a/b/c"), name_of("/a/b/c"), top_of("/a/b/c")), ("/a/b", "c", "a")
        )
        self.assertEqual((parent_of("/a"), name_of("/a"), top_of("/a")), ("/", "a", "a"))
        self.assertEqual((parent_of("/"), top_of("/")), ("", ""))
        self.assertEqual((child_path("/", "a"), child_path("/a", "b")), ("/a", "/a/b"))
