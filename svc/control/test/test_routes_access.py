"""
Tests for L{svc.control.routes_access}: suspending and reinstating accounts
and tenants, and revoking one enroll token, through the real app assembly on
SQLite and PostgreSQL; what each change does to enrollment.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta

from svc.control.routes_entities import utc_now
from svc.control.store.outcomes import EnrollGrant, EnrollRefusal, EnrollRefusalReason
from svc.control.test.backends import PostgresBackend, SQLiteBackend
from svc.control.test.test_routes_entities import EntityRouteCase


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode("ascii")).hexdigest()


class AccessContract(EntityRouteCase):
    """The access routes; each test starts with agent a1 of owner acme."""

    async def set_up(self) -> None:
        await super().set_up()
        self.assertEqual((await self.provision()).status, 200)

    async def mint(self) -> tuple[str, str]:
        """A fresh enroll token for a1: the token and its id."""
        answer = await self.call("POST", "/v1/agents/a1/enroll-token")
        self.assertEqual(answer.status, 200, answer.body)
        return answer.json()["token"], answer.json()["token_id"]

    async def verdict(self, token: str) -> object:
        """What enrolling with C{token} would answer now (spending nothing)."""
        return await self.result(self.store.peek_enroll_token(_hash(token), self.now()))

    def now(self) -> datetime:
        return utc_now(self.clock)

    async def test_suspend_tenant_refuses_enrollment_until_reinstated(self) -> None:
        """A suspended tenant's tokens are refused tenant_suspended; reinstating restores them."""
        token, _ = await self.mint()
        suspended = await self.call("POST", "/v1/tenants/acme/suspend")
        self.assertEqual(
            (suspended.status, suspended.json()),
            (
                200,
                {
                    "tenant": "acme",
                    "owner": "acme",
                    "suspended": True,
                    "created_at": "2026-11-22T19:00:00Z",
                },
            ),
        )
        self.assertEqual(
            await self.verdict(token), EnrollRefusal(EnrollRefusalReason.TENANT_SUSPENDED)
        )
        reinstated = await self.call("POST", "/api/v1/tenants/acme/reinstate")
        self.assertEqual((reinstated.status, reinstated.json()["suspended"]), (200, False))
        self.assertIsInstance(await self.verdict(token), EnrollGrant)

    async def test_suspend_account_refuses_enrollment_and_revokes_nothing(self) -> None:
        """A suspended account's tokens are refused user_suspended; its agent stays provisioned."""
        token, _ = await self.mint()
        suspended = await self.call("POST", "/v1/entities/account/acme/suspend")
        self.assertEqual(suspended.status, 200, suspended.body)
        self.assertTrue(suspended.json()["suspended"])
        self.assertEqual([a["state"] for a in suspended.json()["allocations"]], ["provisioned"])
        self.assertEqual(
            await self.verdict(token), EnrollRefusal(EnrollRefusalReason.USER_SUSPENDED)
        )
        self.assertEqual(self.pushes.revocations, 0)
        agent = await self.call("GET", "/v1/entities/agent/a1")
        self.assertEqual((agent.status, agent.json()["state"]), (200, "provisioned"))
        resolved = await self.call("GET", "/v1/entities/account/acme")
        self.assertTrue(resolved.json()["suspended"])
        reinstated = await self.call("POST", "/api/v1/entities/account/acme/reinstate")
        self.assertFalse(reinstated.json()["suspended"])
        self.assertIsInstance(await self.verdict(token), EnrollGrant)

    async def test_reinstating_a_deleted_account_keeps_its_allocations_revoked(self) -> None:
        """After DELETE of the account, reinstating lifts the suspension only."""
        self.assertEqual((await self.call("DELETE", "/v1/entities/account/acme")).status, 204)
        reinstated = await self.call("POST", "/v1/entities/account/acme/reinstate")
        self.assertFalse(reinstated.json()["suspended"])
        self.assertEqual([a["state"] for a in reinstated.json()["allocations"]], ["revoked"])

    async def test_unknown_and_malformed(self) -> None:
        """Unknown accounts and tenants are 404; malformed ids 400; no token 401."""
        for path in ("/v1/entities/account/nobody/suspend", "/v1/tenants/nobody/suspend"):
            self.assertEqual((await self.call("POST", path)).status, 404, path)
        self.assertError(
            await self.call("POST", "/v1/tenants/a..b/suspend"),
            400,
            "invalid_request",
            "invalid_tenant",
        )
        self.assertError(
            await self.call("POST", "/v1/entities/account/-x/reinstate"),
            400,
            "invalid_request",
            "invalid_owner",
        )
        answer = await self.call("POST", "/v1/tenants/acme/suspend", headers={})
        self.assertEqual(answer.status, 401)

    async def test_revoke_unspent_token(self) -> None:
        """An unspent token revoked can no longer enroll; revoking again is the same answer."""
        token, token_id = await self.mint()
        answer = await self.call("POST", f"/v1/enroll-tokens/{token_id}/revoke")
        self.assertEqual(answer.status, 200, answer.body)
        body = answer.json()
        allocation_id = body.pop("allocation_id")
        self.assertEqual(len(allocation_id), 32)
        self.assertEqual(
            body,
            {
                "token_id": token_id,
                "agent_id": "a1",
                "state": "revoked",
                "created_at": "2026-11-22T19:00:00Z",
                "expires_at": "2026-11-22T19:10:00Z",
                "consumed_at": None,
                "revoked_at": "2026-11-22T19:00:00Z",
            },
        )
        self.assertEqual(await self.verdict(token), EnrollRefusal(EnrollRefusalReason.REVOKED))
        again = await self.call("POST", f"/v1/enroll-tokens/{token_id}/revoke")
        self.assertEqual(again.json(), answer.json())

    async def test_revoke_leaves_other_tokens(self) -> None:
        """Revoking one token leaves the agent's other tokens working."""
        _, first = await self.mint()
        other, _ = await self.mint()
        await self.call("POST", f"/v1/enroll-tokens/{first}/revoke")
        self.assertIsInstance(await self.verdict(other), EnrollGrant)

    async def test_revoke_spent_or_expired_token(self) -> None:
        """A spent token is answered consumed (not revoked); an expired unspent one is revoked."""
        token, token_id = await self.mint()
        spent = await self.result(self.store.consume_enroll_token(_hash(token), self.now()))
        self.assertIsInstance(spent, EnrollGrant)
        answer = await self.call("POST", f"/v1/enroll-tokens/{token_id}/revoke")
        self.assertEqual((answer.json()["state"], answer.json()["revoked_at"]), ("consumed", None))
        _, late = await self.mint()
        self.clock.advance(timedelta(minutes=11).total_seconds())
        answer = await self.call("POST", f"/v1/enroll-tokens/{late}/revoke")
        self.assertEqual(answer.json()["state"], "revoked")
        self.assertIsNotNone(answer.json()["revoked_at"])

    async def test_revoke_unknown_token(self) -> None:
        """An unknown or malformed token id is 404; the route is not under /api."""
        for token_id in ("0" * 32, "not-hex", "A" * 32):
            answer = await self.call("POST", f"/v1/enroll-tokens/{token_id}/revoke")
            self.assertEqual(answer.status, 404, token_id)
        _, token_id = await self.mint()
        answer = await self.call("POST", f"/api/v1/enroll-tokens/{token_id}/revoke")
        self.assertEqual(answer.status, 404)


class AccessTests(AccessContract, SQLiteBackend):
    """The access routes over SQLite."""


class PostgresAccessTests(AccessContract, PostgresBackend):
    """The access routes over PostgreSQL."""
