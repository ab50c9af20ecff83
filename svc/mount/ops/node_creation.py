"""
The namespace operations that make a node or a name: C{mkdir}, C{symlink},
C{mknod} (and L{NodeCreation.make_node}, which a C{create} uses in a
directory not listed whole), C{link}, and the creation on the data plane of
a pending file an operation needs there (L{NodeCreation.materialize}). Each
translates one kernel request into at most a few data-plane requests (sent
by the outbox's sender, which settles lost answers:
L{svc.mount.remote.remote_changes}), keeps the inode table in step, and writes its audit line
(``docs/specifications/mount-fs.md``). A new node's owner and mode follow
the directory's set-group-ID bit, as on a local disk (L{new_owner},
L{new_mode}).

They run one at a time with the other changes of names (the context's
namespace lock, also taken to send write-back commits, and waiting for their
answers: L{svc.mount.core.namespace_lock}), so a path computed from the inode
table is still the server's path when the request arrives. A C{link} of a
file the data plane has, or that a commit already sent creates, goes beside
the commits in flight.
"""

from __future__ import annotations

import errno
import stat

from svc.audit.events import CallerProcess
from svc.audit.names import EventName
from svc.mount.core.attributes import Attributes, Entry, FileKind, kind_of_mode
from svc.mount.core.client_audit import audit_path
from svc.mount.core.errors import FSError
from svc.mount.core.fs_context import FSContext, audit_name, decode_name, join
from svc.mount.core.inodes import Node
from svc.mount.outbox.recorded import settle_record
from svc.mount.remote.namespace_hand_off import settled_at


def new_owner(caller: CallerProcess, directory: Node) -> tuple[int, int]:
    """
    The uid and gid of a node C{caller} creates in C{directory}: the
    caller's, except that a node made in a set-group-ID directory takes the
    directory's group (as Linux's C{inode_init_owner} does on a local disk).
    """
    gid = directory.attributes.gid if directory.attributes.mode & stat.S_ISGID else caller.gid
    return (caller.uid or 0, gid or 0)


def new_mode(mode: int, directory: Node, kind: FileKind) -> int:
    """
    The permission bits of a node of C{kind} created with C{mode} in
    C{directory}: a directory made in a set-group-ID directory is
    set-group-ID too, so the group passes down the tree. (The kernel has
    already cleared the bit of a new file whose caller is not in that group.)
    """
    bits = stat.S_IMODE(mode)
    if kind is FileKind.DIR and directory.attributes.mode & stat.S_ISGID:
        bits |= stat.S_ISGID
    return bits


class NodeCreation:
    """See the module docstring."""

    def __init__(self, context: FSContext) -> None:
        self._ctx = context

    async def mkdir(self, parent: int, name: bytes, mode: int, caller: CallerProcess) -> Entry:
        """Create directory C{name} in C{parent}."""
        ctx = self._ctx
        async with ctx.namespace_lock:
            directory = ctx.directory(parent)
            rel = join(ctx.rel_of(directory), audit_name(name))
            with ctx.audit.line(
                EventName.MKDIR,
                rel,
                caller,
                session_id=ctx.write_session(),
                mode=stat.S_IMODE(mode),
            ):
                decoded = decode_name(name)
                ctx.check_write(rel)
                self.refuse_pending(directory, decoded, rel)
                uid, gid = new_owner(caller, directory)
                bits = new_mode(mode, directory, FileKind.DIR)
                path = ctx.server_path(rel)
                created = await ctx.await_write(
                    ctx.remote.dir_create(
                        path,
                        mode=bits,
                        uid=uid,
                        gid=gid,
                        session_id=ctx.write_session(),
                    )
                )
                node = ctx.table.learn(directory, decoded, created)
                node.complete = True
                directory.entry_added(created)
                ctx.table.looked_up(node)
                return Entry(node.ino, ctx.attributes(node))

    async def symlink(
        self, parent: int, name: bytes, target: bytes, caller: CallerProcess
    ) -> Entry:
        """Create symlink C{name} in C{parent} pointing at C{target}."""
        ctx = self._ctx
        async with ctx.namespace_lock:
            directory = ctx.directory(parent)
            rel = join(ctx.rel_of(directory), audit_name(name))
            with ctx.audit.line(EventName.SYMLINK, rel, caller, session_id=ctx.write_session()):
                decoded = decode_name(name)
                try:
                    text = target.decode("utf-8")
                except UnicodeDecodeError:
                    raise FSError(errno.EINVAL, "symlink target is not UTF-8") from None
                ctx.check_write(rel)
                self.refuse_pending(directory, decoded, rel)
                uid, gid = new_owner(caller, directory)
                path = ctx.server_path(rel)
                created = await ctx.await_write(
                    ctx.remote.symlink(path, text, uid=uid, gid=gid, session_id=ctx.write_session())
                )
                node = ctx.table.learn(directory, decoded, created)
                directory.entry_added(created)
                ctx.table.looked_up(node)
                return Entry(node.ino, ctx.attributes(node))

    async def mknod(
        self, parent: int, name: bytes, mode: int, rdev: int, caller: CallerProcess
    ) -> Entry:
        """
        Create a regular file, FIFO, socket or device node (audited as
        C{create}, the spec having no C{mknod} client event).
        """
        ctx = self._ctx
        async with ctx.namespace_lock:
            directory = ctx.directory(parent)
            rel = join(ctx.rel_of(directory), audit_name(name))
            with ctx.audit.line(
                EventName.CREATE,
                rel,
                caller,
                session_id=ctx.write_session(),
                mode=stat.S_IMODE(mode),
            ):
                decoded = decode_name(name)
                kind = kind_of_mode(mode)
                if kind is None or kind in (FileKind.DIR, FileKind.SYMLINK):
                    raise FSError(errno.EINVAL, f"mknod of mode {mode:o}")
                ctx.check_write(rel)
                node = await self.make_node(directory, rel, decoded, kind, mode, rdev, caller)
                ctx.table.looked_up(node)
                return Entry(node.ino, ctx.attributes(node))

    async def make_node(
        self,
        directory: Node,
        rel: str,
        decoded: str,
        kind: FileKind,
        mode: int,
        rdev: int,
        caller: CallerProcess,
    ) -> Node:
        """
        Create a node of C{kind} (not a directory or symlink) at C{rel}
        (caller holds the namespace lock and has checked the policy).
        """
        ctx = self._ctx
        self.refuse_pending(directory, decoded, rel)
        uid, gid = new_owner(caller, directory)
        device = kind in (FileKind.CHARDEV, FileKind.BLOCKDEV)
        bits = new_mode(mode, directory, kind)
        created = await self._mknod(rel, kind, bits, rdev if device else 0, uid, gid)
        node = ctx.table.learn(directory, decoded, created)
        directory.entry_added(created)
        if kind is FileKind.FILE:
            node.chunks = ()
            node.chunks_version = created.version
        return node

    async def link(
        self, ino: int, new_parent: int, new_name: bytes, caller: CallerProcess
    ) -> Entry:
        """
        Give inode C{ino} the further name C{new_parent/new_name}: beside the
        commits in flight when the file exists on the data plane or a commit
        already sent creates it (L{_exists_or_committing}; git's object
        store links each closed temporary file), else after them, creating a
        pending file first. Either way the call waits for its own answer.
        """
        ctx = self._ctx
        await ctx.namespace_lock.moves_settled(ino)
        await settled_at(ctx, new_parent, new_name)
        known = ctx.table.get(ino)
        behind = known is not None and self._exists_or_committing(known)
        lock = ctx.namespace_lock
        async with lock.sending_commit(after_closes=True) if behind else lock:
            node = ctx.node(ino)
            target_dir = ctx.directory(new_parent)
            rel = ctx.rel_of(node)
            to_rel = join(ctx.rel_of(target_dir), audit_name(new_name))
            with ctx.audit.line(
                EventName.LINK,
                rel,
                caller,
                session_id=ctx.write_session(),
                to_path=audit_path(to_rel),
            ):
                decoded = decode_name(new_name)
                ctx.check_read(rel, directory=False)
                ctx.check_write(to_rel)
                if node.kind is FileKind.DIR:
                    raise FSError(errno.EPERM, "hard link to a directory")
                self.refuse_pending(target_dir, decoded, to_rel)
                if not self._exists_or_committing(node):
                    await self.materialize(node)
                path, to_path = ctx.server_path(rel), ctx.server_path(to_rel)
                linked = await ctx.await_write(
                    ctx.remote.link(path, to_path, session_id=ctx.write_session())
                )
                node = ctx.table.learn(target_dir, decoded, linked)
                target_dir.entry_added(linked)
                ctx.table.looked_up(node)
                return Entry(node.ino, ctx.attributes(node))

    def _exists_or_committing(self, node: Node) -> bool:
        """
        Whether C{node} is a file the data plane has, or will have once the
        commit already sent for it (a closed new file's) is run.
        """
        if node.kind is not FileKind.FILE:
            return False
        if not node.pending:
            return True
        state = self._ctx.files.state(node.ino)
        return state is not None and state.commits_in_flight > 0

    async def materialize(self, node: Node) -> None:
        """
        Create pending file C{node} on the data plane now, empty (as a
        C{create} used to): an operation is about to need it there. Its open
        state's changes are then committed over that version. The caller
        holds the namespace lock.
        """
        ctx = self._ctx
        if not node.pending:
            return
        link = ctx.table.primary_name(node)
        if link is None:
            return  # unlinked: it will never reach the server
        directory, _name = link
        attributes = node.attributes
        state = ctx.files.state(node.ino)
        created = await self._mknod(
            ctx.rel_of(node), FileKind.FILE, attributes.mode, 0, attributes.uid, attributes.gid
        )
        ctx.table.bind(node, created)
        directory.entry_added(created)
        node.chunks = ()
        node.chunks_version = created.version
        if state is not None:
            state.version = created.version
            # The mknod, recorded itself, made what an empty close recorded.
            settle_record(ctx.outbox, state, state.recorded)

    async def _mknod(
        self, rel: str, kind: FileKind, mode: int, rdev: int, uid: int, gid: int
    ) -> Attributes:
        """C{mknod} at C{rel}: the new node's attributes (an answer lost is settled)."""
        ctx = self._ctx
        path = ctx.server_path(rel)
        return await ctx.await_write(
            ctx.remote.mknod(
                path,
                kind=kind,
                mode=mode,
                rdev=rdev,
                uid=uid,
                gid=gid,
                session_id=ctx.write_session(),
            )
        )

    def refuse_pending(self, directory: Node, name: str, rel: str) -> None:
        """
        EEXIST if C{name} in C{directory} is a pending file (the data plane
        does not know it, so it would not refuse the name itself).
        """
        child = self._ctx.table.child(directory, name)
        if child is not None and child.pending:
            raise FSError(errno.EEXIST, f"{rel!r} exists")
