"""
Changes someone else made to the disk: the owner's revert from the
dashboard, or another connection of this agent. The data plane names the
paths in a C{changed} push (``dataplane-ops.md``); the mount then stops
trusting what it cached for them, so the next use asks the server
(``mount-consistency.md`` section 6). The rules, per path:

 - A change carrying this mount's own session id is this mount's (made on
   its previous connection while it moved to a new one): ignored. So are
   paths outside the disk and paths whose directory is not cached (nothing
   below it is cached either).
 - The directory holding the name is no longer complete (a missing name may
   now exist) and its attributes are fetched again; the kernel forgets the
   entry and the directory's attributes.
 - A cached non-directory that is not open here loses the name, its cached
   attributes and chunk list; the kernel drops its attributes and page
   cache. The next lookup learns whatever the path names now (the same
   inode keeps its FUSE number).
 - A file open here keeps its name and its open content: only its
   attributes go stale. Its next commit meets the change in the
   compare-and-swap and follows the conflict rule (``mount-consistency.md``
   section 3): nothing the program wrote is lost.
 - A directory keeps its names (files open below it keep their paths); it
   goes stale and incomplete.

Everything here runs on the reactor thread and sends nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

from twisted.logger import Logger

from svc.mount.core.attributes import FileKind
from svc.mount.core.fs_context import FSContext
from svc.mount.core.inodes import Node

_log = Logger()

__all__ = ["apply_outside_changes"]


def apply_outside_changes(ctx: FSContext, paths: Iterable[str], session_id: str | None) -> int:
    """
    Forget what C{ctx} cached for the server paths C{paths}, changed by a
    writer whose session was C{session_id}; how many paths touched the cache.
    """
    if session_id is not None and session_id == ctx.session_id:
        return 0
    touched = 0
    for path in paths:
        rel = _relative(ctx.disk, path)
        if rel is not None and _forget(ctx, rel):
            touched += 1
    if touched:
        _log.info(
            "{count} path(s) changed on the data plane by another writer; cache entries dropped",
            count=touched,
        )
    return touched


def _relative(disk: str, path: str) -> str | None:
    if path == disk:
        return ""
    if path.startswith(disk + "/"):
        return path[len(disk) + 1 :]
    return None


def _forget(ctx: FSContext, rel: str) -> bool:
    table = ctx.table
    if rel == "":
        _stale_directory(ctx, table.root)
        return True
    parts = rel.split("/")
    directory: Node | None = table.root
    for part in parts[:-1]:
        assert directory is not None
        directory = table.child(directory, part)
        if directory is None or directory.kind is not FileKind.DIR:
            return False
    assert directory is not None
    name = parts[-1]
    _stale_directory(ctx, directory)
    ctx.invalidate_entry(directory.ino, name.encode("utf-8", "surrogateescape"))
    child = table.child(directory, name)
    if child is None:
        return True
    if child.kind is FileKind.DIR:
        _stale_directory(ctx, child)
        return True
    child.chunks = None
    child.chunks_version = None
    child.kernel_version = None
    if ctx.files.state(child.ino) is not None:
        child.stale = not child.pending
    else:
        table.forget_name(directory, name)
    ctx.invalidate(child.ino)
    return True


def _stale_directory(ctx: FSContext, directory: Node) -> None:
    directory.complete = False
    directory.stale = True
    ctx.invalidate(directory.ino)
