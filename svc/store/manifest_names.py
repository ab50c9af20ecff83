"""
Namespace changes on ``routes.db``: creating names (mkdir, symlink, mknod,
link), removing them (unlink, rmdir) and moving them (rename, a directory
with its whole subtree).

Each mutation runs inside one transaction opened by its caller
(L{svc.store.manifests.ManifestStore}), appends its journal row in that same
transaction and reads time and author from the L{Stamp} it is given.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from svc.store import footprint_rows
from svc.store.errors import (
    CrossSubtree,
    InvalidArgument,
    IsADirectory,
    NotADirectory,
    NotPermitted,
    SubtreeMoveRefused,
)
from svc.store.journal_rows import Snapshot, append_entry, snapshot_of
from svc.store.manifest_paths import (
    ROOT,
    check_path,
    check_symlink_target,
    descendant_range,
    is_inside,
    parent_of,
    top_of,
)
from svc.store.manifest_rows import (
    InodeRow,
    Stamp,
    drop_directory,
    drop_name,
    insert_inode,
    insert_name,
    lookup,
    lookup_inode,
    require,
    require_absent,
    require_parent_directory,
    touch_directory,
)
from svc.store.manifest_values import (
    CreateResult,
    FileKind,
    PurgeResult,
    RemoveResult,
    RenameResult,
    check_id,
    check_mode,
)
from svc.wire.messages import MAX_PATH_BYTES

#: Kinds L{mknod} creates.
MKNOD_KINDS = frozenset(
    {
        FileKind.FILE,
        FileKind.FIFO,
        FileKind.CHAR_DEVICE,
        FileKind.BLOCK_DEVICE,
        FileKind.SOCKET,
    }
)
_DEVICE_KINDS = frozenset({FileKind.CHAR_DEVICE, FileKind.BLOCK_DEVICE})

#: Asked by L{rename}, inside its transaction, before it moves a directory
#: from the first path to the second with everything below it: L{None} to go
#: on, or why not (the rename then fails with L{SubtreeMoveRefused}).
SubtreeMoveCheck = Callable[[str, str], str | None]
_MAX_RDEV = 2**63 - 1


def remove_entry(
    connection: sqlite3.Connection, stamp: Stamp, path: str, row: InodeRow
) -> RemoveResult:
    """
    Remove the name ``path`` (a non-directory, or an empty directory) and
    record the change in its parent; no journal row.

    @raise NotEmpty: a directory with entries.
    """
    parent = require_parent_directory(connection, path)
    if row.is_directory:
        drop_directory(connection, path, row)
        touch_directory(connection, parent.id, stamp, -1)
        nlink, released = 0, frozenset[str]()
    else:
        nlink, released = drop_name(connection, path, row, top_of(path), stamp)
        touch_directory(connection, parent.id, stamp)
    return RemoveResult(
        path=path,
        kind=row.kind,
        inode=row.id,
        nlink=nlink,
        size=row.size,
        released_hashes=released,
        journal_seq=0,
        changed_ns=stamp.now_ns,
    )


def delete(connection: sqlite3.Connection, stamp: Stamp, path: str) -> RemoveResult:
    """
    Unlink the non-directory ``path``.

    @raise NotFound: no such name.
    @raise IsADirectory: ``path`` is a directory.
    """
    row = require(connection, check_path(path))
    if row.is_directory:
        raise IsADirectory(path)
    result = remove_entry(connection, stamp, path, row)
    seq = append_entry(
        connection,
        stamp,
        "delete",
        path,
        old=snapshot_of(row),
        new=None,
        released=footprint_rows.released_refs(result.released_hashes, row.chunk_list()),
    )
    return _with_seq(result, seq)


def rmdir(connection: sqlite3.Connection, stamp: Stamp, path: str) -> RemoveResult:
    """
    Remove the empty directory ``path``.

    @raise NotFound: no such name.
    @raise NotADirectory: ``path`` is not a directory.
    @raise NotEmpty: it has entries.
    @raise InvalidArgument: ``path`` is the root.
    """
    if check_path(path) == ROOT:
        raise InvalidArgument("cannot remove the root")
    row = require(connection, path)
    if not row.is_directory:
        raise NotADirectory(path)
    result = remove_entry(connection, stamp, path, row)
    seq = append_entry(connection, stamp, "rmdir", path, old=snapshot_of(row), new=None)
    return _with_seq(result, seq)


def _with_seq(result: RemoveResult, seq: int) -> RemoveResult:
    return RemoveResult(
        path=result.path,
        kind=result.kind,
        inode=result.inode,
        nlink=result.nlink,
        size=result.size,
        released_hashes=result.released_hashes,
        journal_seq=seq,
        changed_ns=result.changed_ns,
    )


def _create(
    connection: sqlite3.Connection,
    stamp: Stamp,
    op: str,
    path: str,
    *,
    inode: int,
    parent: InodeRow,
) -> CreateResult:
    insert_name(connection, path, inode)
    row = lookup_inode(connection, inode)
    touch_directory(connection, parent.id, stamp, 1 if row.is_directory else 0)
    seq = append_entry(connection, stamp, op, path, old=None, new=snapshot_of(row))
    return CreateResult(path, row.attributes(), seq)


def mkdir(
    connection: sqlite3.Connection, stamp: Stamp, path: str, *, mode: int, uid: int, gid: int
) -> CreateResult:
    """
    Create the directory ``path``.

    @raise AlreadyExists: the name is taken.
    @raise NotFound: the parent does not exist.
    @raise NotADirectory: the parent is not a directory.
    """
    check_path(path)
    check_mode(mode)
    check_id(uid, "uid")
    check_id(gid, "gid")
    parent = require_absent(connection, path)
    inode = insert_inode(connection, stamp, kind=FileKind.DIRECTORY, mode=mode, uid=uid, gid=gid)
    return _create(connection, stamp, "mkdir", path, inode=inode, parent=parent)


def symlink(
    connection: sqlite3.Connection, stamp: Stamp, path: str, *, target: str, uid: int, gid: int
) -> CreateResult:
    """
    Create the symlink ``path`` pointing at ``target`` (mode 0o777).

    @raise AlreadyExists: the name is taken.
    """
    check_path(path)
    check_symlink_target(target)
    check_id(uid, "uid")
    check_id(gid, "gid")
    parent = require_absent(connection, path)
    inode = insert_inode(
        connection,
        stamp,
        kind=FileKind.SYMLINK,
        mode=0o777,
        uid=uid,
        gid=gid,
        size=len(target.encode("utf-8")),
        symlink_target=target,
    )
    return _create(connection, stamp, "symlink", path, inode=inode, parent=parent)


def mknod(
    connection: sqlite3.Connection,
    stamp: Stamp,
    path: str,
    *,
    kind: FileKind,
    mode: int,
    rdev: int,
    uid: int,
    gid: int,
) -> CreateResult:
    """
    Create a special file (or an empty regular file) ``path``. ``rdev`` is
    kept for character and block devices and must be 0 otherwise.

    @raise InvalidArgument: ``kind`` is a directory or symlink.
    @raise AlreadyExists: the name is taken.
    """
    check_path(path)
    if kind not in MKNOD_KINDS:
        raise InvalidArgument(f"mknod cannot create a {kind.value}")
    if not isinstance(rdev, int) or not 0 <= rdev <= _MAX_RDEV:
        raise InvalidArgument("rdev out of range")
    if rdev and kind not in _DEVICE_KINDS:
        raise InvalidArgument("rdev is only meaningful for devices")
    check_mode(mode)
    check_id(uid, "uid")
    check_id(gid, "gid")
    parent = require_absent(connection, path)
    inode = insert_inode(connection, stamp, kind=kind, mode=mode, uid=uid, gid=gid, rdev=rdev)
    return _create(connection, stamp, "mknod", path, inode=inode, parent=parent)


def link(connection: sqlite3.Connection, stamp: Stamp, existing: str, new: str) -> CreateResult:
    """
    Give the non-directory ``existing`` a second name ``new``.

    @raise NotPermitted: ``existing`` is a directory.
    @raise CrossSubtree: the names lie in different top-level directories.
    @raise AlreadyExists: ``new`` is taken.
    """
    row = require(connection, check_path(existing))
    check_path(new)
    if row.is_directory:
        raise NotPermitted(f"{existing} is a directory")
    if top_of(existing) != top_of(new):
        raise CrossSubtree(f"{existing} and {new} are on different disks")
    parent = require_absent(connection, new)
    insert_name(connection, new, row.id)
    connection.execute(
        "UPDATE inodes SET nlink = nlink + 1, ctime_ns = ? WHERE id = ?",
        (stamp.now_ns, row.id),
    )
    touch_directory(connection, parent.id, stamp)
    after = lookup_inode(connection, row.id)
    seq = append_entry(
        connection, stamp, "link", new, old=None, new=snapshot_of(after), to_path=existing
    )
    return CreateResult(new, after.attributes(), seq)


def rename(
    connection: sqlite3.Connection,
    stamp: Stamp,
    source: str,
    destination: str,
    subtree_check: SubtreeMoveCheck | None = None,
) -> RenameResult:
    """
    Move ``source`` to ``destination`` with POSIX semantics, a directory with
    all its descendants, replacing a non-directory or empty directory at the
    destination. Renaming a name onto itself, or onto another name of the
    same inode, changes nothing. When ``source`` is a directory,
    ``subtree_check`` (if given) is asked first, in this transaction, so
    the kind it is asked about cannot change before the move.

    @raise NotFound: ``source`` or the destination's parent is missing.
    @raise InvalidArgument: either is the root, or ``destination`` lies
        inside ``source``, or a moved name would exceed 4096 bytes.
    @raise SubtreeMoveRefused: ``subtree_check`` refused a directory's move.
    @raise CrossSubtree: they lie in different top-level directories.
    @raise NotADirectory: a directory over a non-directory.
    @raise IsADirectory: a non-directory over a directory.
    @raise NotEmpty: the destination directory has entries.
    """
    check_path(source)
    check_path(destination)
    if ROOT in (source, destination):
        raise InvalidArgument("cannot rename the root")
    row = require(connection, source)
    if source == destination:
        return RenameResult(source, destination, 0, None, None)
    if row.is_directory and is_inside(destination, source):
        raise InvalidArgument(f"cannot move {source} inside itself")
    if row.is_directory and subtree_check is not None:
        refusal = subtree_check(source, destination)
        if refusal is not None:
            raise SubtreeMoveRefused(source, destination, refusal)
    top = top_of(source)
    if top != top_of(destination):
        raise CrossSubtree(f"{source} and {destination} are on different disks")
    new_parent = require_parent_directory(connection, destination)
    old_parent = require_parent_directory(connection, source)
    target = lookup(connection, destination)
    replaced: RemoveResult | None = None
    replaced_state: Snapshot | None = None
    if target is not None:
        if target.id == row.id:
            return RenameResult(source, destination, 0, None, None)
        if row.is_directory and not target.is_directory:
            raise NotADirectory(destination)
        if not row.is_directory and target.is_directory:
            raise IsADirectory(destination)
        replaced_state = snapshot_of(target)
        replaced = remove_entry(connection, stamp, destination, target)
    moved = _move_names(connection, source, destination, row.is_directory)
    connection.execute("UPDATE inodes SET ctime_ns = ? WHERE id = ?", (stamp.now_ns, row.id))
    subdirectory = 1 if row.is_directory else 0
    if old_parent.id == new_parent.id:
        touch_directory(connection, old_parent.id, stamp)
    else:
        touch_directory(connection, old_parent.id, stamp, -subdirectory)
        touch_directory(connection, new_parent.id, stamp, subdirectory)
    state = snapshot_of(row)
    seq = append_entry(
        connection,
        stamp,
        "rename",
        source,
        old=state,
        new=state,
        to_path=destination,
        replaced=replaced_state,
        released=()
        if replaced is None or replaced_state is None
        else footprint_rows.released_refs(replaced.released_hashes, replaced_state.chunks),
    )
    return RenameResult(
        source,
        destination,
        moved,
        None if replaced is None else _with_seq(replaced, seq),
        seq,
        changed_ns=stamp.now_ns,
    )


def _move_names(
    connection: sqlite3.Connection, source: str, destination: str, subtree: bool
) -> int:
    connection.execute(
        "UPDATE names SET path = ?, parent = ? WHERE path = ?",
        (destination, parent_of(destination), source),
    )
    if not subtree:
        return 1
    low, high = descendant_range(source)
    growth = len(destination.encode("utf-8")) - len(source.encode("utf-8"))
    if growth > 0:
        (longest,) = connection.execute(
            "SELECT max(length(CAST(path AS BLOB))) FROM names WHERE path >= ? AND path < ?",
            (low, high),
        ).fetchone()
        if longest is not None and longest + growth > MAX_PATH_BYTES:
            raise InvalidArgument(f"a moved path would exceed {MAX_PATH_BYTES} bytes")
    cursor = connection.execute(
        "UPDATE names SET path = ?1 || substr(path, ?2), parent = ?1 || substr(parent, ?2)"
        " WHERE path >= ?3 AND path < ?4",
        (destination, len(source) + 1, low, high),
    )
    return 1 + cursor.rowcount


def purge_subtree(connection: sqlite3.Connection, stamp: Stamp, top: str) -> PurgeResult:
    """
    Erase the agent disk ``/<top>``: every name and inode in it, its chunk
    references and usage, its footprint rows (uploads, retained and
    collectable chunks), and every journal row whose C{path} or C{to_path}
    lies in it. Not journaled (it is the erasure of that history). The root
    directory's times, version and link count follow.

    @raise InvalidArgument: ``top`` is not a single path component.
    """
    if not isinstance(top, str) or top == "" or "/" in top:
        raise InvalidArgument("top must be one path component")
    path = check_path("/" + top)
    low, high = descendant_range(path)
    in_subtree = "(path = ? OR (path >= ? AND path < ?))"
    bounds = (path, low, high)
    hashes = frozenset(
        digest.hex()
        for (digest,) in connection.execute("SELECT hash FROM chunk_refs WHERE top = ?", (top,))
    ) | footprint_rows.purge(connection, top)
    head = lookup(connection, path)
    inodes = [
        (inode,)
        for (inode,) in connection.execute(
            f"SELECT DISTINCT inode FROM names WHERE {in_subtree}",  # noqa: S608
            bounds,
        )
    ]
    count = connection.execute(f"DELETE FROM names WHERE {in_subtree}", bounds).rowcount  # noqa: S608
    connection.executemany("DELETE FROM inodes WHERE id = ?", inodes)
    connection.execute("DELETE FROM chunk_refs WHERE top = ?", (top,))
    connection.execute("DELETE FROM subtree_usage WHERE top = ?", (top,))
    journal_rows = connection.execute(
        "DELETE FROM journal WHERE (path = ? OR (path >= ? AND path < ?))"
        " OR (to_path = ? OR (to_path >= ? AND to_path < ?))",
        bounds + bounds,
    ).rowcount
    if head is not None:
        root = require(connection, ROOT)
        touch_directory(connection, root.id, stamp, -1 if head.is_directory else 0)
    return PurgeResult(top, count, hashes, journal_rows)
