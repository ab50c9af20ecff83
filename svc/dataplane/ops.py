"""
The request schemas of the data-plane operations: each REQUEST payload map
parsed and validated into a frozen value, before anything else looks at it.

Rules (``docs/specifications/dataplane-ops.md``): keys the schema does not
name are ignored (forward compatibility; C{"op"} itself is one of them); an
optional key whose value is nil counts as absent; a missing required key, a
value of the wrong type or an array longer than its limit is
L{SchemaMismatch} (EPROTO); a value of the right type outside its range or
set is L{BadValue} (EINVAL). Paths are only type-checked here: confinement
and policy come next, in the service. Booleans are never accepted as
integers.

The response maps are built by L{svc.dataplane.replies}.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import attrs

from svc.dataplane.errors import BadValue, UnknownOp
from svc.dataplane.op_fields import (
    I64,
    MISSING,
    U32,
    check_int,
    chunk_hash_value,
    get_value,
    mode_value,
    optional_bool,
    optional_int,
    optional_list,
    optional_str,
    owner_values,
    require_int,
    require_list,
    require_str,
    session_value,
    type_error,
)
from svc.store.lease_values import LeaseMode
from svc.store.manifest_values import MAX_CHUNK_SIZE, ChunkRef, FileKind
from svc.wire.ops import REQUEST_OPS, Op

MAX_CHUNK_HAS = 4096
"""The most hashes one C{chunk_has} may probe."""

MAX_MANIFEST_CHUNKS = 12000
"""The most chunks one C{manifest_put} may name (12000 entries of 72 bytes
fit the default 1 MiB payload with room to spare)."""

MAX_INLINE_CHUNKS = 64
"""The most chunks one C{manifest_put} may carry in its raw segment (C{inline}),
and the most one C{manifest_get} reply carries."""

MAX_INLINE_BYTES = 1 << 20
"""The most bytes of chunks one C{manifest_put} may carry in its raw segment,
and the largest C{inline_max} of a C{manifest_get}."""

MAX_LIST_LIMIT = 1000
"""The most entries one C{list} answer holds (also the default)."""

MAX_JOURNAL_LIMIT = 100
"""The most rows one C{journal_query} answer holds (also the default)."""

MAX_LEASE_ID_LENGTH = 64
"""Longest C{lease_id} string accepted (a real one is 32)."""

MAX_SYMLINK_TARGET_BYTES = 4096
"""Longest symlink target in UTF-8 bytes."""

MKNOD_KINDS: Mapping[str, FileKind] = {
    kind.value: kind
    for kind in (
        FileKind.FILE,
        FileKind.FIFO,
        FileKind.CHAR_DEVICE,
        FileKind.BLOCK_DEVICE,
        FileKind.SOCKET,
    )
}
"""The C{kind} values C{mknod} accepts."""


# Requests.


@attrs.frozen
class PathUse:
    """
    One path a request carries and how it uses it: C{write} for a change,
    C{traverse} for a listing or stat (directories on the way to what the
    policy allows may be traversed).
    """

    path: str
    write: bool = False
    traverse: bool = False


@attrs.frozen
class ListRequest:
    """C{list}: one page of a directory's entries, by name after C{after}."""

    path: str
    after: str | None
    limit: int


@attrs.frozen
class HeadFileRequest:
    """C{head_file}: the attributes of one path (stat)."""

    path: str


@attrs.frozen
class ManifestGetRequest:
    """
    C{manifest_get}: attributes and chunk list of one path; C{inline_max}
    (0: none) is the largest file whose chunks the reply carries in its raw
    segment.
    """

    path: str
    inline_max: int = 0


@attrs.frozen
class ManifestPutRequest:
    """C{manifest_put}: compare-and-swap a regular file's content."""

    path: str
    expected_version: int
    chunks: tuple[ChunkRef, ...]
    size: int
    mode: int
    mtime_ns: int
    uid: int
    gid: int
    session_id: str | None
    atime_ns: int | None = None
    inline: tuple[ChunkRef, ...] = ()
    """Chunks of C{chunks} whose bytes the raw segment carries, in its order."""


@attrs.frozen
class PathWriteRequest:
    """C{manifest_delete}, C{dir_remove}: a change naming one path only."""

    path: str
    session_id: str | None


@attrs.frozen
class TwoPathRequest:
    """
    C{manifest_rename} (C{path} moved to C{to_path}) and C{link} (new name
    C{to_path} for the existing C{path}).
    """

    path: str
    to_path: str
    session_id: str | None


@attrs.frozen
class DirCreateRequest:
    """C{dir_create}: a new directory."""

    path: str
    mode: int
    uid: int
    gid: int
    session_id: str | None


@attrs.frozen
class SetattrRequest:
    """C{setattr}: change some attributes; absent ones stay."""

    path: str
    mode: int | None
    uid: int | None
    gid: int | None
    size: int | None
    mtime_ns: int | None
    atime_ns: int | None
    session_id: str | None

    def changes(self) -> dict[str, int | None]:
        """The attribute keyword arguments of L{TenantStorage.setattr}."""
        return {
            "mode": self.mode,
            "uid": self.uid,
            "gid": self.gid,
            "size": self.size,
            "mtime_ns": self.mtime_ns,
            "atime_ns": self.atime_ns,
        }


@attrs.frozen
class SymlinkRequest:
    """C{symlink}: a new symbolic link C{path} whose target is C{target}."""

    path: str
    target: str
    uid: int
    gid: int
    session_id: str | None


@attrs.frozen
class ReadlinkRequest:
    """C{readlink}: the target of a symbolic link."""

    path: str


@attrs.frozen
class MknodRequest:
    """C{mknod}: a new special file (or empty regular file)."""

    path: str
    kind: FileKind
    mode: int
    rdev: int
    uid: int
    gid: int
    session_id: str | None


@attrs.frozen
class ChunkGetRequest:
    """C{chunk_get}: one chunk's bytes."""

    hash: str


@attrs.frozen
class ChunkPutRequest:
    """C{chunk_put}: store the raw segment under C{hash}."""

    hash: str
    session_id: str | None


@attrs.frozen
class ChunkHasRequest:
    """C{chunk_has}: which of C{hashes} the agent may reference without upload."""

    hashes: tuple[str, ...]


@attrs.frozen
class JournalQueryRequest:
    """C{journal_query}: one page of the agent's own journal rows."""

    path: str | None
    below: bool
    since_ms: int | None
    until_ms: int | None
    cursor: int | None
    limit: int
    newest_first: bool


@attrs.frozen
class JournalRevertRequest:
    """C{journal_revert_path}: restore C{path} to its state before C{seq}."""

    path: str
    seq: int
    session_id: str | None


@attrs.frozen
class LeaseGrantRequest:
    """C{lease_grant}: a read or write lease on C{path}."""

    path: str
    mode: LeaseMode
    wait: bool
    session_id: str | None


@attrs.frozen
class LeaseIdRequest:
    """C{lease_refresh}, C{lease_release}: one of the connection's leases."""

    lease_id: str


@attrs.frozen
class EmptyRequest:
    """C{statfs}, C{ping}, C{close}: no arguments."""


Request = (
    ListRequest
    | HeadFileRequest
    | ManifestGetRequest
    | ManifestPutRequest
    | PathWriteRequest
    | TwoPathRequest
    | DirCreateRequest
    | SetattrRequest
    | SymlinkRequest
    | ReadlinkRequest
    | MknodRequest
    | ChunkGetRequest
    | ChunkPutRequest
    | ChunkHasRequest
    | JournalQueryRequest
    | JournalRevertRequest
    | LeaseGrantRequest
    | LeaseIdRequest
    | EmptyRequest
)


# Parsers.


def _parse_list(p: Mapping[str, object]) -> ListRequest:
    limit = optional_int(p, "limit", 1, MAX_LIST_LIMIT, MAX_LIST_LIMIT)
    assert limit is not None
    return ListRequest(require_str(p, "path"), optional_str(p, "after", 4096), limit)


def _parse_chunks(p: Mapping[str, object]) -> tuple[ChunkRef, ...]:
    chunks = []
    for index, item in enumerate(require_list(p, "chunks", MAX_MANIFEST_CHUNKS)):
        key = f"chunks[{index}]"
        if not isinstance(item, list | tuple) or len(item) != 2:
            raise type_error(key, "a [hash, size] array", item)
        chunk_hash = chunk_hash_value(key + "[0]", item[0])
        size = check_int(key + "[1]", item[1], 1, MAX_CHUNK_SIZE)
        chunks.append(ChunkRef(chunk_hash, size))
    return tuple(chunks)


def _parse_inline(p: Mapping[str, object], chunks: tuple[ChunkRef, ...]) -> tuple[ChunkRef, ...]:
    sizes = {chunk.hash: chunk.size for chunk in chunks}
    inline: dict[str, ChunkRef] = {}
    for index, item in enumerate(optional_list(p, "inline", MAX_INLINE_CHUNKS)):
        chunk_hash = chunk_hash_value(f"inline[{index}]", item)
        if chunk_hash not in sizes:
            raise BadValue(f"inline[{index}] is not one of the chunks")
        if chunk_hash in inline:
            raise BadValue(f"inline[{index}] repeats a chunk")
        inline[chunk_hash] = ChunkRef(chunk_hash, sizes[chunk_hash])
    if sum(chunk.size for chunk in inline.values()) > MAX_INLINE_BYTES:
        raise BadValue(f"inline chunks exceed {MAX_INLINE_BYTES} bytes")
    return tuple(inline.values())


def _parse_manifest_put(p: Mapping[str, object]) -> ManifestPutRequest:
    path = require_str(p, "path")
    uid, gid = owner_values(p)
    mode = mode_value(p)
    assert mode is not None
    chunks = _parse_chunks(p)
    return ManifestPutRequest(
        path=path,
        expected_version=require_int(p, "expected_version", 0, I64),
        chunks=chunks,
        size=require_int(p, "size", 0, I64),
        mode=mode,
        mtime_ns=require_int(p, "mtime_ns", -I64, I64),
        uid=uid,
        gid=gid,
        session_id=session_value(p),
        atime_ns=optional_int(p, "atime_ns", -I64, I64),
        inline=_parse_inline(p, chunks),
    )


def _parse_dir_create(p: Mapping[str, object]) -> DirCreateRequest:
    path = require_str(p, "path")
    mode = mode_value(p)
    assert mode is not None
    uid, gid = owner_values(p)
    return DirCreateRequest(path, mode, uid, gid, session_value(p))


def _parse_setattr(p: Mapping[str, object]) -> SetattrRequest:
    return SetattrRequest(
        path=require_str(p, "path"),
        mode=mode_value(p, required=False),
        uid=optional_int(p, "uid", 0, U32),
        gid=optional_int(p, "gid", 0, U32),
        size=optional_int(p, "size", 0, I64),
        mtime_ns=optional_int(p, "mtime_ns", -I64, I64),
        atime_ns=optional_int(p, "atime_ns", -I64, I64),
        session_id=session_value(p),
    )


def _parse_symlink(p: Mapping[str, object]) -> SymlinkRequest:
    path = require_str(p, "path")
    target = require_str(p, "target")
    if not target or len(target.encode("utf-8", "surrogatepass")) > MAX_SYMLINK_TARGET_BYTES:
        raise BadValue(f"'target' must be 1 to {MAX_SYMLINK_TARGET_BYTES} bytes")
    uid, gid = owner_values(p)
    return SymlinkRequest(path, target, uid, gid, session_value(p))


def _parse_mknod(p: Mapping[str, object]) -> MknodRequest:
    path = require_str(p, "path")
    kind_name = require_str(p, "kind")
    kind = MKNOD_KINDS.get(kind_name)
    if kind is None:
        raise BadValue(f"'kind' must be one of {', '.join(MKNOD_KINDS)}")
    mode = mode_value(p)
    assert mode is not None
    rdev = optional_int(p, "rdev", 0, I64, 0)
    assert rdev is not None
    uid, gid = owner_values(p)
    return MknodRequest(path, kind, mode, rdev, uid, gid, session_value(p))


def _parse_chunk_has(p: Mapping[str, object]) -> ChunkHasRequest:
    items = require_list(p, "hashes", MAX_CHUNK_HAS)
    return ChunkHasRequest(tuple(chunk_hash_value(f"hashes[{i}]", h) for i, h in enumerate(items)))


def _parse_journal_query(p: Mapping[str, object]) -> JournalQueryRequest:
    path = get_value(p, "path", False)
    if path is not MISSING and not isinstance(path, str):
        raise type_error("path", "a string", path)
    limit = optional_int(p, "limit", 1, MAX_JOURNAL_LIMIT, MAX_JOURNAL_LIMIT)
    assert limit is not None
    return JournalQueryRequest(
        path=None if path is MISSING else str(path),
        below=optional_bool(p, "below", True),
        since_ms=optional_int(p, "since_ms", 0, I64),
        until_ms=optional_int(p, "until_ms", 0, I64),
        cursor=optional_int(p, "cursor", 0, I64),
        limit=limit,
        newest_first=optional_bool(p, "newest_first", False),
    )


def _parse_lease_grant(p: Mapping[str, object]) -> LeaseGrantRequest:
    path = require_str(p, "path")
    mode_name = require_str(p, "mode")
    try:
        mode = LeaseMode(mode_name)
    except ValueError:
        raise BadValue("'mode' must be 'read' or 'write'") from None
    return LeaseGrantRequest(path, mode, optional_bool(p, "wait", False), session_value(p))


def _parse_lease_id(p: Mapping[str, object]) -> LeaseIdRequest:
    lease_id = require_str(p, "lease_id")
    if len(lease_id) > MAX_LEASE_ID_LENGTH:
        raise BadValue(f"'lease_id' longer than {MAX_LEASE_ID_LENGTH} characters")
    return LeaseIdRequest(lease_id)


def _chunk_hash(p: Mapping[str, object]) -> str:
    return chunk_hash_value("hash", get_value(p, "hash", True))


def _two_paths(p: Mapping[str, object]) -> TwoPathRequest:
    return TwoPathRequest(require_str(p, "path"), require_str(p, "to_path"), session_value(p))


def _path_write(p: Mapping[str, object]) -> PathWriteRequest:
    return PathWriteRequest(require_str(p, "path"), session_value(p))


_PARSERS: Mapping[Op, Callable[[Mapping[str, object]], Request]] = {
    Op.LIST: _parse_list,
    Op.HEAD_FILE: lambda p: HeadFileRequest(require_str(p, "path")),
    Op.MANIFEST_GET: lambda p: ManifestGetRequest(
        require_str(p, "path"), optional_int(p, "inline_max", 0, MAX_INLINE_BYTES, 0) or 0
    ),
    Op.MANIFEST_PUT: _parse_manifest_put,
    Op.MANIFEST_DELETE: _path_write,
    Op.MANIFEST_RENAME: _two_paths,
    Op.DIR_CREATE: _parse_dir_create,
    Op.DIR_REMOVE: _path_write,
    Op.SETATTR: _parse_setattr,
    Op.SYMLINK: _parse_symlink,
    Op.READLINK: lambda p: ReadlinkRequest(require_str(p, "path")),
    Op.MKNOD: _parse_mknod,
    Op.LINK: _two_paths,
    Op.STATFS: lambda p: EmptyRequest(),
    Op.CHUNK_GET: lambda p: ChunkGetRequest(_chunk_hash(p)),
    Op.CHUNK_PUT: lambda p: ChunkPutRequest(_chunk_hash(p), session_value(p)),
    Op.CHUNK_HAS: _parse_chunk_has,
    Op.JOURNAL_QUERY: _parse_journal_query,
    Op.JOURNAL_REVERT_PATH: lambda p: JournalRevertRequest(
        require_str(p, "path"), require_int(p, "seq", 1, I64), session_value(p)
    ),
    Op.LEASE_GRANT: _parse_lease_grant,
    Op.LEASE_REFRESH: _parse_lease_id,
    Op.LEASE_RELEASE: _parse_lease_id,
    Op.PING: lambda p: EmptyRequest(),
    Op.CLOSE: lambda p: EmptyRequest(),
}


def request_op(name: object) -> Op:
    """
    The L{Op} a client sent, or L{UnknownOp} (ENOSYS) for a name that is not
    a request operation (push names included).
    """
    if isinstance(name, str) and name in REQUEST_OPS:
        return Op(name)
    raise UnknownOp(name if isinstance(name, str) else repr(name))


def parse_request(op: Op, payload: Mapping[str, object]) -> Request:
    """
    The validated request of C{op} in C{payload}.

    @raise SchemaMismatch: EPROTO, see the module docstring.
    @raise BadValue: EINVAL, see the module docstring.
    """
    return _PARSERS[op](payload)


WRITE_OPS = frozenset(
    {
        Op.MANIFEST_PUT,
        Op.MANIFEST_DELETE,
        Op.MANIFEST_RENAME,
        Op.DIR_CREATE,
        Op.DIR_REMOVE,
        Op.SETATTR,
        Op.SYMLINK,
        Op.MKNOD,
        Op.LINK,
        Op.CHUNK_PUT,
        Op.JOURNAL_REVERT_PATH,
    }
)
"""Operations that change the tenant's data (C{readonly} refuses them)."""


def path_uses(op: Op, request: Request) -> tuple[PathUse, ...]:
    """
    Every path C{request} carries, each with its kind of access; chunk,
    lease-id and connection operations carry none.
    """
    write = op in WRITE_OPS
    if isinstance(request, TwoPathRequest):
        # A link's existing name is only read, but must not be denied either:
        # linking it elsewhere would expose it under another name.
        return (
            PathUse(request.path, write=op is Op.MANIFEST_RENAME),
            PathUse(request.to_path, True),
        )
    if isinstance(request, ListRequest | HeadFileRequest):
        return (PathUse(request.path, traverse=True),)
    if isinstance(request, JournalQueryRequest):
        return () if request.path is None else (PathUse(request.path),)
    path = getattr(request, "path", None)
    if isinstance(path, str):
        return (PathUse(path, write=write),)
    return ()


def first_path(request: Request) -> str | None:
    """The path an audit line names for C{request} (the source of two)."""
    path = getattr(request, "path", None)
    return path if isinstance(path, str) else None


def session_of(request: Request) -> str | None:
    """The C{session_id} a request carries, if any."""
    session = getattr(request, "session_id", None)
    return session if isinstance(session, str) else None
