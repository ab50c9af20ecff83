"""
Write-back, part two: the compare-and-swap commit and what happens when it
is lost. The rule is specified in ``docs/specifications/mount-consistency.md``.

L{commit} sends C{manifest_put} with the version the open file was based on.
On C{ESTALE} it fetches the path's manifest again and:

 - retries with the current version when the change it lost to is
   I{provably compatible}: the current chunk list equals the base the edit
   was made on (only the version moved: a same-content write, a revert to
   the same bytes) or equals the new content itself (the same bytes are
   already there); a creation (expected version 0) has no base, so only
   the second case applies. At most C{max_retries} times (C{cas_retries});
 - otherwise reports a L{Conflict}: the caller keeps the other writer's
   version at the path and saves ours as a conflict copy
   (L{conflict_name}), never overwriting and never dropping either.

A put whose answer was lost with the connection (C{RemoteFailure.unknown})
is sent once more: if the first ran, the compare-and-swap refuses the
second, and a current version with exactly the committed content, size and
mtime is adopted as the commit (no second version is made). A put
recorded in the outbox carries its entry's tag (C{tag}): the data plane
answers it sent again with the answer the first sending got, which counts
as adopted too (the commit ran earlier).

On C{ESTALE} with C{details.reason} C{lease_conflict} (another connection
holds the path's write lease), C{wait_for_lease} is called once first: it
asks for the lease waiting in the path's queue, so the holder is asked to
yield (``mount-consistency.md`` section 6); the rule above then applies to
what the path holds once the lease is ours (or not had).

On C{EINVAL} with C{details.missing} (a chunk the server no longer shows
this connection, e.g. after a reconnect), the missing chunks are read back
from the content, uploaded, and the put retried once.

Neither retry happens once the file was renamed after the put was sent (a
rename handed off behind it, ``mount-consistency.md`` section 2.6): the
server ran that rename after the refused put, so the old path is no longer
the file's. The failure is raised instead; the file stays dirty, and its
next write-back commits (and resolves) at the name it has then.

The first C{manifest_put} is sent while the write-back's last uploads may
still be in flight on the same connection: the server runs it once they are
stored (``docs/specifications/dataplane-ops.md`` section 7), so the commit
costs no extra round trip. An upload that failed is the error reported
unless the put succeeded anyway. The chunks the uploader held back
(L{ChunkUploader.take_inline}) ride in the first put's raw segment; a server
that ignores them answers C{missing}, and they are uploaded as above.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable, Mapping, Sequence

import attrs
from blake3 import blake3
from twisted.internet.defer import Deferred

from svc.chunking import ChunkRef, chunk_hash
from svc.mount.core.attributes import NAME_MAX, FileKind
from svc.mount.core.errors import FSError, RemoteFailure
from svc.mount.remote.data_plane import ChunkEntry, LastWriter, Manifest, PutResult, Remote
from svc.mount.writeback.uploads import ChunkUploader, Reader
from svc.wire.errno import WireErrno
from svc.wire.kinds import OutboxTag

DEFAULT_MAX_CAS_RETRIES = 3
"""Compare-and-swap retries after provably compatible changes."""

CAS_CONFLICT = "cas_conflict"
"""C{recovery_kind}: another writer committed a different content."""

LEASE_CONFLICT = "lease_conflict"
"""C{recovery_kind}: another connection holds the path's write lease."""


@attrs.frozen
class CommitRequest:
    """What to commit where, and what the edit was based on."""

    path: str
    expected_version: int
    base: tuple[ChunkRef, ...]
    chunks: tuple[ChunkRef, ...]
    size: int
    mode: int
    mtime_ns: int
    uid: int
    gid: int
    atime_ns: int | None = None


@attrs.frozen
class Committed:
    """
    The content is committed as C{version} after C{cas_retries} retries;
    C{inode} is the file's data-plane inode number and C{ctime_ns} its new
    ctime, when the server said. C{adopted}: the version was found, not made
    now (a put whose answer was lost had run; rule 0 of the ESTALE rule).
    """

    version: int
    cas_retries: int
    inode: int | None = None
    ctime_ns: int | None = None
    adopted: bool = False


@attrs.frozen
class Conflict:
    """
    The compare-and-swap was lost to an incompatible change.

    @ivar current: the path's manifest now (L{None}: the path is gone).
    """

    kind: str
    your_version: int
    current_version: int
    last_writer: LastWriter
    cas_retries: int
    current: Manifest | None


def entries(chunks: Sequence[ChunkRef]) -> tuple[ChunkEntry, ...]:
    """A chunk list in the wire's C{(hash, size)} form."""
    return tuple(ChunkEntry(ref.hash, ref.length) for ref in chunks)


def _compatible(current: Manifest, request: CommitRequest) -> bool:
    if current.attributes.kind is not FileKind.FILE:
        return False
    if request.expected_version == 0:
        # A creation's base is "no file", which no existing file equals.
        return current.chunks == entries(request.chunks)
    return current.chunks in (entries(request.base), entries(request.chunks))


def _ours(current: Manifest, request: CommitRequest) -> bool:
    """Whether C{current} is what C{request} commits: its content, size and mtime."""
    found = current.attributes
    return (
        found.kind is FileKind.FILE
        and current.chunks == entries(request.chunks)
        and found.size == request.size
        and found.mtime_ns == request.mtime_ns
    )


def _int(details: Mapping[str, object], key: str) -> int | None:
    value = details.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(details: Mapping[str, object], key: str) -> str | None:
    value = details.get(key)
    return value if isinstance(value, str) and value else None


def _last_writer(details: Mapping[str, object], current: Manifest | None) -> LastWriter:
    agent = _text(details, "last_writer_agent_id")
    if agent is None and current is not None:
        return current.last_writer
    return LastWriter(
        agent, _text(details, "last_writer_session_id"), _int(details, "last_writer_at_unix_ms")
    )


async def commit(
    remote: Remote,
    request: CommitRequest,
    *,
    session_id: str | None,
    uploader: ChunkUploader,
    read: Reader,
    max_retries: int = DEFAULT_MAX_CAS_RETRIES,
    moved: Callable[[], bool] = lambda: False,
    wait_for_lease: Callable[[], Deferred[bool | None]] | None = None,
    tag: OutboxTag | None = None,
) -> Committed | Conflict:
    """
    Commit C{request}; see the module docstring. C{read} reads the new
    content (to re-upload chunks the server reports missing). The first
    C{manifest_put} is sent before waiting for C{uploader}'s uploads still
    in flight (L{ChunkUploader.settle}). C{moved()} says whether the file
    no longer has C{request.path} (then a refused put is not retried).
    C{wait_for_lease()} takes the path's write lease, waiting for its
    holder to yield, and fires whether it is held (L{None}: the wait was not
    answered; then the put's refusal is no verdict and the commit fails as
    if the connection had been lost, leaving the file's changes to a later
    write-back rather than to a conflict copy). C{tag}: the outbox entry
    recording the commit (every put carries it, so the data plane applies
    it at most once, and answers a put sent again with its first answer).

    @raise RemoteFailure: any other failure of the put.
    """
    expected = request.expected_version
    retries = 0
    reuploaded = False
    resent = False
    chunks = entries(request.chunks)
    inline = uploader.take_inline()

    def put(expected_version: int, inline: ChunkUploader.Inline = ()) -> Deferred[PutResult]:
        return remote.manifest_put(
            request.path,
            expected_version=expected_version,
            chunks=chunks,
            size=request.size,
            mode=request.mode,
            mtime_ns=request.mtime_ns,
            uid=request.uid,
            gid=request.gid,
            session_id=session_id,
            atime_ns=request.atime_ns,
            inline=inline,
            outbox=tag,
        )

    # The first put goes out behind the uploads still in flight (the server
    # runs it once they are stored); an upload that failed explains a put
    # refused for missing chunks, but a put that succeeded is committed.
    attempt = put(expected, inline)
    try:
        await uploader.settle()
    except RemoteFailure as upload_failure:
        try:
            result = await attempt
        except RemoteFailure:
            raise upload_failure from None
        uploader.inline_stored(inline)
        return Committed(result.version, retries, result.inode, result.ctime_ns)
    while True:
        try:
            result = await attempt
        except RemoteFailure as failure:
            if moved():
                raise  # renamed behind the put: its next write-back, at its new name
            if failure.unknown and not resent:
                # The answer was lost with the connection: sent again (on the
                # next one). If the first ran, the compare-and-swap refuses
                # this one, and the version found is ours (adopted below).
                resent = True
                attempt = put(expected, inline)
                continue
            missing = failure.details.get("missing")
            if failure.wire is WireErrno.EINVAL and isinstance(missing, list) and not reuploaded:
                reuploaded = True
                named = [name for name in missing if isinstance(name, str)]
                await _upload_missing(request, named, uploader, read)
                attempt = put(expected)
                continue
            if failure.wire is not WireErrno.ESTALE:
                raise
            wait_for_lease = await _lease_waited(failure, wait_for_lease, request.path)
            current = await _current(remote, request.path)
            if resent and current is not None and _ours(current, request):
                uploader.inline_stored(inline)
                found = current.attributes
                return Committed(
                    found.version, retries, found.server_inode, found.ctime_ns, adopted=True
                )
            if current is not None and retries < max_retries and _compatible(current, request):
                retries += 1
                expected = current.attributes.version
                attempt = put(expected)
                continue
            uploader.inline_stored(inline)  # refused on its version, not its chunks
            return _conflict(failure, current, request, retries)
        uploader.inline_stored(inline)
        # A tagged put sent again may be answered with the first sending's
        # answer (it ran before the connection was lost): made earlier.
        adopted = resent and tag is not None
        return Committed(result.version, retries, result.inode, result.ctime_ns, adopted=adopted)


async def _lease_waited(
    failure: RemoteFailure,
    wait_for_lease: Callable[[], Deferred[bool | None]] | None,
    path: str,
) -> Callable[[], Deferred[bool | None]] | None:
    """
    Wait for the write lease when C{failure} says another connection holds
    it; what is left to call next time (L{None} once called: only once).

    @raise RemoteFailure: (EIO, no errno from the data plane) the wait was
        not answered: whether the lease can be had is not known yet.
    """
    if wait_for_lease is None or failure.details.get("reason") != "lease_conflict":
        return wait_for_lease
    if await wait_for_lease() is None:
        raise RemoteFailure(
            errno.EIO, f"manifest_put {path}: the wait for its write lease got no answer"
        )
    return None


def _conflict(
    failure: RemoteFailure, current: Manifest | None, request: CommitRequest, retries: int
) -> Conflict:
    """The lost compare-and-swap C{failure} of C{request}, C{current} found at its path."""
    reason = failure.details.get("reason")
    current_version = _int(failure.details, "current_version")
    if current is not None:
        current_version = current.attributes.version
    return Conflict(
        kind=LEASE_CONFLICT if reason == "lease_conflict" else CAS_CONFLICT,
        your_version=request.expected_version,
        current_version=current_version or 0,
        last_writer=_last_writer(failure.details, current),
        cas_retries=retries,
        current=current,
    )


async def _current(remote: Remote, path: str) -> Manifest | None:
    try:
        return await remote.manifest_get(path)
    except RemoteFailure as failure:
        if failure.wire is WireErrno.ENOENT:
            return None
        raise


async def _upload_missing(
    request: CommitRequest, missing: list[str], uploader: ChunkUploader, read: Reader
) -> None:
    wanted = set(missing)
    for ref in request.chunks:
        if ref.hash not in wanted:
            continue
        wanted.discard(ref.hash)
        data = await read(ref.offset, ref.length)
        if chunk_hash(data) != ref.hash:
            raise FSError(errno.EIO, f"chunk {ref.hash} changed while being committed")
        await uploader.put(ref.hash, data)
    if wanted:
        raise FSError(errno.EIO, "the server reports chunks missing that the file does not name")


def conflict_name(name: str, session_id: str | None, now: float, attempt: int = 0) -> str:
    """
    The name of the conflict copy of C{name}:
    C{<name>.conflict-<session tag>-<UTC time>[-<attempt>]}, where the tag is
    the first 8 hex digits of BLAKE3(session id) (C{nosession} without one),
    the original name cut (at a character boundary) so the whole fits in
    L{NAME_MAX} UTF-8 bytes.
    """
    tag = blake3(session_id.encode()).hexdigest()[:8] if session_id else "nosession"
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    suffix = f".conflict-{tag}-{stamp}" + (f"-{attempt}" if attempt else "")
    budget = NAME_MAX - len(suffix.encode())
    encoded = name.encode("utf-8", "surrogateescape")
    if len(encoded) > budget:
        name = encoded[:budget].decode("utf-8", "ignore")
    return name + suffix
