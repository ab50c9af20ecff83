"""
Shared fixtures for the routes.db tests: an open store on a temp file with
an inline worker and a fake clock, chunk references made from labels, and an
independent consistency check that recomputes every derived column from the
raw tables.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Sequence
from typing import Any, TypeVar

import blake3
import msgpack
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from svc.store.manifest_values import ChunkRef, PutResult, Writer
from svc.store.manifests import ManifestStore
from svc.testing.worker import ImmediateWorker

T = TypeVar("T")
E = TypeVar("E", bound=BaseException)

ALICE = Writer("alice", "mount:aa")
BOB = Writer("bob", "mount:bb")

#: The fake clock's start: 2026-11-01T00:00:00Z.
START_SECONDS = 1_793_491_200.0


def chunk(label: object, size: int = 1000) -> ChunkRef:
    """
    A chunk reference whose hash is the BLAKE3 of ``label``.
    """
    return ChunkRef(blake3.blake3(repr(label).encode()).hexdigest(), size)


class StoreTestCase(SynchronousTestCase):
    """
    A test case with a fresh store in C{self.store}.
    """

    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(START_SECONDS)
        self.worker = ImmediateWorker()
        self.db_path = self.mktemp()
        self.store = self.open_store()
        self.addCleanup(self.store.close)

    def open_store(self) -> ManifestStore:
        """Open the database at C{self.db_path}."""
        return self.successResultOf(ManifestStore.open(self.db_path, self.worker, self.clock))

    def ok(self, deferred: Deferred[T]) -> T:
        """The result of an already-fired L{Deferred}."""
        return self.successResultOf(deferred)

    def fails(self, deferred: Deferred[Any], error: type[E]) -> E:
        """The exception of an already-failed L{Deferred}, which must be an ``error``."""
        value = self.failureResultOf(deferred, error).value
        assert isinstance(value, error)
        return value

    def mkdirs(self, *paths: str, writer: Writer = ALICE) -> None:
        """Create each directory in turn."""
        for path in paths:
            self.ok(self.store.mkdir(path, mode=0o755, uid=1000, gid=1000, writer=writer))

    def write(
        self,
        path: str,
        chunks: tuple[ChunkRef, ...] | list[ChunkRef],
        expected_version: int = 0,
        writer: Writer = ALICE,
        mode: int = 0o644,
    ) -> PutResult:
        """Put ``chunks`` at ``path`` and return the result."""
        return self.ok(
            self.store.put(
                path,
                expected_version=expected_version,
                chunks=chunks,
                size=sum(c.size for c in chunks),
                mode=mode,
                mtime_ns=123,
                uid=1000,
                gid=1000,
                writer=writer,
            )
        )

    def put_deferred(
        self,
        path: str,
        expected_version: int,
        chunks: Sequence[ChunkRef | tuple[str, int]],
        *,
        writer: Writer = ALICE,
        mode: int = 0o644,
        uid: int = 0,
        quota_bytes: int | None = None,
    ) -> Deferred[PutResult]:
        """A put of ``chunks`` with the matching size, not yet waited for."""
        size = sum(c.size if isinstance(c, ChunkRef) else c[1] for c in chunks)
        return self.store.put(
            path,
            expected_version=expected_version,
            chunks=chunks,
            size=size,
            mode=mode,
            mtime_ns=0,
            uid=uid,
            gid=0,
            writer=writer,
            quota_bytes=quota_bytes,
        )

    def names(self, directory: str) -> list[str]:
        """The entry names of ``directory``."""
        return [entry.name for entry in self.ok(self.store.list_dir(directory))]

    def assert_consistent(self) -> None:
        """Check the derived columns against a recomputation from scratch."""
        check_consistency(self, self.db_path)


def check_consistency(case: SynchronousTestCase, db_path: str) -> None:
    """
    Recompute, through a separate read connection, everything the store
    maintains incrementally and compare: parents, link counts, chunk
    references per top, subtree usage and file sizes.
    """
    connection = sqlite3.connect(db_path)
    try:
        names = connection.execute("SELECT path, parent, inode FROM names").fetchall()
        inodes = {
            row[0]: row
            for row in connection.execute("SELECT id, kind, nlink, size, chunks FROM inodes")
        }
        refs = {
            (top, bytes(digest)): (size, count)
            for top, digest, size, count in connection.execute(
                "SELECT top, hash, size, refs FROM chunk_refs"
            )
        }
        usage = {
            top: (used, count)
            for top, used, count in connection.execute(
                "SELECT top, bytes, chunks FROM subtree_usage WHERE chunks > 0 OR bytes > 0"
            )
        }
        footprint = _footprint_tables(connection)
    finally:
        connection.close()
    by_path = {path: inode for path, _, inode in names}
    links: Counter[int] = Counter(inode for _, _, inode in names)
    subdirs: Counter[str] = Counter()
    tops: dict[int, set[str]] = {}
    for path, parent, inode in names:
        if path == "/":
            case.assertEqual(parent, "")
            continue
        expected_parent = path.rsplit("/", 1)[0] or "/"
        case.assertEqual(parent, expected_parent, path)
        case.assertIn(parent, by_path, path)
        case.assertEqual(inodes[by_path[parent]][1], "dir", path)
        if inodes[inode][1] == "dir":
            subdirs[parent] += 1
        tops.setdefault(inode, set()).add(path[1:].split("/", 1)[0])
    case.assertEqual(set(links), set(inodes), "every inode has a name and no more")
    expected_refs: dict[tuple[str, bytes], tuple[int, int]] = {}
    for inode_id, (_, kind, nlink, size, blob) in inodes.items():
        if kind == "dir":
            case.assertEqual(links[inode_id], 1)
            path = next(p for p, i in by_path.items() if i == inode_id)
            case.assertEqual(nlink, 2 + subdirs[path], path)
            continue
        case.assertEqual(nlink, links[inode_id])
        records = [
            (blob[i : i + 32], int.from_bytes(blob[i + 32 : i + 40], "big"))
            for i in range(0, len(blob), 40)
        ]
        if kind == "file":
            case.assertEqual(size, sum(s for _, s in records))
        else:
            case.assertEqual(records, [])
        case.assertEqual(len(tops[inode_id]), 1, "an inode lives in one top")
        (top,) = tops[inode_id]
        for digest, chunk_size in records:
            old_size, old_count = expected_refs.get((top, digest), (chunk_size, 0))
            case.assertEqual(old_size, chunk_size)
            expected_refs[(top, digest)] = (chunk_size, old_count + 1)
    case.assertEqual(refs, expected_refs)
    expected_usage: dict[str, tuple[int, int]] = {}
    for (top, _), (chunk_size, _) in expected_refs.items():
        used, count = expected_usage.get(top, (0, 0))
        expected_usage[top] = (used + chunk_size, count + 1)
    case.assertEqual(usage, expected_usage)
    _check_footprint(case, footprint, set(refs))


def _footprint_tables(connection: sqlite3.Connection) -> dict[str, Any]:
    return {
        "journal": connection.execute(
            "SELECT seq, path, top, old_state, new_state, replaced_state FROM journal"
        ).fetchall(),
        "uploads": {
            (top, bytes(digest)): size
            for top, digest, size in connection.execute("SELECT top, hash, size FROM uploads")
        },
        "retained": {
            (top, bytes(digest)): (size, last_seq)
            for top, digest, size, last_seq in connection.execute(
                "SELECT top, hash, size, last_seq FROM retained_chunks"
            )
        },
        "collectable": {
            bytes(digest): (top, size)
            for digest, top, size in connection.execute("SELECT hash, top, size FROM collectable")
        },
        "totals": {
            top: (uncommitted, retained, collectable)
            for top, uncommitted, retained, collectable in connection.execute(
                "SELECT top, uncommitted_bytes, retained_bytes, collectable_bytes FROM footprint"
                " WHERE uncommitted_bytes > 0 OR retained_bytes > 0 OR collectable_bytes > 0"
            )
        },
    }


def _snapshot_chunks(blob: bytes | None) -> list[tuple[bytes, int]]:
    if blob is None:
        return []
    records = msgpack.unpackb(blob, raw=False)["chunks"]
    return [
        (bytes(records[i : i + 32]), int.from_bytes(records[i + 32 : i + 40], "big"))
        for i in range(0, len(records), 40)
    ]


def _check_footprint(
    case: SynchronousTestCase, tables: dict[str, Any], live: set[tuple[str, bytes]]
) -> None:
    """
    The footprint rules of L{svc.store.footprint_rows}, recomputed: uploads
    never of a live chunk; a chunk retained exactly when a row of its top
    names it and no live file of the top does, by the newest such row;
    collectable chunks named by nothing; the totals their sums.
    """
    newest: dict[tuple[str, bytes], tuple[int, int]] = {}
    for seq, path, top, *states in sorted(tables["journal"]):
        case.assertEqual(top, path[1:].split("/", 1)[0], f"journal row {seq}: its top")
        for blob in states:
            for digest, size in _snapshot_chunks(blob):
                newest[(top, digest)] = (size, seq)
    expected_retained = {key: value for key, value in newest.items() if key not in live}
    case.assertEqual(tables["retained"], expected_retained, "retained chunks")
    uploads = tables["uploads"]
    case.assertEqual(set(uploads) & live, set(), "uploads of chunks the top names")
    named = {digest for _, digest in live | set(uploads) | set(expected_retained)}
    collectable = tables["collectable"]
    case.assertEqual(set(collectable) & named, set(), "collectable chunks still named")
    totals: dict[str, list[int]] = {}
    for (top, _), size in uploads.items():
        totals.setdefault(top, [0, 0, 0])[0] += size
    for (top, _), (size, _) in expected_retained.items():
        totals.setdefault(top, [0, 0, 0])[1] += size
    for top, size in collectable.values():
        totals.setdefault(top, [0, 0, 0])[2] += size
    case.assertEqual(
        tables["totals"], {top: tuple(parts) for top, parts in totals.items()}, "footprint totals"
    )
