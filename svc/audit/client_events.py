"""
Constructors for the mount-client lines whose fields need more than
L{svc.audit.events.client_event}: C{flush} with its chunk statistics and
C{recovery_*} conflict fields, C{setattr} with its bitmask, C{lease_denied},
and the cache and enrollment lines, which have no calling process.
"""

from __future__ import annotations

import enum
import re

import attrs

from svc.audit.events import AuditEvent, CallerProcess, client_event
from svc.audit.names import EventName, Origin

_HEX = re.compile(r"\A[0-9a-f]+\Z")


class SetattrField(enum.IntFlag):
    """The bits of C{setattr_fields}."""

    MODE = 0x01
    UID = 0x02
    GID = 0x04
    SIZE = 0x08
    MTIME = 0x10
    ATIME = 0x20


class EvictionReason(enum.StrEnum):
    """The C{reason} of a C{cache_evicted} line."""

    LOW_WATER = "low_water"
    HIGH_WATER = "high_water"


def _count(_i: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{attribute.name} must be a non-negative int, got {value!r}")


@attrs.frozen
class FlushStats:
    """What a successful flush sent: C{chunks_new}, C{chunks_reused},
    C{cas_retries} and the committed C{version_new}."""

    chunks_new: int = attrs.field(validator=_count)
    chunks_reused: int = attrs.field(validator=_count)
    cas_retries: int = attrs.field(validator=_count)
    version_new: int = attrs.field(validator=_count)


@attrs.frozen
class WriteConflict:
    """
    The C{recovery_*} fields of a flush that lost its compare-and-swap.
    The last writer's agent, session and time are included only when known.
    """

    kind: str
    suggested_action: str
    your_version: int = attrs.field(validator=_count)
    current_version: int = attrs.field(validator=_count)
    last_writer_agent_id: str | None = None
    last_writer_session_id: str | None = None
    last_writer_at_unix_ms: int | None = None


def flush_event(
    *,
    ts: float,
    path: str,
    caller: CallerProcess,
    size: int | None,
    allowed: bool = True,
    stats: FlushStats | None = None,
    conflict: WriteConflict | None = None,
    session_id: str | None = None,
    offset: int | None = None,
) -> AuditEvent:
    """
    A C{flush} line: C{size} bytes flushed, the chunk statistics when
    known, and the C{recovery_*} fields on a write conflict. C{offset} is
    for the macOS write path only.
    """
    return client_event(
        EventName.FLUSH,
        ts=ts,
        path=path,
        allowed=allowed,
        caller=caller,
        size=size,
        offset=offset,
        session_id=session_id,
        chunks_new=stats.chunks_new if stats else None,
        chunks_reused=stats.chunks_reused if stats else None,
        cas_retries=stats.cas_retries if stats else None,
        version_new=stats.version_new if stats else None,
        recovery_kind=conflict.kind if conflict else None,
        recovery_suggested_action=conflict.suggested_action if conflict else None,
        recovery_your_version=conflict.your_version if conflict else None,
        recovery_current_version=conflict.current_version if conflict else None,
        recovery_last_writer_agent_id=conflict.last_writer_agent_id if conflict else None,
        recovery_last_writer_session_id=conflict.last_writer_session_id if conflict else None,
        recovery_last_writer_at_unix_ms=conflict.last_writer_at_unix_ms if conflict else None,
    )


def setattr_event(
    *,
    ts: float,
    path: str,
    caller: CallerProcess,
    allowed: bool,
    fields: SetattrField,
    session_id: str | None = None,
) -> AuditEvent:
    """A C{setattr} line with the C{setattr_fields} bitmask of what changed."""
    return client_event(
        EventName.SETATTR,
        ts=ts,
        path=path,
        allowed=allowed,
        caller=caller,
        session_id=session_id,
        setattr_fields=int(fields),
    )


def lease_denied_event(*, ts: float, path: str, caller: CallerProcess) -> AuditEvent:
    """A write lease was refused; the client falls back to uncached access
    (always C{allowed: true}, rule 3)."""
    return client_event(EventName.LEASE_DENIED, ts=ts, path=path, allowed=True, caller=caller)


def cache_corrupt_event(*, ts: float, chunk_hash: str, size: int) -> AuditEvent:
    """
    A cached chunk failed BLAKE3 re-verification: C{path} is the hex hash,
    C{allowed: false}, C{command} null and no process fields.
    """
    if not _HEX.match(chunk_hash):
        raise ValueError(f"chunk hash must be lowercase hex, got {chunk_hash!r}")
    return AuditEvent(
        origin=Origin.CLIENT,
        ts=ts,
        event=EventName.CACHE_CORRUPT,
        path=chunk_hash,
        allowed=False,
        command=None,
        size=size,
    )


def cache_evicted_event(
    *, ts: float, bytes_freed: int, chunks_evicted: int, reason: EvictionReason
) -> AuditEvent:
    """
    An LRU prune: C{size} is the bytes freed, C{chunks_reused} the number of
    chunks evicted (the specification's field name), C{path} empty.
    """
    return AuditEvent(
        origin=Origin.CLIENT,
        ts=ts,
        event=EventName.CACHE_EVICTED,
        path="",
        allowed=True,
        command=None,
        size=bytes_freed,
        extra=(("chunks_reused", chunks_evicted), ("reason", EvictionReason(reason).value)),
    )


def enrollment_event(*, ts: float, serial: str | None) -> AuditEvent:
    """
    A leaf obtained at mount time: C{path} is its serial (lowercase hex),
    or, when enrollment failed (C{serial} L{None}), empty with
    C{allowed: false}.
    """
    if serial is not None and not _HEX.match(serial):
        raise ValueError(f"certificate serial must be lowercase hex, got {serial!r}")
    return AuditEvent(
        origin=Origin.CLIENT,
        ts=ts,
        event=EventName.ENROLLMENT,
        path=serial or "",
        allowed=serial is not None,
        command=None,
    )
