"""
Tests for C{POST /agent/renew}: an agent holding a live leaf gets a fresh
one by proving possession of its key (signed request through the HTTP app),
and every refusal.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from svc.control.agent_auth import sign_request
from svc.control.store.values import CertificateKind
from svc.control.test.backends import PostgresBackend, RouteBackend, SQLiteBackend
from svc.control.test.test_enrollment_support import (
    NOW,
    TRUST_DOMAIN,
    Enrolled,
    RouteWorld,
)
from svc.pki.chain import verify_chain
from svc.pki.identity import DenyList, admit_agent
from svc.pki.issuance import issue_agent_leaf, issue_org_root, issue_tenant_intermediate
from svc.pki.pem import certs_to_pem
from svc.testing.web import Answer

RENEW = "/agent/renew"


class RenewContract(RouteBackend):
    """A signed renewal request mints a new leaf for the same agent."""

    async def set_up(self) -> None:
        self.world = await RouteWorld.open(self, SVC_ENROLL_RATE_LIMIT="3/60")
        self.enrolled = await self.world.enrolled()

    def now_ms(self) -> int:
        return int(self.world.clock.seconds() * 1000)

    def signed_body(
        self,
        enrolled: Enrolled | None = None,
        *,
        key: Ed25519PrivateKey | None = None,
        path: str = RENEW,
        timestamp_ms: int | None = None,
    ) -> dict[str, Any]:
        enrolled = enrolled or self.enrolled
        body: dict[str, Any] = sign_request(
            key or enrolled.key,
            enrolled.leaf,
            "POST",
            path,
            self.now_ms() if timestamp_ms is None else timestamp_ms,
        )
        body["ca_chain_pem"] = enrolled.body["ca_chain_pem"]
        return body

    async def renew(self, body: dict[str, Any] | None) -> Answer:
        return await self.world.post_json(RENEW, body)

    def assertRefused(self, answer: Answer, status: int, code: str, description: str = "") -> None:
        self.assertEqual(answer.status, status, answer.body)
        body = answer.json()
        self.assertEqual(body["error"], code)
        self.assertEqual(body.get("error_description", ""), description)

    async def test_renewal(self) -> None:
        """200: a new leaf, new key, same tenant/agent/owner, valid one hour from now."""
        self.world.clock.advance(50 * 60)
        answer = await self.renew(self.signed_body())
        self.assertEqual(answer.status, 200, answer.body)
        renewed = Enrolled(answer.json())
        self.assertNotEqual(renewed.serial, self.enrolled.serial)
        self.assertNotEqual(renewed.body["client_key_pem"], self.enrolled.body["client_key_pem"])
        intermediate, root = renewed.chain
        now = NOW + timedelta(minutes=50)
        verify_chain(renewed.leaf, [intermediate], root, now)
        identity = admit_agent(renewed.leaf, intermediate, TRUST_DOMAIN, DenyList())
        self.assertEqual(
            (identity.tenant_id, identity.agent_id, identity.user_id), ("acme", "agent-1", "alice")
        )
        self.assertEqual(renewed.leaf.not_valid_after_utc, now + timedelta(hours=1))
        self.assertEqual(renewed.body["allocation_id"], self.enrolled.body["allocation_id"])

    async def test_renewal_recorded(self) -> None:
        """The renewed leaf is recorded as an issued agent leaf."""
        renewed = Enrolled((await self.renew(self.signed_body())).json())
        record = await self.world.result(self.world.store.find_certificate(renewed.serial))
        self.assertEqual(record.kind, CertificateKind.AGENT_LEAF)
        self.assertEqual((record.tenant_id, record.agent_id), ("acme", "agent-1"))

    async def test_renewal_reports_tenant_placed(self) -> None:
        """A renewal tells the push loop the tenant is placed; a refused one does not."""
        self.assertEqual(self.world.pushes.placed, ["acme"])
        self.assertEqual((await self.renew(self.signed_body())).status, 200)
        self.assertEqual(self.world.pushes.placed, ["acme", "acme"])
        self.assertEqual(
            (await self.renew(self.signed_body(key=Ed25519PrivateKey.generate()))).status, 401
        )
        self.assertEqual(self.world.pushes.placed, ["acme", "acme"])

    async def test_renewed_leaf_renews(self) -> None:
        """A renewed leaf can itself be renewed, so a mount outlives one hour."""
        renewed = Enrolled((await self.renew(self.signed_body())).json())
        self.world.clock.advance(55 * 60)
        self.assertEqual((await self.renew(self.signed_body(renewed))).status, 200)

    async def test_leaf_alone_with_intermediate_in_client_cert(self) -> None:
        """client_cert_pem may carry the leaf then its intermediate instead of ca_chain_pem."""
        body = self.signed_body()
        del body["ca_chain_pem"]
        body["client_cert_pem"] += certs_to_pem([self.enrolled.intermediate]).decode()
        self.assertEqual((await self.renew(body)).status, 200)

    async def test_without_intermediate(self) -> None:
        """A leaf without its intermediate does not verify: 401 invalid_client."""
        body = self.signed_body()
        del body["ca_chain_pem"]
        self.assertRefused(await self.renew(body), 401, "invalid_client")

    async def test_expired_leaf(self) -> None:
        """A leaf past its NotAfter: 401 invalid_client."""
        self.world.clock.advance(3601)
        self.assertRefused(await self.renew(self.signed_body()), 401, "invalid_client")

    async def test_other_root(self) -> None:
        """A well-formed leaf for the same tenant/agent under another org's root: 401."""
        root = issue_org_root("Intruder", NOW)
        intermediate = issue_tenant_intermediate(root, "acme", TRUST_DOMAIN, NOW)
        leaf = issue_agent_leaf(
            intermediate,
            tenant_id="acme",
            agent_id="agent-1",
            user_id="alice",
            trust_domain=TRUST_DOMAIN,
            now=NOW,
        )
        body: dict[str, Any] = sign_request(leaf.key, leaf.cert, "POST", RENEW, self.now_ms())
        body["ca_chain_pem"] = certs_to_pem([intermediate.cert, root.cert]).decode()
        self.assertRefused(await self.renew(body), 401, "invalid_client")

    async def test_revoked_serial(self) -> None:
        """A leaf whose serial is in cert_revocations: 401 invalid_client."""
        await self.world.result(
            self.world.store.add_revocation(
                self.enrolled.serial, self.enrolled.leaf.not_valid_after_utc, NOW
            )
        )
        self.assertRefused(await self.renew(self.signed_body()), 401, "invalid_client")

    async def test_revoked_allocation(self) -> None:
        """The agent's allocation was revoked: 410 revoked."""
        allocation_id = self.enrolled.body["allocation_id"]
        await self.world.result(self.world.store.revoke_allocation(allocation_id, NOW))
        self.assertRefused(await self.renew(self.signed_body()), 410, "revoked")

    async def test_suspended_user(self) -> None:
        """The owner is suspended: 403 user_suspended."""
        await self.world.result(self.world.store.set_user_suspended("alice", True))
        self.assertRefused(
            await self.renew(self.signed_body()), 403, "access_denied", "user_suspended"
        )

    async def test_suspended_tenant(self) -> None:
        """The tenant is suspended: 403 tenant_suspended."""
        await self.world.result(self.world.store.set_tenant_suspended("acme", True))
        self.assertRefused(
            await self.renew(self.signed_body()), 403, "access_denied", "tenant_suspended"
        )

    async def test_reassigned_agent(self) -> None:
        """
        An agent moved to another owner cannot renew the old owner's leaf:
        401, the reassignment revoked it; were it not listed, 403
        allocation_reassigned.
        """
        await self.world.result(
            self.world.store.reassign_agent("agent-1", owner_id="bob", tenant_id="beta", now=NOW)
        )
        self.assertRefused(await self.renew(self.signed_body()), 401, "invalid_client")
        await self.sql(self.world.store, "DELETE FROM cert_revocations")
        self.world.clock.advance(1)  # a new proof, not a replayed one
        self.assertRefused(
            await self.renew(self.signed_body()), 403, "access_denied", "allocation_reassigned"
        )

    async def test_revoked_allocation_second_enrollment(self) -> None:
        """
        After its allocation is revoked, a second enrollment of the agent
        (which never mounted) is refused 410 revoked, as the first is.
        """
        second = await self.world.enrolled()
        allocation_id = self.enrolled.body["allocation_id"]
        self.assertEqual(second.body["allocation_id"], allocation_id)
        await self.world.result(self.world.store.revoke_allocation(allocation_id, NOW))
        for enrolled in (second, self.enrolled):
            self.assertRefused(await self.renew(self.signed_body(enrolled)), 410, "revoked")

    async def test_bad_signature(self) -> None:
        """A proof signed by another key: 401 invalid_client."""
        body = self.signed_body(key=Ed25519PrivateKey.generate())
        self.assertRefused(await self.renew(body), 401, "invalid_client")

    async def test_signature_for_another_route(self) -> None:
        """A proof signed for another path does not authorise a renewal."""
        body = self.signed_body(path="/allocations/x/mount")
        self.assertRefused(await self.renew(body), 401, "invalid_client")

    async def test_stale_timestamp(self) -> None:
        """A proof more than 60 s old (or ahead) is refused."""
        self.assertRefused(
            await self.renew(self.signed_body(timestamp_ms=self.now_ms() - 60_001)),
            401,
            "invalid_client",
        )
        self.assertRefused(
            await self.renew(self.signed_body(timestamp_ms=self.now_ms() + 60_001)),
            401,
            "invalid_client",
        )

    async def test_timestamp_at_window_edge(self) -> None:
        """A proof exactly 60 s old is still accepted."""
        answer = await self.renew(self.signed_body(timestamp_ms=self.now_ms() - 60_000))
        self.assertEqual(answer.status, 200)

    async def test_replayed_proof(self) -> None:
        """The same signed body is accepted once."""
        body = self.signed_body()
        self.assertEqual((await self.renew(body)).status, 200)
        self.assertRefused(await self.renew(body), 401, "invalid_client")

    async def test_malformed_proofs(self) -> None:
        """Missing or malformed proof fields and certificates are 401 invalid_client."""
        good = self.signed_body()
        variants: list[dict[str, Any]] = [
            {**good, "proof_signature": "not base64!"},
            {**good, "proof_signature": "AAAA"},
            {**good, "proof_timestamp_ms": "1"},
            {**good, "proof_timestamp_ms": True},
            {k: v for k, v in good.items() if k != "proof_signature"},
            {**good, "client_cert_pem": "garbage"},
            {**good, "client_cert_pem": 7},
        ]
        for body in variants:
            self.assertRefused(await self.renew(body), 401, "invalid_client")

    async def test_fingerprint_is_not_enough(self) -> None:
        """agent_fingerprint identifies but proves no key: 401 proof_of_possession_required."""
        answer = await self.renew({"agent_fingerprint": self.enrolled.body["agent_fingerprint"]})
        self.assertRefused(answer, 401, "invalid_client", "proof_of_possession_required")

    async def test_no_credential(self) -> None:
        """No body and no client certificate: 401 invalid_client."""
        self.assertRefused(await self.renew(None), 401, "invalid_client")

    async def test_rate_limited_per_leaf(self) -> None:
        """Renewals of one leaf are rate-limited (429 with Retry-After)."""
        for _ in range(3):
            self.assertEqual((await self.renew(self.signed_body())).status, 200)
            self.world.clock.advance(1)
        answer = await self.renew(self.signed_body())
        self.assertRefused(answer, 429, "rate_limited")
        self.assertEqual(answer.header("Retry-After"), "57")

    async def test_no_ca(self) -> None:
        """Without an open CA: 503 with Retry-After: 60."""
        world = await RouteWorld.open(self, with_root=False)
        answer = await world.post_json(RENEW, self.signed_body())
        self.assertRefused(answer, 503, "temporarily_unavailable", "agent_ca_not_ready")
        self.assertEqual(answer.header("Retry-After"), "60")


# On both backends: SQLite in memory, synchronously; PostgreSQL.


class RenewTests(RenewContract, SQLiteBackend):
    """Renew over SQLite."""


class PostgresRenewTests(RenewContract, PostgresBackend):
    """Renew over PostgreSQL."""
