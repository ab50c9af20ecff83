"""
The contract of revoking an agent: revoking its allocation (by id, by agent,
with its owner) or reassigning it revokes every unexpired leaf issued to the
agent, whatever its enrollment, not only the mount-lease holder's.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import attrs

from svc.control.store.outcomes import MountGranted
from svc.control.store.test.contract_mounts import MINUTE, enrollment_leaf, renewed_leaf
from svc.control.store.test.contract_support import HOUR, NOW, TTL, StoreCase, holder
from svc.control.store.values import IssuedCertificate, Revocation

#: When the tests revoke: every leaf below but the expired one is still valid.
AT = NOW + 50 * MINUTE

#: The agent-1 leaves L{AgentRevocationContract._two_enrollments} records that
#: are unexpired at L{AT}, by serial, each with its own not-after: a1 (the
#: lease holder's enrollment) and b1 (renewed from a1, holding the lease now),
#: c1 (a second enrollment that never held the lease) and c2 (renewed from c1).
AGENT_1_LEAVES = (
    ("a1", NOW + HOUR),
    ("b1", NOW + TTL / 2 + HOUR),
    ("c1", NOW + 10 * MINUTE + HOUR),
    ("c2", NOW + 40 * MINUTE + HOUR),
)


class AgentRevocationContract(StoreCase):
    """Revoking or reassigning an agent revokes the leaves of all its enrollments."""

    async def _two_enrollments(self) -> str:
        """
        Agent-1 of alice: enrolled with a1 at NOW and mounted, renewed a1 ->
        b1 at 30 s (the lease moves to b1); enrolled again (another pod) with
        c1 at 10 min, renewed c1 -> c2 at 40 min, never mounted; and a leaf
        e1 of a third enrollment, expired at L{AT}. Bob's agent-2 has a leaf
        d1. The allocation id of agent-1.
        """
        allocation = await self.provisioned()
        await self.store.record_certificate(enrollment_leaf("a1"))
        granted = await self.store.acquire_mount(
            allocation.allocation_id, holder(serial="a1"), NOW, TTL
        )
        assert isinstance(granted, MountGranted)
        await self.store.record_renewal("a1", renewed_leaf("b1", at=TTL / 2))
        await self.store.record_certificate(enrollment_leaf("c1", at=10 * MINUTE))
        await self.store.record_renewal("c1", renewed_leaf("c2", at=40 * MINUTE))
        await self.store.record_certificate(enrollment_leaf("e1", at=-2 * HOUR))
        await self.provisioned("agent-2", owner_id="bob", tenant_id="tenant-b")
        await self.store.record_certificate(bob_leaf("d1", "agent-2"))
        return allocation.allocation_id

    async def agent_revocations(self, at: timedelta = AT - NOW) -> list[tuple[str, datetime]]:
        """The active revocations at C{NOW + at}: serial and not-after."""
        return [(r.serial, r.not_after) for r in await self.store.active_revocations(NOW + at)]

    async def test_revoke_allocation_revokes_every_enrollment(self) -> None:
        """Revoking the allocation revokes every unexpired leaf of the agent, of any enrollment."""
        allocation_id = await self._two_enrollments()
        await self.store.revoke_allocation(allocation_id, AT)
        self.assertEqual(await self.agent_revocations(), list(AGENT_1_LEAVES))
        self.assertIsNone(await self.store.get_mount_lease(allocation_id))

    async def test_revocations_keep_their_own_not_after(self) -> None:
        """Each leaf is revoked at the revocation time until its own not-after, then ages out."""
        allocation_id = await self._two_enrollments()
        await self.store.revoke_allocation(allocation_id, AT)
        self.assertEqual(
            await self.store.active_revocations(AT),
            tuple(Revocation(serial, not_after, AT) for serial, not_after in AGENT_1_LEAVES),
        )
        self.assertEqual(
            [serial for serial, _ in await self.agent_revocations(HOUR + 20 * MINUTE)], ["c2"]
        )

    async def test_revoke_agent_revokes_every_enrollment(self) -> None:
        """revoke_agent revokes every unexpired leaf of the agent, of any enrollment."""
        await self._two_enrollments()
        await self.store.revoke_agent("agent-1", AT)
        self.assertEqual(await self.agent_revocations(), list(AGENT_1_LEAVES))

    async def test_revoke_without_lease_revokes_every_enrollment(self) -> None:
        """An allocation with no mount lease still has all its agent's leaves revoked."""
        allocation_id = await self._two_enrollments()
        await self.store.force_unmount(allocation_id, "alice", NOW + MINUTE)
        await self.store.revoke_allocation(allocation_id, AT)
        self.assertEqual(await self.agent_revocations(), list(AGENT_1_LEAVES))

    async def test_revoking_again_adds_nothing(self) -> None:
        """A second revocation keeps the first records and adds no leaf."""
        allocation_id = await self._two_enrollments()
        await self.store.revoke_allocation(allocation_id, AT)
        first = await self.store.active_revocations(AT)
        await self.store.revoke_agent("agent-1", AT + MINUTE)
        await self.store.revoke_allocation(allocation_id, AT + MINUTE)
        self.assertEqual(await self.store.active_revocations(AT), first)

    async def test_revoke_owner_revokes_every_enrollment_of_each_agent(self) -> None:
        """
        revoke_owner revokes every unexpired leaf of each of its agents,
        mounted or not; its owner-scoped allocation and other owners' agents
        revoke nothing more.
        """
        await self._two_enrollments()
        await self.provisioned("agent-3")
        await self.provisioned(None)
        await self.store.record_certificate(enrollment_leaf("f1", "agent-3", at=5 * MINUTE))
        await self.store.revoke_owner("alice", AT)
        self.assertEqual(
            await self.agent_revocations(),
            sorted([*AGENT_1_LEAVES, ("f1", NOW + 5 * MINUTE + HOUR)]),
        )

    async def test_reassign_revokes_every_enrollment(self) -> None:
        """Reassigning the agent revokes every unexpired leaf of it (they name the old owner)."""
        allocation_id = await self._two_enrollments()
        await self.store.reassign_agent("agent-1", owner_id="carol", tenant_id="tenant-c", now=AT)
        self.assertEqual(await self.agent_revocations(), list(AGENT_1_LEAVES))
        self.assertIsNone(await self.store.get_mount_lease(allocation_id))

    async def test_reassign_to_the_same_owner_revokes_nothing(self) -> None:
        """Reassigning an agent to its own owner and tenant changes nothing."""
        allocation_id = await self._two_enrollments()
        await self.store.reassign_agent("agent-1", owner_id="alice", tenant_id="tenant-a", now=AT)
        self.assertEqual(await self.agent_revocations(), [])
        self.assertIsNotNone(await self.store.get_mount_lease(allocation_id))

    async def test_release_still_revokes_only_the_holders_enrollment(self) -> None:
        """Ending a lease alone (release, owner unmount) leaves the other enrollment valid."""
        allocation_id = await self._two_enrollments()
        await self.store.force_unmount(allocation_id, "alice", AT)
        self.assertEqual(await self.agent_revocations(), list(AGENT_1_LEAVES[:2]))


def bob_leaf(serial: str, agent_id: str) -> IssuedCertificate:
    """The record of a leaf of bob's C{agent_id} (tenant-b) minted at NOW."""
    return attrs.evolve(enrollment_leaf(serial, agent_id), subject="bob", tenant_id="tenant-b")
