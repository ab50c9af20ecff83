"""
The inode table: FUSE inode numbers, the names cache and the attribute
cache of one mount. Pure: no I/O.

FUSE inode numbers are assigned here, stable for the life of the mount: the
mount root (the agent's disk C{/<agent_id>}) is L{ROOT_INODE} (1, llfuse's
C{ROOT_INODE}); any other inode the data plane reports is numbered with the
data plane's own inode number (never reused there), so every mount, on any
machine, shows a file with the same C{st_ino} (git compares it); a file this
mount creates, before the data plane has it, takes a number of its own from
L{LOCAL_NUMBERS} down, kept for as long as the kernel knows the node. A
number keeps across renames; hard links share the data plane's inode
number and so share one FUSE inode.

Names are a tree of C{(parent inode, name)} links, so renaming a directory
is one update and the paths below it follow. A directory whose whole listing
was read (or that this mount created) is I{complete}: a name missing from it
does not exist, with no round trip. Under the exclusive mount lease this
mount is the only writer of the disk, so the cache is authoritative until
the mount's own operations change it; operations that change attributes the
client does not compute (a parent's mtime after a removal, a link count)
mark them I{stale}, to be fetched again when next needed. A create's
effect on its directory is computed (L{Node.entry_added}).

The table is changed on the reactor thread only. FUSE threads may read it
(L{svc.mount.ops.namespace_reads.NamespaceReads.known_attributes}): single lookups and
attribute values (frozen) are read whole, and a path, which is read from
several links, is formed under the names guard, which every change of
names holds (L{path_from_any_thread}).
"""

from __future__ import annotations

import errno
import functools
import itertools
import threading
from collections.abc import Callable, Iterable
from typing import Concatenate, ParamSpec, TypeVar

import attrs

from svc.chunking import ChunkRef
from svc.mount.core.attributes import Attributes, FileKind
from svc.mount.core.errors import FSError

ROOT_INODE = 1
"""The FUSE inode number of the mount root (llfuse's C{ROOT_INODE})."""

P = ParamSpec("P")
R = TypeVar("R")


def _changes_names(
    method: Callable[Concatenate[InodeTable, P], R],
) -> Callable[Concatenate[InodeTable, P], R]:
    """A method that changes names: it holds the table's names guard throughout."""

    def guarded(self: InodeTable, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with self._names_guard:
            return method(self, *args, **kwargs)

    functools.update_wrapper(guarded, method)
    return guarded


@attrs.define(eq=False)
class Node:
    """
    One inode as this mount knows it.

    @ivar names: its C{(parent inode, name)} links (empty once unlinked).
    @ivar lookups: the kernel's lookup count (see L{InodeTable.forget}).
    @ivar stale: the attributes must be fetched again before being reported.
    @ivar pending: a regular file this mount created that is not on the data
        plane yet (no server inode); its first commit, or an operation that
        needs it there, creates it (``mount-consistency.md`` section 2).
    @ivar children: directories: known children by name.
    @ivar complete: directories: C{children} is the whole directory.
    @ivar chunks: files: the chunk list of version C{chunks_version}.
    @ivar kernel_version: files: the content version the kernel's page cache
        was last filled from (for C{keep_cache}).
    """

    ino: int
    attributes: Attributes
    names: set[tuple[int, str]] = attrs.Factory(set)
    lookups: int = 0
    stale: bool = False
    pending: bool = False
    children: dict[str, int] = attrs.Factory(dict)
    complete: bool = False
    chunks: tuple[ChunkRef, ...] | None = None
    chunks_version: int | None = None
    kernel_version: int | None = None

    @property
    def kind(self) -> FileKind:
        """The inode's kind."""
        return self.attributes.kind

    def entry_added(self, added: Attributes) -> None:
        """
        This directory gained a name for the inode whose attributes the
        creating request (C{dir_create}, C{symlink}, C{mknod}, C{link})
        answered: the data plane sets the directory's mtime and ctime to that
        inode's ctime, raises its version by one and, for a new directory,
        its link count by one (``dataplane-ops.md`` section 2), so no
        refetch is needed. Stale attributes stay stale.
        """
        if self.stale:
            return
        self.attributes = attrs.evolve(
            self.attributes,
            mtime_ns=added.ctime_ns,
            ctime_ns=added.ctime_ns,
            version=self.attributes.version + 1,
            nlink=self.attributes.nlink + (1 if added.kind is FileKind.DIR else 0),
        )

    def entry_removed(self, changed_ns: int | None, *, directory: bool) -> None:
        """
        This directory lost a name (a directory's, if C{directory}), and the
        data plane answered with its new mtime and ctime (C{changed_ns}: it
        raises its version by one and, for a directory removed, lowers its
        link count by one; ``dataplane-ops.md`` section 2), so no refetch is
        needed. A server that does not say makes the attributes stale.
        """
        self.entries_changed(changed_ns, links=-1 if directory else 0)

    def entries_changed(self, changed_ns: int | None, *, versions: int = 1, links: int = 0) -> None:
        """
        This directory's entries changed: mtime and ctime C{changed_ns} (as
        the data plane answered), version C{versions} higher, link count
        C{links} more. L{None} (the server did not say) makes the
        attributes stale; stale attributes stay stale.
        """
        if changed_ns is None:
            self.stale = True
            return
        if self.stale:
            return
        self.attributes = attrs.evolve(
            self.attributes,
            mtime_ns=changed_ns,
            ctime_ns=changed_ns,
            version=self.attributes.version + versions,
            nlink=self.attributes.nlink + links,
        )

    def set_attributes(self, attributes: Attributes) -> None:
        """Fresh attributes from the server (keeps a known symlink target)."""
        if attributes.symlink_target is None and self.attributes.symlink_target is not None:
            attributes = attrs.evolve(attributes, symlink_target=self.attributes.symlink_target)
        self.attributes = attributes
        self.stale = False


LOCAL_NUMBERS = (1 << 32) - 1
"""The first FUSE inode number given to a node the data plane has not
numbered (a pending file), counting down; below 2^32, so a program built
without large-file support can still C{stat} it."""


class InodeTable:
    """The inode, name and attribute caches of one mount."""

    def __init__(
        self, root: Attributes, *, pinned: Callable[[int], bool] = lambda ino: False
    ) -> None:
        """
        @param root: the attributes of the disk root.
        @param pinned: whether an inode must be kept although it has no
            name and no kernel lookups (it has open handles).
        """
        self._nodes: dict[int, Node] = {}
        self._by_server: dict[int, int] = {}
        self._local_numbers = itertools.count(LOCAL_NUMBERS, -1)
        self._pinned = pinned
        self.generation = 0
        """
        Bumped by every change that may change the path of a node already
        named (a name moved or dropped, a directory learnt under another
        name): a path checked at one generation still holds while it is
        unchanged. A new name (a file created, a name learnt, a listing) or a
        node without names dropped changes no existing path, and does not
        bump it, so a write grant outlives other files being created. Read
        from any thread.
        """
        self._names_guard = threading.RLock()
        """
        Held by every change of names (one reactor step, never across a
        wait) and by L{path_from_any_thread}, so a reader on another thread
        never sees a change half made.
        """
        self.root = Node(ROOT_INODE, root)
        self._nodes[ROOT_INODE] = self.root
        self._by_server[root.server_inode] = ROOT_INODE

    def __len__(self) -> int:
        return len(self._nodes)

    def get(self, ino: int) -> Node | None:
        """The node C{ino}, if known."""
        return self._nodes.get(ino)

    def require(self, ino: int) -> Node:
        """The node C{ino}; ENOENT when the kernel names a forgotten inode."""
        node = self._nodes.get(ino)
        if node is None:
            raise FSError(errno.ENOENT, f"unknown inode {ino}")
        return node

    def child(self, parent: Node, name: str) -> Node | None:
        """The known child C{name} of directory C{parent}."""
        ino = parent.children.get(name)
        return self._nodes.get(ino) if ino is not None else None

    def primary_name(self, node: Node) -> tuple[Node, str] | None:
        """The parent and name by which C{node}'s path is formed."""
        if not node.names:
            return None
        parent_ino, name = min(node.names)
        return self._nodes[parent_ino], name

    def path_of(self, node: Node) -> str | None:
        """
        The path relative to the mount root (C{""} for the root, C{"a/b"}
        below it); L{None} for an unlinked inode.
        """
        parts: list[str] = []
        current = node
        for _depth in range(4096):
            if current.ino == ROOT_INODE:
                return "/".join(reversed(parts))
            link = self.primary_name(current)
            if link is None:
                return None
            current, name = link
            parts.append(name)
        raise FSError(errno.ELOOP, "directory cycle in the inode table")

    def path_from_any_thread(self, node: Node) -> str | None:
        """L{path_of}, from a thread other than the reactor's."""
        with self._names_guard:
            return self.path_of(node)

    @_changes_names
    def learn(self, parent: Node, name: str, attributes: Attributes) -> Node:
        """
        Record that C{parent} has child C{name} with C{attributes}: the
        node of that data-plane inode (created or refreshed), linked there.
        A different inode cached under that name loses the name.
        """
        existing = self.child(parent, name)
        if existing is not None and existing.attributes.server_inode != attributes.server_inode:
            self.unlink(parent, name)
            existing = None
        node = existing
        if node is None:
            ino = self._by_server.get(attributes.server_inode)
            node = self._nodes.get(ino) if ino is not None else None
        if node is None:
            node = Node(self._number_for(attributes.server_inode), attributes)
            self._nodes[node.ino] = node
            self._by_server[attributes.server_inode] = node.ino
        else:
            node.set_attributes(attributes)
        if attributes.kind is FileKind.DIR:
            for old_parent, old_name in list(node.names):
                if (old_parent, old_name) != (parent.ino, name):
                    self._remove_link(node, old_parent, old_name)
        link = (parent.ino, name)
        if node.names and link not in node.names:
            self.generation += 1  # another name: the one its path is formed by may change
        node.names.add(link)
        parent.children[name] = node.ino
        return node

    @_changes_names
    def add_pending(self, parent: Node, name: str, attributes: Attributes) -> Node:
        """
        A new regular file C{name} in C{parent}, known only to this mount
        (L{Node.pending}): a fresh FUSE inode number, no data-plane inode
        (C{attributes.server_inode} is ignored until L{bind}).
        """
        node = Node(self._local_number(), attributes, pending=True)
        self._nodes[node.ino] = node
        node.names.add((parent.ino, name))
        parent.children[name] = node.ino
        return node

    def _number_for(self, server_inode: int) -> int:
        """
        The FUSE number of a node the data plane numbers C{server_inode}:
        that number, unless it is not one (the root's, 0 from a server that
        does not say) or a live node has it (a pending file's own number).
        """
        if server_inode > ROOT_INODE and server_inode not in self._nodes:
            return server_inode
        return self._local_number()

    def _local_number(self) -> int:
        """The next FUSE number of this mount's own, not held by a live node."""
        while True:
            number = next(self._local_numbers)
            if number not in self._nodes and number > ROOT_INODE:
                return number

    def bind(self, node: Node, attributes: Attributes) -> None:
        """
        Pending C{node} now exists on the data plane with C{attributes}
        (its server inode number among them).
        """
        node.set_attributes(attributes)
        node.pending = False
        self._by_server[attributes.server_inode] = node.ino

    def has_pending_children(self, directory: Node) -> bool:
        """Whether C{directory} holds a name of a pending file."""
        for ino in directory.children.values():
            child = self._nodes.get(ino)
            if child is not None and child.pending:
                return True
        return False

    @_changes_names
    def unlink(self, parent: Node, name: str) -> Node | None:
        """
        C{name} left C{parent}: the node it named (its link count lowered),
        or L{None} if the name was not cached.
        """
        self.generation += 1
        node = self.child(parent, name)
        parent.children.pop(name, None)
        if node is None:
            return None
        self._remove_link(node, parent.ino, name)
        nlink = max(0, node.attributes.nlink - 1)
        node.attributes = attrs.evolve(node.attributes, nlink=nlink)
        if node.names:
            node.stale = not node.pending  # ctime changed on the server
        else:
            if not node.pending:
                self._by_server.pop(node.attributes.server_inode, None)
            self.discard_if_unused(node)
        return node

    @_changes_names
    def forget_name(self, parent: Node, name: str) -> Node | None:
        """
        Stop caching the name C{name} of C{parent} without saying it went
        away (someone else changed it): the node it named, if cached, loses
        the link but keeps its link count, and is dropped once nothing uses
        it; C{parent} is no longer complete. The next lookup asks the
        server, which may name the same inode (found again by its server
        inode number, so its FUSE number is kept), another one, or none.
        """
        self.generation += 1
        parent.complete = False
        node = self.child(parent, name)
        parent.children.pop(name, None)
        if node is None:
            return None
        self._remove_link(node, parent.ino, name)
        node.stale = not node.pending
        self.discard_if_unused(node)
        return node

    @_changes_names
    def move(self, parent: Node, name: str, new_parent: Node, new_name: str) -> Node | None:
        """
        C{parent/name} was renamed to C{new_parent/new_name} (replacing what
        was there): the moved node, or L{None} if the source was not cached
        (then C{new_parent} can no longer be complete).
        """
        self.generation += 1
        node = self.child(parent, name)
        target = self.child(new_parent, new_name)
        if node is not None and node is target:
            return node  # two names of one inode: POSIX rename does nothing
        if target is not None:
            self.unlink(new_parent, new_name)
        else:
            new_parent.children.pop(new_name, None)
        if node is None:
            parent.children.pop(name, None)
            new_parent.complete = False
            return None
        parent.children.pop(name, None)
        self._remove_link(node, parent.ino, name)
        node.names.add((new_parent.ino, new_name))
        new_parent.children[new_name] = node.ino
        node.stale = True  # ctime
        return node

    @_changes_names
    def set_listing(self, directory: Node, entries: Iterable[tuple[str, Attributes]]) -> None:
        """
        The whole listing of C{directory}: learn every entry, drop cached
        names it does not have (except pending files, which the data plane
        does not know yet), and mark the directory complete.
        """
        seen = set()
        for name, attributes in entries:
            seen.add(name)
            pending = self.child(directory, name)
            if pending is not None and pending.pending:
                continue  # ours; the server's entry is a conflict the commit meets
            self.learn(directory, name, attributes)
        for name in [name for name in directory.children if name not in seen]:
            child = self.child(directory, name)
            if child is None or not child.pending:
                self.unlink(directory, name)
        directory.complete = True

    def looked_up(self, node: Node) -> None:
        """The kernel received C{node} in an entry: one more lookup."""
        with self._names_guard:  # FUSE threads count lookups too
            node.lookups += 1

    def count_lookup_from_any_thread(self, parent: Node, name: str, child: Node) -> bool:
        """
        From a thread other than the reactor's: if C{child} is still the
        known child C{name} of C{parent}, count one more lookup of it
        (L{looked_up}), so it cannot be dropped before the kernel hears of
        it, and say so.
        """
        with self._names_guard:
            if self.child(parent, name) is not child:
                return False
            child.lookups += 1
            return True

    @_changes_names
    def forget(self, ino: int, count: int) -> None:
        """The kernel dropped C{count} lookups of C{ino}."""
        node = self._nodes.get(ino)
        if node is None:
            return
        node.lookups = max(0, node.lookups - count)
        self.discard_if_unused(node)

    @_changes_names
    def discard_if_unused(self, node: Node) -> None:
        """
        Drop an unlinked node the kernel no longer references and no handle
        keeps open. (Named nodes are kept: they are the names cache.)
        """
        if (
            node.ino != ROOT_INODE
            and not node.names
            and node.lookups == 0
            and not self._pinned(node.ino)
            and self._nodes.get(node.ino) is node
        ):
            del self._nodes[node.ino]
            if not node.pending and self._by_server.get(node.attributes.server_inode) == node.ino:
                del self._by_server[node.attributes.server_inode]

    @_changes_names
    def _remove_link(self, node: Node, parent_ino: int, name: str) -> None:
        self.generation += 1
        node.names.discard((parent_ino, name))
        parent = self._nodes.get(parent_ino)
        if parent is not None and parent.children.get(name) == node.ino:
            del parent.children[name]
