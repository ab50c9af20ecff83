"""
Transactions over exclusive mount leases, revoked serials and the record of
issued certificates.

Every mount-lease change first locks its allocation's row
(L{locked_allocation}), so acquisitions, refreshes, releases, forced
unmounts and revocations of one allocation happen one at a time.
"""

# Statements below interpolate only this package's constant column lists and
# fixed clauses; every value goes through a parameter.
# ruff: noqa: S608

from __future__ import annotations

from datetime import timedelta

import attrs

from svc.control.store.errors import LeaseLost, NotFound
from svc.control.store.outcomes import MountGranted, MountOutcome
from svc.control.store.rules import (
    enrollment_to_record,
    holds,
    mount_decision,
)
from svc.control.store.sql import Rows, Sql, Transaction, as_int
from svc.control.store.transactions import rows
from svc.control.store.transactions.common import (
    add_revocation,
    current_mount_lease,
    end_mount_lease,
    leaf_enrollment,
    locked_agent_allocation,
    locked_allocation,
)
from svc.control.store.values import (
    IssuedCertificate,
    MountHolder,
    MountLease,
    Revocation,
    from_micros,
    to_micros,
)

__all__ = [
    "acquire_mount",
    "active_revocations",
    "add_revocation",
    "find_certificate",
    "force_unmount",
    "get_mount_lease",
    "prune_revocations",
    "record_certificate",
    "record_renewal",
    "refresh_mount",
    "release_mount",
]


def acquire_mount(
    allocation_id: str,
    holder: MountHolder,
    now_us: int,
    ttl_us: int,
    force: bool,
    session_key: bytes,
    nonce: bytes,
) -> Transaction[MountOutcome]:
    """
    Acquire the exclusive mount lease of C{allocation_id} for C{holder} as
    L{svc.control.store.rules.mount_decision} decides (L{NotFound},
    L{svc.control.store.errors.Revoked}). A grant increments the
    allocation's C{mount_epoch} and replaces any lease row with the new one,
    whose session id is minted at the new epoch with C{session_key} and
    C{nonce}. A forced takeover does not revoke the displaced enrollment:
    it is demoted (its refresh is refused, its session fenced) and may keep
    reading.
    """
    allocation = yield from locked_allocation(allocation_id)
    epochs: Rows = yield Sql(
        "SELECT mount_epoch FROM allocations WHERE allocation_id = ?", (allocation_id,)
    )
    incumbent = yield from current_mount_lease(allocation_id)
    outcome = mount_decision(
        allocation,
        incumbent,
        holder,
        from_micros(now_us),
        timedelta(microseconds=ttl_us),
        force,
        session_key=session_key,
        mount_epoch=as_int(epochs.only()[0]),
        nonce=nonce,
    )
    if isinstance(outcome, MountGranted):
        lease = outcome.lease
        yield Sql(
            "UPDATE allocations SET mount_epoch = ? WHERE allocation_id = ?",
            (lease.epoch, allocation_id),
        )
        yield Sql(
            f"INSERT INTO mount_leases ({rows.MOUNT_LEASE_COLUMNS})"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (allocation_id) DO UPDATE SET"
            " agent_id = excluded.agent_id, leaf_serial = excluded.leaf_serial,"
            " leaf_not_after_us = excluded.leaf_not_after_us,"
            " fingerprint = excluded.fingerprint, session_id = excluded.session_id,"
            " session_epoch = excluded.session_epoch,"
            " bound_us = excluded.bound_us, expires_us = excluded.expires_us",
            (
                allocation_id,
                holder.agent_id,
                holder.leaf_serial,
                to_micros(holder.leaf_not_after),
                holder.fingerprint,
                lease.session_id,
                lease.epoch,
                now_us,
                to_micros(lease.expires_at),
            ),
        )
    return outcome


def refresh_mount(
    allocation_id: str, holder: MountHolder, now_us: int, ttl_us: int
) -> Transaction[MountLease]:
    """
    Extend C{holder}'s mount lease of C{allocation_id} to C{now + ttl}.
    An expired lease nobody has taken over is still the holder's.

    @raise LeaseLost: C{holder} does not hold the lease (another enrollment
        took it, it was released, or the allocation was revoked).
    """
    allocation = yield from locked_allocation(allocation_id)
    lease = yield from current_mount_lease(allocation_id)
    if not allocation.live or lease is None or not holds(lease, holder):
        raise LeaseLost(f"the mount lease of {allocation_id} is not held by this enrollment")
    expires_us = now_us + ttl_us
    yield Sql(
        "UPDATE mount_leases SET expires_us = ? WHERE allocation_id = ?",
        (expires_us, allocation_id),
    )
    return attrs.evolve(lease, expires_at=from_micros(expires_us))


def release_mount(allocation_id: str, holder: MountHolder, now_us: int) -> Transaction[MountLease]:
    """
    End C{holder}'s mount lease of C{allocation_id} and record every
    unexpired leaf of its enrollment (the leaf and those it was renewed
    from) in C{cert_revocations}, each with its own not-after.

    @raise LeaseLost: C{holder} does not hold the lease.
    """
    yield from locked_allocation(allocation_id)
    lease = yield from current_mount_lease(allocation_id)
    if lease is None or not holds(lease, holder):
        raise LeaseLost(f"the mount lease of {allocation_id} is not held by this enrollment")
    yield from end_mount_lease(allocation_id, now_us)
    return lease


def force_unmount(allocation_id: str, owner_id: str, now_us: int) -> Transaction[MountLease | None]:
    """
    The owner ends whatever mount lease C{allocation_id} has; the holder's
    enrollment is revoked as on release. L{NotFound} unless C{owner_id} owns the
    allocation; L{None} when there was no lease.
    """
    allocation = yield from locked_allocation(allocation_id)
    if allocation.owner_id != owner_id:
        raise NotFound(f"no allocation {allocation_id}")
    return (yield from end_mount_lease(allocation_id, now_us))


def record_renewal(
    agent_id: str, previous_serial: str, leaf: IssuedCertificate
) -> Transaction[MountLease | None]:
    """
    Record C{leaf}, minted for C{agent_id} by renewing its leaf C{previous_serial},
    as a leaf of C{previous_serial}'s enrollment (L{record_certificate},
    L{leaf_enrollment}), and hand the mount lease that leaf holds, if
    any, to C{leaf}: its serial, not-after and fingerprint replace the
    holder's, and its session id, epoch, C{bound_at} and expiry are kept.
    A lease the previous leaf still holds after expiry (nobody took it
    over, so L{refresh_mount} would extend it) moves too. The moved lease,
    or L{None} when the previous leaf held none.

    @raise NotFound: C{agent_id} has no allocation.
    """
    allocation = yield from locked_agent_allocation(agent_id)
    enrollment = yield from leaf_enrollment(agent_id, previous_serial)
    yield from record_certificate(leaf, renewed=enrollment)
    # The CA may have recorded the leaf already (as its own enrollment).
    yield Sql(
        "UPDATE issued_certificates SET enrollment_serial = ?"
        " WHERE serial = ? AND agent_id = ? AND kind = 'agent_leaf'",
        (enrollment_to_record(leaf, enrollment), leaf.serial, agent_id),
    )
    lease = yield from current_mount_lease(allocation.allocation_id)
    previous = MountHolder(agent_id, previous_serial, leaf.not_after)
    if lease is None or not holds(lease, previous):
        return None
    successor = MountHolder(agent_id, leaf.serial, leaf.not_after, leaf.fingerprint)
    yield Sql(
        "UPDATE mount_leases SET leaf_serial = ?, leaf_not_after_us = ?, fingerprint = ?"
        " WHERE allocation_id = ? AND leaf_serial = ?",
        (
            successor.leaf_serial,
            to_micros(successor.leaf_not_after),
            successor.fingerprint,
            allocation.allocation_id,
            previous_serial,
        ),
    )
    return attrs.evolve(lease, holder=successor)


def get_mount_lease(allocation_id: str) -> Transaction[MountLease | None]:
    """The mount-lease row of C{allocation_id} (live or expired), if any."""
    return (yield from current_mount_lease(allocation_id))


def active_revocations(now_us: int) -> Transaction[tuple[Revocation, ...]]:
    """Every revoked serial whose certificate has not expired at C{now_us}."""
    found: Rows = yield Sql(
        f"SELECT {rows.REVOCATION_COLUMNS} FROM cert_revocations"
        " WHERE not_after_us > ? ORDER BY serial",
        (now_us,),
    )
    return tuple(rows.revocation(row) for row in found.rows)


def prune_revocations(now_us: int) -> Transaction[int]:
    """Delete revocations of certificates expired by C{now_us}; how many."""
    found: Rows = yield Sql("DELETE FROM cert_revocations WHERE not_after_us <= ?", (now_us,))
    return found.rowcount


def record_certificate(
    certificate: IssuedCertificate, renewed: str | None = None
) -> Transaction[None]:
    """
    Record a signing event (a serial recorded before keeps its first
    record). An agent leaf is recorded as a leaf of enrollment C{renewed}
    when it was minted by renewing a leaf of that enrollment, else as the
    first leaf of its own enrollment
    (L{svc.control.store.rules.enrollment_to_record}).
    """
    yield Sql(
        f"INSERT INTO issued_certificates ({rows.CERTIFICATE_COLUMNS}, enrollment_serial)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (serial) DO NOTHING",
        (
            certificate.serial,
            certificate.kind.value,
            certificate.subject,
            to_micros(certificate.not_after),
            to_micros(certificate.issued_at),
            certificate.tenant_id,
            certificate.agent_id,
            certificate.fingerprint,
            enrollment_to_record(certificate, renewed),
        ),
    )


def find_certificate(
    serial: str | None = None, fingerprint: str | None = None
) -> Transaction[IssuedCertificate]:
    """
    The issued certificate with C{serial}, or else the most recent one with
    C{fingerprint} (L{NotFound} if none).
    """
    key: str | None
    if serial is not None:
        where, key = "serial = ?", serial
    else:
        where, key = "fingerprint = ?", fingerprint
    found: Rows = yield Sql(
        f"SELECT {rows.CERTIFICATE_COLUMNS} FROM issued_certificates"
        f" WHERE {where} ORDER BY issued_us DESC LIMIT 1",
        (key,),
    )
    row = found.one()
    if row is None:
        raise NotFound("no such issued certificate")
    return rows.certificate(row)
