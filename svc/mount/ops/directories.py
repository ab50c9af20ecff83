"""
Reading directories: C{opendir} takes a snapshot of a directory's names
(listing it whole, L{svc.mount.ops.listings}, unless the names cache already
holds all of it), C{readdir} returns pages of that snapshot by offset: C{.} and
C{..} first (offsets 1 and 2, not audited: they name the directory and its
parent, not entries), then each name audited as C{readdir_entry}.
"""

from __future__ import annotations

import errno
import itertools
from collections.abc import Sequence

import attrs

from svc.audit.events import CallerProcess
from svc.audit.names import EventName
from svc.mount.core.attributes import DirEntry, Entry, FileKind
from svc.mount.core.errors import FSError
from svc.mount.core.fs_context import FSContext, join
from svc.mount.core.inodes import ROOT_INODE
from svc.mount.ops.listings import Listings

DEFAULT_READDIR_PAGE = 256
"""Entries returned by one C{readdir} call unless told otherwise."""

DOTS = (".", "..")
"""The names every listing starts with."""


@attrs.define
class _DirHandle:
    ino: int
    rel: str
    names: list[tuple[str, int]]


class DirectoryReader:
    """Open directory handles; see the module docstring."""

    def __init__(self, context: FSContext, listings: Listings) -> None:
        self._ctx = context
        self._listings = listings
        self._dirs: dict[int, _DirHandle] = {}
        self._dir_numbers = itertools.count(1)

    async def opendir(self, ino: int, caller: CallerProcess) -> int:
        """Open directory C{ino} for reading: a snapshot of its names."""
        ctx = self._ctx
        node = ctx.directory(ino)
        rel = ctx.rel_of(node)
        with ctx.audit.line(EventName.OPENDIR, rel, caller):
            ctx.check_read(rel, directory=True)
            if not node.complete:
                await self._listings.list_whole(node)
            names = sorted(node.children.items(), key=lambda item: item[0].encode("utf-8"))
            parent = min((link[0] for link in node.names), default=ROOT_INODE)
            names[:0] = [(".", node.ino), ("..", parent)]
            fh = next(self._dir_numbers)
            self._dirs[fh] = _DirHandle(node.ino, rel, names)
            return fh

    def readdir(
        self, fh: int, offset: int, caller: CallerProcess, limit: int = DEFAULT_READDIR_PAGE
    ) -> Sequence[DirEntry]:
        """
        Up to C{limit} entries of open directory C{fh} from C{offset} (0:
        the start); each entry's C{next_offset} resumes after it. Names the
        policy hides are left out.
        """
        ctx = self._ctx
        handle = self._dirs.get(fh)
        if handle is None:
            raise FSError(errno.EBADF, f"no open directory {fh}")
        result: list[DirEntry] = []
        index = offset
        while index < len(handle.names) and len(result) < limit:
            name, ino = handle.names[index]
            index += 1
            node = ctx.table.get(ino)
            if node is None:
                continue
            if name in DOTS:
                result.append(DirEntry(name.encode(), Entry(ino, ctx.attributes(node)), index))
                continue
            rel = join(handle.rel, name)
            try:
                ctx.check_read(rel, directory=node.kind is FileKind.DIR)
            except FSError:
                continue
            attributes = ctx.attributes(node)
            ctx.audit.simple(EventName.READDIR_ENTRY, rel, caller, size=attributes.size)
            result.append(DirEntry(name.encode("utf-8"), Entry(ino, attributes), index))
        return result

    def releasedir(self, fh: int) -> None:
        """Forget open directory C{fh}."""
        self._dirs.pop(fh, None)
