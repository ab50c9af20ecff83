"""
The data-plane request each outbox entry is (``mount-outbox.md`` section 6,
``dataplane-ops.md`` section 3). Pure: no I/O.

Every request carries the entry's C{outbox} tag, so the data plane applies
it at most once however often it is sent.
"""

from __future__ import annotations

import stat

from svc.mount.outbox.entries import (
    Commit,
    Entry,
    Link,
    Mkdir,
    Mknod,
    Rename,
    Rmdir,
    SetAttributes,
    Symlink,
    Unlink,
)
from svc.wire.kinds import ChunkEntry, OutboxTag
from svc.wire.messages import (
    DirCreateRequest,
    ManifestPutRequest,
    MknodRequest,
    PathWriteRequest,
    SetattrRequest,
    SymlinkRequest,
    TwoPathRequest,
)
from svc.wire.ops import Op

PERMISSIONS = 0o7777
"""The bits of a mode the data plane takes (the type goes in C{kind})."""

_NODE_KINDS = {
    stat.S_IFREG: "file",
    stat.S_IFIFO: "fifo",
    stat.S_IFCHR: "chardev",
    stat.S_IFBLK: "blockdev",
    stat.S_IFSOCK: "socket",
}


def node_kind(mode: int) -> str:
    """The C{mknod} kind of a mode's type bits (C{ValueError} for another type)."""
    kind = _NODE_KINDS.get(stat.S_IFMT(mode))
    if kind is None:
        raise ValueError(f"mknod cannot make a node of mode {mode:o}")
    return kind


def tag_of(outbox: bytes, seq: int, settled: int) -> OutboxTag:
    """The C{outbox} field of entry C{seq} of outbox C{outbox}."""
    return OutboxTag(outbox.hex(), seq, settled)


def request_of(entry: Entry, tag: OutboxTag | None, session_id: str | None) -> tuple[Op, object]:
    """The operation and request message that send C{entry} (tagged C{tag})."""
    if isinstance(entry, Commit):
        if entry.chained:
            # Its expected version is the answer to an earlier entry: for
            # the coalescing of issue 36, which will resolve it first.
            raise ValueError("a chained commit cannot be sent before its version is known")
        return Op.MANIFEST_PUT, ManifestPutRequest(
            path=entry.path,
            expected_version=entry.expected,
            chunks=tuple(ChunkEntry(chunk.hash, chunk.length) for chunk in entry.chunks),
            size=entry.size,
            mode=entry.owner.mode & PERMISSIONS,
            mtime_ns=entry.mtime_ns,
            uid=entry.owner.uid,
            gid=entry.owner.gid,
            session_id=session_id,
            atime_ns=entry.atime_ns,
            outbox=tag,
        )
    if isinstance(entry, Mkdir):
        owner = entry.owner
        return Op.DIR_CREATE, DirCreateRequest(
            entry.path, owner.mode & PERMISSIONS, owner.uid, owner.gid, session_id, tag
        )
    if isinstance(entry, Mknod):
        owner = entry.owner
        return Op.MKNOD, MknodRequest(
            entry.path,
            node_kind(owner.mode),
            owner.mode & PERMISSIONS,
            entry.rdev,
            owner.uid,
            owner.gid,
            session_id,
            tag,
        )
    if isinstance(entry, Symlink):
        return Op.SYMLINK, SymlinkRequest(
            entry.path, entry.target, entry.uid, entry.gid, session_id, tag
        )
    if isinstance(entry, Link):
        return Op.LINK, TwoPathRequest(entry.existing, entry.path, session_id, tag)
    if isinstance(entry, Unlink):
        return Op.MANIFEST_DELETE, PathWriteRequest(entry.path, session_id, tag)
    if isinstance(entry, Rmdir):
        return Op.DIR_REMOVE, PathWriteRequest(entry.path, session_id, tag)
    if isinstance(entry, Rename):
        return Op.MANIFEST_RENAME, TwoPathRequest(entry.path, entry.to, session_id, tag)
    assert isinstance(entry, SetAttributes)
    mode = None if entry.mode is None else entry.mode & PERMISSIONS
    return Op.SETATTR, SetattrRequest(
        entry.path,
        mode,
        entry.uid,
        entry.gid,
        entry.size,
        entry.mtime_ns,
        entry.atime_ns,
        session_id,
        tag,
    )
