"""
C{unlink} and C{rmdir}: each sends one data-plane request, keeps the inode
table in step, and writes its audit line (``docs/specifications/mount-fs.md``).
A pending file never reached the server and is only forgotten (unless an
atomic save's replay was to put it over a file the server still has at its
name: that file is removed).

A removal the mount can judge (a name it knows; for C{rmdir}, a directory
listed whole and empty) returns once its request is sent when
L{NamespaceHandOffs} allows: it is I{handed off}, shows in the mount's
picture at once, and its answer is handled when it comes
(L{svc.mount.remote.namespace_hand_off.settle_unlink};
``docs/specifications/mount-consistency.md`` section 2.6). Removals wait for
the commits in flight but not for each other (C{rm -r} is pipelined:
L{svc.mount.core.namespace_lock.NamespaceLock.handing_off}), and first for a
handed-off change about the same name
(L{svc.mount.remote.namespace_hand_off.settled_at}).
"""

from __future__ import annotations

import errno

from svc.audit.events import CallerProcess
from svc.audit.names import EventName
from svc.mount.core.attributes import FileKind
from svc.mount.core.errors import FSError
from svc.mount.core.fs_context import FSContext, audit_name, decode_name, join
from svc.mount.core.inodes import Node
from svc.mount.outbox.recorded import settle_record
from svc.mount.remote.namespace_hand_off import (
    HandedRemoval,
    NamespaceHandOffs,
    settle_unlink,
    settled_at,
)


class Removals:
    """See the module docstring."""

    def __init__(self, context: FSContext, hand_offs: NamespaceHandOffs) -> None:
        """
        @param hand_offs: whether a removal may hand off; shared with the
            renames (L{svc.mount.ops.renames.Renames}): one bound, and one
            failure makes both wait until a change succeeds.
        """
        self._ctx = context
        self._hand_offs = hand_offs

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
        await settled_at(ctx, parent, name)
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
                    self._forget_empty_record(child)
                    if self._save_to_replay_dropped(child):
                        # The file the save was to replace is still there.
                        changed = await ctx.await_write(remove(path, session_id=session))
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
                    answer = remove(path, session_id=session, handed_off=True)
                    removal = HandedRemoval(folder, decoded, child, path)
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
                changed = await ctx.await_write(remove(path, session_id=session))
                self._hand_offs.succeeded()
                ctx.table.unlink(folder, decoded)
                folder.entry_removed(changed, directory=directory)

    def _forget_empty_record(self, node: Node) -> None:
        """
        Pending C{node} lost its name: what an empty close recorded of it
        must not create it on the next mount (``mount-outbox.md`` section 8).
        """
        state = self._ctx.files.state(node.ino)
        if state is not None and not node.names:
            settle_record(self._ctx.outbox, state, state.recorded)

    def _save_to_replay_dropped(self, node: Node) -> bool:
        """
        Whether pending C{node} was to replay an atomic save over a file the
        server still has at its name (L{svc.mount.remote.never_created.take_replay},
        L{svc.mount.core.file_state.FileState.replaces_version}); that replay is
        dropped (the file is being removed).
        """
        state = self._ctx.files.state(node.ino)
        if state is None or (state.replay_via is None and state.replaces_version is None):
            return False
        state.replay_via = None
        state.replaces_version = None
        return True
