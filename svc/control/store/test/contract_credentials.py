"""
The contract of credentials: the enroll-token state table, single use under
concurrency, API tokens, admin sessions, and that only hashes are stored.
"""

from __future__ import annotations

from datetime import timedelta

from twisted.internet.defer import gatherResults

from svc.control.store.errors import Conflict, InvalidValue, NotFound, Revoked
from svc.control.store.outcomes import EnrollGrant, EnrollRefusal, EnrollRefusalReason
from svc.control.store.test.contract_support import (
    HOUR,
    NOW,
    StoreCase,
    token_hash,
)
from svc.control.store.values import CertificateKind, IssuedCertificate

SECRET = "enroll-secret"


def _refused(reason: EnrollRefusalReason) -> EnrollRefusal:
    return EnrollRefusal(reason)


class CredentialsContract(StoreCase):
    """Enroll tokens, API tokens and admin sessions."""

    async def test_token_is_consumed_once(self) -> None:
        """A valid token yields a grant naming its allocation, user and tenant, then is consumed."""
        allocation = await self.provisioned()
        token_id = await self.enroll_token(allocation)
        grant = await self.store.consume_enroll_token(token_hash(SECRET), NOW)
        assert isinstance(grant, EnrollGrant)
        self.assertEqual(grant.token_id, token_id)
        self.assertEqual(grant.allocation, allocation)
        self.assertEqual(
            (grant.agent_id, grant.user.user_id, grant.tenant.tenant_id),
            ("agent-1", "alice", "tenant-a"),
        )
        self.assertEqual((await self.store.get_enroll_token(token_id)).consumed_at, NOW)
        self.assertEqual(
            await self.store.consume_enroll_token(token_hash(SECRET), NOW),
            _refused(EnrollRefusalReason.CONSUMED),
        )

    async def test_unknown_token(self) -> None:
        """A hash nobody stored is unknown, a 401 reason."""
        outcome = await self.store.consume_enroll_token(token_hash("never-issued"), NOW)
        self.assertEqual(outcome, _refused(EnrollRefusalReason.UNKNOWN))
        self.assertTrue(EnrollRefusalReason.UNKNOWN.credential_invalid)

    async def test_expired_token(self) -> None:
        """A token is expired from its expires_at on, and stays unspent."""
        allocation = await self.provisioned()
        token_id = await self.enroll_token(allocation, expires_in=HOUR)
        outcome = await self.store.consume_enroll_token(token_hash(SECRET), NOW + HOUR)
        self.assertEqual(outcome, _refused(EnrollRefusalReason.EXPIRED))
        self.assertIsNone((await self.store.get_enroll_token(token_id)).consumed_at)
        just_before = NOW + HOUR - timedelta(microseconds=1)
        self.assertIsInstance(
            await self.store.consume_enroll_token(token_hash(SECRET), just_before), EnrollGrant
        )

    async def test_revoked_token(self) -> None:
        """A revoked token is refused; revoking again or after use changes nothing."""
        allocation = await self.provisioned()
        token_id = await self.enroll_token(allocation)
        revoked = await self.store.revoke_enroll_token(token_id, NOW)
        self.assertEqual(revoked.revoked_at, NOW)
        self.assertEqual(await self.store.revoke_enroll_token(token_id, NOW + HOUR), revoked)
        self.assertEqual(
            await self.store.consume_enroll_token(token_hash(SECRET), NOW),
            _refused(EnrollRefusalReason.REVOKED),
        )
        await self.refused(self.store.revoke_enroll_token("0" * 32, NOW), NotFound)

    async def test_suspended_user_and_tenant(self) -> None:
        """Suspended user or tenant refuse the token with a 403 reason and leave it unspent."""
        allocation = await self.provisioned()
        await self.enroll_token(allocation)
        await self.store.set_user_suspended("alice", True)
        outcome = await self.store.consume_enroll_token(token_hash(SECRET), NOW)
        self.assertEqual(outcome, _refused(EnrollRefusalReason.USER_SUSPENDED))
        self.assertFalse(EnrollRefusalReason.USER_SUSPENDED.credential_invalid)
        await self.store.set_user_suspended("alice", False)
        await self.store.set_tenant_suspended("tenant-a", True)
        self.assertEqual(
            await self.store.consume_enroll_token(token_hash(SECRET), NOW),
            _refused(EnrollRefusalReason.TENANT_SUSPENDED),
        )
        await self.store.set_tenant_suspended("tenant-a", False)
        self.assertIsInstance(
            await self.store.consume_enroll_token(token_hash(SECRET), NOW), EnrollGrant
        )

    async def test_owner_scoped_allocation_needs_agent_scope(self) -> None:
        """A token bound to an allocation without an agent is refused agent_scope_required."""
        allocation = await self.provisioned(agent_id=None)
        await self.enroll_token(allocation)
        self.assertEqual(
            await self.store.consume_enroll_token(token_hash(SECRET), NOW),
            _refused(EnrollRefusalReason.AGENT_SCOPE_REQUIRED),
        )

    async def test_peek_spends_nothing(self) -> None:
        """Peeking answers what consuming would, and the token is still spendable after."""
        allocation = await self.provisioned()
        await self.enroll_token(allocation)
        peeked = await self.store.peek_enroll_token(token_hash(SECRET), NOW)
        self.assertIsInstance(peeked, EnrollGrant)
        self.assertEqual(await self.store.consume_enroll_token(token_hash(SECRET), NOW), peeked)
        self.assertEqual(
            await self.store.peek_enroll_token(token_hash(SECRET), NOW),
            _refused(EnrollRefusalReason.CONSUMED),
        )

    async def test_concurrent_consumers_get_one_grant(self) -> None:
        """Consumers of one token in flight together: exactly one grant, the rest consumed."""
        allocation = await self.provisioned()
        await self.enroll_token(allocation)
        outcomes = await gatherResults(
            [self.store.consume_enroll_token(token_hash(SECRET), NOW) for _ in range(5)]
        )
        grants = [o for o in outcomes if isinstance(o, EnrollGrant)]
        self.assertEqual(len(grants), 1)
        self.assertEqual(
            [o for o in outcomes if not isinstance(o, EnrollGrant)],
            [_refused(EnrollRefusalReason.CONSUMED)] * 4,
        )

    async def test_token_creation_rules(self) -> None:
        """Tokens need a live allocation, a well-formed hash, and a hash not already stored."""
        allocation = await self.provisioned()
        await self.enroll_token(allocation)
        error = await self.refused(
            self.store.create_enroll_token(
                allocation.allocation_id, token_hash(SECRET), NOW, NOW + HOUR
            ),
            Conflict,
        )
        self.assertEqual(error.code, "duplicate_token")
        await self.refused(
            self.store.create_enroll_token(allocation.allocation_id, SECRET, NOW, NOW + HOUR),
            InvalidValue,
        )
        await self.refused(
            self.store.create_enroll_token("0" * 32, token_hash("x"), NOW, NOW + HOUR), NotFound
        )
        await self.store.revoke_allocation(allocation.allocation_id, NOW)
        await self.refused(
            self.store.create_enroll_token(
                allocation.allocation_id, token_hash("y"), NOW, NOW + HOUR
            ),
            Revoked,
        )

    async def test_record_enrollment(self) -> None:
        """The minted leaf is recorded on its spent token and found by serial and fingerprint."""
        allocation = await self.provisioned()
        token_id = await self.enroll_token(allocation)
        leaf = IssuedCertificate(
            serial="1f2e3d",
            kind=CertificateKind.AGENT_LEAF,
            subject="alice",
            not_after=NOW + HOUR,
            issued_at=NOW,
            tenant_id="tenant-a",
            agent_id="agent-1",
            fingerprint="ab" * 32,
        )
        await self.refused(self.store.record_enrollment(token_id, leaf), NotFound)
        await self.store.consume_enroll_token(token_hash(SECRET), NOW)
        await self.store.record_enrollment(token_id, leaf)
        self.assertEqual((await self.store.get_enroll_token(token_id)).leaf_serial, "1f2e3d")
        self.assertEqual(await self.store.find_certificate("1f2e3d"), leaf)
        self.assertEqual(await self.store.find_certificate_by_fingerprint("ab" * 32), leaf)
        await self.refused(self.store.find_certificate("ffff"), NotFound)
        await self.refused(self.store.find_certificate_by_fingerprint("cd" * 32), NotFound)

    async def test_api_token_lifecycle(self) -> None:
        """API tokens are created, listed, found by hash (last use noted), revoked by their user."""
        await self.store.put_user("alice", "Alice", NOW)
        await self.store.put_user("bob", "Bob", NOW)
        token = await self.store.create_api_token("alice", "ci", token_hash("svc_one"), NOW)
        self.assertIsNone(token.last_used_at)
        used = await self.store.authenticate_api_token(token_hash("svc_one"), NOW + HOUR)
        assert used is not None
        self.assertEqual((used.token_id, used.last_used_at), (token.token_id, NOW + HOUR))
        self.assertIsNone(await self.store.authenticate_api_token(token_hash("svc_other"), NOW))
        self.assertEqual(await self.store.list_api_tokens("alice"), (used,))
        self.assertEqual(await self.store.list_api_tokens("bob"), ())
        await self.refused(self.store.revoke_api_token("bob", token.token_id, NOW), NotFound)
        revoked = await self.store.revoke_api_token("alice", token.token_id, NOW + HOUR)
        self.assertEqual(revoked.revoked_at, NOW + HOUR)
        self.assertEqual(
            await self.store.revoke_api_token("alice", token.token_id, NOW + 2 * HOUR), revoked
        )
        self.assertIsNone(
            await self.store.authenticate_api_token(token_hash("svc_one"), NOW + HOUR)
        )
        self.assertEqual(await self.store.list_api_tokens("alice"), (revoked,))
        await self.refused(
            self.store.create_api_token("nobody", "x", token_hash("z"), NOW), NotFound
        )

    async def test_api_token_of_suspended_user_does_not_authenticate(self) -> None:
        """A suspended user's API tokens authenticate nobody until reinstated."""
        await self.store.put_user("alice", "Alice", NOW)
        await self.store.create_api_token("alice", "ci", token_hash("svc_one"), NOW)
        await self.store.set_user_suspended("alice", True)
        self.assertIsNone(await self.store.authenticate_api_token(token_hash("svc_one"), NOW))
        await self.store.set_user_suspended("alice", False)
        self.assertIsNotNone(await self.store.authenticate_api_token(token_hash("svc_one"), NOW))

    async def test_admin_session_lifecycle(self) -> None:
        """Sessions authenticate until they expire or are revoked, then are pruned."""
        user = await self.store.put_user("alice", "Alice", NOW)
        session = await self.store.create_admin_session(
            "alice", token_hash("cookie"), NOW, NOW + HOUR
        )
        found = await self.store.authenticate_admin_session(token_hash("cookie"), NOW)
        self.assertEqual(found, (session, user))
        self.assertIsNone(
            await self.store.authenticate_admin_session(token_hash("cookie"), NOW + HOUR)
        )
        self.assertIsNone(await self.store.authenticate_admin_session(token_hash("other"), NOW))
        await self.store.create_admin_session("alice", token_hash("second"), NOW, NOW + 2 * HOUR)
        await self.store.set_user_suspended("alice", True)
        self.assertIsNone(await self.store.authenticate_admin_session(token_hash("second"), NOW))
        await self.store.set_user_suspended("alice", False)
        self.assertTrue(await self.store.revoke_admin_session(token_hash("second"), NOW))
        self.assertFalse(await self.store.revoke_admin_session(token_hash("second"), NOW))
        self.assertIsNone(await self.store.authenticate_admin_session(token_hash("second"), NOW))
        await self.store.create_admin_session("alice", token_hash("third"), NOW, NOW + 3 * HOUR)
        self.assertEqual(await self.store.prune_admin_sessions(NOW + HOUR), 2)
        self.assertIsNotNone(
            await self.store.authenticate_admin_session(token_hash("third"), NOW + HOUR)
        )
        await self.refused(
            self.store.create_admin_session("nobody", token_hash("x"), NOW, NOW + HOUR), NotFound
        )

    async def test_only_hashes_are_stored(self) -> None:
        """No raw enroll token, API token or session token appears anywhere in the database."""
        allocation = await self.provisioned()
        secrets = ("raw-enroll-3f9a", "svc_raw-api-77c1", "raw-session-0b4e")
        await self.enroll_token(allocation, token=secrets[0])
        await self.store.create_api_token("alice", "ci", token_hash(secrets[1]), NOW)
        await self.store.create_admin_session("alice", token_hash(secrets[2]), NOW, NOW + HOUR)
        await self.store.consume_enroll_token(token_hash(secrets[0]), NOW)
        text = await self.stored_text()
        self.assertIn(token_hash(secrets[0]), text)
        for secret in secrets:
            self.assertNotIn(secret, text)
