"""
Constructors for the data-plane server lines whose envelope differs from a
plain operation line (L{svc.audit.events.server_event}): path-confinement
denials, lease lines (reduced envelope), the GC sweep and purge reports and
the HTTP surface (including the owner's journal revert).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from svc.audit.events import NO_CERT, AuditEvent, CertFields, server_event
from svc.audit.names import SERVER_COMMAND, EventName, Origin, path_denial_event_for_op
from svc.store.lease_values import LeaseEvent, LeaseEventName, LeaseMode, LeaseReason
from svc.wire.ops import Op

_LEASE_ID = re.compile(r"\A[0-9a-f]+\Z")

LEASE_REASONS: Mapping[LeaseEventName, frozenset[LeaseReason]] = {
    LeaseEventName.GRANT: frozenset({LeaseReason.NONE}),
    LeaseEventName.REFRESH: frozenset({LeaseReason.NONE}),
    LeaseEventName.RELEASE: frozenset({LeaseReason.CLIENT, LeaseReason.CONN_CLOSED}),
    LeaseEventName.REVOKE: frozenset({LeaseReason.CONTENTION, LeaseReason.MANIFEST_PUT_CONTENTION}),
    LeaseEventName.VIOLATION: frozenset({LeaseReason.REVOKE_TIMEOUT, LeaseReason.EXPIRED}),
}
"""The C{reason} values each lease event may carry."""


def path_denied_event(*, ts: float, op: Op, cert: CertFields, path: str) -> AuditEvent:
    """
    A per-agent path-confinement denial (C{EACCES}) of wire operation
    C{op}: C{allowed: false}, named after the lowercase wire operation
    (C{list}, C{stat} for the listing and head operations; the operation's
    own event otherwise, rule 2). Chunk operations log an empty path, as
    every chunk line does.
    """
    event = path_denial_event_for_op(op)
    if op in (Op.CHUNK_GET, Op.CHUNK_PUT, Op.CHUNK_HAS):
        path = ""
    return server_event(event, ts=ts, cert=cert, path=path, allowed=False)


def lease_event(
    *,
    ts: float,
    event: LeaseEventName,
    agent_id: str,
    lease_id: str,
    mode: LeaseMode,
    reason: LeaseReason,
    path: str,
) -> AuditEvent:
    """
    A lease line with the reduced envelope: C{agent_id}, C{lease_id},
    C{mode}, C{reason} (empty for grant and refresh), C{allowed: true},
    C{command} C{svc-server}, the lease's C{path}; no tenant or certificate
    fields. A reason the event never carries is a L{ValueError}.
    """
    event = LeaseEventName(event)
    reason = LeaseReason(reason)
    if reason not in LEASE_REASONS[event]:
        raise ValueError(f"{event.value} never has reason {reason.value!r}")
    if not _LEASE_ID.match(lease_id):
        raise ValueError(f"lease id must be lowercase hex, got {lease_id!r}")
    return AuditEvent(
        origin=Origin.SERVER,
        ts=ts,
        event=event.value,
        path=path,
        allowed=True,
        command=SERVER_COMMAND,
        agent_id=agent_id,
        extra=(
            ("lease_id", lease_id),
            ("mode", LeaseMode(mode).value),
            ("reason", reason.value),
        ),
    )


def lease_line(lease: LeaseEvent, *, ts: float) -> AuditEvent:
    """The audit line of a L{LeaseEvent} from the lease table."""
    return lease_event(
        ts=ts,
        event=lease.event,
        agent_id=lease.agent_id,
        lease_id=lease.lease_id,
        mode=lease.mode,
        reason=lease.reason,
        path=lease.path,
    )


def gc_swept_chunks_event(
    *, ts: float, tenant_id: str, count: int, bytes_freed: int, dry_run: bool
) -> AuditEvent:
    """
    One tenant's sweep cycle: C{tenant_id}, C{count} chunks and
    C{bytes_freed} (what would have been, with C{dry_run}); C{path} empty.
    """
    return server_event(
        EventName.GC_SWEPT_CHUNKS,
        ts=ts,
        cert=CertFields(tenant_id=tenant_id),
        path="",
        allowed=True,
        count=count,
        bytes_freed=bytes_freed,
        dry_run=dry_run,
    )


def agent_data_purged_event(
    *,
    ts: float,
    tenant_id: str,
    agent_id: str,
    count: int,
    bytes_freed: int,
    caller: CertFields = NO_CERT,
) -> AuditEvent:
    """
    An agent's subtree purged: C{path} is the subtree C{/<agent_id>},
    C{tenant_id}, C{count} manifests deleted, C{bytes_freed}. C{caller}
    gives the control plane's certificate serial and subject when known;
    C{agent_id} stays absent because no agent certificate is involved.
    """
    cert = CertFields(
        tenant_id=tenant_id, cert_serial=caller.cert_serial, cert_subject=caller.cert_subject
    )
    return server_event(
        EventName.AGENT_DATA_PURGED,
        ts=ts,
        cert=cert,
        path=f"/{agent_id}",
        allowed=True,
        count=count,
        bytes_freed=bytes_freed,
    )


def http_get_audit_event(*, ts: float, cert: CertFields, records: int) -> AuditEvent:
    """C{GET /audit}: C{size} is the number of records returned after
    scoping and the limit cap."""
    return server_event(
        EventName.HTTP_GET_AUDIT, ts=ts, cert=cert, path="/audit", allowed=True, size=records
    )


def http_auth_event(*, ts: float, request_path: str) -> AuditEvent:
    """An HTTP-layer authentication failure: C{path} is the request path
    plus query, C{allowed: false}, no identity fields."""
    return server_event(EventName.HTTP_AUTH, ts=ts, cert=NO_CERT, path=request_path, allowed=False)


def owner_journal_revert_event(
    *, ts: float, tenant_id: str, allowed: bool, caller: CertFields = NO_CERT
) -> AuditEvent:
    """
    An owner's revert through the control plane (C{POST
    /control/journal/revert}): the C{journal_revert_path} line with C{path}
    empty, C{tenant_id}, and the control plane's certificate serial and
    subject from C{caller}; no C{agent_id} (no agent certificate is
    involved; the journal row itself names C{owner:<user_id>}).
    C{allowed} is false when the revert was refused.
    """
    cert = CertFields(
        tenant_id=tenant_id, cert_serial=caller.cert_serial, cert_subject=caller.cert_subject
    )
    return server_event(EventName.JOURNAL_REVERT_PATH, ts=ts, cert=cert, path="", allowed=allowed)
