"""
The decisions of the control-plane store, as pure functions over records.

Both database implementations read the rows an operation needs (under the
locks that make the operation atomic), ask these functions what to do, and
write the answer; so SQLite and PostgreSQL cannot disagree on the rules.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta

from svc.control.store.errors import Conflict, Revoked
from svc.control.store.outcomes import (
    EnrollGrant,
    EnrollOutcome,
    EnrollRefusal,
    EnrollRefusalReason,
    MountConflict,
    MountConflictCode,
    MountGranted,
    MountOutcome,
)
from svc.control.store.values import (
    Allocation,
    CertificateKind,
    EnrollToken,
    IssuedCertificate,
    MountHolder,
    MountLease,
    RevocableLeaf,
    Server,
    Tenant,
    User,
)
from svc.sessions import mint_session_id

#: Conflict codes of provisioning (HTTP 409).
AGENT_OWNER_MISMATCH = "agent_owner_mismatch"
GRANT_MISMATCH = "grant_mismatch"
TENANT_OWNER_MISMATCH = "tenant_owner_mismatch"


def enroll_verdict(
    token: EnrollToken | None,
    bound: tuple[Allocation, User, Tenant] | None,
    now: datetime,
) -> EnrollOutcome:
    """
    Whether enroll token C{token} (L{None}: no token has that hash) may be
    spent at C{now}, given the allocation, owner and tenant it is bound to.
    Checked in this order: unknown, consumed, revoked, expired (at
    C{expires_at} exactly it is expired), allocation revoked, user suspended,
    tenant suspended, allocation not agent-scoped.
    """
    if token is None or bound is None:
        return EnrollRefusal(EnrollRefusalReason.UNKNOWN)
    if token.consumed_at is not None:
        return EnrollRefusal(EnrollRefusalReason.CONSUMED)
    if token.revoked_at is not None:
        return EnrollRefusal(EnrollRefusalReason.REVOKED)
    if token.expires_at <= now:
        return EnrollRefusal(EnrollRefusalReason.EXPIRED)
    allocation, user, tenant = bound
    if not allocation.live:
        return EnrollRefusal(EnrollRefusalReason.ALLOCATION_REVOKED)
    if user.suspended:
        return EnrollRefusal(EnrollRefusalReason.USER_SUSPENDED)
    if tenant.suspended:
        return EnrollRefusal(EnrollRefusalReason.TENANT_SUSPENDED)
    if not allocation.agent_scoped:
        return EnrollRefusal(EnrollRefusalReason.AGENT_SCOPE_REQUIRED)
    return EnrollGrant(token.token_id, allocation, user, tenant)


def check_same_provisioning(
    existing: Allocation, owner_id: str, tenant_id: str, grant_bytes: int
) -> None:
    """
    Accept a repeated provisioning request for C{existing} only if it is the
    same request.

    @raise Revoked: the existing allocation is revoked or purged (an agent id
        is never reused).
    @raise Conflict: C{agent_owner_mismatch} when owner or tenant differ,
        C{grant_mismatch} when only the grant differs.
    """
    if existing.owner_id != owner_id or existing.tenant_id != tenant_id:
        raise Conflict(
            AGENT_OWNER_MISMATCH, "the agent is already provisioned for another owner or tenant"
        )
    if not existing.live:
        raise Revoked(existing.allocation_id)
    if existing.grant_bytes != grant_bytes:
        raise Conflict(GRANT_MISMATCH, "the agent is already provisioned with another grant")


def mount_decision(
    allocation: Allocation,
    incumbent: MountLease | None,
    holder: MountHolder,
    now: datetime,
    ttl: timedelta,
    force: bool,
    *,
    session_key: bytes,
    mount_epoch: int,
    nonce: bytes,
) -> MountOutcome:
    """
    Decide a mount-lease acquisition by C{holder} at C{now}, the allocation's
    mount-lease epoch being C{mount_epoch}.

      - the allocation must be live (else L{Revoked}) and belong to
        C{holder}'s agent (else C{wrong_agent});
      - no lease, or an expired one: granted;
      - a live lease of the same enrollment (same leaf serial):
        C{already_mounted}, or with C{force} granted afresh (new session);
      - a live lease of another enrollment: C{lease_live}, or with C{force}
        granted, the incumbent reported as displaced.

    A grant binds a new lease at C{now} expiring at C{now + ttl}, at epoch
    C{mount_epoch + 1}, with a session id minted
    (L{svc.sessions.mint_session_id}, with C{session_key} and C{nonce}) for
    the allocation's tenant and agent at that epoch. The caller stores the
    new epoch on the allocation.
    """
    if not allocation.live:
        raise Revoked(allocation.allocation_id)
    agent_id = allocation.agent_id
    if agent_id is None or agent_id != holder.agent_id:
        return MountConflict(MountConflictCode.WRONG_AGENT)
    displaced = None
    if incumbent is not None and incumbent.live(now):
        same = incumbent.holder.leaf_serial == holder.leaf_serial
        if not force:
            code = MountConflictCode.ALREADY_MOUNTED if same else MountConflictCode.LEASE_LIVE
            return MountConflict(code, incumbent)
        displaced = None if same else incumbent
    epoch = mount_epoch + 1
    session_id = mint_session_id(
        session_key, tenant_id=allocation.tenant_id, agent_id=agent_id, epoch=epoch, nonce=nonce
    )
    lease = MountLease(allocation.allocation_id, holder, session_id, epoch, now, now + ttl)
    return MountGranted(lease, displaced)


def holds(lease: MountLease | None, holder: MountHolder) -> bool:
    """
    Whether C{holder} still owns C{lease}: it is the same enrollment (leaf
    serial) and agent. An expired lease nobody has taken over is still owned.
    """
    return (
        lease is not None
        and lease.holder.leaf_serial == holder.leaf_serial
        and lease.holder.agent_id == holder.agent_id
    )


def enrollment_of(leaf_serial: str, recorded: str | None) -> str:
    """
    The enrollment leaf C{leaf_serial} belongs to, named by the serial of
    the leaf minted at that enrollment: C{recorded} (the leaf's
    C{issued_certificates.enrollment_serial}) when known, else the leaf
    itself (a leaf the store has no chain for starts its own).
    """
    return recorded if recorded is not None else leaf_serial


def enrollment_to_record(certificate: IssuedCertificate, renewed: str | None) -> str | None:
    """
    The C{enrollment_serial} recorded with C{certificate}: for an agent leaf
    minted by renewing a leaf of enrollment C{renewed}, that enrollment; for
    any other agent leaf (minted at an enrollment), its own serial; for
    other kinds, none.
    """
    if certificate.kind is not CertificateKind.AGENT_LEAF:
        return None
    return renewed if renewed is not None else certificate.serial


def leaves_to_revoke(
    lease: MountLease | None, leaves: Iterable[RevocableLeaf], now: datetime
) -> tuple[RevocableLeaf, ...]:
    """
    What ending C{lease} revokes: its holder's leaf and each of C{leaves}
    (the other leaves of the holder's enrollment, or of the whole agent),
    leaving out those expired at C{now}; each serial once (the first
    not-after seen wins), by serial.
    """
    found: dict[str, RevocableLeaf] = {}
    if lease is not None:
        held = lease.holder
        found[held.leaf_serial] = RevocableLeaf(held.leaf_serial, held.leaf_not_after)
    for leaf in leaves:
        found.setdefault(leaf.serial, leaf)
    return tuple(found[serial] for serial in sorted(found) if found[serial].not_after > now)


def choose_server(servers: Sequence[Server], loads: Mapping[str, int]) -> Server | None:
    """
    The server a new tenant goes to: the one with the fewest placed tenants
    among those below their capacity; ties go to the earliest registered,
    then the smallest server id. L{None} when every server is full.
    """
    candidates = [s for s in servers if loads.get(s.server_id, 0) < s.capacity]
    if not candidates:
        return None
    return min(
        candidates,
        key=lambda s: (loads.get(s.server_id, 0), s.registered_at, s.server_id),
    )
