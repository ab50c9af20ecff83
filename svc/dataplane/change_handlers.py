"""
The namespace changes (C{manifest_put}, C{manifest_delete}, C{dir_remove},
C{dir_create}, C{manifest_rename}, C{link}, C{setattr}, C{symlink},
C{mknod}), run by L{svc.dataplane.connection.AgentConnection} like every
operation (L{svc.dataplane.handlers}). Each gives way once its work is
queued in the tenant's database, so a connection's next change may start
and share its transaction (L{svc.dataplane.request_order},
``dataplane-ops.md`` section 7).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from twisted.internet.defer import Deferred

from svc.dataplane.calls import Call, Outcome, Release
from svc.dataplane.confinement import relative_to_disk
from svc.dataplane.errors import DiskRootProtected, missing_chunks
from svc.dataplane.interfaces import OpReply
from svc.dataplane.replies import Reply, attributes_map, put_map, rename_map
from svc.store.manifest_names import SubtreeMoveCheck
from svc.store.manifest_values import CreateResult, FileKind, RemoveResult, SetattrResult
from svc.wire.answers import RemoveReply
from svc.wire.contract import answer_map
from svc.wire.messages import (
    DirCreateRequest,
    ManifestPutRequest,
    MknodRequest,
    PathWriteRequest,
    SetattrRequest,
    SymlinkRequest,
    TwoPathRequest,
)

if TYPE_CHECKING:
    from svc.dataplane.connection import AgentConnection

T = TypeVar("T")


def _given_way(change: Deferred[T], release: Release) -> Deferred[T]:
    """
    C{change}, a namespace change the store has queued in the tenant's
    database before returning it: let the connection's next namespace change
    start (L{svc.dataplane.request_order}: consecutive changes share a
    transaction, each still answered after its own commit).
    """
    release()
    return change


def protect_root(conn: AgentConnection, *paths: str) -> None:
    """Refuse a change naming the agent's disk root itself."""
    if conn.root in paths:
        raise DiskRootProtected()


def count_journal(conn: AgentConnection, journal_op: str, seq: int | None) -> None:
    """Count a change that appended journal row C{seq} (none: nothing)."""
    if seq is not None:
        conn.metrics.count_journal_write(journal_op, conn.allocation)


async def manifest_put(
    conn: AgentConnection, call: Call, raw: memoryview, release: Release
) -> Outcome:
    request = call.request
    assert isinstance(request, ManifestPutRequest)
    for stored in call.inline_stored:
        refused = await stored  # the chunk's own line says why
        if refused is not None:
            raise refused
    storage = await conn.storage()
    hashes = list(dict.fromkeys(chunk.hash for chunk in request.chunks))
    visible = await conn.visible_of(storage, hashes)
    invisible = [h for h in hashes if h not in visible]
    if invisible:
        raise missing_chunks(invisible)
    result = await storage.manifest_put(
        request.path,
        expected_version=request.expected_version,
        chunks=request.chunks,
        size=request.size,
        mode=request.mode,
        mtime_ns=request.mtime_ns,
        uid=request.uid,
        gid=request.gid,
        writer=conn.writer(call, put_map),
        holder=conn.holder(),
        atime_ns=request.atime_ns,
        # Queued in the database: the connection's next put may start
        # (request_order: consecutive puts share a transaction).
        queued=release,
    )
    count_journal(conn, "put", result.journal_seq)
    return Outcome(OpReply(put_map(result)), size=result.size, extra={"version": result.version})


async def manifest_delete(
    conn: AgentConnection, call: Call, raw: memoryview, release: Release
) -> Outcome:
    request = call.request
    assert isinstance(request, PathWriteRequest)
    protect_root(conn, request.path)
    storage = await conn.storage()
    result = await _given_way(
        storage.manifest_delete(
            request.path, writer=conn.writer(call, removal_answer), holder=conn.holder()
        ),
        release,
    )
    count_journal(conn, "delete", result.journal_seq)
    return _removed(result)


async def dir_remove(
    conn: AgentConnection, call: Call, raw: memoryview, release: Release
) -> Outcome:
    request = call.request
    assert isinstance(request, PathWriteRequest)
    protect_root(conn, request.path)
    storage = await conn.storage()
    result = await _given_way(
        storage.dir_remove(request.path, writer=conn.writer(call, removal_answer)), release
    )
    count_journal(conn, "rmdir", result.journal_seq)
    return _removed(result)


def removal_answer(result: RemoveResult) -> Reply:
    """
    The answer to a removal: the parent directory's new mtime and ctime
    (``dataplane-ops.md``), so a client updates its copy without asking.
    """
    return answer_map(RemoveReply(result.changed_ns))


def created_answer(result: CreateResult | SetattrResult) -> Reply:
    """The answer to a change that made or changed one inode: its attributes."""
    return attributes_map(result.attributes)


def _removed(result: RemoveResult) -> Outcome:
    return Outcome(OpReply(removal_answer(result)))


async def dir_create(
    conn: AgentConnection, call: Call, raw: memoryview, release: Release
) -> Outcome:
    request = call.request
    assert isinstance(request, DirCreateRequest)
    storage = await conn.storage()
    result = await _given_way(
        storage.dir_create(
            request.path,
            mode=request.mode,
            uid=request.uid,
            gid=request.gid,
            writer=conn.writer(call, created_answer),
        ),
        release,
    )
    count_journal(conn, "mkdir", result.journal_seq)
    return Outcome(OpReply(created_answer(result)))


def _subtree_check(conn: AgentConnection) -> SubtreeMoveCheck | None:
    """
    The agent's path policy as the store asks it, inside a rename's
    transaction, before moving a directory (``path-policy.md`` section 5):
    L{None} to go on, or the policy's reason for refusing.
    """
    policy = conn.policy()
    if policy is None:
        return None
    agent_id = conn.agent_id

    def check(source: str, destination: str) -> str | None:
        decision = policy.check_subtree_move(
            relative_to_disk(source, agent_id), relative_to_disk(destination, agent_id)
        )
        return None if decision.reason is None else decision.reason.value

    return check


async def rename(conn: AgentConnection, call: Call, raw: memoryview, release: Release) -> Outcome:
    request = call.request
    assert isinstance(request, TwoPathRequest)
    protect_root(conn, request.path, request.to_path)
    storage = await conn.storage()
    result = await _given_way(
        storage.manifest_rename(
            request.path,
            request.to_path,
            writer=conn.writer(call, rename_map),
            subtree_check=_subtree_check(conn),
        ),
        release,
    )
    count_journal(conn, "rename", result.journal_seq)
    return Outcome(OpReply(rename_map(result)))


async def link(conn: AgentConnection, call: Call, raw: memoryview, release: Release) -> Outcome:
    request = call.request
    assert isinstance(request, TwoPathRequest)
    storage = await conn.storage()
    result = await _given_way(
        storage.link(request.path, request.to_path, writer=conn.writer(call, created_answer)),
        release,
    )
    count_journal(conn, "link", result.journal_seq)
    return Outcome(OpReply(created_answer(result)))


async def setattr(conn: AgentConnection, call: Call, raw: memoryview, release: Release) -> Outcome:
    request = call.request
    assert isinstance(request, SetattrRequest)
    storage = await conn.storage()
    result = await _given_way(
        storage.setattr(
            request.path, writer=conn.writer(call, created_answer), **request.changes()
        ),
        release,
    )
    count_journal(conn, "setattr", result.journal_seq)
    return Outcome(OpReply(created_answer(result)))


async def symlink(conn: AgentConnection, call: Call, raw: memoryview, release: Release) -> Outcome:
    request = call.request
    assert isinstance(request, SymlinkRequest)
    storage = await conn.storage()
    result = await _given_way(
        storage.symlink(
            request.path,
            request.target,
            uid=request.uid,
            gid=request.gid,
            writer=conn.writer(call, created_answer),
        ),
        release,
    )
    count_journal(conn, "symlink", result.journal_seq)
    return Outcome(OpReply(created_answer(result)))


async def mknod(conn: AgentConnection, call: Call, raw: memoryview, release: Release) -> Outcome:
    request = call.request
    assert isinstance(request, MknodRequest)
    storage = await conn.storage()
    result = await _given_way(
        storage.mknod(
            request.path,
            kind=FileKind(request.kind),
            mode=request.mode,
            rdev=request.rdev,
            uid=request.uid,
            gid=request.gid,
            writer=conn.writer(call, created_answer),
        ),
        release,
    )
    count_journal(conn, "mknod", result.journal_seq)
    return Outcome(OpReply(created_answer(result)))
