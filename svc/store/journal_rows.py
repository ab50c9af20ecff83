"""
The write journal's row format: snapshots of a name's state, journal entries,
their encoding in the C{journal} table, and appending a row.

A snapshot is stored as a msgpack map with exactly these keys (all present):
C{kind} (str, an C{inodes.kind} value), C{mode}, C{uid}, C{gid}, C{size},
C{mtime_ns}, C{version}, C{inode}, C{rdev} (ints), C{symlink_target} (str or
nil) and C{chunks} (bin, the 40-byte-record chunk-list encoding of
L{svc.store.manifest_values.encode_chunks}). A NULL column means the name did
not exist.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from typing import Any

import attrs
import msgpack

from svc.store import footprint_rows
from svc.store.manifest_paths import top_of
from svc.store.manifest_rows import InodeRow, Stamp
from svc.store.manifest_values import ChunkRef, FileKind, decode_chunks, encode_chunks


@attrs.frozen
class Snapshot:
    """
    Enough of a name's state to restore it: for a file the exact chunk list
    (hence the exact bytes); for a directory only its attributes, never its
    entries.
    """

    kind: FileKind
    mode: int
    uid: int
    gid: int
    size: int
    mtime_ns: int
    version: int
    inode: int
    rdev: int
    symlink_target: str | None
    chunks: tuple[ChunkRef, ...]


@attrs.frozen
class JournalEntry:
    """
    One journal row. ``old`` is the state of ``path`` before the change and
    ``new`` the state after it (for C{rename}: of ``to_path`` after it);
    ``replaced`` is what a rename overwrote at ``to_path``. L{None} means
    absent.
    """

    seq: int
    at_ms: int
    agent_id: str
    session_id: str | None
    op: str
    path: str
    to_path: str | None
    old_version: int
    new_version: int
    old: Snapshot | None
    new: Snapshot | None
    replaced: Snapshot | None
    reverts_seq: int | None

    def concerns(self, path: str) -> bool:
        """
        Whether this entry changed the name ``path`` (a rename changes both
        of its names; a link only the new one).
        """
        return path == self.path or (self.op == "rename" and path == self.to_path)

    def state_before(self, path: str) -> Snapshot | None:
        """
        The state of ``path`` just before this entry; ``path`` must be one
        it L{concerns}.
        """
        if path == self.path:
            return self.old
        return self.replaced

    def hashes(self) -> set[str]:
        """Every chunk hash named by any of the entry's snapshots."""
        return {
            chunk.hash
            for snapshot in (self.old, self.new, self.replaced)
            if snapshot is not None
            for chunk in snapshot.chunks
        }


def snapshot_of(row: InodeRow) -> Snapshot:
    """
    The snapshot of an inode row.
    """
    return Snapshot(
        kind=row.kind,
        mode=row.mode,
        uid=row.uid,
        gid=row.gid,
        size=row.size,
        mtime_ns=row.mtime_ns,
        version=row.version,
        inode=row.id,
        rdev=row.rdev,
        symlink_target=row.symlink_target,
        chunks=row.chunk_list(),
    )


def encode_snapshot(snapshot: Snapshot | None) -> bytes | None:
    """
    The column value for ``snapshot``.
    """
    if snapshot is None:
        return None
    packed: bytes = msgpack.packb(
        {
            "kind": snapshot.kind.value,
            "mode": snapshot.mode,
            "uid": snapshot.uid,
            "gid": snapshot.gid,
            "size": snapshot.size,
            "mtime_ns": snapshot.mtime_ns,
            "version": snapshot.version,
            "inode": snapshot.inode,
            "rdev": snapshot.rdev,
            "symlink_target": snapshot.symlink_target,
            "chunks": encode_chunks(snapshot.chunks),
        },
        use_bin_type=True,
    )
    return packed


def decode_snapshot(blob: bytes | None) -> Snapshot | None:
    """
    The snapshot stored in a state column.
    """
    if blob is None:
        return None
    fields: dict[str, Any] = msgpack.unpackb(blob, raw=False)
    return Snapshot(
        kind=FileKind(fields["kind"]),
        mode=fields["mode"],
        uid=fields["uid"],
        gid=fields["gid"],
        size=fields["size"],
        mtime_ns=fields["mtime_ns"],
        version=fields["version"],
        inode=fields["inode"],
        rdev=fields["rdev"],
        symlink_target=fields["symlink_target"],
        chunks=decode_chunks(fields["chunks"]),
    )


ENTRY_COLUMNS = (
    "seq, at_ms, agent_id, session_id, op, path, to_path, old_version, new_version,"
    " old_state, new_state, replaced_state, reverts_seq"
)


def entry_from_row(values: tuple[Any, ...]) -> JournalEntry:
    """
    The entry for a row selected as L{ENTRY_COLUMNS}.
    """
    return JournalEntry(
        seq=values[0],
        at_ms=values[1],
        agent_id=values[2],
        session_id=values[3],
        op=values[4],
        path=values[5],
        to_path=values[6],
        old_version=values[7],
        new_version=values[8],
        old=decode_snapshot(values[9]),
        new=decode_snapshot(values[10]),
        replaced=decode_snapshot(values[11]),
        reverts_seq=values[12],
    )


def append_entry(
    connection: sqlite3.Connection,
    stamp: Stamp,
    op: str,
    path: str,
    *,
    old: Snapshot | None,
    new: Snapshot | None,
    to_path: str | None = None,
    replaced: Snapshot | None = None,
    reverts_seq: int | None = None,
    released: Iterable[ChunkRef] = (),
) -> int:
    """
    Append a journal row in the current transaction and return its seq.
    ``released`` are the chunks the change released (no live file of the
    path's top names them any more): the row retains them
    (L{footprint_rows.released}).
    """
    top = top_of(path)
    cursor = connection.execute(
        "INSERT INTO journal (at_ms, agent_id, session_id, op, path, to_path, old_version,"
        " new_version, old_state, new_state, replaced_state, reverts_seq, top)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            stamp.at_ms,
            stamp.writer.agent_id,
            stamp.writer.session_id,
            op,
            path,
            to_path,
            0 if old is None else old.version,
            0 if new is None else new.version,
            encode_snapshot(old),
            encode_snapshot(new),
            encode_snapshot(replaced),
            reverts_seq,
            top,
        ),
    )
    seq = cursor.lastrowid
    assert seq is not None
    footprint_rows.released(connection, top, seq, released)
    return seq
