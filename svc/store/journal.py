"""
The per-tenant write journal: queries with a seq cursor, revert of one
``(path, seq)`` as a new journaled change, the chunk hashes the retention
window must keep, and pruning.

The row format is in L{svc.store.journal_rows}; every namespace mutation
appends its row in its own transaction (L{svc.store.manifest_writes},
L{svc.store.manifest_names}).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Collection, Sequence
from typing import Any

import attrs

from svc.store import footprint_rows
from svc.store.errors import ChunksCollected, InvalidArgument, NotFound
from svc.store.journal_rows import (
    ENTRY_COLUMNS,
    JournalEntry,
    Snapshot,
    append_entry,
    decode_snapshot,
    entry_from_row,
    snapshot_of,
)
from svc.store.manifest_names import remove_entry
from svc.store.manifest_paths import ROOT, check_path, descendant_range, top_of
from svc.store.manifest_rows import (
    InodeRow,
    Stamp,
    adjust_refs,
    insert_inode,
    insert_name,
    lookup,
    require_parent_directory,
    touch_directory,
)
from svc.store.manifest_values import FileKind, Manifest, encode_chunks

#: The largest page a query returns.
MAX_PAGE = 1000

#: The page size when none is asked for.
DEFAULT_PAGE = 100

#: Reports which of the given chunk hashes the chunk store no longer holds.
MissingChunks = Callable[[Sequence[str]], Collection[str]]


def _check_limit(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not isinstance(value, int) or not 1 <= value <= MAX_PAGE:
        raise InvalidArgument(f"limit must be between 1 and {MAX_PAGE}")


@attrs.frozen
class JournalQuery:
    """
    Which journal rows to return, oldest first (or newest first with
    ``newest_first``), at most ``limit`` of them after ``cursor``.

    ``path`` matches rows whose C{path} or C{to_path} is ``path`` (or lies
    below it, with ``below``); ``agent_id`` matches the author; ``since_ms``
    (inclusive) and ``until_ms`` (exclusive) bound C{at_ms}. ``cursor`` is
    the L{JournalPage.next_cursor} of the previous page.
    """

    path: str | None = None
    below: bool = False
    agent_id: str | None = None
    since_ms: int | None = None
    until_ms: int | None = None
    cursor: int | None = None
    limit: int = attrs.field(default=DEFAULT_PAGE, validator=_check_limit)
    newest_first: bool = False

    def __attrs_post_init__(self) -> None:
        if self.path is not None:
            check_path(self.path)


@attrs.frozen
class JournalPage:
    """
    One page of entries; ``next_cursor`` is L{None} when no further rows
    matched at query time.
    """

    entries: tuple[JournalEntry, ...]
    next_cursor: int | None


@attrs.frozen
class RevertResult:
    """
    A committed revert of ``path`` to its state just before entry
    ``reverted_seq``. ``journal_seq`` is the new row (L{None} when the path
    already was in that state); ``restored`` is the path's manifest after
    (L{None}: the path is now absent).
    """

    path: str
    reverted_seq: int
    journal_seq: int | None
    restored: Manifest | None
    released_hashes: frozenset[str]


def query(connection: sqlite3.Connection, journal_query: JournalQuery) -> JournalPage:
    """
    The page of rows matching ``journal_query``.
    """
    clauses: list[str] = []
    params: list[Any] = []
    path = journal_query.path
    if path is not None and not (journal_query.below and path == ROOT):
        if journal_query.below:
            low, high = descendant_range(path)
            clauses.append(
                "(path = ? OR (path >= ? AND path < ?)"
                " OR to_path = ? OR (to_path >= ? AND to_path < ?))"
            )
            params += [path, low, high, path, low, high]
        else:
            clauses.append("(path = ? OR to_path = ?)")
            params += [path, path]
    if journal_query.agent_id is not None:
        clauses.append("agent_id = ?")
        params.append(journal_query.agent_id)
    if journal_query.since_ms is not None:
        clauses.append("at_ms >= ?")
        params.append(journal_query.since_ms)
    if journal_query.until_ms is not None:
        clauses.append("at_ms < ?")
        params.append(journal_query.until_ms)
    if journal_query.cursor is not None:
        clauses.append("seq < ?" if journal_query.newest_first else "seq > ?")
        params.append(journal_query.cursor)
    where = " AND ".join(clauses) if clauses else "1"
    order = "DESC" if journal_query.newest_first else "ASC"
    rows = connection.execute(
        f"SELECT {ENTRY_COLUMNS} FROM journal WHERE {where} ORDER BY seq {order} LIMIT ?",  # noqa: S608
        (*params, journal_query.limit + 1),
    ).fetchall()
    entries = tuple(entry_from_row(row) for row in rows[: journal_query.limit])
    more = len(rows) > journal_query.limit
    return JournalPage(entries, entries[-1].seq if more else None)


def entry(connection: sqlite3.Connection, seq: int) -> JournalEntry | None:
    """
    The row ``seq``, or L{None}.
    """
    row = connection.execute(
        f"SELECT {ENTRY_COLUMNS} FROM journal WHERE seq = ?",  # noqa: S608
        (seq,),
    ).fetchone()
    return None if row is None else entry_from_row(row)


def revert(
    connection: sqlite3.Connection,
    stamp: Stamp,
    path: str,
    seq: int,
    missing_chunks: MissingChunks,
) -> RevertResult:
    """
    Restore ``path`` to its state just before journal entry ``seq``, as a new
    C{revert} row: remove it if it did not exist then; otherwise recreate or
    overwrite it from the snapshot (a file gets back its exact chunk list, a
    directory only its attributes). Whatever stands at ``path`` now is
    replaced (a directory only if empty). Before it writes anything it asks
    ``missing_chunks`` (on this thread) which of the needed chunks the chunk
    store lost. Quotas are not applied. Runs inside the caller's
    transaction, like every mutation.

    @raise NotFound: no entry ``seq``, the entry is about another path, or
        the parent directory no longer exists.
    @raise ChunksCollected: needed chunks were garbage-collected.
    @raise NotEmpty: a directory with entries stands in the way.
    """
    check_path(path)
    found = entry(connection, seq)
    if found is None or not found.concerns(path):
        raise NotFound(f"no journal entry {seq} for {path}")
    before = found.state_before(path)
    if before is not None and before.chunks:
        needed = sorted({chunk.hash for chunk in before.chunks})
        missing = missing_chunks(needed)
        if missing:
            raise ChunksCollected(tuple(sorted(missing)))
    return _restore(connection, stamp, path, seq, before)


def _restore(
    connection: sqlite3.Connection,
    stamp: Stamp,
    path: str,
    seq: int,
    before: Snapshot | None,
) -> RevertResult:
    if path == ROOT:
        raise InvalidArgument("cannot revert the root")
    current = lookup(connection, path)
    released: frozenset[str] = frozenset()
    current_chunks = () if current is None else current.chunk_list()
    if before is None:
        if current is None:
            return RevertResult(path, seq, None, None, released)
        released = remove_entry(connection, stamp, path, current).released_hashes
        new_seq = append_entry(
            connection,
            stamp,
            "revert",
            path,
            old=snapshot_of(current),
            new=None,
            reverts_seq=seq,
            released=footprint_rows.released_refs(released, current_chunks),
        )
        return RevertResult(path, seq, new_seq, None, released)
    parent = require_parent_directory(connection, path)
    old = None if current is None else snapshot_of(current)
    if current is not None and current.kind is not before.kind:
        released = remove_entry(connection, stamp, path, current).released_hashes
        current = None
    if current is None:
        inode = _recreate(connection, stamp, path, before, parent)
    else:
        inode = current.id
        released = _overwrite(connection, stamp, path, current, before)
    after = lookup(connection, path)
    assert after is not None and after.id == inode
    new_seq = append_entry(
        connection,
        stamp,
        "revert",
        path,
        old=old,
        new=snapshot_of(after),
        reverts_seq=seq,
        released=footprint_rows.released_refs(released, current_chunks),
    )
    return RevertResult(path, seq, new_seq, after.manifest(path), released)


def _recreate(
    connection: sqlite3.Connection,
    stamp: Stamp,
    path: str,
    before: Snapshot,
    parent: InodeRow,
) -> int:
    inode = insert_inode(
        connection,
        stamp,
        kind=before.kind,
        mode=before.mode,
        uid=before.uid,
        gid=before.gid,
        size=before.size,
        mtime_ns=before.mtime_ns,
        chunks=encode_chunks(before.chunks),
        symlink_target=before.symlink_target,
        rdev=before.rdev,
    )
    insert_name(connection, path, inode)
    adjust_refs(connection, top_of(path), (), before.chunks)
    touch_directory(connection, parent.id, stamp, 1 if before.kind is FileKind.DIRECTORY else 0)
    return inode


def _overwrite(
    connection: sqlite3.Connection,
    stamp: Stamp,
    path: str,
    current: InodeRow,
    before: Snapshot,
) -> frozenset[str]:
    if current.kind is FileKind.DIRECTORY:
        connection.execute(
            "UPDATE inodes SET mode = ?, uid = ?, gid = ?, mtime_ns = ?, ctime_ns = ? WHERE id = ?",
            (before.mode, before.uid, before.gid, before.mtime_ns, stamp.now_ns, current.id),
        )
        return frozenset()
    released = adjust_refs(connection, top_of(path), current.chunk_list(), before.chunks)
    connection.execute(
        "UPDATE inodes SET mode = ?, uid = ?, gid = ?, size = ?, mtime_ns = ?, ctime_ns = ?,"
        " chunks = ?, symlink_target = ?, rdev = ?, version = version + 1, writer_agent = ?,"
        " writer_session = ?, written_ms = ? WHERE id = ?",
        (
            before.mode,
            before.uid,
            before.gid,
            before.size,
            before.mtime_ns,
            stamp.now_ns,
            encode_chunks(before.chunks),
            before.symlink_target,
            before.rdev,
            stamp.writer.agent_id,
            stamp.writer.session_id,
            stamp.at_ms,
            current.id,
        ),
    )
    return released


def hashes_since(connection: sqlite3.Connection, cutoff_ms: int) -> frozenset[str]:
    """
    Every chunk hash named by a journal row written at or after
    ``cutoff_ms``: garbage collection must keep these so that the rows in
    the retention window stay revertible.
    """
    found: set[str] = set()
    for states in connection.execute(
        "SELECT old_state, new_state, replaced_state FROM journal WHERE at_ms >= ?",
        (cutoff_ms,),
    ):
        for blob in states:
            snapshot = decode_snapshot(blob)
            if snapshot is not None:
                found.update(chunk.hash for chunk in snapshot.chunks)
    return frozenset(found)


def prune(connection: sqlite3.Connection, before_ms: int, at_ms: int) -> int:
    """
    Delete the rows up to the newest one written before ``before_ms`` (by
    seq, so a clock set back cannot leave an older row behind a pruned one)
    and return how many went; the chunks only they kept become collectable
    (L{footprint_rows.prune_journal_through}, at ``at_ms``). Their seqs are
    never handed out again.
    """
    (through,) = connection.execute(
        "SELECT max(seq) FROM journal WHERE at_ms < ?", (before_ms,)
    ).fetchone()
    if through is None:
        return 0
    return footprint_rows.prune_journal_through(connection, int(through), at_ms)


def row_count(connection: sqlite3.Connection) -> int:
    """
    The number of journal rows (the C{svc_journal_rows_total} gauge).
    """
    (count,) = connection.execute("SELECT count(*) FROM journal").fetchone()
    return int(count)


#: The top of a row's ``path`` in SQL (the first component; the row of a
#: disk's own directory ``/<top>`` included).
_TOP_OF_PATH = "substr(path, 2, instr(substr(path, 2) || '/', '/') - 1)"


def rows_by_top(connection: sqlite3.Connection, tops: Collection[str] | None) -> dict[str, int]:
    """
    How many journal rows each agent disk holds, by top (a row counts for
    the top of its ``path``; a rename's ``to_path`` lies in the same disk):
    for the given ``tops`` (each present, 0 when it has none, through the
    path index), or with L{None} for every top that has rows (one scan).
    """
    if tops is None:
        return {
            str(top): int(count)
            for top, count in connection.execute(
                f"SELECT {_TOP_OF_PATH} AS top, count(*) FROM journal GROUP BY top"  # noqa: S608
            )
            if top
        }
    counts: dict[str, int] = {}
    for top in tops:
        disk = "/" + top
        low, high = descendant_range(disk)
        (count,) = connection.execute(
            "SELECT count(*) FROM journal WHERE path = ? OR (path >= ? AND path < ?)",
            (disk, low, high),
        ).fetchone()
        counts[top] = int(count)
    return counts
