"""
C{setattr}: a node's mode, owner, size or times. A new size is a truncation
(the file operations'). A change of mode, owner or times of a file whose
write-back is due anyway is kept for that write-back instead of sent
(``docs/specifications/mount-fs.md`` section 5); any other change is a
C{setattr} request, sent under the namespace lock
(L{svc.mount.core.namespace_lock}) once a pending file is created on the data
plane (L{svc.mount.ops.node_creation.NodeCreation.materialize}).
"""

from __future__ import annotations

import errno
from collections.abc import Awaitable, Callable

import attrs

from svc.audit.client_events import SetattrField
from svc.audit.events import CallerProcess
from svc.audit.names import EventName
from svc.mount.core.attributes import AttributeChanges, Attributes, FileKind
from svc.mount.core.errors import FSError
from svc.mount.core.file_size_limit import MAX_FILE_BYTES
from svc.mount.core.file_state import FileState
from svc.mount.core.fs_context import FSContext
from svc.mount.core.inodes import Node
from svc.mount.ops.node_creation import NodeCreation

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


class AttributeUpdates:
    """See the module docstring."""

    def __init__(self, context: FSContext, creation: NodeCreation, truncate: Truncate) -> None:
        """
        @param creation: creates a pending file on the data plane before a
            C{setattr} request about it is sent.
        @param truncate: changes a regular file's size.
        """
        self._ctx = context
        self._creation = creation
        self._truncate = truncate

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
                await self._creation.materialize(node)
                path = ctx.server_path(rel)
                node.set_attributes(
                    await ctx.await_write(
                        ctx.remote.setattr(path, changes, session_id=ctx.write_session())
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
