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
