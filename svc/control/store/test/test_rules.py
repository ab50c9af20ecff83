"""
Tests for L{svc.control.store.rules}: the decisions, on plain values.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import attrs
from twisted.trial.unittest import SynchronousTestCase

from svc.control.store.errors import Conflict, Revoked
from svc.control.store.outcomes import (
    EnrollGrant,
    EnrollRefusal,
    EnrollRefusalReason,
    MountConflict,
    MountConflictCode,
    MountGranted,
)
from svc.control.store.rules import (
    check_same_provisioning,
    choose_server,
    enroll_verdict,
    enrollment_of,
    enrollment_to_record,
    holds,
    leaves_to_revoke,
    mount_decision,
)
from svc.control.store.test.contract_support import HOUR, NOW, TTL, holder
from svc.control.store.values import (
    Allocation,
    AllocationState,
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
from svc.sessions import SessionRejected, mint_session_id, verify_session_id
from svc.testing.control_store import TEST_SESSION_KEY

ALLOCATION = Allocation(
    "a" * 32, "agent-1", "alice", "tenant-a", 10, AllocationState.PROVISIONED, NOW
)
USER = User("alice", "Alice", None, False, NOW)
TENANT = Tenant("tenant-a", "alice", False, NOW)
TOKEN = EnrollToken("t" * 32, "0" * 64, ALLOCATION.allocation_id, NOW, NOW + HOUR)
REVOKED = Allocation(
    "a" * 32, "agent-1", "alice", "tenant-a", 10, AllocationState.REVOKED, NOW, NOW
)


def _reason(
    token: EnrollToken | None = TOKEN,
    allocation: Allocation = ALLOCATION,
    user: User = USER,
    tenant: Tenant = TENANT,
) -> EnrollRefusalReason | None:
    outcome = enroll_verdict(token, (allocation, user, tenant), NOW)
    return outcome.reason if isinstance(outcome, EnrollRefusal) else None


class EnrollVerdictTests(SynchronousTestCase):
    """L{enroll_verdict}."""

    def test_grant(self) -> None:
        """A usable token is granted with what it is bound to."""
        self.assertEqual(
            enroll_verdict(TOKEN, (ALLOCATION, USER, TENANT), NOW),
            EnrollGrant(TOKEN.token_id, ALLOCATION, USER, TENANT),
        )

    def test_each_refusal(self) -> None:
        """Each broken condition gives its own reason."""
        suspended_user = User("alice", "Alice", None, True, NOW)
        suspended_tenant = Tenant("tenant-a", "alice", True, NOW)
        owner_scoped = Allocation(
            "a" * 32, None, "alice", "tenant-a", 10, AllocationState.PROVISIONED, NOW
        )
        cases = {
            EnrollRefusalReason.UNKNOWN: _reason(token=None),
            EnrollRefusalReason.CONSUMED: _reason(token=_token(consumed_at=NOW)),
            EnrollRefusalReason.REVOKED: _reason(token=_token(revoked_at=NOW)),
            EnrollRefusalReason.EXPIRED: _reason(token=_token(expires_at=NOW)),
            EnrollRefusalReason.ALLOCATION_REVOKED: _reason(allocation=REVOKED),
            EnrollRefusalReason.USER_SUSPENDED: _reason(user=suspended_user),
            EnrollRefusalReason.TENANT_SUSPENDED: _reason(tenant=suspended_tenant),
            EnrollRefusalReason.AGENT_SCOPE_REQUIRED: _reason(allocation=owner_scoped),
        }
        self.assertEqual({expected: got for expected, got in cases.items()}, {e: e for e in cases})

    def test_token_reasons_come_first(self) -> None:
        """A consumed token of a suspended user is reported consumed (401 before 403)."""
        suspended = User("alice", "Alice", None, True, NOW)
        self.assertEqual(
            _reason(token=_token(consumed_at=NOW), user=suspended), EnrollRefusalReason.CONSUMED
        )

    def test_credential_reasons(self) -> None:
        """Exactly the token's own states are credential failures (401)."""
        invalid = {reason for reason in EnrollRefusalReason if reason.credential_invalid}
        self.assertEqual(
            invalid,
            {
                EnrollRefusalReason.UNKNOWN,
                EnrollRefusalReason.CONSUMED,
                EnrollRefusalReason.REVOKED,
                EnrollRefusalReason.EXPIRED,
            },
        )


def _token(**changes: Any) -> EnrollToken:
    return attrs.evolve(TOKEN, **changes)


NONCE = bytes(range(8))


def _lease(serial: str, bound_at_offset: timedelta = timedelta(0)) -> MountLease:
    bound = NOW + bound_at_offset
    return MountLease(
        ALLOCATION.allocation_id, holder(serial=serial), "mount:" + "1" * 64, 4, bound, bound + TTL
    )


def _decide_for(
    allocation: Allocation, owner: MountHolder, force: bool = False
) -> MountGranted | MountConflict:
    return mount_decision(
        allocation,
        None,
        owner,
        NOW,
        TTL,
        force,
        session_key=TEST_SESSION_KEY,
        mount_epoch=4,
        nonce=NONCE,
    )


class MountDecisionTests(SynchronousTestCase):
    """L{mount_decision} and L{holds}."""

    def _decide(
        self,
        incumbent: MountLease | None,
        serial: str,
        force: bool = False,
        at: timedelta = timedelta(0),
    ) -> MountGranted | MountConflict:
        return mount_decision(
            ALLOCATION,
            incumbent,
            holder(serial=serial),
            NOW + at,
            TTL,
            force,
            session_key=TEST_SESSION_KEY,
            mount_epoch=4,
            nonce=NONCE,
        )

    def test_free(self) -> None:
        """No incumbent: granted from now for the TTL, at the next epoch, with a minted session."""
        outcome = self._decide(None, "a1")
        session_id = mint_session_id(
            TEST_SESSION_KEY, tenant_id="tenant-a", agent_id="agent-1", epoch=5, nonce=NONCE
        )
        self.assertEqual(
            outcome,
            MountGranted(
                MountLease(
                    ALLOCATION.allocation_id, holder(serial="a1"), session_id, 5, NOW, NOW + TTL
                )
            ),
        )

    def test_session_is_for_the_allocation(self) -> None:
        """The session verifies for the allocation's tenant and agent only."""
        outcome = _decide_for(attrs.evolve(ALLOCATION, tenant_id="tenant-b"), holder())
        assert isinstance(outcome, MountGranted)
        session = verify_session_id(
            TEST_SESSION_KEY, outcome.lease.session_id, tenant_id="tenant-b", agent_id="agent-1"
        )
        self.assertEqual(session.epoch, 5)
        for tenant_id, agent_id in (("tenant-a", "agent-1"), ("tenant-b", "agent-2")):
            self.assertRaises(
                SessionRejected,
                verify_session_id,
                TEST_SESSION_KEY,
                outcome.lease.session_id,
                tenant_id=tenant_id,
                agent_id=agent_id,
            )

    def test_matrix(self) -> None:
        """Live incumbents refuse unless forced; expired ones never stand in the way."""
        live = _lease("a1")
        self.assertEqual(
            self._decide(live, "a1"), MountConflict(MountConflictCode.ALREADY_MOUNTED, live)
        )
        self.assertEqual(
            self._decide(live, "a2"), MountConflict(MountConflictCode.LEASE_LIVE, live)
        )
        forced_same = self._decide(live, "a1", force=True)
        assert isinstance(forced_same, MountGranted)
        self.assertIsNone(forced_same.displaced)
        forced_other = self._decide(live, "a2", force=True)
        assert isinstance(forced_other, MountGranted)
        self.assertEqual(forced_other.displaced, live)
        expired = self._decide(live, "a2", at=TTL)
        assert isinstance(expired, MountGranted)
        self.assertIsNone(expired.displaced)

    def test_wrong_agent_and_revoked(self) -> None:
        """Another agent or owner-scoped allocation is wrong_agent even forced; revoked raises."""
        self.assertEqual(
            _decide_for(ALLOCATION, holder("agent-2"), force=True),
            MountConflict(MountConflictCode.WRONG_AGENT),
        )
        self.assertEqual(
            _decide_for(attrs.evolve(ALLOCATION, agent_id=None), holder(), force=True),
            MountConflict(MountConflictCode.WRONG_AGENT),
        )
        self.assertRaises(Revoked, _decide_for, REVOKED, holder())

    def test_holds(self) -> None:
        """Holding means the same leaf serial and agent; nothing is held without a lease."""
        lease = _lease("a1")
        self.assertTrue(holds(lease, holder(serial="a1")))
        self.assertFalse(holds(lease, holder(serial="a2")))
        self.assertFalse(holds(lease, holder("agent-2", "a1")))
        self.assertFalse(holds(None, holder()))


def _server(server_id: str, capacity: int, registered_offset: int = 0) -> Server:
    at = NOW + timedelta(seconds=registered_offset)
    return Server(server_id, f"{server_id}.example", "x:1", capacity, at, at)


class ChooseServerTests(SynchronousTestCase):
    """L{choose_server}."""

    def test_least_loaded_with_room(self) -> None:
        """The server with fewest tenants among those with spare capacity wins."""
        servers = [_server("s1", 2), _server("s2", 5), _server("s3", 1)]
        self.assertEqual(choose_server(servers, {"s1": 1, "s2": 2, "s3": 1}), servers[0])
        self.assertEqual(choose_server(servers, {"s1": 2, "s2": 2, "s3": 1}), servers[1])

    def test_ties_and_full(self) -> None:
        """Ties go to the earliest registered, then the smallest id; all full is None."""
        servers = [_server("s2", 3, 0), _server("s1", 3, 0), _server("s0", 3, 5)]
        self.assertEqual(choose_server(servers, {}), servers[1])
        self.assertIsNone(choose_server(servers, {"s0": 3, "s1": 3, "s2": 3}))
        self.assertIsNone(choose_server([_server("s9", 0)], {}))
        self.assertIsNone(choose_server([], {}))


class SameProvisioningTests(SynchronousTestCase):
    """L{check_same_provisioning}."""

    def test_rules(self) -> None:
        """Same request passes; other owner, tenant or grant conflict; revoked raises Revoked."""
        check_same_provisioning(ALLOCATION, "alice", "tenant-a", 10)
        codes = []
        for owner, tenant, grant in (
            ("bob", "tenant-a", 10),
            ("alice", "t", 10),
            ("alice", "tenant-a", 9),
        ):
            try:
                check_same_provisioning(ALLOCATION, owner, tenant, grant)
            except Conflict as conflict:
                codes.append(conflict.code)
        self.assertEqual(codes, ["agent_owner_mismatch", "agent_owner_mismatch", "grant_mismatch"])
        self.assertRaises(Revoked, check_same_provisioning, REVOKED, "alice", "tenant-a", 10)


class EnrollmentChainTests(SynchronousTestCase):
    """
    Which enrollment a leaf belongs to, and what ending a lease revokes.
    """

    def test_enrollment_of(self) -> None:
        """A leaf's recorded enrollment, or the leaf itself when none is recorded."""
        self.assertEqual(enrollment_of("b2", "a1"), "a1")
        self.assertEqual(enrollment_of("b2", None), "b2")

    def test_enrollment_to_record(self) -> None:
        """An enrolled leaf starts its enrollment, a renewed one joins it, others have none."""
        leaf = IssuedCertificate("b1", CertificateKind.AGENT_LEAF, "alice", NOW + HOUR, NOW)
        self.assertEqual(enrollment_to_record(leaf, None), "b1")
        self.assertEqual(enrollment_to_record(leaf, "a1"), "a1")
        server = attrs.evolve(leaf, kind=CertificateKind.SERVER_LEAF)
        self.assertIsNone(enrollment_to_record(server, "a1"))

    def test_leaves_to_revoke(self) -> None:
        """The lease's leaf and the others, unexpired, once each, by serial."""
        lease = MountLease("a" * 32, holder(serial="b2"), "mount:x", 1, NOW, NOW + TTL)
        chain = [
            RevocableLeaf("b1", NOW + TTL),
            RevocableLeaf("a1", NOW),
            RevocableLeaf("b2", NOW + HOUR),
            RevocableLeaf("b3", NOW + 2 * HOUR),
        ]
        self.assertEqual(
            leaves_to_revoke(lease, chain, NOW),
            (
                RevocableLeaf("b1", NOW + TTL),
                RevocableLeaf("b2", NOW + HOUR),
                RevocableLeaf("b3", NOW + 2 * HOUR),
            ),
        )
        self.assertEqual(leaves_to_revoke(lease, [], NOW + HOUR), ())
        self.assertEqual(
            leaves_to_revoke(None, chain, NOW + HOUR), (RevocableLeaf("b3", NOW + 2 * HOUR),)
        )
