"""
C{rename}, replacing a target: a C{manifest_rename} (a rename that waits
for its answer first creates a pending source or target on the data
plane), the inode table kept in step, and its audit line
(``docs/specifications/mount-fs.md``).

A rename the mount can judge (L{Renames._may_hand_off_rename}: a file,
symlink or device node, not open, no changes not committed, to a name known
free or over another such node) returns once its request is sent, when
L{NamespaceHandOffs} allows: it is I{handed off}, shows in the mount's
picture at once, and its answer is handled when it comes
(L{svc.mount.remote.namespace_hand_off.settle_rename};
``docs/specifications/mount-consistency.md`` section 2.6). Within one
directory it may even go beside the commits in flight, behind the source's
own (an atomic save: L{Renames._rename_beside_commits}). Any other rename
waits for the commits in flight, and a directory's for the handed-off
changes too (L{svc.mount.core.namespace_lock}); every rename first waits for a
handed-off change about its names (L{svc.mount.remote.namespace_hand_off.settled_at}).
"""

from __future__ import annotations

import errno

import attrs
from twisted.internet.defer import Deferred

from svc.audit.events import CallerProcess
from svc.audit.names import EventName
from svc.mount.core.attributes import FileKind
from svc.mount.core.client_audit import AuditLine, audit_path
from svc.mount.core.errors import FSError
from svc.mount.core.fs_context import FSContext, audit_name, decode_name, join
from svc.mount.core.inodes import InodeTable, Node
from svc.mount.ops.node_creation import NodeCreation
from svc.mount.remote.namespace_hand_off import (
    HandedRename,
    NamespaceHandOffs,
    settle_rename,
    settled_at,
)
from svc.mount.remote.remote_values import RenameResult


class Renames:
    """See the module docstring."""

    def __init__(
        self, context: FSContext, creation: NodeCreation, hand_offs: NamespaceHandOffs
    ) -> None:
        """
        @param creation: creates a pending source or target on the data plane
            before a rename that waits for its answer.
        @param hand_offs: whether a rename may hand off; shared with the
            removals (L{svc.mount.ops.removals.Removals}): one bound, and one
            failure makes both wait until a change succeeds.
        """
        self._ctx = context
        self._creation = creation
        self._hand_offs = hand_offs

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
        await settled_at(ctx, parent, name)
        await settled_at(ctx, new_parent, new_name)
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
                        await self._creation.materialize(node)
                renamed = await ctx.await_write(self._send_rename(plan))
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

    def _send_rename(
        self, plan: _RenamePlan, *, handed_off: bool = False
    ) -> Deferred[RenameResult]:
        ctx = self._ctx
        return ctx.remote.rename(
            ctx.server_path(plan.rel),
            ctx.server_path(plan.to_rel),
            session_id=ctx.write_session(),
            handed_off=handed_off,
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
        answer = self._send_rename(plan, handed_off=True)
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
