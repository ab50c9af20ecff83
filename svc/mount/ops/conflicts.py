"""
After a lost compare-and-swap that is not provably compatible
(``docs/specifications/mount-consistency.md`` section 3): this mount's
version is saved as a conflict copy beside the file (L{save_copy}), the
other writer's version becomes the open file's content (L{adopt}), and the
C{flush} line gets its C{recovery_*} fields (L{recovery_fields}).
"""

from __future__ import annotations

from twisted.logger import Logger

from svc.audit.events import ExtraValue
from svc.mount.core.attributes import FileKind
from svc.mount.core.errors import RemoteFailure
from svc.mount.core.extents import chunk_layout
from svc.mount.core.file_state import FileState
from svc.mount.core.fs_context import FSContext, join
from svc.mount.core.inodes import Node
from svc.mount.writeback.commit import CommitRequest, Conflict, conflict_name, entries
from svc.wire.errno import WireErrno

_log = Logger()

CONFLICT_COPY_ATTEMPTS = 5
"""Names tried for a conflict copy before giving up."""


def recovery_fields(
    extra: dict[str, ExtraValue | None], rel: str, copy: str | None, conflict: Conflict
) -> None:
    """The C{recovery_*} fields of the C{flush} line of a conflict, into C{extra}."""
    if copy is not None:
        action = (
            f"the other writer's version stays at /{rel}; yours was saved as /{copy}: "
            f"compare them, merge into /{rel}, then delete the copy"
        )
    else:
        action = (
            f"the other writer's version stays at /{rel}; yours could not be saved as a "
            "copy and stays only in the open file: save it elsewhere before closing"
        )
    writer = conflict.last_writer
    extra.update(
        recovery_kind=conflict.kind,
        recovery_suggested_action=action,
        recovery_your_version=conflict.your_version,
        recovery_current_version=conflict.current_version,
        recovery_last_writer_agent_id=writer.agent_id,
        recovery_last_writer_session_id=writer.session_id,
        recovery_last_writer_at_unix_ms=writer.at_unix_ms,
    )


async def save_copy(
    ctx: FSContext, node: Node, request: CommitRequest, session: str | None
) -> str | None:
    """
    Commit our content as a conflict copy beside the file, under a name
    free here and on the data plane (holding the namespace lock, commits in
    flight or not: L{svc.mount.core.namespace_lock}).
    """
    link = ctx.table.primary_name(node)
    if link is None:
        return None
    directory, name = link
    directory_rel = ctx.rel_of(directory)
    for attempt in range(CONFLICT_COPY_ATTEMPTS):
        copy_name = conflict_name(name, session, ctx.now(), attempt)
        copy_rel = join(directory_rel, copy_name)
        if ctx.table.child(directory, copy_name) is not None:
            continue  # taken here, perhaps by a new file not yet on the data plane
        if not ctx.policy.check(copy_rel, write=True).allowed:
            return None
        try:
            await ctx.remote.manifest_put(
                ctx.server_path(copy_rel),
                expected_version=0,
                chunks=entries(request.chunks),
                size=request.size,
                mode=request.mode,
                mtime_ns=request.mtime_ns,
                uid=request.uid,
                gid=request.gid,
                session_id=session,
            )
        except RemoteFailure as failure:
            if failure.wire in (WireErrno.ESTALE, WireErrno.EEXIST):
                continue
            _log.warn("could not save conflict copy {path}: {error}", path=copy_rel, error=failure)
            return None
        try:
            found = await ctx.remote.head_file(ctx.server_path(copy_rel))
        except RemoteFailure:
            directory.complete = False
        else:
            ctx.table.learn(directory, copy_name, found)
        directory.stale = True
        # The kernel may hold a negative entry for the name (mount-runtime.md section 2).
        ctx.invalidate_entry(directory.ino, copy_name.encode("utf-8", "surrogateescape"))
        return copy_rel
    return None


async def adopt(ctx: FSContext, node: Node, state: FileState, conflict: Conflict) -> None:
    """After a conflict: the other writer's version becomes the file's content."""
    current = conflict.current
    node.kernel_version = None
    if current is not None and current.attributes.kind is FileKind.FILE:
        base = chunk_layout([(c.hash, c.size) for c in current.chunks])
        if node.pending:
            ctx.table.bind(node, current.attributes)
        else:
            node.set_attributes(current.attributes)
        node.chunks = base
        node.chunks_version = current.attributes.version
        done = state.committed(current.attributes.version, base)
    else:
        link = ctx.table.primary_name(node)
        if link is not None:
            directory, name = link
            ctx.table.unlink(directory, name)
            directory.complete = False
            ctx.invalidate_entry(directory.ino, name.encode("utf-8"))
        done = state.committed(state.version, state.layout.base)
    ctx.invalidate(node.ino)
    if done is not None:
        await done
