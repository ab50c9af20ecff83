"""
The namespace operations that change nothing on the data plane: C{lookup},
C{getattr} and C{readlink}; the answers a FUSE thread may give to the first
two without the reactor (L{NamespaceReads.known_lookup},
L{NamespaceReads.known_attributes}); and C{forget}, the kernel dropping its
lookups. A lookup and a readlink write their audit lines
(``docs/specifications/mount-fs.md``).
"""

from __future__ import annotations

import errno
from collections.abc import Sequence

import attrs

from svc.audit.events import CallerProcess
from svc.audit.names import EventName
from svc.mount.core.attributes import Attributes, Entry, FileKind
from svc.mount.core.errors import FSError
from svc.mount.core.fs_context import FSContext, audit_name, decode_name, join
from svc.mount.core.inodes import ROOT_INODE
from svc.mount.ops.listings import Listings


class NamespaceReads:
    """See the module docstring."""

    def __init__(self, context: FSContext, listings: Listings) -> None:
        self._ctx = context
        self._listings = listings

    async def lookup(self, parent: int, name: bytes, caller: CallerProcess) -> Entry:
        """The child C{name} of directory C{parent} (one more kernel lookup)."""
        ctx = self._ctx
        directory = ctx.directory(parent)
        if name in (b".", b".."):
            node = directory
            if name == b".." and directory.ino != ROOT_INODE:
                link = ctx.table.primary_name(directory)
                node = link[0] if link is not None else directory
            rel = ctx.rel_of(node)
            with ctx.audit.line(EventName.LOOKUP, rel, caller) as line:
                ctx.check_read(rel, directory=True)
                attributes = await ctx.fresh(node)
                ctx.table.looked_up(node)
                line.size = attributes.size
                return Entry(node.ino, attributes)
        rel = join(ctx.rel_of(directory), audit_name(name))
        with ctx.audit.line(
            EventName.LOOKUP, rel, caller, ordinary=frozenset({errno.ENOENT})
        ) as line:
            decoded = decode_name(name)
            ctx.check_read(rel, directory=True)
            child = ctx.table.child(directory, decoded)
            if child is None:
                if await self._listings.list_for_lookup(directory):
                    child = ctx.table.child(directory, decoded)
                    if child is None:
                        raise FSError(errno.ENOENT, f"no {rel!r}")
                else:
                    found = await ctx.remote.head_file(ctx.server_path(rel))
                    child = ctx.table.learn(directory, decoded, found)
            if child.kind is not FileKind.DIR:
                ctx.check_read(rel, directory=False)
            attributes = await ctx.fresh(child)
            ctx.table.looked_up(child)
            line.size = attributes.size
            return Entry(child.ino, attributes)

    def known_lookup(self, parent: int, name: bytes, caller: CallerProcess) -> Entry | None:
        """
        Any thread: what L{lookup} would answer with no I/O, when it would,
        with its audit line: the child's entry (counted as looked up) when
        the inode table knows it, its attributes are not stale and no open
        file holds them; C{FSError(ENOENT)} when a complete directory does
        not hold the name. Otherwise L{None}, and the reactor answers: C{.}
        and C{..}, a name that is not UTF-8, a directory not wholly known,
        a path the policy refuses (its refusal is audited there).
        """
        ctx = self._ctx
        directory = ctx.table.get(parent)
        if name in (b".", b"..") or directory is None or directory.kind is not FileKind.DIR:
            return None
        try:
            decoded = decode_name(name)
        except FSError:
            return None
        directory_rel = ctx.table.path_from_any_thread(directory)
        if directory_rel is None:
            return None
        rel = join(directory_rel, audit_name(name))
        if not ctx.policy.check_traverse(rel).allowed:
            return None
        child = ctx.table.child(directory, decoded)
        if child is None:
            if not directory.complete:
                return None
            with ctx.audit.line(EventName.LOOKUP, rel, caller, ordinary=frozenset({errno.ENOENT})):
                raise FSError(errno.ENOENT, f"no {rel!r}")
        if child.stale or ctx.files.state(child.ino) is not None:
            return None
        if child.kind is not FileKind.DIR and not ctx.policy.check(rel, write=False).allowed:
            return None
        attributes = child.attributes
        if not ctx.table.count_lookup_from_any_thread(directory, decoded, child):
            return None  # the name changed meanwhile
        ctx.audit.simple(EventName.LOOKUP, rel, caller, size=attributes.size)
        return Entry(child.ino, attributes)

    def known_attributes(self, ino: int) -> Attributes | None:
        """
        Any thread: what L{getattr} of C{ino} would answer with no I/O, when
        it would: the inode is known, its attributes are not stale, no open
        file holds its size and mtime (the reactor's), it has a name and the
        policy lets it be read. Otherwise L{None}, and the reactor answers
        (fetching, or with the error). An answer read while the reactor
        changes the inode is the one a getattr just before or after the
        change would give.
        """
        ctx = self._ctx
        node = ctx.table.get(ino)
        if node is None or node.stale or ctx.files.state(ino) is not None:
            return None
        attributes = node.attributes
        rel = ctx.table.path_from_any_thread(node)
        if rel is None:
            return None
        directory = attributes.kind is FileKind.DIR
        policy = ctx.policy
        decision = policy.check_traverse(rel) if directory else policy.check(rel, write=False)
        if not decision.allowed or node.stale:
            return None
        return attributes

    async def getattr(self, ino: int, caller: CallerProcess) -> Attributes:
        """The attributes of C{ino} (from the cache unless stale)."""
        ctx = self._ctx
        node = ctx.node(ino)
        rel = ctx.table.path_of(node)
        if rel is not None:
            ctx.check_read(rel, directory=node.kind is FileKind.DIR)
        return await ctx.fresh(node)

    async def readlink(self, ino: int, caller: CallerProcess) -> bytes:
        """The target of symlink C{ino}."""
        ctx = self._ctx
        node = ctx.node(ino)
        rel = ctx.rel_of(node)
        with ctx.audit.line(EventName.READLINK, rel, caller):
            if node.kind is not FileKind.SYMLINK:
                raise FSError(errno.EINVAL, f"{rel!r} is not a symlink")
            ctx.check_read(rel, directory=False)
            target = node.attributes.symlink_target
            if target is None:
                target = await ctx.remote.readlink(ctx.server_path(rel))
                node.attributes = attrs.evolve(node.attributes, symlink_target=target)
            return target.encode("utf-8")

    def forget(self, inodes: Sequence[tuple[int, int]]) -> None:
        """The kernel dropped lookups: C{(ino, count)} pairs."""
        for ino, count in inodes:
            self._ctx.table.forget(ino, count)
