"""
The audit event names of the service specification and the shape of each.

Pure data: which events exist, on which side (mount client or data-plane
server) each is written, and which optional fields each may carry. The
model in L{svc.audit.events} checks every line against these shapes, so no
code path can write a field the specification does not name for that event.
The line format is specified in ``docs/specifications/audit-log.md``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

import attrs

from svc.wire.ops import Op

SERVER_COMMAND = "svc-server"
"""The C{command} of every data-plane server line."""


class Origin(enum.Enum):
    """Which program writes a line (it decides the envelope)."""

    CLIENT = "client"
    SERVER = "server"


class EventName(enum.StrEnum):
    """Every audit event name of the specification."""

    # Mount client, Linux FUSE surface.
    LOOKUP = "lookup"
    OPENDIR = "opendir"
    READDIR_ENTRY = "readdir_entry"
    READDIRPLUS_ENTRY = "readdirplus_entry"
    OPEN = "open"
    READ = "read"
    CREATE = "create"
    MKDIR = "mkdir"
    UNLINK = "unlink"
    RMDIR = "rmdir"
    SYMLINK = "symlink"
    READLINK = "readlink"
    RENAME = "rename"
    LINK = "link"
    SETATTR = "setattr"
    FLUSH = "flush"
    LEASE_DENIED = "lease_denied"
    # Mount client cache and enrollment.
    CACHE_CORRUPT = "cache_corrupt"
    CACHE_EVICTED = "cache_evicted"
    ENROLLMENT = "enrollment"
    # Data-plane server operations (setattr, symlink, readlink, link above).
    LIST_ENTRIES = "list_entries"
    HEAD_FILE = "head_file"
    MANIFEST_GET = "manifest_get"
    MANIFEST_PUT = "manifest_put"
    MANIFEST_DELETE = "manifest_delete"
    MANIFEST_RENAME = "manifest_rename"
    DIR_CREATE = "dir_create"
    DIR_REMOVE = "dir_remove"
    MKNOD = "mknod"
    CHUNK_GET = "chunk_get"
    CHUNK_PUT = "chunk_put"
    CHUNK_HAS = "chunk_has"
    JOURNAL_QUERY = "journal_query"
    JOURNAL_REVERT_PATH = "journal_revert_path"
    # Per-agent path denials of list_entries and head_file (rule 2).
    LIST = "list"
    STAT = "stat"
    # Leases (reduced envelope).
    LEASE_GRANT = "lease_grant"
    LEASE_REFRESH = "lease_refresh"
    LEASE_RELEASE = "lease_release"
    LEASE_REVOKE = "lease_revoke"
    LEASE_VIOLATION = "lease_violation"
    # GC, purge and HTTP.
    GC_SWEPT_CHUNKS = "gc_swept_chunks"
    AGENT_DATA_PURGED = "agent_data_purged"
    HTTP_GET_AUDIT = "http_get_audit"
    HTTP_AUTH = "http_auth"


@attrs.frozen
class EventShape:
    """
    What one event on one side may carry beyond the fixed envelope.

    C{extras} maps each event-specific field to its JSON type (C{int},
    C{str} or C{bool}); C{size}, C{offset} and C{session_id} say whether those
    envelope fields may be non-null/present; C{path_empty} forces C{path} to
    be C{""}; C{allowed}, when not L{None}, is the only value the event may
    have; C{identity} says whether server certificate fields may appear and
    C{reduced} marks the lease envelope (C{agent_id} only, no tenant or cert
    fields); C{process} says whether client C{command}/C{agent_pid}/C{uid}/
    C{gid} may be set.
    """

    extras: Mapping[str, type] = attrs.field(factory=dict)
    size: bool = False
    offset: bool = False
    session_id: bool = False
    path_empty: bool = False
    allowed: bool | None = None
    identity: bool = True
    reduced: bool = False
    process: bool = True


_FLUSH_EXTRAS: Mapping[str, type] = {
    "chunks_new": int,
    "chunks_reused": int,
    "cas_retries": int,
    "version_new": int,
    "recovery_kind": str,
    "recovery_suggested_action": str,
    "recovery_your_version": int,
    "recovery_current_version": int,
    "recovery_last_writer_agent_id": str,
    "recovery_last_writer_session_id": str,
    "recovery_last_writer_at_unix_ms": int,
}

_CLIENT_WRITE = EventShape(session_id=True)

CLIENT_SHAPES: Mapping[str, EventShape] = {
    EventName.LOOKUP: EventShape(size=True),
    EventName.OPENDIR: EventShape(),
    EventName.READDIR_ENTRY: EventShape(size=True),
    EventName.READDIRPLUS_ENTRY: EventShape(size=True),
    EventName.OPEN: EventShape(size=True),
    EventName.READ: EventShape(size=True, offset=True),
    # size only on the macOS surface (size 0 instead of mode).
    EventName.CREATE: EventShape(extras={"mode": int}, size=True, session_id=True),
    EventName.MKDIR: EventShape(extras={"mode": int}, session_id=True),
    EventName.UNLINK: _CLIENT_WRITE,
    EventName.RMDIR: _CLIENT_WRITE,
    EventName.SYMLINK: _CLIENT_WRITE,
    EventName.READLINK: EventShape(),
    EventName.RENAME: EventShape(extras={"to_path": str}, session_id=True),
    EventName.LINK: EventShape(extras={"to_path": str}, session_id=True),
    EventName.SETATTR: EventShape(extras={"setattr_fields": int}, session_id=True),
    # offset only on the macOS write path.
    EventName.FLUSH: EventShape(extras=_FLUSH_EXTRAS, size=True, offset=True, session_id=True),
    EventName.LEASE_DENIED: EventShape(allowed=True),
    EventName.CACHE_CORRUPT: EventShape(size=True, allowed=False, process=False),
    EventName.CACHE_EVICTED: EventShape(
        extras={"chunks_reused": int, "reason": str},
        size=True,
        path_empty=True,
        allowed=True,
        process=False,
    ),
    EventName.ENROLLMENT: EventShape(process=False),
}
"""The events the mount client writes (C{identity} is ignored there)."""

_SERVER_WRITE = EventShape(session_id=True)
_LEASE = EventShape(
    extras={"lease_id": str, "mode": str, "reason": str}, allowed=True, reduced=True
)

SERVER_SHAPES: Mapping[str, EventShape] = {
    EventName.LIST_ENTRIES: EventShape(),
    EventName.HEAD_FILE: EventShape(size=True),
    EventName.MANIFEST_GET: EventShape(extras={"version": int}, size=True),
    EventName.MANIFEST_PUT: EventShape(extras={"version": int}, size=True, session_id=True),
    EventName.MANIFEST_DELETE: _SERVER_WRITE,
    EventName.MANIFEST_RENAME: _SERVER_WRITE,
    EventName.DIR_CREATE: _SERVER_WRITE,
    EventName.DIR_REMOVE: _SERVER_WRITE,
    EventName.SETATTR: _SERVER_WRITE,
    EventName.SYMLINK: _SERVER_WRITE,
    EventName.MKNOD: _SERVER_WRITE,
    EventName.LINK: _SERVER_WRITE,
    EventName.READLINK: EventShape(),
    EventName.CHUNK_GET: EventShape(extras={"hash": str}, size=True, path_empty=True),
    EventName.CHUNK_PUT: EventShape(
        extras={"hash": str}, size=True, session_id=True, path_empty=True
    ),
    EventName.CHUNK_HAS: EventShape(extras={"count": int}, path_empty=True),
    EventName.JOURNAL_QUERY: EventShape(path_empty=True),
    EventName.JOURNAL_REVERT_PATH: EventShape(path_empty=True),
    EventName.LIST: EventShape(allowed=False),
    EventName.STAT: EventShape(allowed=False),
    EventName.LEASE_GRANT: _LEASE,
    EventName.LEASE_REFRESH: _LEASE,
    EventName.LEASE_RELEASE: _LEASE,
    EventName.LEASE_REVOKE: _LEASE,
    EventName.LEASE_VIOLATION: _LEASE,
    EventName.GC_SWEPT_CHUNKS: EventShape(
        extras={"count": int, "bytes_freed": int, "dry_run": bool},
        path_empty=True,
        allowed=True,
    ),
    EventName.AGENT_DATA_PURGED: EventShape(
        extras={"count": int, "bytes_freed": int}, allowed=True
    ),
    EventName.HTTP_GET_AUDIT: EventShape(size=True),
    EventName.HTTP_AUTH: EventShape(allowed=False),
}
"""The events the data-plane server writes."""

LEASE_EVENTS = frozenset(
    {
        EventName.LEASE_GRANT,
        EventName.LEASE_REFRESH,
        EventName.LEASE_RELEASE,
        EventName.LEASE_REVOKE,
        EventName.LEASE_VIOLATION,
    }
)
"""The server lease events, written with the reduced envelope."""


def shape_of(origin: Origin, event: str) -> EventShape:
    """
    The shape of C{event} written by C{origin}; L{ValueError} when that side
    never writes that event.
    """
    shapes = CLIENT_SHAPES if origin is Origin.CLIENT else SERVER_SHAPES
    try:
        return shapes[event]
    except KeyError:
        raise ValueError(f"{origin.value} does not write audit event {event!r}") from None


_OP_EVENTS: Mapping[Op, EventName] = {
    Op.LIST: EventName.LIST_ENTRIES,
    Op.HEAD_FILE: EventName.HEAD_FILE,
    Op.MANIFEST_GET: EventName.MANIFEST_GET,
    Op.MANIFEST_PUT: EventName.MANIFEST_PUT,
    Op.MANIFEST_DELETE: EventName.MANIFEST_DELETE,
    Op.MANIFEST_RENAME: EventName.MANIFEST_RENAME,
    Op.DIR_CREATE: EventName.DIR_CREATE,
    Op.DIR_REMOVE: EventName.DIR_REMOVE,
    Op.SETATTR: EventName.SETATTR,
    Op.SYMLINK: EventName.SYMLINK,
    Op.READLINK: EventName.READLINK,
    Op.MKNOD: EventName.MKNOD,
    Op.LINK: EventName.LINK,
    Op.CHUNK_GET: EventName.CHUNK_GET,
    Op.CHUNK_PUT: EventName.CHUNK_PUT,
    Op.CHUNK_HAS: EventName.CHUNK_HAS,
    Op.JOURNAL_QUERY: EventName.JOURNAL_QUERY,
    Op.JOURNAL_REVERT_PATH: EventName.JOURNAL_REVERT_PATH,
}

_PATH_DENIAL_EVENTS: Mapping[EventName, EventName] = {
    EventName.LIST_ENTRIES: EventName.LIST,
    EventName.HEAD_FILE: EventName.STAT,
}


def event_for_op(op: Op) -> EventName:
    """
    The server event logged for a completed (or policy-denied) wire
    operation. Lease, C{ping} and C{close} operations have no per-operation
    line (leases log L{LEASE_EVENTS}); they raise L{ValueError}.
    """
    try:
        return _OP_EVENTS[op]
    except KeyError:
        raise ValueError(f"wire operation {op.value!r} has no audit event of its own") from None


def path_denial_event(event: str) -> EventName:
    """
    The event name of a per-agent path-confinement denial of C{event}
    (rule 2): C{list} for C{list_entries}, C{stat} for C{head_file}, the
    event itself otherwise.
    """
    name = EventName(event)
    return _PATH_DENIAL_EVENTS.get(name, name)


def path_denial_event_for_op(op: Op) -> EventName:
    """L{path_denial_event} of L{event_for_op}."""
    return path_denial_event(event_for_op(op))


ENVELOPE_FIELDS = (
    "ts",
    "event",
    "path",
    "allowed",
    "command",
    "size",
    "offset",
    "agent_pid",
    "uid",
    "gid",
    "agent_id",
    "tenant_id",
    "cert_serial",
    "cert_subject",
    "session_id",
)
"""Envelope field names in the order a line renders them."""

EXTRA_FIELDS = frozenset(
    name
    for shapes in (CLIENT_SHAPES, SERVER_SHAPES)
    for shape in shapes.values()
    for name in shape.extras
)
"""Every event-specific field name of any event."""
