"""
The data-plane operations themselves, one coroutine per op, run by
L{svc.dataplane.connection.AgentConnection} after it has parsed the request,
confined its paths, applied the path policy and verified its session.

Each returns an L{Outcome}: the reply and what the op's audit line carries.
Store errors propagate; the connection translates them once. The semantics
are specified in ``docs/specifications/dataplane-ops.md``. The namespace
changes are in L{svc.dataplane.change_handlers}, the chunk operations in
L{svc.dataplane.chunk_handlers}, C{list} in L{svc.dataplane.listing}.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING

from twisted.internet.defer import Deferred

from svc.dataplane import change_handlers as changes
from svc.dataplane.calls import (
    Call,
    Outcome,
    Release,
    empty_outcome,
    inline_for,
    inline_named,
    payload_size,
)
from svc.dataplane.change_handlers import count_journal, protect_root
from svc.dataplane.chunk_handlers import chunk_get, chunk_has, chunk_put
from svc.dataplane.confinement import relative_to_disk
from svc.dataplane.errors import (
    OpFailed,
    PolicyDenied,
)
from svc.dataplane.interfaces import OpReply
from svc.dataplane.listing import list_entries
from svc.dataplane.replies import (
    attributes_map,
    journal_page_map,
    lease_denied_map,
    lease_grant_map,
    manifest_map,
    revert_map,
    statfs_map,
)
from svc.policy import PathPolicy
from svc.store.journal import JournalQuery
from svc.store.journal_rows import JournalEntry
from svc.store.lease_values import LeaseGrant, LeaseMode, LeaseReason
from svc.store.manifest_values import (
    FileKind,
)
from svc.wire.answers import ReadlinkReply
from svc.wire.contract import answer_map
from svc.wire.errno import WireErrno
from svc.wire.messages import (
    JournalQueryRequest,
    JournalRevertRequest,
    LeaseGrantRequest,
    LeaseIdRequest,
    ManifestGetRequest,
    PathRequest,
)
from svc.wire.ops import Op

if TYPE_CHECKING:
    from svc.dataplane.connection import AgentConnection

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
    protect_root(conn, request.path)
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
    count_journal(conn, "revert", result.journal_seq)
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
    Op.MANIFEST_PUT: changes.manifest_put,
    Op.MANIFEST_DELETE: changes.manifest_delete,
    Op.MANIFEST_RENAME: changes.rename,
    Op.DIR_CREATE: changes.dir_create,
    Op.DIR_REMOVE: changes.dir_remove,
    Op.SETATTR: changes.setattr,
    Op.SYMLINK: changes.symlink,
    Op.READLINK: _readlink,
    Op.MKNOD: changes.mknod,
    Op.LINK: changes.link,
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
