"""
What becomes of changes a file's last release could not write back
(``docs/specifications/mount-consistency.md`` section 2.5, "Changes kept
through an outage"; ``operator.md`` section 4): the changes given up with
the file saved first under the cache's C{unsent} directory
(L{svc.mount.writeback.unsent}) and a warning saying where, and a new file
that never reached the data plane made empty or its name dropped.
"""

from __future__ import annotations

from twisted.logger import Logger

from svc.mount.core.errors import FSError
from svc.mount.core.file_state import FileState
from svc.mount.core.fs_context import FSContext
from svc.mount.core.inodes import Node
from svc.mount.ops.node_creation import NodeCreation

_log = Logger()


class UnsavedChanges:
    """See the module docstring; used by L{svc.mount.ops.file_closes.FileCloses}."""

    def __init__(self, context: FSContext, creation: NodeCreation) -> None:
        self._ctx = context
        self._creation = creation

    async def let_go(self, state: FileState, node: Node | None, *, discarded: bool) -> None:
        """C{state} is let go by its last release: its changes given up when C{discarded}."""
        if discarded:
            await self._discarding(state, node)

    async def _discarding(self, state: FileState, node: Node | None) -> None:
        """
        C{state}'s changes are given up: its content is saved on the mount's
        disk first, when it still has a name (L{svc.mount.writeback.unsent}),
        and the warning says where.
        """
        ctx = self._ctx
        rel = ctx.table.path_of(node) if node is not None else None
        saved = (
            None if rel is None else await ctx.unsent.save(rel, state.ino, state.size, state.read)
        )
        if saved is None and rel is None:
            # Unlinked: its changes go with it, as on any file system.
            _log.info(
                "dropping the uncommitted changes to unlinked inode {ino} ({size} bytes)",
                size=state.size,
                ino=state.ino,
            )
            return
        if saved is None:
            _log.warn(
                "discarding {size} bytes of uncommitted changes to inode {ino}",
                size=state.size,
                ino=state.ino,
            )
            return
        _log.warn(
            "discarding {size} bytes of uncommitted changes to {path} (inode {ino});"
            " the file as it stood is saved at {saved}",
            size=state.size,
            path=rel,
            ino=state.ino,
            saved=str(saved),
        )

    async def settle_pending(self, node: Node, *, reach: bool) -> None:
        """
        The last handle of a file never committed closed with its write-back
        failed: its changes are discarded (as for any file), and it is
        created empty, as C{create} otherwise does; when even that cannot be
        done (read-only mode, the server refuses, not C{reach}: the data
        plane is not to be asked), its name is dropped.
        """
        ctx = self._ctx
        if ctx.read_only_reason is None and reach:
            try:
                async with ctx.namespace_lock:
                    await self._creation.materialize(node)
            except FSError as error:
                _log.warn(
                    "could not create file inode {ino} empty either: {error}",
                    ino=node.ino,
                    error=error,
                )
            else:
                return
        table = ctx.table
        for parent_ino, name in list(node.names):
            parent = table.get(parent_ino)
            if parent is not None:
                _log.warn(
                    "file {name} (inode {ino}) was never committed: its name is dropped",
                    name=name,
                    ino=node.ino,
                )
                table.unlink(parent, name)
                parent.complete = False  # the name may be taken on the data plane
                ctx.invalidate_entry(parent_ino, name.encode("utf-8"))
