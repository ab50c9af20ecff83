"""
Row-level reads and writes on ``routes.db``: inode lookup, name insertion and
removal, directory bookkeeping, chunk reference counting and transactions.

These functions run on the store's worker thread against an open
C{sqlite3.Connection} inside a transaction opened by
L{svc.store.routes_queue}; the operations in L{svc.store.manifest_writes},
L{svc.store.manifest_names} and the journal revert compose them.
"""

from __future__ import annotations

import sqlite3
from collections import Counter

import attrs

from svc.store.errors import (
    AlreadyExists,
    InvalidArgument,
    IsADirectory,
    LastWriter,
    NotADirectory,
    NotEmpty,
    NotFound,
)
from svc.store.manifest_paths import ROOT, parent_of
from svc.store.manifest_values import (
    Attributes,
    ChunkRef,
    FileKind,
    Manifest,
    Writer,
    decode_chunks,
)

_NS_PER_MS = 1_000_000

_INODE_COLUMNS = (
    "i.id, i.kind, i.mode, i.uid, i.gid, i.size, i.mtime_ns, i.atime_ns, i.ctime_ns, "
    "i.version, i.nlink, i.rdev, i.symlink_target, i.chunks, i.writer_agent, "
    "i.writer_session, i.written_ms"
)

# Built from constants only.
_SELECT_BY_PATH = (
    f"SELECT {_INODE_COLUMNS} FROM names n JOIN inodes i ON i.id = n.inode WHERE n.path = ?"  # noqa: S608
)
_SELECT_BY_ID = f"SELECT {_INODE_COLUMNS} FROM inodes i WHERE i.id = ?"  # noqa: S608


@attrs.frozen
class Stamp:
    """
    The time and author of one change, taken once per transaction.
    """

    now_ns: int
    writer: Writer

    @property
    def at_ms(self) -> int:
        """The time in milliseconds since the epoch."""
        return self.now_ns // _NS_PER_MS


@attrs.frozen
class InodeRow:
    """
    One C{inodes} row as read; ``chunks`` is still the encoded BLOB.
    """

    id: int
    kind: FileKind
    mode: int
    uid: int
    gid: int
    size: int
    mtime_ns: int
    atime_ns: int
    ctime_ns: int
    version: int
    nlink: int
    rdev: int
    symlink_target: str | None
    chunks: bytes
    writer_agent: str
    writer_session: str | None
    written_ms: int

    @property
    def is_directory(self) -> bool:
        """Whether the inode is a directory."""
        return self.kind is FileKind.DIRECTORY

    def chunk_list(self) -> tuple[ChunkRef, ...]:
        """The decoded chunk list."""
        return decode_chunks(self.chunks)

    def attributes(self) -> Attributes:
        """The public attributes."""
        return Attributes(
            inode=self.id,
            kind=self.kind,
            mode=self.mode,
            uid=self.uid,
            gid=self.gid,
            size=self.size,
            mtime_ns=self.mtime_ns,
            atime_ns=self.atime_ns,
            ctime_ns=self.ctime_ns,
            version=self.version,
            nlink=self.nlink,
            rdev=self.rdev,
            symlink_target=self.symlink_target,
        )

    def last_writer(self) -> LastWriter:
        """Who changed the inode last."""
        return LastWriter(self.writer_agent, self.writer_session, self.written_ms)

    def manifest(self, path: str) -> Manifest:
        """The full manifest of this inode under ``path``."""
        return Manifest(path, self.attributes(), self.chunk_list(), self.last_writer())


def _row(values: tuple[object, ...] | None) -> InodeRow | None:
    if values is None:
        return None
    fields = list(values)
    fields[1] = FileKind(fields[1])
    return InodeRow(*fields)  # type: ignore[arg-type]


def lookup(connection: sqlite3.Connection, path: str) -> InodeRow | None:
    """
    The inode named by ``path``, or L{None}.
    """
    return _row(connection.execute(_SELECT_BY_PATH, (path,)).fetchone())


def lookup_inode(connection: sqlite3.Connection, inode: int) -> InodeRow:
    """
    The inode with id ``inode``, which must exist.
    """
    found = _row(connection.execute(_SELECT_BY_ID, (inode,)).fetchone())
    assert found is not None, inode
    return found


def require(connection: sqlite3.Connection, path: str) -> InodeRow:
    """
    The inode named by ``path``.

    @raise NotFound: no such name.
    """
    found = lookup(connection, path)
    if found is None:
        raise NotFound(path)
    return found


def require_parent_directory(connection: sqlite3.Connection, path: str) -> InodeRow:
    """
    The directory that would contain ``path``.

    @raise InvalidArgument: ``path`` is the root.
    @raise NotFound: the parent does not exist.
    @raise NotADirectory: the parent is not a directory.
    """
    if path == ROOT:
        raise InvalidArgument("the root has no parent")
    parent = lookup(connection, parent_of(path))
    if parent is None:
        raise NotFound(parent_of(path))
    if not parent.is_directory:
        raise NotADirectory(parent_of(path))
    return parent


def require_absent(connection: sqlite3.Connection, path: str) -> InodeRow:
    """
    Check that ``path`` can be created and return its parent directory.

    @raise AlreadyExists: the name is taken.
    """
    parent = require_parent_directory(connection, path)
    if lookup(connection, path) is not None:
        raise AlreadyExists(path)
    return parent


def insert_inode(
    connection: sqlite3.Connection,
    stamp: Stamp,
    *,
    kind: FileKind,
    mode: int,
    uid: int,
    gid: int,
    size: int = 0,
    mtime_ns: int | None = None,
    atime_ns: int | None = None,
    version: int = 1,
    chunks: bytes = b"",
    symlink_target: str | None = None,
    rdev: int = 0,
) -> int:
    """
    Add an inode with one link (two for a directory) and return its id;
    its atime is C{atime_ns}, else its mtime.
    """
    mtime = stamp.now_ns if mtime_ns is None else mtime_ns
    cursor = connection.execute(
        "INSERT INTO inodes (kind, mode, uid, gid, size, mtime_ns, atime_ns, ctime_ns,"
        " version, nlink, symlink_target, rdev, chunks, writer_agent, writer_session,"
        " written_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            kind.value,
            mode,
            uid,
            gid,
            size,
            mtime,
            mtime if atime_ns is None else atime_ns,
            stamp.now_ns,
            version,
            2 if kind is FileKind.DIRECTORY else 1,
            symlink_target,
            rdev,
            chunks,
            stamp.writer.agent_id,
            stamp.writer.session_id,
            stamp.at_ms,
        ),
    )
    inode = cursor.lastrowid
    assert inode is not None
    return inode


def insert_name(connection: sqlite3.Connection, path: str, inode: int) -> None:
    """
    Add the name ``path`` for ``inode``.
    """
    connection.execute(
        "INSERT INTO names (path, parent, inode) VALUES (?, ?, ?)",
        (path, parent_of(path), inode),
    )


def touch_directory(
    connection: sqlite3.Connection, directory: int, stamp: Stamp, nlink_delta: int = 0
) -> None:
    """
    Record an entry change in ``directory``: new mtime and ctime, version
    plus one, and ``nlink_delta`` subdirectories more or fewer.
    """
    connection.execute(
        "UPDATE inodes SET mtime_ns = ?1, ctime_ns = ?1, version = version + 1,"
        " nlink = nlink + ?2 WHERE id = ?3",
        (stamp.now_ns, nlink_delta, directory),
    )


def has_children(connection: sqlite3.Connection, directory: str) -> bool:
    """
    Whether any name has ``directory`` as its parent.
    """
    return (
        connection.execute("SELECT 1 FROM names WHERE parent = ? LIMIT 1", (directory,)).fetchone()
        is not None
    )


def adjust_refs(
    connection: sqlite3.Connection,
    top: str,
    old: tuple[ChunkRef, ...],
    new: tuple[ChunkRef, ...],
) -> frozenset[str]:
    """
    Move the chunk references of one inode under ``/<top>`` from ``old`` to
    ``new``, keeping C{subtree_usage} in step, and return the hashes whose
    last reference in the top went away. A chunk the top starts to reference
    stops being charged as uploaded, retained or collectable (the schema's
    C{chunk_named} trigger).

    @raise InvalidArgument: a new chunk's size disagrees with the size
        already recorded for its hash in this top.
    """
    before = Counter(old)
    after = Counter(new)
    removed = before - after
    added = after - before
    bytes_delta = 0
    chunks_delta = 0
    released: set[str] = set()
    for chunk, count in removed.items():
        digest = bytes.fromhex(chunk.hash)
        gone = connection.execute(
            "DELETE FROM chunk_refs WHERE top = ? AND hash = ? AND refs = ? RETURNING size",
            (top, digest, count),
        ).fetchone()
        if gone is not None:
            bytes_delta -= int(gone[0])
            chunks_delta -= 1
            released.add(chunk.hash)
        else:
            connection.execute(
                "UPDATE chunk_refs SET refs = refs - ? WHERE top = ? AND hash = ?",
                (count, top, digest),
            )
    for chunk, count in added.items():
        row = connection.execute(
            "INSERT INTO chunk_refs (top, hash, size, refs) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (top, hash) DO UPDATE SET refs = refs + excluded.refs"
            " WHERE size = excluded.size RETURNING refs",
            (top, bytes.fromhex(chunk.hash), chunk.size, count),
        ).fetchone()
        if row is None:
            raise InvalidArgument(f"chunk {chunk.hash} is recorded with another size")
        if row[0] == count:
            bytes_delta += chunk.size
            chunks_delta += 1
            released.discard(chunk.hash)
    if bytes_delta or chunks_delta:
        # Not an upsert: SQLite checks the CHECK constraints of the row to
        # insert (here possibly negative deltas) before resolving a conflict.
        cursor = connection.execute(
            "UPDATE subtree_usage SET bytes = bytes + ?, chunks = chunks + ? WHERE top = ?",
            (bytes_delta, chunks_delta, top),
        )
        if cursor.rowcount == 0:
            connection.execute(
                "INSERT INTO subtree_usage (top, bytes, chunks) VALUES (?, ?, ?)",
                (top, bytes_delta, chunks_delta),
            )
    return frozenset(released)


def subtree_usage(connection: sqlite3.Connection, top: str) -> int:
    """
    Unique chunk bytes referenced by live files under ``/<top>``.
    """
    row = connection.execute("SELECT bytes FROM subtree_usage WHERE top = ?", (top,)).fetchone()
    return 0 if row is None else int(row[0])


def drop_name(
    connection: sqlite3.Connection, path: str, row: InodeRow, top: str, stamp: Stamp
) -> tuple[int, frozenset[str]]:
    """
    Remove the name ``path`` of non-directory ``row``: one link fewer, and
    the inode with its chunk references gone at zero links. Returns the
    remaining link count and the released hashes. The parent directory is
    not touched.
    """
    connection.execute("DELETE FROM names WHERE path = ?", (path,))
    if row.nlink > 1:
        connection.execute(
            "UPDATE inodes SET nlink = nlink - 1, ctime_ns = ? WHERE id = ?",
            (stamp.now_ns, row.id),
        )
        return row.nlink - 1, frozenset()
    released = adjust_refs(connection, top, row.chunk_list(), ())
    connection.execute("DELETE FROM inodes WHERE id = ?", (row.id,))
    return 0, released


def drop_directory(connection: sqlite3.Connection, path: str, row: InodeRow) -> None:
    """
    Remove the empty directory ``path`` and its inode. The parent directory
    is not touched.

    @raise NotEmpty: it has entries.
    """
    if has_children(connection, path):
        raise NotEmpty(path)
    connection.execute("DELETE FROM names WHERE path = ?", (path,))
    connection.execute("DELETE FROM inodes WHERE id = ?", (row.id,))


def require_non_directory(row: InodeRow, path: str) -> None:
    """
    @raise IsADirectory: ``row`` is a directory.
    """
    if row.is_directory:
        raise IsADirectory(path)
