"""
The namespace operations of the filesystem core: lookup, attributes,
directory changes, names (create, remove, rename, link), symlinks, device nodes,
C{statfs} and C{forget}. Each translates one kernel request into at most a
few data-plane requests, keeps the inode table in step, and writes its
audit line (``docs/specifications/mount-fs.md``).

Operations that change names run one at a time (the context's namespace
lock, also taken to send write-back commits, and waiting for their answers:
L{svc.mount.namespace_lock}), so a path computed from the inode table is still
the server's path when the request arrives.
"""

from __future__ import annotations

import errno
import stat
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import attrs
from twisted.internet.defer import Deferred

from svc.audit.client_events import SetattrField
from svc.audit.events import CallerProcess
from svc.audit.names import EventName
from svc.mount.attributes import (
    AttributeChanges,
    Attributes,
    Entry,
    FileKind,
    FsStats,
    QuotaReport,
    kind_of_mode,
)
from svc.mount.client_audit import AuditLine, audit_path
from svc.mount.errors import FSError, RemoteFailure
from svc.mount.file_size_limit import MAX_FILE_BYTES
from svc.mount.file_state import FileState
from svc.mount.fs_context import FSContext, audit_name, decode_name, join
from svc.mount.inodes import ROOT_INODE, InodeTable, Node
from svc.mount.namespace_hand_off import (
    HandedRemoval,
    HandedRename,
    NamespaceHandOffs,
    settle_rename,
    settle_unlink,
)
from svc.mount.remote_values import RenameResult
from svc.mount.unanswered import send_creation, send_removal, send_rename, send_setattr

T = TypeVar("T")

Truncate = Callable[[Node, int, CallerProcess], Awaitable[None]]
"""Truncates or extends a regular file (provided by the file operations)."""


def setattr_fields(changes: AttributeChanges) -> SetattrField:
    """The C{setattr_fields} bits of C{changes}."""
    fields = SetattrField(0)
    for name, bit in (
        ("mode", SetattrField.MODE),
        ("uid", SetattrField.UID),
        ("gid", SetattrField.GID),
        ("size", SetattrField.SIZE),
        ("mtime_ns", SetattrField.MTIME),
        ("atime_ns", SetattrField.ATIME),
    ):
        if getattr(changes, name) is not None:
            fields |= bit
    return fields


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


class NamespaceOps:
    """See the module docstring."""

    def __init__(self, context: FSContext, truncate: Truncate) -> None:
        self._ctx = context
        self._truncate = truncate
        self._hand_offs = NamespaceHandOffs(
            durable=context.settings.durable_close, connected=context.connected
        )

    async def write(self, request: Awaitable[T]) -> T:
        """Await a write request; a refused session becomes EROFS (read-only)."""
        try:
            return await request
        except RemoteFailure as failure:
            raise self._ctx.write_failed(failure) from None

    # Lookup and attributes

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
                if directory.complete:
                    raise FSError(errno.ENOENT, f"no {rel!r}")
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

    async def setattr(
        self, ino: int, changes: AttributeChanges, caller: CallerProcess
    ) -> Attributes:
        """Change mode, owner, size or times of C{ino}."""
        ctx = self._ctx
        node = ctx.node(ino)
        rel = ctx.table.path_of(node)
        with ctx.audit.line(
            EventName.SETATTR,
            rel or "",
            caller,
            session_id=ctx.write_session(),
            setattr_fields=int(setattr_fields(changes)),
        ):
            if rel is None:
                if ctx.read_only_reason is not None:
                    raise FSError(errno.EROFS, f"read-only: {ctx.read_only_reason}")
            else:
                ctx.check_write(rel)
            if changes.size is not None:
                if node.kind is FileKind.DIR:
                    raise FSError(errno.EISDIR, "size of a directory")
                if node.kind is not FileKind.FILE:
                    raise FSError(errno.EINVAL, "size of a special file")
                if changes.size < 0:
                    raise FSError(errno.EINVAL, "negative size")
                if changes.size > MAX_FILE_BYTES:
                    raise FSError(errno.EFBIG, f"a file may hold at most {MAX_FILE_BYTES} bytes")
                await self._truncate(node, changes.size, caller)
            rest = attrs.evolve(changes, size=None)
            if rest != AttributeChanges():
                await self._set_attributes(node, rest)
            return ctx.attributes(node)

    async def _set_attributes(self, node: Node, changes: AttributeChanges) -> None:
        ctx = self._ctx
        state = ctx.files.state(node.ino)
        if (
            not ctx.namespace_lock.locked  # (a materialize would overwrite the change)
            and ctx.table.path_of(node) is not None
            and _rides_on_write_back(node, state, changes)
        ):
            # Nothing is sent, so no wait for the commits in flight: the
            # file's own, if one is, does not carry the change, which stays
            # kept for the next (FileState.committed). pip's chmod after
            # the close, rsync's fchmod.
            assert state is not None
            self._keep_for_write_back(node, state, changes)
            return
        async with ctx.namespace_lock:
            rel = ctx.table.path_of(node)
            state = ctx.files.state(node.ino)
            if rel is None:  # an open, unlinked file: nothing on the server
                node.attributes = _changed(node.attributes, changes)
            elif _rides_on_write_back(node, state, changes):
                assert state is not None
                self._keep_for_write_back(node, state, changes)
                return
            else:
                await self.materialize(node)
                path = ctx.server_path(rel)
                node.set_attributes(
                    await self.write(
                        send_setattr(
                            ctx,
                            path,
                            lambda: ctx.remote.setattr(
                                path, changes, session_id=ctx.write_session()
                            ),
                        )
                    )
                )
        state = ctx.files.state(node.ino)
        if state is not None and state.dirty and changes.mtime_ns is not None:
            state.mtime_ns = changes.mtime_ns

    def _keep_for_write_back(self, node: Node, state: FileState, changes: AttributeChanges) -> None:
        """
        The file's next C{manifest_put} carries mode, uid, gid, mtime and
        atime: keep the change for it instead of a round trip now (tar,
        cp -a and rsync set them between the last write and the close, pip
        and rsync after it).
        """
        node.attributes = attrs.evolve(
            _changed(node.attributes, changes), ctime_ns=self._ctx.now_ns()
        )
        state.keep_attributes(changes.mtime_ns, changes.atime_ns)

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
                created = await self.write(
                    send_creation(
                        ctx,
                        "mkdir",
                        path,
                        lambda: ctx.remote.dir_create(
                            path,
                            mode=bits,
                            uid=uid,
                            gid=gid,
                            session_id=ctx.write_session(),
                        ),
                        lambda found: (
                            found.kind is FileKind.DIR and (found.uid, found.gid) == (uid, gid)
                        ),
                    )
                )
                node = ctx.table.learn(directory, decoded, created)
                node.complete = True
                directory.entry_added(created)
                ctx.table.looked_up(node)
                return Entry(node.ino, ctx.attributes(node))

    async def rmdir(self, parent: int, name: bytes, caller: CallerProcess) -> None:
        """Remove the empty directory C{name} from C{parent} (handed off when listed and empty)."""
        await self._remove(parent, name, caller, directory=True)

    async def unlink(self, parent: int, name: bytes, caller: CallerProcess) -> None:
        """Remove the non-directory C{name} from C{parent}."""
        await self._remove(parent, name, caller, directory=False)

    async def _remove(
        self, parent: int, name: bytes, caller: CallerProcess, *, directory: bool
    ) -> None:
        ctx = self._ctx
        await self.settled_at(parent, name)
        # Waits for commits in flight, not for removals (rm -r is pipelined).
        async with ctx.namespace_lock.handing_off():
            folder = ctx.directory(parent)
            rel = join(ctx.rel_of(folder), audit_name(name))
            event = EventName.RMDIR if directory else EventName.UNLINK
            with ctx.audit.line(event, rel, caller, session_id=ctx.write_session()) as line:
                decoded = decode_name(name)
                ctx.check_write(rel)
                child = ctx.table.child(folder, decoded)
                if child is not None and directory and child.kind is not FileKind.DIR:
                    raise FSError(errno.ENOTDIR, f"{rel!r} is not a directory")
                if child is not None and not directory and child.kind is FileKind.DIR:
                    raise FSError(errno.EISDIR, f"{rel!r} is a directory")
                if child is None and folder.complete:
                    raise FSError(errno.ENOENT, f"no {rel!r}")
                path = ctx.server_path(rel)
                session = ctx.write_session()
                remove = ctx.remote.dir_remove if directory else ctx.remote.manifest_delete
                if child is not None and child.pending:
                    ctx.table.unlink(folder, decoded)  # never reached the server
                    if self._save_to_replay_dropped(child):
                        # The file the save was to replace is still there.
                        changed = await self.write(
                            send_removal(ctx, path, 0, lambda: remove(path, session_id=session))
                        )
                        folder.entry_removed(changed, directory=False)
                    return
                if child is not None and ctx.table.has_pending_children(child):
                    raise FSError(errno.ENOTEMPTY, f"{rel!r} is not empty")
                if (
                    child is not None
                    and (not directory or (child.complete and not child.children))
                    and self._hand_offs.allowed(
                        ctx.namespace_lock.hand_offs_in_flight,
                        read_only=ctx.read_only_reason is not None,
                    )
                ):
                    answer = remove(path, session_id=session)
                    removal = HandedRemoval(
                        folder, decoded, child, path, lambda: remove(path, session_id=session)
                    )
                    ctx.table.unlink(folder, decoded)
                    # Its link count and times now, as the server will; the
                    # answer brings the server's times.
                    folder.entry_removed(ctx.now_ns(), directory=directory)
                    settle = ctx.namespace_lock.hand_off_sent(leaving=(folder.ino, decoded))
                    handed = line.defer()
                    answer.addBoth(
                        lambda result: settle_unlink(
                            ctx, self._hand_offs, removal, handed, settle, result
                        )
                    )
                    return
                removed = 0 if child is None else child.attributes.server_inode
                changed = await self.write(
                    send_removal(ctx, path, removed, lambda: remove(path, session_id=session))
                )
                self._hand_offs.succeeded()
                ctx.table.unlink(folder, decoded)
                folder.entry_removed(changed, directory=directory)

    def _save_to_replay_dropped(self, node: Node) -> bool:
        """
        Whether pending C{node} was to replay an atomic save over a file the
        server still has at its name (L{svc.mount.unanswered.take_replay},
        L{FileState.replaces_version}); that replay is dropped (the file is
        being removed).
        """
        state = self._ctx.files.state(node.ino)
        if state is None or (state.replay_via is None and state.replaces_version is None):
            return False
        state.replay_via = None
        state.replaces_version = None
        return True

    async def settled_at(self, parent: int, name: bytes) -> None:
        """
        Before an operation changes what C{name} in directory C{parent}
        names (a create, a link, a rename from or onto it, an unlink, an
        rmdir): wait while a handed-off change about that name is in flight
        -- an unlink, rmdir or rename taking a node away from it
        (L{NamespaceLock.vacated}), or a rename of the node it names now
        (L{NamespaceLock.moves_settled}).

        Should such a change's answer be lost, the mount then still tells
        the server's names from its own, and sends it again or undoes it
        in the order the changes were made (``mount-consistency.md``
        section 2.6). Had a later change gone out meanwhile -- a new file
        under a name an atomic save left, an unlink or a second rename of
        a file just renamed -- the first could no longer be told: it would
        be undone, leaving the server's names and the mount's apart (the
        file the unlink should have removed, a new file's commit meeting
        the old one). The kernel holds the directory's lock for the
        caller, so no other change of the name starts meanwhile.
        """
        ctx = self._ctx
        try:
            folder = ctx.directory(parent)
            decoded = decode_name(name)
        except FSError:
            return  # reported by the operation itself
        lock = ctx.namespace_lock
        await lock.vacated(parent, decoded)
        child = ctx.table.child(folder, decoded)
        if child is not None and lock.moving(child.ino):
            await lock.moves_settled(child.ino)

    async def rename(
        self,
        parent: int,
        name: bytes,
        new_parent: int,
        new_name: bytes,
        caller: CallerProcess,
    ) -> None:
        """
        Rename C{parent/name} to C{new_parent/new_name}, replacing a target;
        handed off (returns once sent) when L{_may_hand_off_rename} says so,
        even beside the commits in flight when L{_rename_beside_commits}
        can send it. A directory's rename changes the server's path of
        everything below it, while a handed-off change whose answer was
        lost is looked into at the paths it was sent with: it waits until
        no handed-off change is in flight, as a mkdir does.
        """
        ctx = self._ctx
        await self.settled_at(parent, name)
        await self.settled_at(new_parent, new_name)
        if parent == new_parent:
            async with ctx.namespace_lock.sending_commit(after_closes=True):
                if self._rename_beside_commits(parent, name, new_name, caller):
                    return
        lock = ctx.namespace_lock
        # Waits for commits in flight and, for a directory, handed-off changes.
        async with lock if self._may_move_a_directory(parent, name) else lock.handing_off():
            plan = _RenamePlan.of(ctx, parent, name, new_parent, new_name)
            with self._rename_line(plan, caller) as line:
                plan = plan.decoded(ctx.table)
                ctx.check_write(plan.rel)
                ctx.check_write(plan.to_rel)
                source, target = plan.source, plan.target
                if source is None or source.kind is FileKind.DIR:
                    ctx.check_subtree_move(plan.rel, plan.to_rel)
                if target is not None and ctx.table.has_pending_children(target):
                    raise FSError(errno.ENOTEMPTY, f"{plan.to_rel!r} is not empty")
                if source is not None and self._may_hand_off_rename(plan, source):
                    self._hand_off_rename(plan, source, line)
                    return
                for node in (source, target):
                    if node is not None:
                        await self.materialize(node)
                renamed = await self.write(
                    send_rename(
                        ctx,
                        ctx.server_path(plan.rel),
                        ctx.server_path(plan.to_rel),
                        0 if source is None else source.attributes.server_inode,
                        lambda: self._send_rename(plan),
                    )
                )
                self._hand_offs.succeeded()
                moved_was_stale = source is None or source.stale
                ctx.table.move(plan.source_dir, plan.name, plan.target_dir, plan.new_name)
                _renamed(plan.source_dir, plan.target_dir, source, target, renamed, moved_was_stale)

    def _may_move_a_directory(self, parent: int, name: bytes) -> bool:
        """Whether C{name} in C{parent} may name a directory (unknown names may)."""
        ctx = self._ctx
        try:
            child = ctx.table.child(ctx.directory(parent), decode_name(name))
        except FSError:
            return False  # refused the usual way
        return child is None or child.kind is FileKind.DIR

    def _rename_beside_commits(
        self, parent: int, name: bytes, new_name: bytes, caller: CallerProcess
    ) -> bool:
        """
        Under the lock, commits perhaps in flight: hand off the rename of
        C{name} to C{new_name} in directory C{parent} and say C{True}, when
        the commits in flight cannot be about anything it touches but the
        source's own (an atomic save: the temporary file's commit, just
        handed off by its close), and it may hand off. Otherwise C{False},
        having done nothing: the rename waits for the commits in flight.
        """
        ctx = self._ctx
        try:
            plan = _RenamePlan.of(ctx, parent, name, parent, new_name).decoded(ctx.table)
            ctx.check_write(plan.rel)
            ctx.check_write(plan.to_rel)
        except FSError:
            return False  # refused the usual way, after the commits
        source = plan.source
        if source is None or source.kind is not FileKind.FILE:
            return False
        if not self._may_hand_off_rename(plan, source, source_committing=True):
            return False
        with self._rename_line(plan, caller) as line:
            self._hand_off_rename(plan, source, line)
        return True

    def _rename_line(self, plan: _RenamePlan, caller: CallerProcess) -> AuditLine:
        ctx = self._ctx
        return ctx.audit.line(
            EventName.RENAME,
            plan.rel,
            caller,
            session_id=ctx.write_session(),
            to_path=audit_path(plan.to_rel),
        )

    def _send_rename(self, plan: _RenamePlan) -> Deferred[RenameResult]:
        ctx = self._ctx
        return ctx.remote.rename(
            ctx.server_path(plan.rel),
            ctx.server_path(plan.to_rel),
            session_id=ctx.write_session(),
        )

    def _may_hand_off_rename(
        self, plan: _RenamePlan, source: Node, *, source_committing: bool = False
    ) -> bool:
        """
        Whether a rename of C{source} may return once sent: the mount can
        tell what the server will do (a file, symlink or device node on the
        server, or on its way there, moved to a name known free in a
        directory listed whole, or over another such node that no commit is
        about), neither is open nor holds changes not committed (a
        failure would leave them without a name; a closed file's state may
        linger while its release finishes) -- except, with
        C{source_committing}, the source's own commit in flight, which the
        server runs first -- and L{NamespaceHandOffs} allows one more.
        """
        ctx = self._ctx

        def plain(node: Node, *, committing: bool) -> bool:
            if node.kind is FileKind.DIR:
                return False
            state = ctx.files.state(node.ino)
            if state is None:
                return not node.pending
            if state.handles:
                return False
            if state.commits_in_flight:
                return committing
            return not (state.dirty or node.pending)

        target = plan.target
        if target is None:
            target_known = plan.target_dir.complete
        else:
            target_known = target is not source and plain(target, committing=False)
        return (
            target_known
            and plain(source, committing=source_committing)
            and self._hand_offs.allowed(
                ctx.namespace_lock.hand_offs_in_flight,
                read_only=ctx.read_only_reason is not None,
            )
        )

    def _hand_off_rename(self, plan: _RenamePlan, source: Node, line: AuditLine) -> None:
        """
        Send the rename of C{source}, show it in the mount's picture at once
        (as the server will apply it), and handle its answer when it comes
        (L{settle_rename}); the audit line is written then.
        """
        ctx = self._ctx
        answer = self._send_rename(plan)
        target = plan.target
        handed = HandedRename(
            plan.source_dir,
            plan.name,
            plan.target_dir,
            plan.new_name,
            source,
            target is not None,
            path=ctx.server_path(plan.rel),
            to_path=ctx.server_path(plan.to_rel),
            replaced_inode=None if target is None else target.attributes.server_inode,
            resend=lambda: self._send_rename(plan),
        )
        moved_was_stale = source.stale
        ctx.table.move(plan.source_dir, plan.name, plan.target_dir, plan.new_name)
        expected = RenameResult(1, handed.replaced, ctx.now_ns())
        _renamed(plan.source_dir, plan.target_dir, source, target, expected, moved_was_stale)
        settle = ctx.namespace_lock.hand_off_sent(
            source.ino, leaving=(plan.source_dir.ino, plan.name)
        )
        deferred_line = line.defer()
        answer.addBoth(
            lambda result: settle_rename(
                ctx, self._hand_offs, handed, deferred_line, settle, result
            )
        )

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
        await self.settled_at(new_parent, new_name)
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
                linked = await self.write(
                    send_creation(
                        ctx,
                        "link",
                        to_path,
                        lambda: ctx.remote.link(path, to_path, session_id=ctx.write_session()),
                        lambda found: (
                            bool(node.attributes.server_inode)
                            and found.server_inode == node.attributes.server_inode
                        ),
                    )
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
                created = await self.write(
                    send_creation(
                        ctx,
                        "symlink",
                        path,
                        lambda: ctx.remote.symlink(
                            path, text, uid=uid, gid=gid, session_id=ctx.write_session()
                        ),
                        lambda found: (
                            found.kind is FileKind.SYMLINK and (found.uid, found.gid) == (uid, gid)
                        ),
                    )
                )
                node = ctx.table.learn(directory, decoded, created)
                directory.entry_added(created)
                ctx.table.looked_up(node)
                return Entry(node.ino, ctx.attributes(node))

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

    def refuse_pending(self, directory: Node, name: str, rel: str) -> None:
        """
        EEXIST if C{name} in C{directory} is a pending file (the data plane
        does not know it, so it would not refuse the name itself).
        """
        child = self._ctx.table.child(directory, name)
        if child is not None and child.pending:
            raise FSError(errno.EEXIST, f"{rel!r} exists")

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
        created = await self._mknod(
            ctx.rel_of(node), FileKind.FILE, attributes.mode, 0, attributes.uid, attributes.gid
        )
        ctx.table.bind(node, created)
        directory.entry_added(created)
        node.chunks = ()
        node.chunks_version = created.version
        state = ctx.files.state(node.ino)
        if state is not None:
            state.version = created.version

    async def _mknod(
        self, rel: str, kind: FileKind, mode: int, rdev: int, uid: int, gid: int
    ) -> Attributes:
        """C{mknod} at C{rel}: the new node's attributes (an answer lost is settled)."""
        ctx = self._ctx
        path = ctx.server_path(rel)
        return await self.write(
            send_creation(
                ctx,
                "mknod",
                path,
                lambda: ctx.remote.mknod(
                    path,
                    kind=kind,
                    mode=mode,
                    rdev=rdev,
                    uid=uid,
                    gid=gid,
                    session_id=ctx.write_session(),
                ),
                lambda found: _made_node(found, kind, uid, gid),
            )
        )

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

    # Whole-filesystem

    async def statfs(self, caller: CallerProcess) -> FsStats:
        """Capacity and usage from the quota callable."""
        quota = self._ctx.quota
        report = await quota() if quota is not None else QuotaReport(None, 0)
        return FsStats.from_quota(report)

    def forget(self, inodes: Sequence[tuple[int, int]]) -> None:
        """The kernel dropped lookups: C{(ino, count)} pairs."""
        for ino, count in inodes:
            self._ctx.table.forget(ino, count)


@attrs.frozen
class _RenamePlan:
    """
    A rename's directories, paths and (once L{decoded}) names and the nodes
    the inode table holds at them.
    """

    source_dir: Node
    target_dir: Node
    rel: str
    to_rel: str
    raw_name: bytes
    raw_new_name: bytes
    name: str = ""
    new_name: str = ""
    source: Node | None = None
    target: Node | None = None

    @classmethod
    def of(
        cls, ctx: FSContext, parent: int, name: bytes, new_parent: int, new_name: bytes
    ) -> _RenamePlan:
        """The directories and paths (before the audit line: ENOTDIR, ENOENT)."""
        source_dir = ctx.directory(parent)
        target_dir = ctx.directory(new_parent)
        return cls(
            source_dir,
            target_dir,
            join(ctx.rel_of(source_dir), audit_name(name)),
            join(ctx.rel_of(target_dir), audit_name(new_name)),
            name,
            new_name,
        )

    def decoded(self, table: InodeTable) -> _RenamePlan:
        """With the names decoded (EINVAL) and the nodes C{table} holds at them."""
        name = decode_name(self.raw_name)
        new_name = decode_name(self.raw_new_name)
        return attrs.evolve(
            self,
            name=name,
            new_name=new_name,
            source=table.child(self.source_dir, name),
            target=table.child(self.target_dir, new_name),
        )


def _made_node(found: Attributes, kind: FileKind, uid: int, gid: int) -> bool:
    """Whether C{found} is what a mknod of C{kind} by C{uid}/C{gid} makes (an empty file)."""
    return (
        found.kind is kind
        and (found.uid, found.gid) == (uid, gid)
        and (kind is not FileKind.FILE or found.size == 0)
    )


def _renamed(
    source_dir: Node,
    target_dir: Node,
    moved: Node | None,
    target: Node | None,
    result: RenameResult,
    moved_was_stale: bool,
) -> None:
    """
    After a rename, the two directories' and the moved node's attributes as
    the data plane set them (``dataplane-ops.md``, C{manifest_rename}): from
    the answer's C{dir_ctime_ns} when the moved node, and a replaced
    target, are known; otherwise they are stale, to be fetched again.
    """
    stamp = result.changed_ns
    if stamp is None or result.moved == 0 or moved is None or (result.replaced and target is None):
        source_dir.stale = True
        target_dir.stale = True
        return
    subdirectory = 1 if moved.kind is FileKind.DIR else 0
    replaced = 1 if result.replaced else 0
    replaced_directory = (
        1 if result.replaced and target is not None and target.kind is FileKind.DIR else 0
    )
    if source_dir is target_dir:
        source_dir.entries_changed(stamp, versions=1 + replaced, links=-replaced_directory)
    else:
        source_dir.entries_changed(stamp, links=-subdirectory)
        target_dir.entries_changed(
            stamp, versions=1 + replaced, links=subdirectory - replaced_directory
        )
    if not moved_was_stale:
        moved.set_attributes(attrs.evolve(moved.attributes, ctime_ns=stamp))


def _changed(attributes: Attributes, changes: AttributeChanges) -> Attributes:
    """C{attributes} with the fields C{changes} sets."""
    return attrs.evolve(
        attributes,
        **{key: value for key, value in attrs.asdict(changes).items() if value is not None},
    )


def _rides_on_write_back(node: Node, state: FileState | None, changes: AttributeChanges) -> bool:
    """
    Whether a change of mode, owner or times may wait for the file's
    write-back (``mount-fs.md`` section 5): one is due anyway (the open
    file has changes, or it is pending, or its commit is in flight), and
    every field changed is one C{manifest_put} carries (not the size).
    """
    return (
        node.kind is FileKind.FILE
        and state is not None
        and (state.dirty or node.pending)
        and changes.size is None
    )
