"""
The data-plane operations, each declared once (in the spirit of Twisted
AMP's C{Command}): its name, its request and answer messages
(L{svc.wire.messages}), what its raw segments carry, the errnos it may
answer (with the C{details} each carries), whether a client may send it
again when its outcome is unknown, and whether it writes. Both the server
(L{svc.dataplane}) and the client (L{svc.mount.remote.data_plane}) work from these;
``docs/specifications/wire.md`` section 7 and ``dataplane-ops.md`` are
checked against them (C{svc/wire/test/test_commands.py}).

The limits a request's decoding may use (L{RequestLimits}) are derived from
its message's declared fields: L{svc.wire.contract} refuses a payload
larger, wider or deeper than its operation could legitimately be before it
builds anything from it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping

import attrs

from svc.wire.answers import (
    ChangedPush,
    ChunkHasReply,
    ChunkReply,
    CredentialsRevokedPush,
    EmptyReply,
    FileAttributes,
    JournalPageReply,
    LeaseReply,
    LeaseRevokePush,
    ListReply,
    ManifestReply,
    MissingDetails,
    PutReply,
    ReadlinkReply,
    ReasonDetails,
    RemoveReply,
    RenameReply,
    RevertReply,
    SessionFencedPush,
    StaleDetails,
    StatfsReply,
)
from svc.wire.errno import WireErrno
from svc.wire.kinds import MAX_CHUNK_SIZE, Bound
from svc.wire.messages import (
    MAX_INLINE_BYTES,
    PATH,
    SESSION,
    ChunkGetRequest,
    ChunkHasRequest,
    ChunkPutRequest,
    DirCreateRequest,
    EmptyRequest,
    JournalQueryRequest,
    JournalRevertRequest,
    LeaseGrantRequest,
    LeaseIdRequest,
    ListRequest,
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
from svc.wire.schema import message_bound, message_fields, wire_keys

E = WireErrno


class Raw(enum.Enum):
    """What a frame's raw segment carries for an operation."""

    NONE = "none"
    """Nothing: a raw segment is refused (C{EPROTO})."""

    CHUNK = "chunk"
    """One chunk's bytes (1 to 16 MiB)."""

    INLINE = "inline"
    """
    The bytes of the chunks the map names in C{inline}, concatenated (at
    most 1 MiB); in a C{list} answer, those its entries name in theirs,
    entry after entry.
    """


RAW_LIMITS: Mapping[Raw, int] = {
    Raw.NONE: 0,
    Raw.CHUNK: MAX_CHUNK_SIZE,
    Raw.INLINE: MAX_INLINE_BYTES,
}
"""The largest raw segment of each use."""

UNKNOWN_KEYS = 16
"""Keys a request map may carry beyond its declared ones (newer clients' keys, ignored)."""

UNKNOWN_KEY_BYTES = 4096
"""Bytes of payload those extra keys and their values may take in all."""

OP_KEY_BYTES = 2 + 1 + 32
"""The C{op} key and its value (operation names are at most 32 bytes)."""

ANSWERED_BY_ANY = frozenset({E.EPROTO, E.EIO, E.EAGAIN, E.EBADF, E.ETIMEDOUT})
"""
What any request may be answered (a payload that does not fit, a server
failure, too many in flight, a closing connection, a request given up).
"""


@attrs.frozen
class RequestLimits:
    """
    What decoding one operation's request map may use: its encoded size,
    containers (arrays and maps), the longest array, the largest map, the
    longest string (any that fits the size: the fields judge their own
    strings) and the deepest nesting. Derived from the declared fields
    (L{svc.wire.schema.Bound}) plus room for L{UNKNOWN_KEYS} unknown keys of
    scalars.
    """

    payload: int
    containers: int
    width: int
    keys: int
    string: int
    depth: int
    declared: frozenset[str] = frozenset()
    """The top-level keys the message declares (and C{op})."""

    @classmethod
    def of(cls, message: type) -> RequestLimits:
        """The limits of a request map holding C{message} and C{op}."""
        bound: Bound = message_bound(message)
        return cls(
            payload=bound.size + OP_KEY_BYTES + UNKNOWN_KEY_BYTES,
            containers=bound.containers + UNKNOWN_KEYS,
            width=max(bound.width, UNKNOWN_KEYS),
            keys=bound.keys + 1 + UNKNOWN_KEYS,
            # A string is as long as the payload allows: its own field says
            # what is too long, with its own errno (ENAMETOOLONG for a path).
            string=bound.size + OP_KEY_BYTES + UNKNOWN_KEY_BYTES,
            depth=max(bound.depth, 2),
            declared=frozenset(wire_keys(message)) | {"op"},
        )


@attrs.frozen
class Command:
    """
    One operation of the protocol (build with L{declare}).

    @ivar op: its name (the C{op} key).
    @ivar request: the request message class.
    @ivar reply: the answer message class.
    @ivar errnos: every errno it may be answered with, L{ANSWERED_BY_ANY}
        and those its fields imply included.
    @ivar raw_request: what the request's raw segment carries.
    @ivar raw_reply: what the answer's raw segment carries.
    @ivar details: the C{details} message of an errno, where it has one.
    @ivar resendable: whether running it twice has the effect of running it
        once, so a client may send it again after an unknown outcome.
    @ivar writes: whether it changes the tenant's data (refused under
        C{readonly}; its C{session_id} is verified and recorded).
    @ivar limits: its request's decoding limits (derived from C{request}).
    """

    op: Op
    request: type
    reply: type
    errnos: frozenset[WireErrno]
    raw_request: Raw = Raw.NONE
    raw_reply: Raw = Raw.NONE
    details: Mapping[WireErrno, type] = attrs.field(factory=dict)
    resendable: bool = False
    writes: bool = False
    limits: RequestLimits = attrs.field(init=False)

    @limits.default
    def _limits(self) -> RequestLimits:
        return RequestLimits.of(self.request)

    @property
    def max_raw(self) -> int:
        """The largest raw segment its request may carry."""
        return RAW_LIMITS[self.raw_request]


def declare(
    op: Op,
    request: type,
    reply: type,
    errnos: Iterable[WireErrno] = (),
    *,
    raw_request: Raw = Raw.NONE,
    raw_reply: Raw = Raw.NONE,
    details: Mapping[WireErrno, type] | None = None,
    resendable: bool = False,
    writes: bool = False,
) -> Command:
    """
    The L{Command} C{op}, its errnos completed with what its fields imply:
    any field can be refused (C{EINVAL}); a path can be outside the agent's
    subtree, denied by the path policy (C{EACCES}, policy refusals with
    L{ReasonDetails}) or too long (C{ENAMETOOLONG}); a C{session_id} can be
    refused (C{EPERM} with L{ReasonDetails}); a write can be refused under
    C{readonly} (C{EACCES}).
    """
    kinds: list[object] = [spec.kind for _name, spec in message_fields(request)]
    implied: set[WireErrno] = set(ANSWERED_BY_ANY)
    found: dict[WireErrno, type] = {}
    if kinds:
        implied.add(E.EINVAL)
    if PATH in kinds or writes:
        found[E.EACCES] = ReasonDetails
    if PATH in kinds:
        implied.add(E.ENAMETOOLONG)
    if SESSION in kinds:
        found[E.EPERM] = ReasonDetails
    found.update(details or {})
    return Command(
        op,
        request,
        reply,
        frozenset(implied | set(errnos) | set(found)),
        raw_request,
        raw_reply,
        found,
        resendable,
        writes,
    )


@attrs.frozen
class Push:
    """One server push: its name and message."""

    op: Op
    message: type


_NAMESPACE = {E.ENOENT, E.ENOTDIR}
_CREATE = _NAMESPACE | {E.EEXIST, E.ENOSPC, E.EDQUOT}
_STALE = {E.ESTALE: StaleDetails}

COMMANDS: Mapping[Op, Command] = {
    command.op: command
    for command in (
        declare(Op.LIST, ListRequest, ListReply, _NAMESPACE, raw_reply=Raw.INLINE, resendable=True),
        declare(Op.HEAD_FILE, PathRequest, FileAttributes, _NAMESPACE, resendable=True),
        declare(
            Op.MANIFEST_GET,
            ManifestGetRequest,
            ManifestReply,
            _NAMESPACE,
            raw_reply=Raw.INLINE,
            resendable=True,
        ),
        declare(
            Op.MANIFEST_PUT,
            ManifestPutRequest,
            PutReply,
            _CREATE | {E.EISDIR, E.EINVAL, E.ESTALE},
            raw_request=Raw.INLINE,
            details={E.ESTALE: StaleDetails, E.EINVAL: MissingDetails},
            writes=True,
        ),
        declare(
            Op.MANIFEST_DELETE,
            PathWriteRequest,
            RemoveReply,
            _NAMESPACE | {E.EISDIR, E.ENOSPC},
            details=_STALE,
            writes=True,
        ),
        declare(
            Op.MANIFEST_RENAME,
            TwoPathRequest,
            RenameReply,
            _NAMESPACE | {E.EINVAL, E.EISDIR, E.ENOTEMPTY, E.EEXIST, E.EXDEV, E.ENOSPC},
            writes=True,
        ),
        declare(Op.DIR_CREATE, DirCreateRequest, FileAttributes, _CREATE, writes=True),
        declare(
            Op.DIR_REMOVE, PathWriteRequest, RemoveReply, _NAMESPACE | {E.ENOTEMPTY}, writes=True
        ),
        declare(
            Op.SETATTR,
            SetattrRequest,
            FileAttributes,
            _NAMESPACE | {E.EINVAL, E.EISDIR, E.ENOSPC, E.EDQUOT},
            writes=True,
        ),
        declare(Op.SYMLINK, SymlinkRequest, FileAttributes, _CREATE, writes=True),
        declare(Op.READLINK, PathRequest, ReadlinkReply, _NAMESPACE, resendable=True),
        declare(Op.MKNOD, MknodRequest, FileAttributes, _CREATE, writes=True),
        declare(
            Op.LINK, TwoPathRequest, FileAttributes, _CREATE | {E.EXDEV, E.EMLINK}, writes=True
        ),
        declare(Op.STATFS, EmptyRequest, StatfsReply, set(), resendable=True),
        declare(
            Op.CHUNK_GET,
            ChunkGetRequest,
            ChunkReply,
            {E.ENOENT},
            raw_reply=Raw.CHUNK,
            resendable=True,
        ),
        declare(
            Op.CHUNK_PUT,
            ChunkPutRequest,
            ChunkReply,
            {E.ENOSPC, E.EDQUOT},
            raw_request=Raw.CHUNK,
            resendable=True,
            writes=True,
        ),
        declare(Op.CHUNK_HAS, ChunkHasRequest, ChunkHasReply, set(), resendable=True),
        declare(
            Op.JOURNAL_QUERY, JournalQueryRequest, JournalPageReply, _NAMESPACE, resendable=True
        ),
        declare(
            Op.JOURNAL_REVERT_PATH,
            JournalRevertRequest,
            RevertReply,
            _CREATE | {E.ENOTEMPTY, E.EISDIR, E.ENODATA},
            details={E.ENODATA: MissingDetails},
            writes=True,
        ),
        declare(Op.LEASE_GRANT, LeaseGrantRequest, LeaseReply, set()),
        declare(Op.LEASE_REFRESH, LeaseIdRequest, LeaseReply, {E.ENOENT}),
        declare(Op.LEASE_RELEASE, LeaseIdRequest, EmptyReply, {E.ENOENT}),
        declare(Op.PING, EmptyRequest, EmptyReply, set(), resendable=True),
        declare(Op.CLOSE, EmptyRequest, EmptyReply, set()),
    )
}
"""Every request operation of protocol version 1, by name."""

PUSHES: Mapping[Op, Push] = {
    Op.LEASE_REVOKE: Push(Op.LEASE_REVOKE, LeaseRevokePush),
    Op.CHANGED: Push(Op.CHANGED, ChangedPush),
    Op.CREDENTIALS_REVOKED: Push(Op.CREDENTIALS_REVOKED, CredentialsRevokedPush),
    Op.SESSION_FENCED: Push(Op.SESSION_FENCED, SessionFencedPush),
}
"""Every push of protocol version 1, by name."""


BY_NAME: Mapping[str, Command] = {str(op): command for op, command in COMMANDS.items()}
"""L{COMMANDS} keyed by plain strings (what a received C{op} is)."""


def command_named(op: str) -> Command | None:
    """The command named C{op}, if it is one a client may send."""
    return BY_NAME.get(op)
