"""
Steps several transactions share: reading an allocation under its lock,
ending a mount lease, recording a revocation.
"""

# Statements below interpolate only this package's constant column lists and
# fixed clauses; every value goes through a parameter.
# ruff: noqa: S608

from __future__ import annotations

from svc.control.store.errors import NotFound
from svc.control.store.sql import Rows, Sql, Transaction
from svc.control.store.transactions import rows
from svc.control.store.values import Allocation, MountLease, to_micros


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


def end_mount_lease(allocation_id: str, now_us: int) -> Transaction[MountLease | None]:
    """
    Delete the mount lease of C{allocation_id}, if any, and revoke its
    holder's leaf (unless the leaf has expired already). The caller holds
    the allocation's lock.
    """
    lease = yield from current_mount_lease(allocation_id)
    if lease is None:
        return None
    yield Sql("DELETE FROM mount_leases WHERE allocation_id = ?", (allocation_id,))
    not_after_us = to_micros(lease.holder.leaf_not_after)
    if not_after_us > now_us:
        yield from add_revocation(lease.holder.leaf_serial, not_after_us, now_us)
    return lease
