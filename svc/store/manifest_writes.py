"""
Content and attribute writes on ``routes.db``: the compare-and-swap
C{manifest_put} and C{setattr}.

Like every mutation, each runs inside one transaction opened by its caller
(L{svc.store.manifests.ManifestStore}), appends its journal row in that same
transaction and reads time and author from the L{Stamp} it is given.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from svc.store import footprint_rows
from svc.store.errors import (
    InvalidArgument,
    IsADirectory,
    QuotaExceeded,
    StaleVersion,
)
from svc.store.journal_rows import Snapshot, append_entry, snapshot_of
from svc.store.manifest_paths import ROOT, check_path, top_of
from svc.store.manifest_rows import (
    Stamp,
    adjust_refs,
    insert_inode,
    insert_name,
    lookup,
    lookup_inode,
    require,
    require_parent_directory,
    subtree_usage,
    touch_directory,
)
from svc.store.manifest_values import (
    ChunkRef,
    FileKind,
    PutResult,
    SetattrResult,
    check_id,
    check_mode,
    check_time,
    chunks_of,
    encode_chunks,
)


def put(
    connection: sqlite3.Connection,
    stamp: Stamp,
    path: str,
    *,
    expected_version: int,
    chunks: Sequence[ChunkRef | tuple[str, int]],
    size: int,
    mode: int,
    mtime_ns: int,
    uid: int,
    gid: int,
    quota_bytes: int | None = None,
    atime_ns: int | None = None,
) -> PutResult:
    """
    Compare-and-swap the content of regular file ``path``: create it when
    ``expected_version`` is 0, else replace the content of version
    ``expected_version`` with version + 1. ``size`` must be the sum of the
    chunk sizes (holes are materialised as zero chunks by the client).
    With ``quota_bytes``, a write that raises the unique chunk bytes of the
    path's top-level directory and its uploads not yet committed (the
    chunks the write names stop counting as uploads) above it is refused. ``atime_ns``, when
    given, is the file's new atime (else a new file's is its mtime and a
    replaced file keeps its own).

    @raise StaleVersion: the stored version (0 if absent) is not
        ``expected_version``.
    @raise IsADirectory: ``path`` is a directory.
    @raise InvalidArgument: bad arguments, or ``path`` is not a regular file.
    @raise QuotaExceeded: the write would exceed ``quota_bytes``.
    """
    check_path(path)
    new_chunks = chunks_of(chunks)
    if not isinstance(expected_version, int) or expected_version < 0:
        raise InvalidArgument("expected_version must be a non-negative integer")
    if size != sum(chunk.size for chunk in new_chunks):
        raise InvalidArgument("size must equal the sum of the chunk sizes")
    check_mode(mode)
    check_id(uid, "uid")
    check_id(gid, "gid")
    check_time(mtime_ns, "mtime_ns")
    if atime_ns is not None:
        check_time(atime_ns, "atime_ns")
    if path == ROOT:
        raise IsADirectory(path)
    top = top_of(path)
    charged_before = _charged(connection, top) if quota_bytes is not None else 0
    row = lookup(connection, path)
    blob = encode_chunks(new_chunks)
    if row is None:
        if expected_version != 0:
            raise StaleVersion(expected_version, 0, None)
        parent = require_parent_directory(connection, path)
        inode = insert_inode(
            connection,
            stamp,
            kind=FileKind.FILE,
            mode=mode,
            uid=uid,
            gid=gid,
            size=size,
            mtime_ns=mtime_ns,
            atime_ns=atime_ns,
            chunks=blob,
        )
        insert_name(connection, path, inode)
        touch_directory(connection, parent.id, stamp)
        old_chunks: tuple[ChunkRef, ...] = ()
        version = 1
        old: Snapshot | None = None
    else:
        if row.is_directory:
            raise IsADirectory(path)
        if row.version != expected_version:
            raise StaleVersion(expected_version, row.version, row.last_writer())
        if row.kind is not FileKind.FILE:
            raise InvalidArgument(f"{path} is not a regular file")
        inode = row.id
        old_chunks = row.chunk_list()
        version = row.version + 1
        connection.execute(
            "UPDATE inodes SET chunks = ?, size = ?, mode = ?, uid = ?, gid = ?, mtime_ns = ?,"
            " atime_ns = COALESCE(?, atime_ns), ctime_ns = ?, version = ?, writer_agent = ?,"
            " writer_session = ?, written_ms = ? WHERE id = ?",
            (
                blob,
                size,
                mode,
                uid,
                gid,
                mtime_ns,
                atime_ns,
                stamp.now_ns,
                version,
                stamp.writer.agent_id,
                stamp.writer.session_id,
                stamp.at_ms,
                inode,
            ),
        )
        old = snapshot_of(row)
    released = adjust_refs(connection, top, old_chunks, new_chunks)
    usage_after = subtree_usage(connection, top)
    if quota_bytes is not None:
        charged_after = _charged(connection, top)
        if charged_after > max(quota_bytes, charged_before):
            raise QuotaExceeded(
                f"agent grant {quota_bytes} bytes: the change needs {charged_after} in files"
            )
    new = Snapshot(
        kind=FileKind.FILE,
        mode=mode,
        uid=uid,
        gid=gid,
        size=size,
        mtime_ns=mtime_ns,
        version=version,
        inode=inode,
        rdev=0,
        symlink_target=None,
        chunks=new_chunks,
    )
    seq = append_entry(
        connection,
        stamp,
        "put",
        path,
        old=old,
        new=new,
        released=footprint_rows.released_refs(released, old_chunks),
    )
    return PutResult(
        path=path,
        inode=inode,
        version=version,
        size=size,
        created=row is None,
        old_chunks=old_chunks,
        new_chunks=new_chunks,
        usage_bytes=usage_after,
        journal_seq=seq,
        ctime_ns=stamp.now_ns,
    )


def _charged(connection: sqlite3.Connection, top: str) -> int:
    """What the grant bounds at a commit: the top's live bytes (uploads are bounded apart)."""
    return footprint_rows.read(connection, top).live_bytes


def set_attributes(
    connection: sqlite3.Connection,
    stamp: Stamp,
    path: str,
    *,
    mode: int | None = None,
    uid: int | None = None,
    gid: int | None = None,
    size: int | None = None,
    mtime_ns: int | None = None,
    atime_ns: int | None = None,
) -> SetattrResult:
    """
    Change the given attributes of ``path``. The only size change accepted
    is truncation of a regular file to 0 (a new version with no chunks;
    mtime becomes now unless given) or to its current size; any other size
    goes through L{put}, with the client re-chunking. Attribute-only
    changes do not change the version. Nothing given: nothing changes and
    nothing is journaled.

    @raise InvalidArgument: another size, or a size for a non-file.
    @raise IsADirectory: a size for a directory.
    """
    row = require(connection, check_path(path))
    if all(value is None for value in (mode, uid, gid, size, mtime_ns, atime_ns)):
        return SetattrResult(path, row.attributes(), frozenset(), None)
    new_mode = row.mode if mode is None else check_mode(mode)
    new_uid = row.uid if uid is None else check_id(uid, "uid")
    new_gid = row.gid if gid is None else check_id(gid, "gid")
    new_atime = row.atime_ns if atime_ns is None else check_time(atime_ns, "atime_ns")
    new_mtime = row.mtime_ns if mtime_ns is None else check_time(mtime_ns, "mtime_ns")
    truncate = False
    if size is not None:
        if row.is_directory:
            raise IsADirectory(path)
        if row.kind is not FileKind.FILE:
            raise InvalidArgument(f"{path} is not a regular file")
        if size not in (row.size, 0):
            raise InvalidArgument("only truncation to 0 is done by setattr; re-chunk and put")
        truncate = size == 0 and row.size != 0
    released: frozenset[str] = frozenset()
    if truncate:
        released = adjust_refs(connection, top_of(path), row.chunk_list(), ())
        if mtime_ns is None:
            new_mtime = stamp.now_ns
        connection.execute(
            "UPDATE inodes SET chunks = x'', size = 0, version = version + 1,"
            " writer_agent = ?, writer_session = ?, written_ms = ? WHERE id = ?",
            (stamp.writer.agent_id, stamp.writer.session_id, stamp.at_ms, row.id),
        )
    connection.execute(
        "UPDATE inodes SET mode = ?, uid = ?, gid = ?, mtime_ns = ?, atime_ns = ?,"
        " ctime_ns = ? WHERE id = ?",
        (new_mode, new_uid, new_gid, new_mtime, new_atime, stamp.now_ns, row.id),
    )
    after = lookup_inode(connection, row.id)
    seq = append_entry(
        connection,
        stamp,
        "setattr",
        path,
        old=snapshot_of(row),
        new=snapshot_of(after),
        released=footprint_rows.released_refs(released, row.chunk_list()),
    )
    return SetattrResult(path, after.attributes(), released, seq)
