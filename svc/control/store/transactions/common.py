"""
Steps several transactions share: reading an allocation under its lock,
ending a mount lease, finding an enrollment's or an agent's leaves,
recording revocations.
"""

# Statements below interpolate only this package's constant column lists and
# fixed clauses; every value goes through a parameter.
# ruff: noqa: S608

from __future__ import annotations

from collections.abc import Iterable

from svc.control.store.errors import NotFound
from svc.control.store.rules import enrollment_of, leaves_to_revoke
from svc.control.store.sql import Rows, Sql, Transaction, as_int, as_opt_str, as_str
from svc.control.store.transactions import rows
from svc.control.store.values import (
    Allocation,
    MountLease,
    RevocableLeaf,
    from_micros,
    to_micros,
)


def locked_allocation(allocation_id: str) -> Transaction[Allocation]:
    """
    The allocation C{allocation_id}, its row locked until the transaction
    ends (every change to an allocation or its mount lease takes this lock
    first, which serialises them on PostgreSQL).

    @raise NotFound: no such allocation.
    """
    found: Rows = yield Sql(
        f"SELECT {rows.ALLOCATION_COLUMNS} FROM allocations WHERE allocation_id = ?",
        (allocation_id,),
        lock=True,
    )
    row = found.one()
    if row is None:
        raise NotFound(f"no allocation {allocation_id}")
    return rows.allocation(row)


def locked_agent_allocation(agent_id: str) -> Transaction[Allocation]:
    """
    The allocation of agent C{agent_id}, locked as by L{locked_allocation}.

    @raise NotFound: the agent has never been provisioned.
    """
    found: Rows = yield Sql(
        f"SELECT {rows.ALLOCATION_COLUMNS} FROM allocations WHERE agent_id = ?",
        (agent_id,),
        lock=True,
    )
    row = found.one()
    if row is None:
        raise NotFound(f"no agent {agent_id}")
    return rows.allocation(row)


def current_mount_lease(allocation_id: str) -> Transaction[MountLease | None]:
    """The mount-lease row of C{allocation_id}, live or expired, if any."""
    found: Rows = yield Sql(
        f"SELECT {rows.MOUNT_LEASE_COLUMNS} FROM mount_leases WHERE allocation_id = ?",
        (allocation_id,),
    )
    row = found.one()
    return None if row is None else rows.mount_lease(row)


def add_revocation(serial: str, not_after_us: int, now_us: int) -> Transaction[None]:
    """
    Record C{serial} in C{cert_revocations} (a serial already there keeps
    its first record).
    """
    yield Sql(
        "INSERT INTO cert_revocations (serial, not_after_us, revoked_us) VALUES (?, ?, ?)"
        " ON CONFLICT (serial) DO NOTHING",
        (serial, not_after_us, now_us),
    )


def leaf_enrollment(agent_id: str, leaf_serial: str) -> Transaction[str]:
    """
    The enrollment (L{svc.control.store.rules.enrollment_of}) of
    C{agent_id}'s leaf C{leaf_serial}, as recorded in
    C{issued_certificates}.
    """
    found: Rows = yield Sql(
        "SELECT enrollment_serial FROM issued_certificates WHERE serial = ? AND agent_id = ?",
        (leaf_serial, agent_id),
    )
    row = found.one()
    return enrollment_of(leaf_serial, None if row is None else as_opt_str(row[0]))


def enrollment_leaves(
    agent_id: str, enrollment: str, now_us: int
) -> Transaction[tuple[RevocableLeaf, ...]]:
    """
    The leaves of C{agent_id}'s enrollment C{enrollment} recorded in
    C{issued_certificates} that have not expired at C{now_us}.
    """
    found: Rows = yield Sql(
        "SELECT serial, not_after_us FROM issued_certificates"
        " WHERE enrollment_serial = ? AND agent_id = ? AND kind = 'agent_leaf'"
        " AND not_after_us > ? ORDER BY serial",
        (enrollment, agent_id, now_us),
    )
    return tuple(RevocableLeaf(as_str(row[0]), from_micros(as_int(row[1]))) for row in found.rows)


def revoke_enrollment(lease: MountLease, now_us: int) -> Transaction[tuple[RevocableLeaf, ...]]:
    """
    Revoke every leaf of the enrollment holding C{lease} that is unexpired
    at C{now_us}: the lease's leaf and every other leaf of its enrollment,
    so every leaf it was renewed from
    (L{svc.control.store.rules.leaves_to_revoke}). What was revoked.
    """
    agent_id = lease.holder.agent_id
    enrollment = yield from leaf_enrollment(agent_id, lease.holder.leaf_serial)
    chain = yield from enrollment_leaves(agent_id, enrollment, now_us)
    return (yield from add_revocations(leaves_to_revoke(lease, chain, from_micros(now_us)), now_us))


def agent_leaves(agent_id: str, now_us: int) -> Transaction[tuple[RevocableLeaf, ...]]:
    """
    Every agent leaf issued to C{agent_id} recorded in
    C{issued_certificates} that has not expired at C{now_us}, whatever its
    enrollment.
    """
    found: Rows = yield Sql(
        "SELECT serial, not_after_us FROM issued_certificates"
        " WHERE agent_id = ? AND kind = 'agent_leaf' AND not_after_us > ? ORDER BY serial",
        (agent_id, now_us),
    )
    return tuple(RevocableLeaf(as_str(row[0]), from_micros(as_int(row[1]))) for row in found.rows)


def revoke_agent_leaves(agent_id: str, now_us: int) -> Transaction[tuple[RevocableLeaf, ...]]:
    """
    Revoke every leaf of C{agent_id} unexpired at C{now_us}
    (L{agent_leaves}): those of every enrollment, whether or not it ever
    held the mount lease. What was revoked (serials already revoked keep
    their first record).
    """
    leaves = yield from agent_leaves(agent_id, now_us)
    return (yield from add_revocations(leaves, now_us))


def add_revocations(
    leaves: Iterable[RevocableLeaf], now_us: int
) -> Transaction[tuple[RevocableLeaf, ...]]:
    """L{add_revocation} of each of C{leaves}; returns them."""
    added = tuple(leaves)
    for leaf in added:
        yield from add_revocation(leaf.serial, to_micros(leaf.not_after), now_us)
    return added


def end_mount_lease(allocation_id: str, now_us: int) -> Transaction[MountLease | None]:
    """
    Delete the mount lease of C{allocation_id}, if any, and revoke every
    unexpired leaf of its holder's enrollment (L{revoke_enrollment}). The
    caller holds the allocation's lock.
    """
    lease = yield from current_mount_lease(allocation_id)
    if lease is None:
        return None
    yield Sql("DELETE FROM mount_leases WHERE allocation_id = ?", (allocation_id,))
    yield from revoke_enrollment(lease, now_us)
    return lease
