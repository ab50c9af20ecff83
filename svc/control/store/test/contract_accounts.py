"""
The contract of users, tenants and allocations: provisioning, quotas,
budgets, suspension, revocation, reassignment, purge, migrations.
"""

from __future__ import annotations

from twisted.internet.defer import gatherResults

from svc.control.store.errors import (
    Conflict,
    InvalidValue,
    NotFound,
    Revoked,
    SchemaTooNew,
)
from svc.control.store.outcomes import EnrollRefusal, EnrollRefusalReason
from svc.control.store.test.contract_support import (
    GIB,
    HOUR,
    NOW,
    TTL,
    StoreCase,
    holder,
    token_hash,
)
from svc.control.store.values import AllocationState


class AccountsContract(StoreCase):
    """Provisioning and the life of allocations."""

    async def test_provision_creates_owner_tenant_and_allocation(self) -> None:
        """A first provisioning makes a live agent-scoped allocation, its owner and tenant."""
        done = await self.store.provision(
            agent_id="agent-1", owner_id="alice", tenant_id="tenant-a", grant_bytes=GIB, now=NOW
        )
        allocation = done.allocation
        self.assertTrue(done.created)
        self.assertEqual(
            (allocation.agent_id, allocation.owner_id, allocation.tenant_id),
            ("agent-1", "alice", "tenant-a"),
        )
        self.assertEqual(allocation.grant_bytes, GIB)
        self.assertEqual(allocation.state, AllocationState.PROVISIONED)
        self.assertEqual(allocation.created_at, NOW)
        self.assertRegex(allocation.allocation_id, "^[0-9a-f]{32}$")
        user = await self.store.get_user("alice")
        self.assertEqual(
            (user.display_name, user.suspended, user.budget_bytes), ("alice", False, None)
        )
        tenant = await self.store.get_tenant("tenant-a")
        self.assertEqual((tenant.owner_id, tenant.suspended), ("alice", False))
        self.assertEqual(await self.store.get_allocation(allocation.allocation_id), allocation)
        self.assertEqual(await self.store.get_agent_allocation("agent-1"), allocation)

    async def test_provision_is_idempotent(self) -> None:
        """Repeating an identical request returns the same allocation, marked not created."""
        first = await self.provisioned()
        again = await self.store.provision(
            agent_id="agent-1",
            owner_id="alice",
            tenant_id="tenant-a",
            grant_bytes=GIB,
            now=NOW + HOUR,
        )
        self.assertFalse(again.created)
        self.assertEqual(again.allocation, first)

    async def test_concurrent_identical_provisions_make_one_allocation(self) -> None:
        """Identical requests in flight together agree on one allocation, created once."""
        results = await gatherResults(
            [
                self.store.provision(
                    agent_id="agent-1",
                    owner_id="alice",
                    tenant_id="tenant-a",
                    grant_bytes=GIB,
                    now=NOW,
                )
                for _ in range(3)
            ]
        )
        self.assertEqual(len({r.allocation.allocation_id for r in results}), 1)
        self.assertEqual(sorted(r.created for r in results), [False, False, True])

    async def test_provision_conflicts_with_other_owner_or_tenant(self) -> None:
        """The same agent id under another owner or tenant is agent_owner_mismatch."""
        await self.provisioned()
        for owner, tenant in (("bob", "tenant-b"), ("alice", "tenant-other")):
            error = await self.refused(
                self.store.provision(
                    agent_id="agent-1", owner_id=owner, tenant_id=tenant, grant_bytes=GIB, now=NOW
                ),
                Conflict,
            )
            self.assertEqual(error.code, "agent_owner_mismatch")

    async def test_provision_conflicts_with_other_grant(self) -> None:
        """The same agent with another grant is grant_mismatch (quota goes through PATCH)."""
        await self.provisioned()
        error = await self.refused(
            self.store.provision(
                agent_id="agent-1", owner_id="alice", tenant_id="tenant-a", grant_bytes=1, now=NOW
            ),
            Conflict,
        )
        self.assertEqual(error.code, "grant_mismatch")

    async def test_tenant_of_another_owner_is_refused_and_nothing_written(self) -> None:
        """Another owner's tenant is tenant_owner_mismatch; the refused request writes nothing."""
        await self.provisioned()
        error = await self.refused(
            self.store.provision(
                agent_id="agent-2", owner_id="bob", tenant_id="tenant-a", grant_bytes=GIB, now=NOW
            ),
            Conflict,
        )
        self.assertEqual(error.code, "tenant_owner_mismatch")
        await self.refused(self.store.get_user("bob"), NotFound)
        await self.refused(self.store.get_agent_allocation("agent-2"), NotFound)

    async def test_revoked_agent_is_never_reprovisioned(self) -> None:
        """Provisioning a revoked agent again fails with Revoked: agent ids are not reused."""
        allocation = await self.provisioned()
        await self.store.revoke_allocation(allocation.allocation_id, NOW)
        await self.refused(
            self.store.provision(
                agent_id="agent-1", owner_id="alice", tenant_id="tenant-a", grant_bytes=GIB, now=NOW
            ),
            Revoked,
        )

    async def test_owner_scoped_provision(self) -> None:
        """Without an agent, one live owner-scoped allocation per owner and tenant, idempotently."""
        first = await self.provisioned(agent_id=None)
        self.assertFalse(first.agent_scoped)
        again = await self.provisioned(agent_id=None)
        self.assertEqual(again, first)
        await self.store.revoke_allocation(first.allocation_id, NOW)
        fresh = await self.provisioned(agent_id=None)
        self.assertNotEqual(fresh.allocation_id, first.allocation_id)

    async def test_bad_arguments_are_invalid_values(self) -> None:
        """Malformed ids, negative grants and naive datetimes fail with InvalidValue."""
        bad: list[dict[str, object]] = [
            {"agent_id": "../x"},
            {"owner_id": ""},
            {"tenant_id": "a/b"},
            {"grant_bytes": -1},
            {"now": NOW.replace(tzinfo=None)},
        ]
        for override in bad:
            arguments: dict[str, object] = {
                "agent_id": "agent-1",
                "owner_id": "alice",
                "tenant_id": "tenant-a",
                "grant_bytes": GIB,
                "now": NOW,
            }
            arguments.update(override)
            await self.refused(self.store.provision(**arguments), InvalidValue)  # type: ignore[arg-type]
        await self.refused(self.store.get_agent_allocation("agent-1"), NotFound)

    async def test_unknown_records_are_not_found(self) -> None:
        """Lookups of records that do not exist fail with NotFound."""
        for lookup in (
            self.store.get_allocation("0" * 32),
            self.store.get_agent_allocation("nobody"),
            self.store.get_user("nobody"),
            self.store.get_tenant("nobody"),
            self.store.set_agent_quota("nobody", 1),
            self.store.revoke_allocation("0" * 32, NOW),
            self.store.set_user_suspended("nobody", True),
            self.store.set_tenant_suspended("nobody", True),
        ):
            await self.refused(lookup, NotFound)

    async def test_list_allocations_of_owner(self) -> None:
        """A user's allocations in every state, oldest first; nobody else's."""
        one = await self.provisioned("agent-1")
        two = await self.store.provision(
            agent_id="agent-2",
            owner_id="alice",
            tenant_id="tenant-a",
            grant_bytes=1,
            now=NOW + HOUR,
        )
        await self.provisioned("agent-3", owner_id="bob", tenant_id="tenant-b")
        revoked = await self.store.revoke_allocation(one.allocation_id, NOW + HOUR)
        listed = await self.store.list_allocations("alice")
        self.assertEqual(listed, (revoked, two.allocation))
        self.assertEqual(await self.store.list_allocations("nobody"), ())

    async def test_set_agent_quota(self) -> None:
        """Setting a quota changes the grant of a live allocation; a revoked one is Revoked."""
        allocation = await self.provisioned()
        changed = await self.store.set_agent_quota("agent-1", 5 * GIB)
        self.assertEqual(changed.grant_bytes, 5 * GIB)
        self.assertEqual(
            (await self.store.get_allocation(allocation.allocation_id)).grant_bytes, 5 * GIB
        )
        await self.store.revoke_agent("agent-1", NOW)
        await self.refused(self.store.set_agent_quota("agent-1", GIB), Revoked)

    async def test_account_budget(self) -> None:
        """The shared budget is set, creating the account if needed, and cleared with None."""
        user = await self.store.set_account_budget("carol", 10 * GIB, NOW)
        self.assertEqual((user.user_id, user.budget_bytes), ("carol", 10 * GIB))
        cleared = await self.store.set_account_budget("carol", None, NOW)
        self.assertIsNone(cleared.budget_bytes)
        await self.refused(self.store.set_account_budget("carol", -5, NOW), InvalidValue)

    async def test_put_user_creates_and_renames(self) -> None:
        """The user-seed creates a user, and on repeat renames it without resetting it."""
        created = await self.store.put_user("alice", "Alice", NOW)
        self.assertEqual((created.display_name, created.created_at), ("Alice", NOW))
        await self.store.set_user_suspended("alice", True)
        renamed = await self.store.put_user("alice", "Alice A.", NOW + HOUR)
        self.assertEqual(
            (renamed.display_name, renamed.created_at, renamed.suspended), ("Alice A.", NOW, True)
        )

    async def test_suspension_flags(self) -> None:
        """Users and tenants are suspended and reinstated."""
        await self.provisioned()
        self.assertTrue((await self.store.set_user_suspended("alice", True)).suspended)
        self.assertTrue((await self.store.get_user("alice")).suspended)
        self.assertFalse((await self.store.set_user_suspended("alice", False)).suspended)
        self.assertTrue((await self.store.set_tenant_suspended("tenant-a", True)).suspended)
        self.assertTrue((await self.store.get_tenant("tenant-a")).suspended)

    async def test_revoke_allocation_ends_lease_and_tokens(self) -> None:
        """Revoking ends the mount lease (revoking its leaf) and unspent tokens; idempotently."""
        allocation = await self.provisioned()
        await self.enroll_token(allocation)
        await self.store.acquire_mount(allocation.allocation_id, holder(serial="beef"), NOW, TTL)
        revoked = await self.store.revoke_allocation(allocation.allocation_id, NOW + TTL)
        self.assertEqual((revoked.state, revoked.revoked_at), (AllocationState.REVOKED, NOW + TTL))
        self.assertIsNone(await self.store.get_mount_lease(allocation.allocation_id))
        active = await self.store.active_revocations(NOW + TTL)
        self.assertEqual([r.serial for r in active], ["beef"])
        self.assertEqual(
            await self.store.consume_enroll_token(token_hash("enroll-secret"), NOW + TTL),
            EnrollRefusal(EnrollRefusalReason.REVOKED),
        )
        self.assertEqual(
            await self.store.revoke_allocation(allocation.allocation_id, NOW + HOUR), revoked
        )

    async def test_revoke_owner(self) -> None:
        """Revoking an owner suspends it and revokes every allocation it has, and no one else's."""
        await self.provisioned("agent-1")
        await self.provisioned("agent-2")
        other = await self.provisioned("agent-3", owner_id="bob", tenant_id="tenant-b")
        revoked = await self.store.revoke_owner("alice", NOW)
        self.assertEqual(sorted(str(a.agent_id) for a in revoked), ["agent-1", "agent-2"])
        self.assertTrue(all(a.state is AllocationState.REVOKED for a in revoked))
        self.assertTrue((await self.store.get_user("alice")).suspended)
        self.assertEqual(await self.store.get_allocation(other.allocation_id), other)
        await self.refused(self.store.revoke_owner("nobody", NOW), NotFound)

    async def test_reassign_agent(self) -> None:
        """Reassigning moves the allocation, creates owner and tenant, and ends the mount lease."""
        allocation = await self.provisioned()
        await self.store.acquire_mount(allocation.allocation_id, holder(serial="c0de"), NOW, TTL)
        moved = await self.store.reassign_agent(
            "agent-1", owner_id="bob", tenant_id="tenant-b", now=NOW
        )
        self.assertEqual(
            (moved.allocation_id, moved.owner_id, moved.tenant_id),
            (allocation.allocation_id, "bob", "tenant-b"),
        )
        self.assertEqual((await self.store.get_tenant("tenant-b")).owner_id, "bob")
        self.assertIsNone(await self.store.get_mount_lease(allocation.allocation_id))
        self.assertEqual([r.serial for r in await self.store.active_revocations(NOW)], ["c0de"])
        self.assertEqual(await self.store.list_allocations("alice"), ())
        error = await self.refused(
            self.store.reassign_agent("agent-1", owner_id="carol", tenant_id="tenant-a", now=NOW),
            Conflict,
        )
        self.assertEqual(error.code, "tenant_owner_mismatch")

    async def test_purge_bookkeeping(self) -> None:
        """Only revoked allocations are listed for the purge sweep and may be marked purged."""
        allocation = await self.provisioned()
        error = await self.refused(self.store.mark_purged(allocation.allocation_id, NOW), Conflict)
        self.assertEqual(error.code, "not_revoked")
        self.assertEqual(await self.store.list_revoked_allocations(), ())
        revoked = await self.store.revoke_allocation(allocation.allocation_id, NOW)
        self.assertEqual(await self.store.list_revoked_allocations(), (revoked,))
        purged = await self.store.mark_purged(allocation.allocation_id, NOW + HOUR)
        self.assertEqual((purged.state, purged.purged_at), (AllocationState.PURGED, NOW + HOUR))
        self.assertEqual(await self.store.list_revoked_allocations(), ())
        self.assertEqual(
            await self.store.mark_purged(allocation.allocation_id, NOW + 2 * HOUR), purged
        )

    async def test_allocations_paged(self) -> None:
        """Every owner's allocations by id, page by page after the last id, optionally by state."""
        made = [
            await self.provisioned(f"agent-{n}", owner_id=f"owner-{n}", tenant_id=f"tenant-{n}")
            for n in range(5)
        ]
        revoked = await self.store.revoke_allocation(made[2].allocation_id, NOW)
        expected = sorted(
            (revoked if a.allocation_id == revoked.allocation_id else a for a in made),
            key=lambda a: a.allocation_id,
        )
        first = await self.store.list_allocations_page(None, 2)
        second = await self.store.list_allocations_page(first[-1].allocation_id, 2)
        third = await self.store.list_allocations_page(second[-1].allocation_id, 2)
        self.assertEqual((*first, *second, *third), tuple(expected))
        self.assertEqual(len(third), 1)
        self.assertEqual(await self.store.list_allocations_page(third[-1].allocation_id, 2), ())
        only = await self.store.list_allocations_page(None, 10, AllocationState.REVOKED)
        self.assertEqual(only, (revoked,))
        for bad in (0, 1001):
            await self.refused(self.store.list_allocations_page(None, bad), InvalidValue)

    async def test_reopen_keeps_data_and_migrates_once(self) -> None:
        """Opening an up-to-date database again applies nothing and keeps every record."""
        allocation = await self.provisioned()
        again = await self.reopen()
        self.assertEqual(await again.get_allocation(allocation.allocation_id), allocation)
        third = await self.reopen()
        self.assertEqual(await third.list_allocations("alice"), (allocation,))

    async def test_newer_schema_is_refused(self) -> None:
        """A database migrated by a newer svc is refused with SchemaTooNew."""
        await self.tamper(
            "INSERT INTO schema_migrations (version, description, applied_us)"
            " VALUES (999, 'future', 0)"
        )
        error = await self.refused(self.reopen(), SchemaTooNew)
        self.assertEqual(error.found, 999)
