"""
The read-only queries of ``routes.db``: one name's manifest, a directory
listing, a symlink target, and the chunk-reference summaries that garbage
collection and quotas read.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from svc.store.errors import InvalidArgument, NotADirectory
from svc.store.manifest_paths import check_path, child_path, name_of
from svc.store.manifest_rows import InodeRow, require
from svc.store.manifest_values import (
    CHUNK_RECORD_BYTES,
    DirectoryEntry,
    FileChunks,
    FileKind,
    Manifest,
    decode_chunks,
)


def get(connection: sqlite3.Connection, path: str) -> Manifest:
    """
    The manifest of ``path``.

    @raise NotFound: no such name.
    """
    return require(connection, check_path(path)).manifest(path)


def list_directory(
    connection: sqlite3.Connection, path: str, after: str | None = None, limit: int | None = None
) -> tuple[DirectoryEntry, ...]:
    """
    The entries of directory ``path`` in byte order of their names: those
    whose names sort after ``after`` (all, if None), at most ``limit`` (all,
    if None). Reads only the rows it returns (index ``names_by_parent_path``).

    @raise NotFound: no such name.
    @raise NotADirectory: ``path`` is not a directory.
    """
    if not require(connection, check_path(path)).is_directory:
        raise NotADirectory(path)
    # A directory's children share its path and a slash, so their paths sort
    # as their names do.
    query = _SELECT_ENTRIES + " WHERE n.parent = ?"
    parameters: list[object] = [path]
    if after is not None:
        query += " AND n.path > ?"
        parameters.append(child_path(path, after))
    query += " ORDER BY n.path"
    if limit is not None:
        query += " LIMIT ?"
        parameters.append(limit)
    entries = []
    for values in connection.execute(query, parameters):
        fields = list(values[1:])
        fields[1] = FileKind(fields[1])
        entries.append(DirectoryEntry(name_of(values[0]), InodeRow(*fields).attributes()))
    return tuple(entries)


_SELECT_ENTRIES = (
    "SELECT n.path, i.id, i.kind, i.mode, i.uid, i.gid, i.size, i.mtime_ns, i.atime_ns,"
    " i.ctime_ns, i.version, i.nlink, i.rdev, i.symlink_target, x'', i.writer_agent,"
    " i.writer_session, i.written_ms"
    " FROM names n JOIN inodes i ON i.id = n.inode"
)


_SELECT_CHUNK_LISTS = (
    "SELECT n.path, i.id, i.version, i.chunks FROM names n JOIN inodes i ON i.id = n.inode"
)
_FILE_OF_AT_MOST = "i.kind = ? AND (? < 0 OR length(i.chunks) <= ?)"


def chunk_lists(
    connection: sqlite3.Connection,
    directory: str,
    names: Sequence[str],
    max_chunks: int | None = None,
) -> dict[str, FileChunks]:
    """
    The chunk lists of the regular files among the entries ``names`` of
    ``directory``, by name, each with its inode and version; names that are
    absent, not regular files, or (with ``max_chunks``) whose list has more
    entries than that are left out. Reads the rows of those names only.
    """
    found: dict[str, FileChunks] = {}
    wanted = list(dict.fromkeys(names))
    longest = -1 if max_chunks is None else max_chunks * CHUNK_RECORD_BYTES
    for start in range(0, len(wanted), _QUERY_BATCH):
        batch = [child_path(directory, name) for name in wanted[start : start + _QUERY_BATCH]]
        marks = ",".join("?" * len(batch))
        # Built from constants and placeholders only.
        query = f"{_SELECT_CHUNK_LISTS} WHERE n.path IN ({marks}) AND {_FILE_OF_AT_MOST}"
        rows = connection.execute(query, (*batch, FileKind.FILE.value, longest, longest))
        for path, inode, version, blob in rows:
            found[name_of(path)] = FileChunks(inode, version, decode_chunks(blob))
    return found


def readlink(connection: sqlite3.Connection, path: str) -> str:
    """
    The target of symlink ``path``.

    @raise InvalidArgument: ``path`` is not a symlink.
    """
    row = require(connection, check_path(path))
    if row.kind is not FileKind.SYMLINK or row.symlink_target is None:
        raise InvalidArgument(f"{path} is not a symlink")
    return row.symlink_target


def live_hashes(connection: sqlite3.Connection) -> frozenset[str]:
    """
    Every chunk hash referenced by a live file anywhere in the namespace.
    """
    return frozenset(
        digest.hex() for (digest,) in connection.execute("SELECT DISTINCT hash FROM chunk_refs")
    )


def usage_by_top(connection: sqlite3.Connection) -> dict[str, int]:
    """
    Unique chunk bytes per top-level directory that references any chunk.
    """
    return {
        top: int(used)
        for top, used in connection.execute("SELECT top, bytes FROM subtree_usage WHERE chunks > 0")
    }


_QUERY_BATCH = 500


def referenced_under(connection: sqlite3.Connection, top: str, hashes: Sequence[str]) -> set[str]:
    """
    Those of ``hashes`` that a live file under ``/<top>`` references.
    """
    found: set[str] = set()
    for start in range(0, len(hashes), _QUERY_BATCH):
        batch = hashes[start : start + _QUERY_BATCH]
        marks = ",".join("?" * len(batch))
        rows = connection.execute(
            f"SELECT hash FROM chunk_refs WHERE top = ? AND hash IN ({marks})",  # noqa: S608
            (top, *(bytes.fromhex(h) for h in batch)),
        )
        found.update(digest.hex() for (digest,) in rows)
    return found
