"""
The contract of mount leases and certificate revocations.
"""

from __future__ import annotations

from datetime import timedelta

import attrs
from twisted.internet.defer import gatherResults

from svc.control.store.errors import InvalidValue, LeaseLost, NotFound, Revoked
from svc.control.store.outcomes import EnrollGrant, MountConflict, MountConflictCode, MountGranted
from svc.control.store.test.contract_support import (
    HOUR,
    NOW,
    SESSION_KEY,
    TTL,
    StoreCase,
    holder,
)
from svc.control.store.values import (
    CertificateKind,
    IssuedCertificate,
    MountHolder,
    Revocation,
    to_micros,
)
from svc.sessions import SessionRejected, session_key, verify_session_id

NOW_US = to_micros(NOW)
MINUTE = timedelta(minutes=1)


def renewed_leaf(
    serial: str = "b1", agent_id: str = "agent-1", at: timedelta = timedelta(0)
) -> IssuedCertificate:
    """The record of an agent leaf minted by a renewal at C{NOW + at}, valid an hour."""
    return IssuedCertificate(
        serial=serial,
        kind=CertificateKind.AGENT_LEAF,
        subject="alice",
        not_after=NOW + at + HOUR,
        issued_at=NOW + at,
        tenant_id="tenant-a",
        agent_id=agent_id,
        fingerprint=serial * 32,
    )


#: The rows of a previous-release database: an allocation with a lease whose
#: session id has the old form ('mount:' + 32 hex).
_PREVIOUS_RELEASE_ROWS = (
    f"INSERT INTO users (user_id, display_name, created_us) VALUES ('alice', 'Alice', {NOW_US})",
    f"INSERT INTO tenants (tenant_id, owner_id, created_us) VALUES ('tenant-a', 'alice', {NOW_US})",
    "INSERT INTO allocations (allocation_id, agent_id, owner_id, tenant_id, grant_bytes, state,"
    f" created_us) VALUES ('{'f' * 32}', 'agent-1', 'alice', 'tenant-a', 1, 'provisioned',"
    f" {NOW_US})",
    "INSERT INTO mount_leases (allocation_id, agent_id, leaf_serial, leaf_not_after_us,"
    f" session_id, bound_us, expires_us) VALUES ('{'f' * 32}', 'agent-1', 'a1',"
    f" {to_micros(NOW + HOUR)}, 'mount:{'e' * 32}', {NOW_US}, {to_micros(NOW + TTL)})",
)


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
        self.assertRegex(lease.session_id, "^mount:[0-9a-f]{64}$")
        self.assertEqual(lease.epoch, 1)
        self.assertEqual(await self.store.get_mount_lease(allocation.allocation_id), lease)

    async def test_session_id_verifies_for_the_allocation(self) -> None:
        """The session id is a svc.sessions id of the allocation's tenant and agent at its epoch."""
        allocation = await self.provisioned(tenant_id="tenant-z")
        lease = (await self._granted(allocation.allocation_id, "a1")).lease
        session = verify_session_id(
            SESSION_KEY, lease.session_id, tenant_id="tenant-z", agent_id="agent-1"
        )
        self.assertEqual(session.epoch, lease.epoch)
        for tenant_id, agent_id in (("tenant-a", "agent-1"), ("tenant-z", "agent-2")):
            self.assertRaises(
                SessionRejected,
                verify_session_id,
                SESSION_KEY,
                lease.session_id,
                tenant_id=tenant_id,
                agent_id=agent_id,
            )
        self.assertRaises(
            SessionRejected,
            verify_session_id,
            session_key("another-service-token"),
            lease.session_id,
            tenant_id="tenant-z",
            agent_id="agent-1",
        )

    async def test_epochs_increase_across_grants_and_survive_reopen(self) -> None:
        """Each grant, forced or not, takes the next epoch; refusals, refreshes, reopens keep it."""
        allocation = await self.provisioned()
        allocation_id = allocation.allocation_id
        epochs = [(await self._granted(allocation_id, "a1")).lease.epoch]
        again = await self.store.acquire_mount(allocation_id, holder(serial="a1"), NOW, TTL)
        self.assertIsInstance(again, MountConflict)
        epochs.append((await self._granted(allocation_id, "a1", force=True)).lease.epoch)
        epochs.append((await self._granted(allocation_id, "a2", force=True)).lease.epoch)
        refreshed = await self.store.refresh_mount(allocation_id, holder(serial="a2"), NOW, TTL)
        self.assertEqual(refreshed.epoch, epochs[-1])
        await self.store.release_mount(allocation_id, holder(serial="a2"), NOW)
        epochs.append((await self._granted(allocation_id, "a3")).lease.epoch)
        epochs.append((await self._granted(allocation_id, "a4", TTL)).lease.epoch)
        self.assertEqual(epochs, [1, 2, 3, 4, 5])
        reopened = await self.reopen()
        kept = await reopened.get_mount_lease(allocation_id)
        assert kept is not None
        self.assertEqual(kept.epoch, 5)
        await reopened.force_unmount(allocation_id, "alice", NOW + TTL)
        after = await reopened.acquire_mount(allocation_id, holder(serial="a5"), NOW + TTL, TTL)
        assert isinstance(after, MountGranted)
        self.assertEqual(after.lease.epoch, 6)
        verify_session_id(
            SESSION_KEY, after.lease.session_id, tenant_id="tenant-a", agent_id="agent-1"
        )

    async def test_epochs_are_per_allocation(self) -> None:
        """Each allocation counts its own epochs from 1."""
        one = await self.provisioned("agent-1")
        two = await self.provisioned("agent-2")
        await self._granted(one.allocation_id, "a1")
        await self._granted(one.allocation_id, "a1", force=True)
        granted = await self.store.acquire_mount(
            two.allocation_id, holder("agent-2", "b1"), NOW, TTL
        )
        assert isinstance(granted, MountGranted)
        self.assertEqual(granted.lease.epoch, 1)

    async def test_previous_release_lease_survives_migration(self) -> None:
        """A lease row of the previous release reads as epoch 0; the next grant is epoch 1."""
        store = await self.open_previous_release(_PREVIOUS_RELEASE_ROWS)
        old = await store.get_mount_lease("f" * 32)
        assert old is not None
        self.assertEqual((old.session_id, old.epoch), ("mount:" + "e" * 32, 0))
        self.assertEqual(old.holder, holder(serial="a1"))
        forced = await store.acquire_mount("f" * 32, holder(serial="a2"), NOW, TTL, force=True)
        assert isinstance(forced, MountGranted)
        self.assertEqual((forced.displaced, forced.lease.epoch), (old, 1))
        verify_session_id(
            SESSION_KEY, forced.lease.session_id, tenant_id="tenant-a", agent_id="agent-1"
        )

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
        self.assertEqual((first.epoch, forced.lease.epoch), (1, 2))
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
        self.assertGreater(forced.lease.epoch, first.epoch)
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
        self.assertEqual(
            (refreshed.session_id, refreshed.epoch, refreshed.bound_at),
            (first.session_id, first.epoch, NOW),
        )
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

    async def test_renewal_moves_lease(self) -> None:
        """A renewal hands the old leaf's lease to the new one, keeping session, epoch and times."""
        allocation = await self.provisioned()
        allocation_id = allocation.allocation_id
        await self._granted(allocation_id, "a1")
        first = (await self._granted(allocation_id, "a1", force=True)).lease
        leaf = renewed_leaf(at=TTL / 2)
        moved = await self.store.record_renewal("a1", leaf)
        successor = MountHolder("agent-1", "b1", NOW + TTL / 2 + HOUR, "b1" * 32)
        self.assertEqual(moved, attrs.evolve(first, holder=successor))
        self.assertEqual(await self.store.get_mount_lease(allocation_id), moved)
        self.assertEqual(await self.store.find_certificate("b1"), leaf)
        await self.refused(
            self.store.refresh_mount(allocation_id, holder(serial="a1"), NOW + TTL / 2, TTL),
            LeaseLost,
        )
        refreshed = await self.store.refresh_mount(allocation_id, successor, NOW + TTL, TTL)
        self.assertEqual(
            (refreshed.session_id, refreshed.epoch, refreshed.bound_at, refreshed.expires_at),
            (first.session_id, 2, first.bound_at, NOW + 2 * TTL),
        )
        await self.store.release_mount(allocation_id, successor, NOW + TTL)
        self.assertEqual(
            await self.store.active_revocations(NOW + TTL),
            (Revocation("b1", NOW + TTL / 2 + HOUR, NOW + TTL),),
        )

    async def test_renewal_moves_expired_lease_nobody_took(self) -> None:
        """An expired lease still held by the renewed leaf moves, as a refresh would extend it."""
        allocation = await self.provisioned()
        first = (await self._granted(allocation.allocation_id, "a1")).lease
        moved = await self.store.record_renewal("a1", renewed_leaf(at=2 * TTL))
        assert moved is not None
        self.assertEqual(
            (moved.holder.leaf_serial, moved.session_id, moved.expires_at),
            ("b1", first.session_id, NOW + TTL),
        )

    async def test_renewal_of_leaf_without_lease_only_records(self) -> None:
        """A leaf holding no lease (none, or another enrollment's) is recorded; no lease moves."""
        allocation = await self.provisioned()
        allocation_id = allocation.allocation_id
        self.assertIsNone(await self.store.record_renewal("a1", renewed_leaf("b1")))
        self.assertIsNone(await self.store.get_mount_lease(allocation_id))
        self.assertEqual((await self.store.find_certificate("b1")).serial, "b1")
        taken = (await self._granted(allocation_id, "a2")).lease
        self.assertIsNone(await self.store.record_renewal("a1", renewed_leaf("b2")))
        self.assertEqual(await self.store.get_mount_lease(allocation_id), taken)
        self.assertEqual((await self.store.find_certificate("b2")).serial, "b2")

    async def test_renewal_moves_only_its_agents_lease(self) -> None:
        """The old serial is matched within the leaf's agent: another agent's lease stays."""
        await self.provisioned("agent-1")
        other = await self.provisioned("agent-2")
        outcome = await self.store.acquire_mount(
            other.allocation_id, holder("agent-2", "a1"), NOW, TTL
        )
        assert isinstance(outcome, MountGranted)
        self.assertIsNone(await self.store.record_renewal("a1", renewed_leaf("b1", "agent-1")))
        self.assertEqual(await self.store.get_mount_lease(other.allocation_id), outcome.lease)

    async def test_renewal_refusals_record_nothing(self) -> None:
        """An unknown agent is NotFound, a leaf naming no agent InvalidValue; nothing is kept."""
        ghost = renewed_leaf(agent_id="ghost")
        await self.refused(self.store.record_renewal("a1", ghost), NotFound)
        await self.refused(self.store.find_certificate("b1"), NotFound)
        await self.provisioned()
        for leaf in (
            attrs.evolve(renewed_leaf("b2"), agent_id=None),
            attrs.evolve(renewed_leaf("b3"), kind=CertificateKind.SERVER_LEAF),
        ):
            await self.refused(self.store.record_renewal("a1", leaf), InvalidValue)
            await self.refused(self.store.find_certificate(leaf.serial), NotFound)
        await self.refused(self.store.record_renewal("A1", renewed_leaf()), InvalidValue)


def enrollment_leaf(
    serial: str = "a1", agent_id: str = "agent-1", at: timedelta = timedelta(0)
) -> IssuedCertificate:
    """The record of the leaf minted at an enrollment at C{NOW + at}, valid an hour."""
    return renewed_leaf(serial, agent_id, at)


class RenewalChainContract(StoreCase):
    """
    A lease that ends revokes every unexpired leaf of its enrollment: the
    leaf it is held by and every leaf that leaf was renewed from (the live
    data-plane connection of a renewed mount was opened with an older leaf).
    """

    async def _renewed_mount(self) -> tuple[str, MountHolder]:
        """
        Agent-1 enrolled with a1 at NOW, mounted, renewed a1 -> b1 at 30 s
        and b1 -> b2 at 50 min: the allocation id and the holder (b2). As
        the CA does, b1's signing was recorded before its renewal was.
        """
        allocation = await self.provisioned()
        await self.store.record_certificate(enrollment_leaf("a1"))
        granted = await self.store.acquire_mount(
            allocation.allocation_id, holder(serial="a1"), NOW, TTL
        )
        assert isinstance(granted, MountGranted)
        await self.store.record_certificate(renewed_leaf("b1", at=TTL / 2))
        await self.store.record_renewal("a1", renewed_leaf("b1", at=TTL / 2))
        moved = await self.store.record_renewal("b1", renewed_leaf("b2", at=50 * MINUTE))
        assert moved is not None
        return allocation.allocation_id, moved.holder

    async def revoked(self, at: timedelta) -> list[tuple[str, timedelta]]:
        """The active revocations at C{NOW + at}: serial and not-after - NOW."""
        return [
            (r.serial, r.not_after - NOW) for r in await self.store.active_revocations(NOW + at)
        ]

    async def test_release_revokes_the_renewal_chain(self) -> None:
        """Releasing with the latest leaf revokes it and both leaves it was renewed from."""
        allocation_id, latest = await self._renewed_mount()
        await self.store.release_mount(allocation_id, latest, NOW + 55 * MINUTE)
        self.assertEqual(
            await self.revoked(55 * MINUTE),
            [("a1", HOUR), ("b1", HOUR + TTL / 2), ("b2", HOUR + 50 * MINUTE)],
        )

    async def test_expired_leaves_of_the_chain_are_not_revoked(self) -> None:
        """A leaf of the chain that has expired already is left out."""
        allocation_id, latest = await self._renewed_mount()
        await self.store.release_mount(allocation_id, latest, NOW + HOUR + TTL / 4)
        self.assertEqual(
            await self.revoked(HOUR), [("b1", HOUR + TTL / 2), ("b2", HOUR + 50 * MINUTE)]
        )

    async def test_owner_unmount_revokes_the_renewal_chain(self) -> None:
        """The owner's forced unmount revokes every unexpired leaf of the enrollment."""
        allocation_id, _latest = await self._renewed_mount()
        await self.store.force_unmount(allocation_id, "alice", NOW + 55 * MINUTE)
        self.assertEqual(
            [serial for serial, _ in await self.revoked(55 * MINUTE)], ["a1", "b1", "b2"]
        )

    async def test_enrollment_recorded_by_token_starts_a_chain(self) -> None:
        """A leaf recorded by record_enrollment is the start of its renewals' chain."""
        allocation = await self.provisioned()
        await self.store.create_enroll_token(allocation.allocation_id, "0" * 64, NOW, NOW + HOUR)
        grant = await self.store.consume_enroll_token("0" * 64, NOW)
        assert isinstance(grant, EnrollGrant)
        await self.store.record_enrollment(grant.token_id, enrollment_leaf("a1"))
        await self.store.acquire_mount(allocation.allocation_id, holder(serial="a1"), NOW, TTL)
        moved = await self.store.record_renewal("a1", renewed_leaf("b1", at=TTL))
        assert moved is not None
        await self.store.release_mount(allocation.allocation_id, moved.holder, NOW + 2 * TTL)
        self.assertEqual([s for s, _ in await self.revoked(2 * TTL)], ["a1", "b1"])

    async def test_other_enrollments_are_left_alone(self) -> None:
        """Ending one enrollment's lease revokes no leaf of another enrollment or agent."""
        allocation_id, latest = await self._renewed_mount()
        await self.provisioned("agent-2")
        await self.store.record_certificate(enrollment_leaf("c1"))
        await self.store.record_renewal("c1", renewed_leaf("c2", at=TTL))
        await self.store.record_certificate(enrollment_leaf("d1", "agent-2"))
        await self.store.release_mount(allocation_id, latest, NOW + 55 * MINUTE)
        self.assertEqual(
            [serial for serial, _ in await self.revoked(55 * MINUTE)], ["a1", "b1", "b2"]
        )

    async def test_revoking_the_allocation_revokes_the_chain(self) -> None:
        """
        Revoking the allocation revokes its lease's whole enrollment (and the
        agent's other enrollments: see contract_revocation).
        """
        allocation_id, _latest = await self._renewed_mount()
        await self.store.record_certificate(enrollment_leaf("c1", at=10 * MINUTE))
        await self.store.revoke_allocation(allocation_id, NOW + 55 * MINUTE)
        self.assertEqual(
            [serial for serial, _ in await self.revoked(55 * MINUTE)], ["a1", "b1", "b2", "c1"]
        )

    async def test_revoking_the_owner_revokes_every_chain(self) -> None:
        """revoke_owner revokes the enrollment of each of its allocations' leases."""
        allocation_id, _latest = await self._renewed_mount()
        other = await self.provisioned("agent-2")
        await self.store.record_certificate(enrollment_leaf("d1", "agent-2"))
        await self.store.acquire_mount(
            other.allocation_id, holder("agent-2", "d1"), NOW + 55 * MINUTE, TTL
        )
        await self.store.revoke_owner("alice", NOW + 55 * MINUTE)
        self.assertEqual(
            [serial for serial, _ in await self.revoked(55 * MINUTE)], ["a1", "b1", "b2", "d1"]
        )
        self.assertIsNone(await self.store.get_mount_lease(allocation_id))

    async def test_reassignment_revokes_the_chain(self) -> None:
        """Reassigning the agent revokes its lease's whole enrollment."""
        allocation_id, _latest = await self._renewed_mount()
        await self.store.reassign_agent(
            "agent-1", owner_id="bob", tenant_id="tenant-b", now=NOW + 55 * MINUTE
        )
        self.assertEqual(
            [serial for serial, _ in await self.revoked(55 * MINUTE)], ["a1", "b1", "b2"]
        )
        self.assertIsNone(await self.store.get_mount_lease(allocation_id))

    async def test_forced_takeover_revokes_nothing(self) -> None:
        """
        A forced takeover displaces the incumbent but revokes none of its
        leaves (it is demoted: its refresh is refused and its session fenced);
        the incumbent's chain is revoked only when the new lease ends.
        """
        allocation_id, latest = await self._renewed_mount()
        await self.store.refresh_mount(allocation_id, latest, NOW + 55 * MINUTE, TTL)
        await self.store.record_certificate(enrollment_leaf("c1", at=55 * MINUTE))
        outcome = await self.store.acquire_mount(
            allocation_id, holder(serial="c1"), NOW + 55 * MINUTE, TTL, force=True
        )
        assert isinstance(outcome, MountGranted)
        assert outcome.displaced is not None
        self.assertEqual(outcome.displaced.holder, latest)
        self.assertEqual(await self.revoked(55 * MINUTE), [])
        lease = await self.store.get_mount_lease(allocation_id)
        assert lease is not None
        self.assertEqual(lease.holder.leaf_serial, "c1")

    async def test_grants_without_takeover_revoke_nothing(self) -> None:
        """A first grant, the holder's forced refresh and taking an expired lease revoke nothing."""
        allocation = await self.provisioned()
        await self.store.record_certificate(enrollment_leaf("a1"))
        for serial, at, force in (("a1", 0, False), ("a1", 1, True), ("a2", 60, False)):
            outcome = await self.store.acquire_mount(
                allocation.allocation_id, holder(serial=serial), NOW + at * TTL, TTL, force
            )
            assert isinstance(outcome, MountGranted)
        self.assertEqual(await self.revoked(timedelta(0)), [])

    async def test_chain_survives_reopen(self) -> None:
        """The chain is durable: a reopened store still revokes it."""
        allocation_id, latest = await self._renewed_mount()
        reopened = await self.reopen()
        await reopened.release_mount(allocation_id, latest, NOW + 55 * MINUTE)
        self.assertEqual(
            [r.serial for r in await reopened.active_revocations(NOW + 55 * MINUTE)],
            ["a1", "b1", "b2"],
        )

    async def test_leaves_recorded_before_migration_3_start_chains(self) -> None:
        """An agent leaf recorded before migration 3 starts the chain of its renewals."""
        store = await self.open_previous_release((*_PREVIOUS_RELEASE_ROWS, _PREVIOUS_RELEASE_LEAF))
        moved = await store.record_renewal("a1", renewed_leaf("b1", at=TTL / 2))
        assert moved is not None
        await store.release_mount("f" * 32, moved.holder, NOW + TTL)
        self.assertEqual(
            [r.serial for r in await store.active_revocations(NOW + TTL)], ["a1", "b1"]
        )


#: The issued-certificate row of the previous release's lease holder (a1).
_PREVIOUS_RELEASE_LEAF = (
    "INSERT INTO issued_certificates (serial, kind, subject, tenant_id, agent_id, fingerprint,"
    f" not_after_us, issued_us) VALUES ('a1', 'agent_leaf', 'alice', 'tenant-a', 'agent-1',"
    f" '{'a1' * 32}', {to_micros(NOW + HOUR)}, {NOW_US})"
)
