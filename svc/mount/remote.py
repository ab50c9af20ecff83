"""
Typed data-plane operations for the mount client.

L{Remote} wraps one connection's C{call(op, payload, raw)} seam (a
L{svc.dataplane_client.client.DataPlaneClient}, or in tests a
L{svc.testing.local_connection.LocalConnection}) with one method per
operation of ``docs/specifications/dataplane-ops.md``, returning frozen
values. Failures are translated here, once, into L{RemoteFailure}: the
server's wire errno becomes the local errno of the same name; a request that
got no answer (connection lost, timeout, refused before sending) is EIO,
marked C{unknown} when it was sent and may have run. So is the server's
C{ETIMEDOUT} (the request may still run), with its own errno.
A reply that does not have the documented shape is EIO too.

The reply values are in L{svc.mount.remote_values} (re-exported here).
L{DirectChunkSource} is the simplest L{IChunkSource}: every fetch is a
verified C{chunk_get}.
"""

from __future__ import annotations

import errno
import stat
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from twisted.internet.defer import Deferred, fail
from twisted.logger import Logger
from twisted.python.failure import Failure

from svc.chunking import chunk_hash
from svc.dataplane_client.client import Reply
from svc.dataplane_client.errors import (
    CallTimedOut,
    DataPlaneError,
    OutcomeUnknown,
    RemoteError,
)
from svc.mount.attributes import AttributeChanges, Attributes, FileKind, type_bits
from svc.mount.errors import RemoteFailure, local_errno
from svc.mount.outbox.entries import (
    Entry,
    Link,
    Mkdir,
    Mknod,
    Owner,
    Rename,
    Rmdir,
    SetAttributes,
    Symlink,
    Unlink,
)
from svc.mount.outbox.requests import request_of
from svc.mount.remote_values import (
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
)
from svc.wire.answers import (
    ChunkHasReply,
    FileAttributes,
    ListReply,
    ManifestReply,
    PutReply,
    RemoveReply,
    RenameReply,
)
from svc.wire.commands import COMMANDS
from svc.wire.contract import decode_answer
from svc.wire.errno import WireErrno
from svc.wire.errors import CodecError
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
from svc.wire.schema import encode_message

T = TypeVar("T")

_log = Logger()

__all__ = [
    "CHUNK_HAS_LIMIT",
    "INLINE_CHUNK_LIMIT",
    "LIST_PAGE_LIMIT",
    "MANIFEST_CHUNK_LIMIT",
    "ChunkEntry",
    "DirectChunkSource",
    "DiskUsage",
    "IChunkSource",
    "IDataPlaneCaller",
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


E = TypeVar("E", bound=Entry)


class ChangeRecorder(Protocol):
    """Where changes are recorded before they are sent (L{svc.mount.outbox.outbox.Outbox})."""

    def append(
        self, make: Callable[[int], E], chunks: Mapping[str, bytes] = ..., *, send: bool = ...
    ) -> E:
        """Persist the entry C{make(seq)} builds."""

    def tag(self, entry: Entry) -> OutboxTag:
        """The C{outbox} field of C{entry}'s request."""

    def done(self, entry: Entry) -> None:
        """C{entry} was seen through."""


def _request_of(entry: Entry, tag: OutboxTag | None, session_id: str | None) -> tuple[Op, object]:
    """L{request_of}, a field the wire refuses being an C{EINVAL} failure."""
    try:
        return request_of(entry, tag, session_id)
    except FieldRefused as error:
        raise RemoteFailure(errno.EINVAL, f"{entry.op.value}: {error.message}") from None


class IDataPlaneCaller(Protocol):
    """The seam: one data-plane connection's request method."""

    def call(
        self,
        op: str,
        payload: Mapping[str, object],
        raw: bytes | memoryview = b"",
        *,
        timeout: float | None = None,
    ) -> Deferred[Reply]:
        """Send C{op}; fires with the L{Reply} or fails with a L{DataPlaneError}."""


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


def _dir_ctime(answer: RemoveReply, reply: Reply) -> int | None:
    """A removal's answer: the parent's new mtime and ctime, if the server says."""
    return answer.dir_ctime_ns


def _attributes(answer: FileAttributes, reply: Reply) -> Attributes:
    return attributes_of(answer)


def _may_have_run(error: Exception) -> bool:
    """Whether the request that failed with C{error} was sent and may have run."""
    if isinstance(error, CallTimedOut):
        return error.sent
    return isinstance(error, OutcomeUnknown)


class Remote:
    """
    The data-plane operations over one L{IDataPlaneCaller}; see the module
    docstring. Every method returns a L{Deferred}; every failure is a
    L{RemoteFailure}.
    """

    def __init__(
        self,
        caller: IDataPlaneCaller,
        *,
        timeout: float | None = None,
        recorder: ChangeRecorder | None = None,
    ) -> None:
        """
        @param recorder: where every namespace change (not a commit: the
            write-back records its own) is recorded before it is sent, and
            which tags it (the mount's outbox, ``mount-outbox.md`` section
            8); L{None}: nowhere, untagged.
        """
        self._caller = caller
        self._timeout = timeout
        self._recorder = recorder

    def _request(
        self,
        op: str,
        payload: Mapping[str, object],
        parse: Callable[[Reply], T],
        raw: bytes | memoryview = b"",
    ) -> Deferred[T]:
        # Callbacks, not a coroutine: every request of the mount comes
        # through here, and a coroutine's Deferred and resumption cost more
        # than the rest of this method.
        def translated(failure: Failure) -> Failure:
            error = failure.value
            if isinstance(error, RemoteError):
                raise RemoteFailure(
                    local_errno(error.errno),
                    f"{op}: {error.message}",
                    error.errno,
                    error.details,
                    # The server gave up waiting; a request that had started
                    # still runs to its end (dataplane-ops.md section 7).
                    unknown=error.errno is WireErrno.ETIMEDOUT,
                ) from None
            if isinstance(error, (DataPlaneError, CodecError)):
                raise RemoteFailure(
                    errno.EIO, f"{op}: {error}", unknown=_may_have_run(error)
                ) from None
            return failure

        def parsed(reply: Reply) -> T:
            try:
                return parse(reply)
            except FieldRefused as error:
                raise RemoteFailure(errno.EIO, f"{op}: unexpected reply: {error.message}") from None
            except (BadReply, ValueError, TypeError) as error:
                raise RemoteFailure(errno.EIO, f"{op}: unexpected reply: {error}") from None

        try:
            called = self._caller.call(op, payload, raw, timeout=self._timeout)
        except Exception:
            called = fail()
        return called.addCallbacks(parsed, translated)

    def _call(
        self,
        op: Op,
        request: object,
        parse: Callable[[Any, Reply], T],
        raw: bytes | memoryview = b"",
    ) -> Deferred[T]:
        """
        Send the declared C{request} of C{op} and decode its answer with the
        declared answer message, then C{parse(answer, reply)} it into the
        mount's value.
        """
        command = COMMANDS[op]

        def answered(reply: Reply) -> T:
            return parse(decode_answer(command, reply.payload), reply)

        return self._request(op.value, encode_message(request), answered, raw)

    # Reads

    def list_dir(
        self, path: str, after: str | None = None, limit: int | None = None
    ) -> Deferred[ListPage]:
        """One page of directory C{path}, names after C{after}."""
        request = ListRequest(path, after, MAX_LIST_LIMIT if limit is None else limit)

        def parse(answer: ListReply, reply: Reply) -> ListPage:
            listed = tuple(
                ListedEntry(entry.name, attributes_of(entry.attributes)) for entry in answer.entries
            )
            return ListPage(listed, answer.next_after)

        return self._call(Op.LIST, request, parse)

    def head_file(self, path: str) -> Deferred[Attributes]:
        """The attributes of C{path}."""
        return self._call(Op.HEAD_FILE, PathRequest(path), _attributes)

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

    # Writes (each takes the mount session)

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

    def manifest_delete(self, path: str, *, session_id: str | None) -> Deferred[int | None]:
        """
        Unlink the non-directory C{path}; the parent's new mtime and ctime
        (L{None} from a server that does not say).
        """
        return self._change(lambda seq: Unlink(seq, path), session_id, _dir_ctime)

    def rename(self, path: str, to_path: str, *, session_id: str | None) -> Deferred[RenameResult]:
        """Move C{path} to C{to_path} (C{manifest_rename})."""

        def parse(answer: RenameReply, reply: Reply) -> RenameResult:
            return RenameResult(answer.moved, answer.replaced, answer.dir_ctime_ns)

        return self._change(lambda seq: Rename(seq, path, to_path), session_id, parse)

    def dir_create(
        self, path: str, *, mode: int, uid: int, gid: int, session_id: str | None
    ) -> Deferred[Attributes]:
        """Create directory C{path}."""
        owner = Owner(mode, uid, gid)
        return self._change(lambda seq: Mkdir(seq, path, owner), session_id, _attributes)

    def dir_remove(self, path: str, *, session_id: str | None) -> Deferred[int | None]:
        """Remove the empty directory C{path}; as L{manifest_delete}."""
        return self._change(lambda seq: Rmdir(seq, path), session_id, _dir_ctime)

    def setattr(
        self, path: str, changes: AttributeChanges, *, session_id: str | None
    ) -> Deferred[Attributes]:
        """Change attributes of C{path} (C{size} only 0 or the current size)."""

        def make(seq: int) -> SetAttributes:
            return SetAttributes(
                seq,
                path,
                mode=changes.mode,
                uid=changes.uid,
                gid=changes.gid,
                atime_ns=changes.atime_ns,
                mtime_ns=changes.mtime_ns,
                size=changes.size,
            )

        return self._change(make, session_id, _attributes)

    def symlink(
        self, path: str, target: str, *, uid: int, gid: int, session_id: str | None
    ) -> Deferred[Attributes]:
        """Create symlink C{path} pointing at C{target}."""
        return self._change(
            lambda seq: Symlink(seq, path, target, uid, gid), session_id, _attributes
        )

    def mknod(
        self,
        path: str,
        *,
        kind: FileKind,
        mode: int,
        rdev: int,
        uid: int,
        gid: int,
        session_id: str | None,
    ) -> Deferred[Attributes]:
        """Create a non-directory, non-symlink node at C{path}."""
        owner = Owner(type_bits(kind) | stat.S_IMODE(mode), uid, gid)
        return self._change(lambda seq: Mknod(seq, path, owner, rdev), session_id, _attributes)

    def link(self, path: str, to_path: str, *, session_id: str | None) -> Deferred[Attributes]:
        """Add the name C{to_path} to the inode of C{path}."""
        return self._change(lambda seq: Link(seq, to_path, path), session_id, _attributes)

    def _change(
        self,
        make: Callable[[int], Entry],
        session_id: str | None,
        parse: Callable[[Any, Reply], T],
    ) -> Deferred[T]:
        """
        Send the change C{make(seq)} builds, recorded first in the outbox
        when there is one (L{ChangeRecorder}): tagged with its entry, which
        settles once the request is answered, refused or lost (a lost one's
        resend is a change of its own, L{svc.mount.unanswered}).
        """
        recorder = self._recorder
        if recorder is None:
            try:
                op, request = _request_of(make(0), None, session_id)
            except RemoteFailure as error:
                return fail(error)
            return self._call(op, request, parse)
        try:
            entry = recorder.append(make, send=False)
        except OSError as error:  # the cache disk (full, gone) or a stopped outbox
            name = make(0).op.value
            return fail(
                RemoteFailure(
                    error.errno or errno.EIO, f"{name}: recording it in the outbox: {error}"
                )
            )
        try:
            op, request = _request_of(entry, recorder.tag(entry), session_id)
        except RemoteFailure as error:
            recorder.done(entry)
            return fail(error)

        def settle(result: T | Failure) -> T | Failure:
            recorder.done(entry)
            return result

        return self._call(op, request, parse).addBoth(settle)

    def change(self, op: Op, request: object) -> Deferred[Any]:
        """
        Send the declared write C{request} of C{op} as it is (an outbox
        entry's, L{svc.mount.outbox.requests}); its decoded answer message.
        """
        return self._call(op, request, lambda answer, _: answer)

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
