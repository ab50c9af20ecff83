"""
Typed data-plane operations for the mount client.

L{Remote} has one method per operation of
``docs/specifications/dataplane-ops.md``, returning frozen values, over one
connection's C{call(op, payload, raw)} seam
(L{svc.mount.remote.remote_calls.IDataPlaneCaller}). Its requests, and the one
translation of their failures into L{RemoteFailure}, are
L{svc.mount.remote.remote_calls}; its namespace changes, each recorded first in
the outbox, are L{svc.mount.remote.remote_changes}; the reads, commits
(C{manifest_put}), chunks and leases are here.

The reply values are in L{svc.mount.remote.remote_values} (re-exported here).
L{DirectChunkSource} is the simplest L{IChunkSource}: every fetch is a
verified C{chunk_get}.
"""

from __future__ import annotations

import errno
from collections.abc import Awaitable, Iterable, Sequence
from typing import Protocol, TypeVar

from twisted.internet.defer import Deferred, fail

from svc.chunking import chunk_hash
from svc.dataplane_client.client import Reply
from svc.mount.core.attributes import Attributes
from svc.mount.core.errors import RemoteFailure
from svc.mount.remote.remote_changes import NamespaceChanges
from svc.mount.remote.remote_values import (
    BadReply,
    ChunkEntry,
    DiskUsage,
    LastWriter,
    LeaseAnswer,
    ListedEntry,
    ListPage,
    Manifest,
    PutResult,
    RenameResult,
    attributes_of,
    disk_usage_of,
    inline_chunks,
    lease_answer_of,
    listed_entries,
)
from svc.wire.answers import ChunkHasReply, ListReply, ManifestReply, PutReply
from svc.wire.kinds import FieldRefused, OutboxTag
from svc.wire.messages import (
    MAX_CHUNK_HAS,
    MAX_INLINE_CHUNKS,
    MAX_LIST_LIMIT,
    MAX_MANIFEST_CHUNKS,
    ChunkGetRequest,
    ChunkHasRequest,
    ChunkPutRequest,
    EmptyRequest,
    LeaseGrantRequest,
    LeaseIdRequest,
    ListRequest,
    ManifestGetRequest,
    ManifestPutRequest,
    PathRequest,
)
from svc.wire.ops import Op

T = TypeVar("T")

__all__ = [
    "CHUNK_HAS_LIMIT",
    "INLINE_CHUNK_LIMIT",
    "LIST_PAGE_LIMIT",
    "MANIFEST_CHUNK_LIMIT",
    "ChunkEntry",
    "DirectChunkSource",
    "DiskUsage",
    "IChunkSource",
    "LastWriter",
    "LeaseAnswer",
    "ListPage",
    "ListedEntry",
    "Manifest",
    "PutResult",
    "Remote",
    "RenameResult",
    "gather",
]

CHUNK_HAS_LIMIT = MAX_CHUNK_HAS
"""Hashes per C{chunk_has} request."""

MANIFEST_CHUNK_LIMIT = MAX_MANIFEST_CHUNKS
"""Chunks per C{manifest_put}."""

INLINE_CHUNK_LIMIT = MAX_INLINE_CHUNKS
"""Chunks one C{manifest_put} may carry in its raw segment (C{inline})."""

LIST_PAGE_LIMIT = MAX_LIST_LIMIT
"""Entries per C{list} page."""


class IChunkSource(Protocol):
    """
    Where the filesystem core gets chunk bytes (the chunk cache in
    production): C{fetch} fires with bytes that hash to C{chunk_hash}
    (verified by the source) or fails; C{put} offers bytes just uploaded, so
    reading them back after a flush needs no download.
    """

    def fetch(self, chunk_hash: str, /) -> Deferred[bytes]:
        """The bytes of chunk C{chunk_hash}."""

    def put(self, chunk_hash: str, data: bytes | memoryview, /) -> object:
        """Remember C{data} as chunk C{chunk_hash} (best effort)."""

    def holds(self, chunk_hash: str, /) -> bool:
        """Whether a C{fetch} of C{chunk_hash} would most likely need no download."""


class Remote(NamespaceChanges):
    """
    The data-plane operations over one
    L{svc.mount.remote.remote_calls.IDataPlaneCaller}: the namespace changes
    (L{NamespaceChanges}, each recorded first with C{recorder=outbox}) and
    the reads, commits, chunks and leases here. Every method returns a
    L{Deferred}; every failure is a L{RemoteFailure}
    (L{svc.mount.remote.remote_calls}).
    """

    # Reads

    def list_dir(
        self,
        path: str,
        after: str | None = None,
        limit: int | None = None,
        *,
        chunks: bool = False,
        inline_max: int = 0,
    ) -> Deferred[ListPage]:
        """
        One page of directory C{path}, names after C{after}; with C{chunks},
        files' entries carry their chunk lists, and with C{inline_max} too,
        files of at most that many bytes their chunks' bytes (from a server
        that knows them: ``dataplane-ops.md``, C{list}).
        """
        request = ListRequest(
            path,
            after,
            MAX_LIST_LIMIT if limit is None else limit,
            chunks=chunks,
            inline_max=inline_max,
        )

        def parse(answer: ListReply, reply: Reply) -> ListPage:
            return ListPage(listed_entries(answer.entries, bytes(reply.raw)), answer.next_after)

        return self._call(Op.LIST, request, parse)

    def head_file(self, path: str) -> Deferred[Attributes]:
        """The attributes of C{path}."""
        return self._call(Op.HEAD_FILE, PathRequest(path), lambda answer, _: attributes_of(answer))

    def manifest_get(self, path: str, *, inline_max: int = 0) -> Deferred[Manifest]:
        """
        The manifest of C{path}; with C{inline_max}, a file of at most that
        many bytes comes with its chunks' bytes (L{Manifest.inline}, from a
        server that knows C{inline_max}).
        """

        def parse(answer: ManifestReply, reply: Reply) -> Manifest:
            return Manifest(
                attributes_of(answer.attributes),
                answer.chunks,
                LastWriter(
                    answer.last_writer_agent_id,
                    answer.last_writer_session_id,
                    answer.last_writer_at_unix_ms,
                ),
                inline_chunks(answer.inline, answer.chunks, bytes(reply.raw)),
            )

        return self._call(Op.MANIFEST_GET, ManifestGetRequest(path, inline_max), parse)

    def readlink(self, path: str) -> Deferred[str]:
        """The target of symlink C{path}."""
        return self._call(Op.READLINK, PathRequest(path), lambda answer, _: answer.target)

    def statfs(self) -> Deferred[DiskUsage]:
        """The usage and limits of the agent's disk (the certificate's agent)."""
        return self._call(Op.STATFS, EmptyRequest(), lambda answer, _: disk_usage_of(answer))

    # Commits (the namespace changes are L{NamespaceChanges})

    def manifest_put(
        self,
        path: str,
        *,
        expected_version: int,
        chunks: Sequence[ChunkEntry],
        size: int,
        mode: int,
        mtime_ns: int,
        uid: int,
        gid: int,
        session_id: str | None,
        atime_ns: int | None = None,
        inline: Sequence[tuple[str, bytes | memoryview]] = (),
        outbox: OutboxTag | None = None,
    ) -> Deferred[PutResult]:
        """
        Commit C{chunks} at C{path} if its version is C{expected_version}
        (with its atime, when given). C{inline}: chunks of C{chunks} not
        uploaded yet, C{(hash, bytes)}, carried in the request's raw segment
        (``docs/specifications/dataplane-ops.md``, C{manifest_put}).
        C{outbox}: the outbox entry the put is (applied at most once).
        """
        try:
            request = ManifestPutRequest(
                path=path,
                expected_version=expected_version,
                chunks=tuple(ChunkEntry(chunk.hash, chunk.size) for chunk in chunks),
                size=size,
                mode=mode,
                mtime_ns=mtime_ns,
                uid=uid,
                gid=gid,
                session_id=session_id,
                atime_ns=atime_ns,
                inline=tuple(chunk_hash for chunk_hash, _ in inline),
                outbox=outbox,
            )
        except FieldRefused as error:
            return fail(RemoteFailure(errno.EINVAL, f"manifest_put: {error.message}"))
        raw = b"".join(data for _, data in inline) if inline else b""

        def parse(answer: PutReply, reply: Reply) -> PutResult:
            return PutResult(
                answer.version, answer.size, answer.created, answer.inode, answer.ctime_ns
            )

        return self._call(Op.MANIFEST_PUT, request, parse, raw=raw)

    # Chunks

    def chunk_get(self, chunk_hash: str) -> Deferred[bytes]:
        """The bytes of a chunk (verified by the server, not re-verified here)."""
        return self._call(Op.CHUNK_GET, ChunkGetRequest(chunk_hash), lambda _, r: bytes(r.raw))

    def chunk_has(self, hashes: Sequence[str]) -> Deferred[list[bool]]:
        """Which of C{hashes} (at most L{CHUNK_HAS_LIMIT}) are stored and visible."""

        def parse(answer: ChunkHasReply, reply: Reply) -> list[bool]:
            if len(answer.present) != len(hashes):
                raise BadReply("present does not answer every hash")
            return list(answer.present)

        return self._call(Op.CHUNK_HAS, ChunkHasRequest(tuple(hashes)), parse)

    def chunk_put(
        self, chunk_hash: str, data: bytes | memoryview, *, session_id: str | None
    ) -> Deferred[int]:
        """Upload a chunk; fires with its size."""
        request = ChunkPutRequest(chunk_hash, session_id)
        return self._call(Op.CHUNK_PUT, request, lambda answer, _: answer.size, raw=data)

    # Leases

    def lease_grant(
        self, path: str, mode: str, *, wait: bool = False, session_id: str | None = None
    ) -> Deferred[LeaseAnswer]:
        """Ask for a C{read} or C{write} lease on C{path}."""
        request = LeaseGrantRequest(path, mode, wait, session_id)
        return self._call(Op.LEASE_GRANT, request, lambda answer, _: lease_answer_of(answer))

    def lease_refresh(self, lease_id: str) -> Deferred[LeaseAnswer]:
        """Extend a lease."""
        request = LeaseIdRequest(lease_id)
        return self._call(Op.LEASE_REFRESH, request, lambda answer, _: lease_answer_of(answer))

    def lease_release(self, lease_id: str) -> Deferred[None]:
        """Give a lease up."""
        return self._call(Op.LEASE_RELEASE, LeaseIdRequest(lease_id), lambda _answer, _: None)


class DirectChunkSource:
    """
    An L{IChunkSource} without a cache: each fetch is a C{chunk_get} whose
    bytes are re-hashed (a mismatch is EIO). C{put} does nothing.
    """

    def __init__(self, remote: Remote) -> None:
        self._remote = remote

    def fetch(self, chunk_hash: str, /) -> Deferred[bytes]:
        async def fetching() -> bytes:
            data = await self._remote.chunk_get(chunk_hash)
            if _hash_of(data) != chunk_hash:
                raise RemoteFailure(errno.EIO, f"chunk {chunk_hash} failed verification")
            return data

        return Deferred.fromCoroutine(fetching())

    def put(self, chunk_hash: str, data: bytes | memoryview, /) -> None:
        return None

    def holds(self, chunk_hash: str, /) -> bool:
        return False


def _hash_of(data: bytes) -> str:
    return chunk_hash(data)


async def gather(awaitables: Iterable[Awaitable[T]]) -> list[T]:
    """
    Await every one of C{awaitables} (already started), in order; if one
    fails, the others are still awaited (their failures consumed) and the
    first failure is raised.
    """
    results: list[T] = []
    first: BaseException | None = None
    for awaitable in list(awaitables):
        try:
            results.append(await awaitable)
        except Exception as error:
            if first is None:
                first = error
    if first is not None:
        raise first
    return results
