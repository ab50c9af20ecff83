"""
Transactions over users, tenants and allocations: provisioning, quotas,
budgets, suspension, revocation, reassignment, purge bookkeeping.
"""

# Statements below interpolate only this package's constant column lists and
# fixed clauses; every value goes through a parameter.
# ruff: noqa: S608

from __future__ import annotations

from svc.control.store.errors import Conflict, NotFound, Revoked
from svc.control.store.outcomes import Provisioned
from svc.control.store.rules import TENANT_OWNER_MISMATCH, check_same_provisioning
from svc.control.store.sql import Rows, Sql, Transaction
from svc.control.store.transactions import rows
from svc.control.store.transactions.common import (
    end_mount_lease,
    locked_agent_allocation,
    locked_allocation,
    revoke_agent_leaves,
)
from svc.control.store.values import Allocation, AllocationState, Tenant, User

#: Conflict code: purging an allocation that is still provisioned.
NOT_REVOKED = "not_revoked"

_SELECT_ALLOCATION = f"SELECT {rows.ALLOCATION_COLUMNS} FROM allocations"


def _insert_user(user_id: str, now_us: int) -> Transaction[None]:
    yield Sql(
        "INSERT INTO users (user_id, display_name, budget_bytes, suspended, created_us)"
        " VALUES (?, ?, NULL, ?, ?) ON CONFLICT (user_id) DO NOTHING",
        (user_id, user_id, False, now_us),
    )


def put_user(user_id: str, display_name: str, now_us: int) -> Transaction[User]:
    """Create user C{user_id}, or set the display name of the existing one."""
    found: Rows = yield Sql(
        "INSERT INTO users (user_id, display_name, budget_bytes, suspended, created_us)"
        " VALUES (?, ?, NULL, ?, ?)"
        " ON CONFLICT (user_id) DO UPDATE SET display_name = excluded.display_name"
        f" RETURNING {rows.USER_COLUMNS}",
        (user_id, display_name, False, now_us),
    )
    return rows.user(found.only())


def get_user(user_id: str) -> Transaction[User]:
    """User C{user_id} (L{NotFound} if none)."""
    found: Rows = yield Sql(
        f"SELECT {rows.USER_COLUMNS} FROM users WHERE user_id = ?",
        (user_id,),
    )
    row = found.one()
    if row is None:
        raise NotFound(f"no user {user_id}")
    return rows.user(row)


def set_user_suspended(user_id: str, suspended: bool) -> Transaction[User]:
    """Suspend or reinstate user C{user_id} (L{NotFound} if none)."""
    found: Rows = yield Sql(
        f"UPDATE users SET suspended = ? WHERE user_id = ? RETURNING {rows.USER_COLUMNS}",
        (suspended, user_id),
    )
    row = found.one()
    if row is None:
        raise NotFound(f"no user {user_id}")
    return rows.user(row)


def set_account_budget(owner_id: str, budget_bytes: int | None, now_us: int) -> Transaction[User]:
    """
    Set the shared budget of account C{owner_id} (L{None}: no budget),
    creating the account if it does not exist yet.
    """
    yield from _insert_user(owner_id, now_us)
    found: Rows = yield Sql(
        f"UPDATE users SET budget_bytes = ? WHERE user_id = ? RETURNING {rows.USER_COLUMNS}",
        (budget_bytes, owner_id),
    )
    return rows.user(found.only())


def get_tenant(tenant_id: str) -> Transaction[Tenant]:
    """Tenant C{tenant_id} (L{NotFound} if none)."""
    found: Rows = yield Sql(
        f"SELECT {rows.TENANT_COLUMNS} FROM tenants WHERE tenant_id = ?",
        (tenant_id,),
    )
    row = found.one()
    if row is None:
        raise NotFound(f"no tenant {tenant_id}")
    return rows.tenant(row)


def set_tenant_suspended(tenant_id: str, suspended: bool) -> Transaction[Tenant]:
    """Suspend or reinstate tenant C{tenant_id} (L{NotFound} if none)."""
    found: Rows = yield Sql(
        f"UPDATE tenants SET suspended = ? WHERE tenant_id = ? RETURNING {rows.TENANT_COLUMNS}",
        (suspended, tenant_id),
    )
    row = found.one()
    if row is None:
        raise NotFound(f"no tenant {tenant_id}")
    return rows.tenant(row)


def _ensure_owner_and_tenant(owner_id: str, tenant_id: str, now_us: int) -> Transaction[None]:
    yield from _insert_user(owner_id, now_us)
    yield Sql(
        "INSERT INTO tenants (tenant_id, owner_id, suspended, created_us) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (tenant_id) DO NOTHING",
        (tenant_id, owner_id, False, now_us),
    )
    found: Rows = yield Sql("SELECT owner_id FROM tenants WHERE tenant_id = ?", (tenant_id,))
    if found.only()[0] != owner_id:
        raise Conflict(TENANT_OWNER_MISMATCH, f"tenant {tenant_id} belongs to another owner")


def provision(
    allocation_id: str,
    agent_id: str | None,
    owner_id: str,
    tenant_id: str,
    grant_bytes: int,
    now_us: int,
) -> Transaction[Provisioned]:
    """
    Provision an allocation (creating the owner and tenant when missing),
    or return the one an identical earlier request made. C{allocation_id} is
    the id to use if a new allocation is made. See
    L{svc.control.store.rules.check_same_provisioning} for the refusals.
    """
    yield from _ensure_owner_and_tenant(owner_id, tenant_id, now_us)
    key: tuple[str, ...]
    if agent_id is not None:
        where, key = "agent_id = ?", (agent_id,)
        target = "(agent_id)"
    else:
        where = "owner_id = ? AND tenant_id = ? AND agent_id IS NULL AND state = 'provisioned'"
        key = (owner_id, tenant_id)
        target = "(owner_id, tenant_id) WHERE agent_id IS NULL AND state = 'provisioned'"
    select = Sql(f"{_SELECT_ALLOCATION} WHERE {where}", key, lock=True)
    existing: Rows = yield select
    if not existing.rows:
        inserted: Rows = yield Sql(
            "INSERT INTO allocations (allocation_id, agent_id, owner_id, tenant_id, grant_bytes,"
            " state, created_us) VALUES (?, ?, ?, ?, ?, 'provisioned', ?)"
            f" ON CONFLICT {target} DO NOTHING RETURNING {rows.ALLOCATION_COLUMNS}",
            (allocation_id, agent_id, owner_id, tenant_id, grant_bytes, now_us),
        )
        if inserted.rows:
            return Provisioned(rows.allocation(inserted.rows[0]), created=True)
        # A concurrent identical request committed first.
        existing = yield select
    allocation = rows.allocation(existing.only())
    check_same_provisioning(allocation, owner_id, tenant_id, grant_bytes)
    return Provisioned(allocation, created=False)


def get_allocation(allocation_id: str) -> Transaction[Allocation]:
    """Allocation C{allocation_id} in any state (L{NotFound} if none)."""
    found: Rows = yield Sql(f"{_SELECT_ALLOCATION} WHERE allocation_id = ?", (allocation_id,))
    row = found.one()
    if row is None:
        raise NotFound(f"no allocation {allocation_id}")
    return rows.allocation(row)


def get_agent_allocation(agent_id: str) -> Transaction[Allocation]:
    """The allocation of agent C{agent_id} in any state (L{NotFound} if none)."""
    found: Rows = yield Sql(f"{_SELECT_ALLOCATION} WHERE agent_id = ?", (agent_id,))
    row = found.one()
    if row is None:
        raise NotFound(f"no agent {agent_id}")
    return rows.allocation(row)


def list_allocations(owner_id: str) -> Transaction[tuple[Allocation, ...]]:
    """Every allocation of C{owner_id}, in any state, oldest first."""
    found: Rows = yield Sql(
        f"{_SELECT_ALLOCATION} WHERE owner_id = ? ORDER BY created_us, allocation_id",
        (owner_id,),
    )
    return tuple(rows.allocation(row) for row in found.rows)


def list_revoked_allocations() -> Transaction[tuple[Allocation, ...]]:
    """Every revoked, not yet purged allocation, oldest revocation first."""
    found: Rows = yield Sql(
        f"{_SELECT_ALLOCATION} WHERE state = 'revoked' ORDER BY revoked_us, allocation_id"
    )
    return tuple(rows.allocation(row) for row in found.rows)


MAX_PAGE = 1000
"""The most allocations one L{list_allocations_page} returns."""


def list_allocations_page(
    after: str | None, limit: int, state: AllocationState | None
) -> Transaction[tuple[Allocation, ...]]:
    """
    At most C{limit} allocations of every owner (in C{state} when given),
    by allocation id, after C{after} when given.
    """
    where: list[str] = []
    values: list[object] = []
    if after is not None:
        where.append("allocation_id > ?")
        values.append(after)
    if state is not None:
        where.append("state = ?")
        values.append(state.value)
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    found: Rows = yield Sql(
        f"{_SELECT_ALLOCATION}{clause} ORDER BY allocation_id LIMIT ?", (*values, limit)
    )
    return tuple(rows.allocation(row) for row in found.rows)


def set_agent_quota(agent_id: str, grant_bytes: int) -> Transaction[Allocation]:
    """
    Set the grant of agent C{agent_id}'s allocation (L{NotFound},
    L{svc.control.store.errors.Revoked}).
    """
    allocation = yield from locked_agent_allocation(agent_id)
    _require_live(allocation)
    found: Rows = yield Sql(
        "UPDATE allocations SET grant_bytes = ? WHERE allocation_id = ?"
        f" RETURNING {rows.ALLOCATION_COLUMNS}",
        (grant_bytes, allocation.allocation_id),
    )
    return rows.allocation(found.only())


def _revoke(allocation: Allocation, now_us: int) -> Transaction[Allocation]:
    if not allocation.live:
        return allocation
    found: Rows = yield Sql(
        "UPDATE allocations SET state = 'revoked', revoked_us = ? WHERE allocation_id = ?"
        f" RETURNING {rows.ALLOCATION_COLUMNS}",
        (now_us, allocation.allocation_id),
    )
    yield from end_mount_lease(allocation.allocation_id, now_us)
    if allocation.agent_id is not None:
        yield from revoke_agent_leaves(allocation.agent_id, now_us)
    yield Sql(
        "UPDATE enroll_tokens SET revoked_us = ?"
        " WHERE allocation_id = ? AND consumed_us IS NULL AND revoked_us IS NULL",
        (now_us, allocation.allocation_id),
    )
    return rows.allocation(found.only())


def revoke_allocation(allocation_id: str, now_us: int) -> Transaction[Allocation]:
    """
    Revoke allocation C{allocation_id}: its mount lease ends, every
    unexpired leaf of its agent is revoked (those of the holder's
    enrollment and of every other enrollment of the agent) and its unspent
    enroll tokens are revoked. Revoking a revoked or purged allocation
    changes nothing.
    """
    allocation = yield from locked_allocation(allocation_id)
    return (yield from _revoke(allocation, now_us))


def revoke_agent(agent_id: str, now_us: int) -> Transaction[Allocation]:
    """L{revoke_allocation} of agent C{agent_id}'s allocation."""
    allocation = yield from locked_agent_allocation(agent_id)
    return (yield from _revoke(allocation, now_us))


def revoke_owner(owner_id: str, now_us: int) -> Transaction[tuple[Allocation, ...]]:
    """
    Suspend user C{owner_id} and revoke every allocation it owns; returns
    them all (L{NotFound} if there is no such user).
    """
    yield from set_user_suspended(owner_id, True)
    found: Rows = yield Sql(
        f"{_SELECT_ALLOCATION} WHERE owner_id = ? ORDER BY created_us, allocation_id",
        (owner_id,),
        lock=True,
    )
    revoked = []
    for row in found.rows:
        revoked.append((yield from _revoke(rows.allocation(row), now_us)))
    return tuple(revoked)


def reassign_agent(
    agent_id: str, owner_id: str, tenant_id: str, now_us: int
) -> Transaction[Allocation]:
    """
    Move agent C{agent_id}'s allocation to C{owner_id} / C{tenant_id}
    (creating them when missing). A mount lease ends, and every unexpired
    leaf of the agent is revoked, whatever its enrollment (they all name the
    old owner and tenant). Moving the bytes is the data plane's business.
    """
    allocation = yield from locked_agent_allocation(agent_id)
    _require_live(allocation)
    if (allocation.owner_id, allocation.tenant_id) == (owner_id, tenant_id):
        return allocation
    yield from _ensure_owner_and_tenant(owner_id, tenant_id, now_us)
    found: Rows = yield Sql(
        "UPDATE allocations SET owner_id = ?, tenant_id = ? WHERE allocation_id = ?"
        f" RETURNING {rows.ALLOCATION_COLUMNS}",
        (owner_id, tenant_id, allocation.allocation_id),
    )
    yield from end_mount_lease(allocation.allocation_id, now_us)
    yield from revoke_agent_leaves(agent_id, now_us)
    return rows.allocation(found.only())


def mark_purged(allocation_id: str, now_us: int) -> Transaction[Allocation]:
    """
    Record that the data of revoked allocation C{allocation_id} has been
    erased. A provisioned allocation is refused (L{Conflict}
    C{not_revoked}); a purged one is returned unchanged.
    """
    allocation = yield from locked_allocation(allocation_id)
    if allocation.state is AllocationState.PURGED:
        return allocation
    if allocation.live:
        raise Conflict(NOT_REVOKED, f"allocation {allocation_id} is not revoked")
    found: Rows = yield Sql(
        "UPDATE allocations SET state = 'purged', purged_us = ? WHERE allocation_id = ?"
        f" RETURNING {rows.ALLOCATION_COLUMNS}",
        (now_us, allocation_id),
    )
    return rows.allocation(found.only())


def _require_live(allocation: Allocation) -> None:
    if not allocation.live:
        raise Revoked(allocation.allocation_id)
