"""
The data-plane operations themselves, one coroutine per op, run by
L{svc.dataplane.connection.AgentConnection} after it has parsed the request,
confined its paths, applied the path policy and verified its session.

Each returns an L{Outcome}: the reply and what the op's audit line carries.
Store errors propagate; the connection translates them once. The semantics
are specified in ``docs/specifications/dataplane-ops.md``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, TypeVar

from twisted.internet.defer import Deferred

from svc.dataplane.calls import (
    Call,
    Outcome,
    Release,
    empty_outcome,
    inline_for,
    inline_named,
    payload_size,
)
from svc.dataplane.chunk_handlers import chunk_get, chunk_has, chunk_put
from svc.dataplane.confinement import relative_to_disk
from svc.dataplane.errors import (
    DiskRootProtected,
    OpFailed,
    PolicyDenied,
    missing_chunks,
)
from svc.dataplane.interfaces import OpReply
from svc.dataplane.listing import list_entries
from svc.dataplane.replies import (
    Reply,
    attributes_map,
    journal_page_map,
    lease_denied_map,
    lease_grant_map,
    manifest_map,
    put_map,
    rename_map,
    revert_map,
    statfs_map,
)
from svc.policy import PathPolicy
from svc.store.journal import JournalQuery
from svc.store.journal_rows import JournalEntry
from svc.store.lease_values import LeaseGrant, LeaseMode, LeaseReason
from svc.store.manifest_names import SubtreeMoveCheck
from svc.store.manifest_values import (
    CreateResult,
    FileKind,
    RemoveResult,
    SetattrResult,
)
from svc.wire.answers import ReadlinkReply, RemoveReply
from svc.wire.contract import answer_map
from svc.wire.errno import WireErrno
from svc.wire.messages import (
    DirCreateRequest,
    JournalQueryRequest,
    JournalRevertRequest,
    LeaseGrantRequest,
    LeaseIdRequest,
    ManifestGetRequest,
    ManifestPutRequest,
    MknodRequest,
    PathRequest,
    PathWriteRequest,
    SetattrRequest,
    SymlinkRequest,
    TwoPathRequest,
)
from svc.wire.ops import Op

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


def _protect_root(conn: AgentConnection, *paths: str) -> None:
    if conn.root in paths:
        raise DiskRootProtected()


def _count_journal(conn: AgentConnection, journal_op: str, seq: int | None) -> None:
    if seq is not None:
        conn.metrics.count_journal_write(journal_op, conn.allocation)


# Namespace reads.


async def _head_file(
    conn: AgentConnection, call: Call, raw: memoryview, release: Release
) -> Outcome:
    request = call.request
    assert isinstance(request, PathRequest | ManifestGetRequest)
    storage = await conn.storage()
    manifest = await storage.manifest_get(request.path)
    policy = conn.policy()
    traversed = isinstance(request, PathRequest)
    if policy is not None and traversed and manifest.kind is not FileKind.DIRECTORY:
        decision = policy.check(relative_to_disk(request.path, conn.agent_id), write=False)
        if not decision.allowed:
            assert decision.reason is not None
            raise PolicyDenied(decision.reason.value)
    if isinstance(request, PathRequest):
        return Outcome(OpReply(attributes_map(manifest.attributes)), size=manifest.size)
    conn.visible.add(chunk.hash for chunk in manifest.chunks)
    reply = manifest_map(manifest)
    conn.metrics.count_bytes("out", Op.MANIFEST_GET.value, payload_size(reply))
    return Outcome(
        OpReply(reply),
        size=manifest.size,
        extra={"version": manifest.version},
        inline=inline_named(inline_for(request.inline_max, manifest.attributes, manifest.chunks)),
    )


async def _readlink(
    conn: AgentConnection, call: Call, raw: memoryview, release: Release
) -> Outcome:
    request = call.request
    assert isinstance(request, PathRequest)
    storage = await conn.storage()
    return Outcome(OpReply(answer_map(ReadlinkReply(await storage.readlink(request.path)))))


# Namespace writes.


async def _manifest_put(
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
    _count_journal(conn, "put", result.journal_seq)
    return Outcome(OpReply(put_map(result)), size=result.size, extra={"version": result.version})


async def _manifest_delete(
    conn: AgentConnection, call: Call, raw: memoryview, release: Release
) -> Outcome:
    request = call.request
    assert isinstance(request, PathWriteRequest)
    _protect_root(conn, request.path)
    storage = await conn.storage()
    result = await _given_way(
        storage.manifest_delete(
            request.path, writer=conn.writer(call, removal_answer), holder=conn.holder()
        ),
        release,
    )
    _count_journal(conn, "delete", result.journal_seq)
    return _removed(result)


async def _dir_remove(
    conn: AgentConnection, call: Call, raw: memoryview, release: Release
) -> Outcome:
    request = call.request
    assert isinstance(request, PathWriteRequest)
    _protect_root(conn, request.path)
    storage = await conn.storage()
    result = await _given_way(
        storage.dir_remove(request.path, writer=conn.writer(call, removal_answer)), release
    )
    _count_journal(conn, "rmdir", result.journal_seq)
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


async def _dir_create(
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
    _count_journal(conn, "mkdir", result.journal_seq)
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


async def _rename(conn: AgentConnection, call: Call, raw: memoryview, release: Release) -> Outcome:
    request = call.request
    assert isinstance(request, TwoPathRequest)
    _protect_root(conn, request.path, request.to_path)
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
    _count_journal(conn, "rename", result.journal_seq)
    return Outcome(OpReply(rename_map(result)))


async def _link(conn: AgentConnection, call: Call, raw: memoryview, release: Release) -> Outcome:
    request = call.request
    assert isinstance(request, TwoPathRequest)
    storage = await conn.storage()
    result = await _given_way(
        storage.link(request.path, request.to_path, writer=conn.writer(call, created_answer)),
        release,
    )
    _count_journal(conn, "link", result.journal_seq)
    return Outcome(OpReply(created_answer(result)))


async def _setattr(conn: AgentConnection, call: Call, raw: memoryview, release: Release) -> Outcome:
    request = call.request
    assert isinstance(request, SetattrRequest)
    storage = await conn.storage()
    result = await _given_way(
        storage.setattr(
            request.path, writer=conn.writer(call, created_answer), **request.changes()
        ),
        release,
    )
    _count_journal(conn, "setattr", result.journal_seq)
    return Outcome(OpReply(created_answer(result)))


async def _symlink(conn: AgentConnection, call: Call, raw: memoryview, release: Release) -> Outcome:
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
    _count_journal(conn, "symlink", result.journal_seq)
    return Outcome(OpReply(created_answer(result)))


async def _mknod(conn: AgentConnection, call: Call, raw: memoryview, release: Release) -> Outcome:
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
    _count_journal(conn, "mknod", result.journal_seq)
    return Outcome(OpReply(created_answer(result)))


# The disk.


async def _statfs(conn: AgentConnection, call: Call, raw: memoryview, release: Release) -> Outcome:
    # The agent is the certificate's: the request names none.
    storage = await conn.storage()
    usage = await storage.quota_usage(conn.agent_id)
    return Outcome(OpReply(statfs_map(usage)))


# Journal.


def _entry_readable(conn: AgentConnection, policy: PathPolicy | None, entry: JournalEntry) -> bool:
    if policy is None:
        return True
    for path in (entry.path, entry.to_path):
        if path is not None and path != conn.root:
            relative = relative_to_disk(path, conn.agent_id)
            if not policy.check(relative, write=False).allowed:
                return False
    return True


async def _journal_query(
    conn: AgentConnection, call: Call, raw: memoryview, release: Release
) -> Outcome:
    request = call.request
    assert isinstance(request, JournalQueryRequest)
    storage = await conn.storage()
    path = conn.root if request.path is None else request.path
    query = JournalQuery(
        path=path,
        below=True if request.path is None else request.below,
        since_ms=request.since_ms,
        until_ms=request.until_ms,
        cursor=request.cursor,
        limit=request.limit,
        newest_first=request.newest_first,
    )
    started = conn.now()
    page = await storage.journal_query(query)
    conn.metrics.observe_journal_query(conn.now() - started)
    policy = conn.policy()
    entries = [e for e in page.entries if _entry_readable(conn, policy, e)]
    return Outcome(OpReply(journal_page_map(entries, page.next_cursor)))


async def _journal_revert(
    conn: AgentConnection, call: Call, raw: memoryview, release: Release
) -> Outcome:
    request = call.request
    assert isinstance(request, JournalRevertRequest)
    _protect_root(conn, request.path)
    storage = await conn.storage()
    metrics = conn.metrics
    try:
        result = await storage.journal_revert(request.path, request.seq, writer=conn.writer(call))
    except Exception:
        metrics.count_journal_revert(conn.allocation, "error")
        raise
    metrics.count_journal_revert(
        conn.allocation, "noop" if result.journal_seq is None else "reverted"
    )
    _count_journal(conn, "revert", result.journal_seq)
    return Outcome(OpReply(revert_map(result)))


# Leases.


async def _lease_grant(
    conn: AgentConnection, call: Call, raw: memoryview, release: Release
) -> Outcome:
    request = call.request
    assert isinstance(request, LeaseGrantRequest)
    storage = await conn.storage()
    if conn.closing:
        raise OpFailed(WireErrno.EBADF, "connection closed")
    answer = storage.leases.grant(
        request.path, LeaseMode(request.mode), conn.holder(), request.wait
    )
    release()
    result = await answer
    if isinstance(result, LeaseGrant):
        return Outcome(OpReply(lease_grant_map(result, conn.now())))
    return Outcome(OpReply(lease_denied_map(result)))


async def _lease_refresh(
    conn: AgentConnection, call: Call, raw: memoryview, release: Release
) -> Outcome:
    request = call.request
    assert isinstance(request, LeaseIdRequest)
    storage = await conn.storage()
    answer = storage.leases.refresh(request.lease_id, conn.holder())
    release()
    return Outcome(OpReply(lease_grant_map(await answer, conn.now())))


async def _lease_release(
    conn: AgentConnection, call: Call, raw: memoryview, release: Release
) -> Outcome:
    request = call.request
    assert isinstance(request, LeaseIdRequest)
    storage = await conn.storage()
    done: Deferred[None] = storage.leases.release(
        request.lease_id, conn.holder(), LeaseReason.CLIENT
    )
    release()
    await done
    return empty_outcome()


# Connection.


async def _ping(conn: AgentConnection, call: Call, raw: memoryview, release: Release) -> Outcome:
    return empty_outcome()


async def _close(conn: AgentConnection, call: Call, raw: memoryview, release: Release) -> Outcome:
    storage = await conn.storage()
    await storage.leases.release_connection(conn.connection_id)
    return empty_outcome()


_HANDLERS: Mapping[Op, Callable[[AgentConnection, Call, memoryview, Release], Awaitable[Outcome]]]
_HANDLERS = {
    Op.LIST: list_entries,
    Op.HEAD_FILE: _head_file,
    Op.MANIFEST_GET: _head_file,
    Op.MANIFEST_PUT: _manifest_put,
    Op.MANIFEST_DELETE: _manifest_delete,
    Op.MANIFEST_RENAME: _rename,
    Op.DIR_CREATE: _dir_create,
    Op.DIR_REMOVE: _dir_remove,
    Op.SETATTR: _setattr,
    Op.SYMLINK: _symlink,
    Op.READLINK: _readlink,
    Op.MKNOD: _mknod,
    Op.LINK: _link,
    Op.STATFS: _statfs,
    Op.CHUNK_GET: chunk_get,
    Op.CHUNK_PUT: chunk_put,
    Op.CHUNK_HAS: chunk_has,
    Op.JOURNAL_QUERY: _journal_query,
    Op.JOURNAL_REVERT_PATH: _journal_revert,
    Op.LEASE_GRANT: _lease_grant,
    Op.LEASE_REFRESH: _lease_refresh,
    Op.LEASE_RELEASE: _lease_release,
    Op.PING: _ping,
    Op.CLOSE: _close,
}


async def perform(conn: AgentConnection, call: Call, raw: memoryview, release: Release) -> Outcome:
    """Run the checked request C{call} on C{conn}."""
    return await _HANDLERS[call.op](conn, call, raw, release)
