"""
The contract of mount leases and certificate revocations.
"""

from __future__ import annotations

from datetime import timedelta

from twisted.internet.defer import gatherResults

from svc.control.store.errors import LeaseLost, NotFound, Revoked
from svc.control.store.outcomes import MountConflict, MountConflictCode, MountGranted
from svc.control.store.test.contract_support import HOUR, NOW, TTL, StoreCase, holder
from svc.control.store.values import Revocation


class MountsContract(StoreCase):
    """The exclusive mount lease of an allocation, and revoked serials."""

    async def _granted(
        self, allocation_id: str, serial: str, at: timedelta = timedelta(0), force: bool = False
    ) -> MountGranted:
        outcome = await self.store.acquire_mount(
            allocation_id, holder(serial=serial), NOW + at, TTL, force
        )
        assert isinstance(outcome, MountGranted), outcome
        return outcome

    async def test_acquire_grants_lease(self) -> None:
        """With no lease, the holder gets one bound now, expiring after the TTL, with a session."""
        allocation = await self.provisioned()
        granted = await self._granted(allocation.allocation_id, "a1")
        lease = granted.lease
        self.assertIsNone(granted.displaced)
        self.assertEqual((lease.bound_at, lease.expires_at), (NOW, NOW + TTL))
        self.assertEqual(lease.holder, holder(serial="a1"))
        self.assertRegex(lease.session_id, "^mount:[0-9a-f]{32}$")
        self.assertEqual(await self.store.get_mount_lease(allocation.allocation_id), lease)

    async def test_wrong_agent(self) -> None:
        """An enrollment of another agent is refused wrong_agent and the lease is untouched."""
        allocation = await self.provisioned()
        outcome = await self.store.acquire_mount(
            allocation.allocation_id, holder("agent-2", "b2"), NOW, TTL
        )
        self.assertEqual(outcome, MountConflict(MountConflictCode.WRONG_AGENT))
        self.assertIsNone(await self.store.get_mount_lease(allocation.allocation_id))

    async def test_same_enrollment_already_mounted(self) -> None:
        """The holder asking again is already_mounted; with force it gets a fresh session."""
        allocation = await self.provisioned()
        first = (await self._granted(allocation.allocation_id, "a1")).lease
        again = await self.store.acquire_mount(
            allocation.allocation_id, holder(serial="a1"), NOW + TTL / 2, TTL
        )
        self.assertEqual(again, MountConflict(MountConflictCode.ALREADY_MOUNTED, first))
        forced = await self._granted(allocation.allocation_id, "a1", TTL / 2, force=True)
        self.assertIsNone(forced.displaced)
        self.assertNotEqual(forced.lease.session_id, first.session_id)
        self.assertEqual(forced.lease.bound_at, NOW + TTL / 2)

    async def test_live_lease_of_another_enrollment(self) -> None:
        """Another enrollment meets lease_live with the incumbent's bound_at and expiry."""
        allocation = await self.provisioned()
        first = (await self._granted(allocation.allocation_id, "a1")).lease
        outcome = await self.store.acquire_mount(
            allocation.allocation_id, holder(serial="a2"), NOW + TTL / 2, TTL
        )
        assert isinstance(outcome, MountConflict)
        self.assertEqual(outcome.code, MountConflictCode.LEASE_LIVE)
        assert outcome.incumbent is not None
        self.assertEqual(
            (outcome.incumbent.bound_at, outcome.incumbent.expires_at), (NOW, NOW + TTL)
        )
        self.assertEqual(await self.store.get_mount_lease(allocation.allocation_id), first)

    async def test_force_displaces_incumbent(self) -> None:
        """With force, another enrollment takes the live lease; the incumbent is displaced."""
        allocation = await self.provisioned()
        first = (await self._granted(allocation.allocation_id, "a1")).lease
        forced = await self._granted(allocation.allocation_id, "a2", TTL / 2, force=True)
        self.assertEqual(forced.displaced, first)
        self.assertEqual(forced.lease.holder.leaf_serial, "a2")
        await self.refused(
            self.store.refresh_mount(
                allocation.allocation_id, holder(serial="a1"), NOW + TTL / 2, TTL
            ),
            LeaseLost,
        )

    async def test_expired_lease_is_taken_without_force(self) -> None:
        """Once a lease has expired, another enrollment acquires it without force."""
        allocation = await self.provisioned()
        await self._granted(allocation.allocation_id, "a1")
        taken = await self._granted(allocation.allocation_id, "a2", TTL)
        self.assertIsNone(taken.displaced)
        self.assertEqual(taken.lease.bound_at, NOW + TTL)

    async def test_refresh(self) -> None:
        """The holder extends its lease and session, even expired if nobody took it."""
        allocation = await self.provisioned()
        first = (await self._granted(allocation.allocation_id, "a1")).lease
        refreshed = await self.store.refresh_mount(
            allocation.allocation_id, holder(serial="a1"), NOW + TTL / 2, TTL
        )
        self.assertEqual((refreshed.session_id, refreshed.bound_at), (first.session_id, NOW))
        self.assertEqual(refreshed.expires_at, NOW + TTL / 2 + TTL)
        self.assertEqual(await self.store.get_mount_lease(allocation.allocation_id), refreshed)
        late = await self.store.refresh_mount(
            allocation.allocation_id, holder(serial="a1"), NOW + 3 * TTL, TTL
        )
        self.assertEqual(late.expires_at, NOW + 4 * TTL)
        await self.refused(
            self.store.refresh_mount(allocation.allocation_id, holder(serial="a2"), NOW, TTL),
            LeaseLost,
        )

    async def test_release_records_revocation(self) -> None:
        """Releasing ends the lease and revokes the holder's leaf until its not-after."""
        allocation = await self.provisioned()
        await self._granted(allocation.allocation_id, "a1")
        await self.refused(
            self.store.release_mount(allocation.allocation_id, holder(serial="a2"), NOW), LeaseLost
        )
        released = await self.store.release_mount(
            allocation.allocation_id, holder(serial="a1"), NOW + TTL
        )
        self.assertEqual(released.holder.leaf_serial, "a1")
        self.assertIsNone(await self.store.get_mount_lease(allocation.allocation_id))
        self.assertEqual(
            await self.store.active_revocations(NOW + TTL),
            (Revocation("a1", NOW + HOUR, NOW + TTL),),
        )
        await self.refused(
            self.store.release_mount(allocation.allocation_id, holder(serial="a1"), NOW + TTL),
            LeaseLost,
        )
        await self.refused(
            self.store.refresh_mount(allocation.allocation_id, holder(serial="a1"), NOW + TTL, TTL),
            LeaseLost,
        )

    async def test_owner_forced_unmount(self) -> None:
        """The owner ends any lease, revoking the leaf; others cannot; no lease gives None."""
        allocation = await self.provisioned()
        await self._granted(allocation.allocation_id, "a1")
        await self.refused(self.store.force_unmount(allocation.allocation_id, "bob", NOW), NotFound)
        ended = await self.store.force_unmount(allocation.allocation_id, "alice", NOW)
        assert ended is not None
        self.assertEqual(ended.holder.leaf_serial, "a1")
        self.assertEqual([r.serial for r in await self.store.active_revocations(NOW)], ["a1"])
        self.assertIsNone(await self.store.force_unmount(allocation.allocation_id, "alice", NOW))

    async def test_revoked_or_unknown_allocation(self) -> None:
        """Mounting a revoked allocation is Revoked; an unknown one NotFound."""
        allocation = await self.provisioned()
        await self.store.revoke_allocation(allocation.allocation_id, NOW)
        await self.refused(
            self.store.acquire_mount(allocation.allocation_id, holder(), NOW, TTL), Revoked
        )
        await self.refused(self.store.acquire_mount("0" * 32, holder(), NOW, TTL), NotFound)

    async def test_concurrent_acquisitions_grant_one(self) -> None:
        """Enrollments acquiring together: one lease, the others see lease_live."""
        allocation = await self.provisioned()
        outcomes = await gatherResults(
            [
                self.store.acquire_mount(allocation.allocation_id, holder(serial=f"a{n}"), NOW, TTL)
                for n in range(4)
            ]
        )
        granted = [o for o in outcomes if isinstance(o, MountGranted)]
        self.assertEqual(len(granted), 1)
        codes = [o.code for o in outcomes if isinstance(o, MountConflict)]
        self.assertEqual(codes, [MountConflictCode.LEASE_LIVE] * 3)
        self.assertEqual(
            await self.store.get_mount_lease(allocation.allocation_id), granted[0].lease
        )

    async def test_revocations_age_out(self) -> None:
        """Revocations last until the cert's not-after, then are pruned; first record wins."""
        await self.store.add_revocation("aa", NOW + HOUR, NOW)
        await self.store.add_revocation("bb", NOW + 2 * HOUR, NOW)
        await self.store.add_revocation("aa", NOW + 5 * HOUR, NOW + HOUR / 2)
        self.assertEqual(
            await self.store.active_revocations(NOW),
            (Revocation("aa", NOW + HOUR, NOW), Revocation("bb", NOW + 2 * HOUR, NOW)),
        )
        self.assertEqual(
            [r.serial for r in await self.store.active_revocations(NOW + HOUR)], ["bb"]
        )
        self.assertEqual(await self.store.prune_revocations(NOW + HOUR), 1)
        self.assertEqual(await self.store.prune_revocations(NOW + HOUR), 0)
        self.assertEqual([r.serial for r in await self.store.active_revocations(NOW)], ["bb"])

    async def test_release_of_expired_leaf_adds_nothing(self) -> None:
        """A leaf that has already expired is not added to the revocations on release."""
        allocation = await self.provisioned()
        await self._granted(allocation.allocation_id, "a1")
        await self.store.release_mount(
            allocation.allocation_id, holder(serial="a1"), NOW + 2 * HOUR
        )
        self.assertEqual(await self.store.active_revocations(NOW), ())
