"""
Tests for L{svc.control.routes_entities} through the real app assembly
(L{build_control_app}), an in-memory store and fake data-plane servers.
"""

from __future__ import annotations

import base64
import hashlib
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
from twisted.internet.task import Clock
from twisted.web.resource import Resource

from svc.control.app import build_control_app
from svc.control.dataplane_client import QuotaUpdate, SessionFence
from svc.control.routes_access import AccessDeps, access_routes
from svc.control.routes_entities import EntityDeps, entity_routes, new_enroll_token
from svc.control.routing import Feature
from svc.control.settings import ControlSettings
from svc.control.store.outcomes import EnrollGrant
from svc.control.store.values import AllocationState, MountHolder
from svc.control.test.backends import PostgresBackend, RouteBackend, SQLiteBackend, json_body
from svc.control.test.test_dataplane_client import FakeDataPlane, fake_client
from svc.testing.web import Answer

NOW = datetime(2026, 11, 22, 19, 0, 0, tzinfo=UTC)
TOKEN = "service-token-" + "x" * 30
FQDN = "dp1.test"
ENVIRON = {
    "DATABASE_URL": "sqlite:///control.db",
    "SVC_CONTROL_PLANE_TOKEN": TOKEN,
    "SVC_SECRETS_DIR": "/secrets",
    "SVC_DEV_MODE": "1",
    "SVC_TRUST_DOMAIN": "svc.test",
    "SVC_MOUNT_PREFIX": "/mnt/agents-root",
    "SVC_ENROLL_TOKEN_TTL_SECONDS": "600",
}
SERVICE = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}


@attrs.define
class RecordedPushes:
    """L{svc.control.revocation_push.PushNotices} that records what it is told."""

    revocations: int = 0
    quotas: list[QuotaUpdate] = attrs.field(factory=list)
    placed: list[str] = attrs.field(factory=list)
    registered: list[str] = attrs.field(factory=list)
    fences: list[SessionFence] = attrs.field(factory=list)

    def revocations_changed(self) -> None:
        self.revocations += 1

    def quota_changed(self, update: QuotaUpdate) -> None:
        self.quotas.append(update)

    def tenant_placed(self, tenant_id: str) -> None:
        self.placed.append(tenant_id)

    def server_registered(self, fqdn: str) -> None:
        self.registered.append(fqdn)

    def session_granted(self, fence: SessionFence) -> None:
        self.fences.append(fence)


class EntityRouteCase(RouteBackend):
    """
    An app with the service-token entity and access routes over a fresh
    store (on either backend).
    """

    async def set_up(self) -> None:
        self.clock = Clock()
        self.clock.advance(NOW.timestamp())
        self.store = await self.open_control_store()
        self.plane = FakeDataPlane(FQDN)
        self.pushes = RecordedPushes()
        self.ca_ready = True
        self.random = iter(bytes([n]) * 32 for n in range(1, 100))
        deps = EntityDeps(
            store=self.store,
            settings=ControlSettings.from_environ(ENVIRON),
            clock=self.clock,
            client=fake_client({FQDN: self.plane}, self.clock),
            pushes=self.pushes,
            random_bytes=lambda n: next(self.random)[:n],
        )
        app = build_control_app(
            deps.settings,
            self.clock.seconds,
            [*entity_routes(deps), *access_routes(AccessDeps(self.store, self.clock))],
            ready=lambda feature: feature is not Feature.AGENT_CA or self.ca_ready,
        )
        self.resource: Resource = app.resource()

    async def call(
        self,
        method: str,
        path: str,
        body: object = None,
        *,
        headers: dict[str, str] | None = None,
    ) -> Answer:
        return await self.send(
            self.resource,
            method,
            path,
            headers=SERVICE if headers is None else headers,
            body=json_body(body),
        )

    async def provision(self, agent: str = "a1", owner: str = "acme", **extra: Any) -> Answer:
        body = {"type": "agent", "id": agent, "owner": owner, "grant_bytes": 1000, **extra}
        return await self.call("POST", "/v1/entities", body)

    def assertError(self, answer: Answer, status: int, code: str, description: str = "") -> None:
        expected: dict[str, object] = {"error": code}
        if description:
            expected["error_description"] = description
        self.assertEqual((answer.status, answer.json()), (status, expected))

    async def place(self, tenant: str = "acme") -> None:
        await self.result(self.store.register_server(FQDN, "10.0.0.1:7443", 10, NOW))
        await self.result(self.store.place_tenant(tenant, NOW))


class ProvisionContract(EntityRouteCase):
    """POST /v1/entities."""

    async def test_provision_agent(self) -> None:
        """A new agent is provisioned: 200 with its allocation and virtual_path."""
        answer = await self.provision(tenant="team-1")
        self.assertEqual(answer.status, 200)
        body = answer.json()
        self.assertEqual(len(body.pop("allocation_id")), 32)
        self.assertEqual(
            body,
            {
                "type": "agent",
                "id": "a1",
                "owner": "acme",
                "tenant": "team-1",
                "grant_bytes": 1000,
                "state": "provisioned",
                "virtual_path": "/mnt/agents-root/agents/a1",
                "created_at": "2026-11-22T19:00:00Z",
                "created": True,
            },
        )

    async def test_general_headers(self) -> None:
        """Responses carry X-Request-ID (echoed) and Svc-API-Version: 1."""
        answer = await self.call(
            "POST",
            "/v1/entities",
            {"type": "agent", "id": "a1", "owner": "acme", "grant_bytes": 1},
            headers={**SERVICE, "X-Request-ID": "req-42"},
        )
        self.assertEqual(answer.header("X-Request-ID"), "req-42")
        self.assertEqual(answer.header("Svc-API-Version"), "1")

    async def test_tenant_defaults_to_owner(self) -> None:
        """Without a tenant the owner is the tenant."""
        self.assertEqual((await self.provision()).json()["tenant"], "acme")

    async def test_idempotent(self) -> None:
        """The same request again answers the same allocation with created false."""
        first = (await self.provision()).json()
        again = await self.provision()
        self.assertEqual(again.status, 200)
        self.assertEqual(again.json(), {**first, "created": False})
        self.assertEqual(len(self.pushes.quotas), 1)

    async def test_api_alias(self) -> None:
        """The route is also served under /api."""
        body = {"type": "agent", "id": "a1", "owner": "acme", "grant_bytes": 5}
        self.assertEqual((await self.call("POST", "/api/v1/entities", body)).status, 200)

    async def test_conflicts(self) -> None:
        """A different grant, owner or a foreign tenant is 409 with the store's code."""
        await self.provision()
        grant = {"type": "agent", "id": "a1", "owner": "acme", "grant_bytes": 5}
        self.assertError(await self.call("POST", "/v1/entities", grant), 409, "grant_mismatch")
        self.assertError(await self.provision(owner="other"), 409, "agent_owner_mismatch")
        self.assertError(
            await self.provision(agent="a2", owner="other", tenant="acme"),
            409,
            "tenant_owner_mismatch",
        )

    async def test_revoked_agent_not_reprovisioned(self) -> None:
        """A revoked agent id is 410 revoked: ids are never reused."""
        await self.provision()
        await self.call("DELETE", "/v1/entities/agent/a1")
        self.assertError(await self.provision(), 410, "revoked")

    async def test_provision_account(self) -> None:
        """An account entity is an owner-scoped allocation without a virtual path."""
        body = {"type": "account", "id": "acme", "grant_bytes": 10}
        answer = await self.call("POST", "/v1/entities", body)
        self.assertEqual(answer.status, 200)
        self.assertEqual(answer.json()["type"], "account")
        self.assertEqual(answer.json()["owner"], "acme")
        self.assertNotIn("virtual_path", answer.json())
        self.assertEqual(self.pushes.quotas, [])

    async def test_whole_float_byte_count_is_that_integer(self) -> None:
        """JSON has one number type: 1000.0 and 1e3 are the integer 1000."""
        for spelled in (b"1000.0", b"1e3"):
            body = b'{"type":"agent","id":"a1","owner":"acme","grant_bytes":' + spelled + b"}"
            answer = await self.send(
                self.resource, "POST", "/v1/entities", headers=SERVICE, body=body
            )
            self.assertEqual(answer.status, 200, answer.body)
            self.assertEqual(answer.json()["grant_bytes"], 1000)
            self.assertIsInstance(answer.json()["grant_bytes"], int)

    async def test_invalid_bodies(self) -> None:
        """Bad ids, missing fields, bad byte counts and unknown types are 400."""
        cases: list[tuple[dict[str, object], str]] = [
            ({"type": "robot", "id": "a1", "owner": "o", "grant_bytes": 1}, "unknown_entity_type"),
            ({"type": "agent", "id": "../x", "owner": "o", "grant_bytes": 1}, "invalid_id"),
            ({"type": "agent", "id": "a1", "owner": "o/x", "grant_bytes": 1}, "invalid_owner"),
            ({"type": "agent", "id": "a1", "owner": 7, "grant_bytes": 1}, "invalid_owner"),
            ({"type": "agent", "id": "a1", "grant_bytes": 1}, "missing_field:owner"),
            ({"type": "agent", "id": "a1", "owner": "o"}, "missing_field:grant_bytes"),
            ({"type": "agent", "id": "a1", "owner": "o", "grant_bytes": -1}, "invalid_grant_bytes"),
            (
                {"type": "agent", "id": "a1", "owner": "o", "grant_bytes": 1.5},
                "invalid_grant_bytes",
            ),
            (
                {"type": "agent", "id": "a1", "owner": "o", "grant_bytes": True},
                "invalid_grant_bytes",
            ),
            (
                {"type": "agent", "id": "a1", "owner": "o", "grant_bytes": 2.0**60},
                "invalid_grant_bytes",
            ),
            (
                {"type": "agent", "id": "a1", "owner": "o", "grant_bytes": 2**63},
                "invalid_grant_bytes",
            ),
            (
                {"type": "agent", "id": "a1", "owner": "o", "tenant": "", "grant_bytes": 1},
                "invalid_tenant",
            ),
            (
                {"type": "account", "id": "o", "owner": "p", "grant_bytes": 1},
                "invalid_owner",
            ),
        ]
        for body, description in cases:
            self.assertError(
                await self.call("POST", "/v1/entities", body), 400, "invalid_request", description
            )

    async def test_body_required(self) -> None:
        """An empty body is 400 body_required."""
        self.assertError(
            await self.call("POST", "/v1/entities"), 400, "invalid_request", "body_required"
        )

    async def test_service_token_required(self) -> None:
        """Without the service token the route is 401 invalid_token with WWW-Authenticate."""
        for headers in ({}, {"Authorization": "Bearer wrong-token"}):
            answer = await self.call("POST", "/v1/entities", {"type": "agent"}, headers=headers)
            self.assertError(answer, 401, "invalid_token")
            self.assertEqual(answer.header("WWW-Authenticate"), "Bearer")

    async def test_grant_pushed_when_created(self) -> None:
        """A new agent's grant is handed to the push loop."""
        await self.provision()
        [update] = self.pushes.quotas
        self.assertEqual(update.body()["grant_bytes"], 1000)


class ResolveContract(EntityRouteCase):
    """GET /v1/entities/{type}/{id}."""

    async def test_agent(self) -> None:
        """An agent resolves to the provisioning answer without `created`."""
        created = (await self.provision()).json()
        del created["created"]
        answer = await self.call("GET", "/v1/entities/agent/a1")
        self.assertEqual((answer.status, answer.json()), (200, created))
        self.assertEqual((await self.call("GET", "/api/v1/entities/agent/a1")).json(), created)

    async def test_unknown(self) -> None:
        """Unknown agents, accounts and entity types are 404."""
        self.assertEqual((await self.call("GET", "/v1/entities/agent/nobody")).status, 404)
        self.assertEqual((await self.call("GET", "/v1/entities/account/nobody")).status, 404)
        answer = await self.call("GET", "/v1/entities/robot/a1")
        self.assertError(answer, 404, "not_found", "unknown_entity_type")

    async def test_invalid_id(self) -> None:
        """An id outside the certificate alphabet is 400."""
        answer = await self.call("GET", "/v1/entities/agent/a..b")
        self.assertError(answer, 400, "invalid_request", "invalid_agent_id")

    async def test_revoked_is_gone(self) -> None:
        """A revoked agent resolves to 410 revoked."""
        await self.provision()
        await self.call("DELETE", "/v1/entities/agent/a1")
        self.assertError(await self.call("GET", "/v1/entities/agent/a1"), 410, "revoked")

    async def test_account(self) -> None:
        """An account shows its budget and every allocation."""
        await self.provision("a1")
        self.clock.advance(1)
        await self.provision("a2", tenant="team-2")
        await self.call("POST", "/v1/entities/account/acme/budget", {"budget_bytes": 5000})
        body = (await self.call("GET", "/v1/entities/account/acme")).json()
        self.assertEqual(
            (body["type"], body["id"], body["budget_bytes"], body["suspended"]),
            ("account", "acme", 5000, False),
        )
        self.assertEqual(
            [(a["agent_id"], a["tenant"], a["state"]) for a in body["allocations"]],
            [("a1", "acme", "provisioned"), ("a2", "team-2", "provisioned")],
        )


class QuotaContract(EntityRouteCase):
    """PATCH /v1/entities/agent/{id}."""

    async def test_sets_grant_and_pushes(self) -> None:
        """The grant changes and the change is handed to the push loop."""
        await self.provision()
        answer = await self.call("PATCH", "/v1/entities/agent/a1", {"grant_bytes": 77})
        self.assertEqual((answer.status, answer.json()["grant_bytes"]), (200, 77))
        self.assertEqual(self.pushes.quotas[-1].body()["grant_bytes"], 77)
        stored = await self.result(self.store.get_agent_allocation("a1"))
        self.assertEqual(stored.grant_bytes, 77)

    async def test_errors(self) -> None:
        """Unknown 404, revoked 410, accounts and bad values 400."""
        self.assertEqual(
            (await self.call("PATCH", "/v1/entities/agent/nobody", {"grant_bytes": 1})).status, 404
        )
        await self.provision()
        self.assertError(
            await self.call("PATCH", "/v1/entities/agent/a1", {"grant_bytes": "1"}),
            400,
            "invalid_request",
            "invalid_grant_bytes",
        )
        self.assertError(
            await self.call("PATCH", "/v1/entities/account/acme", {"grant_bytes": 1}),
            400,
            "invalid_request",
            "not_supported_for_type",
        )
        await self.call("DELETE", "/v1/entities/agent/a1")
        self.assertError(
            await self.call("PATCH", "/v1/entities/agent/a1", {"grant_bytes": 1}), 410, "revoked"
        )


class RevokeContract(EntityRouteCase):
    """DELETE /v1/entities/{type}/{id}."""

    async def test_revoke_agent(self) -> None:
        """Revocation is 204 without a body, idempotent, and triggers a revocation push."""
        await self.provision()
        answer = await self.call("DELETE", "/v1/entities/agent/a1")
        self.assertEqual(
            (answer.status, answer.body, answer.header("Content-Type")), (204, b"", None)
        )
        self.assertEqual(self.pushes.revocations, 1)
        self.assertEqual((await self.call("DELETE", "/api/v1/entities/agent/a1")).status, 204)
        stored = await self.result(self.store.get_agent_allocation("a1"))
        self.assertEqual(stored.state, AllocationState.REVOKED)

    async def test_revoke_ends_mount_with_revocation(self) -> None:
        """Revoking a mounted agent's allocation puts the holder's leaf on the revocation list."""
        allocation_id = (await self.provision()).json()["allocation_id"]
        await self.place()
        holder = MountHolder("a1", "5e", NOW + timedelta(hours=1))
        await self.result(
            self.store.acquire_mount(allocation_id, holder, NOW, timedelta(seconds=60))
        )
        await self.call("DELETE", "/v1/entities/agent/a1")
        active = await self.result(self.store.active_revocations(NOW))
        self.assertEqual([r.serial for r in active], ["5e"])

    async def test_revoke_account(self) -> None:
        """Revoking an account suspends it and revokes all its allocations."""
        await self.provision("a1")
        await self.provision("a2")
        self.assertEqual((await self.call("DELETE", "/v1/entities/account/acme")).status, 204)
        for agent in ("a1", "a2"):
            self.assertEqual((await self.call("GET", f"/v1/entities/agent/{agent}")).status, 410)
        self.assertTrue((await self.call("GET", "/v1/entities/account/acme")).json()["suspended"])

    async def test_unknown(self) -> None:
        """Revoking an unknown entity is 404."""
        self.assertEqual((await self.call("DELETE", "/v1/entities/agent/nobody")).status, 404)
        self.assertEqual((await self.call("DELETE", "/v1/entities/account/nobody")).status, 404)


class ReassignContract(EntityRouteCase):
    """POST /v1/entities/agent/{id}/reassign."""

    async def test_reassign(self) -> None:
        """The agent moves to the new owner (and tenant, default the owner)."""
        await self.provision()
        answer = await self.call("POST", "/v1/entities/agent/a1/reassign", {"owner": "globex"})
        self.assertEqual(answer.status, 200)
        self.assertEqual((answer.json()["owner"], answer.json()["tenant"]), ("globex", "globex"))
        self.assertEqual(self.pushes.revocations, 1)
        self.assertEqual(self.pushes.quotas[-1].body()["tenant"], "globex")
        answer = await self.call(
            "POST", "/api/v1/entities/agent/a1/reassign", {"owner": "globex", "tenant": "g2"}
        )
        self.assertEqual(answer.json()["tenant"], "g2")

    async def test_errors(self) -> None:
        """Foreign tenant 409, unknown 404, revoked 410, accounts and bad bodies 400."""
        await self.provision("a1")
        await self.provision("b1", owner="other")
        self.assertError(
            await self.call(
                "POST", "/v1/entities/agent/a1/reassign", {"owner": "x", "tenant": "other"}
            ),
            409,
            "tenant_owner_mismatch",
        )
        self.assertEqual(
            (await self.call("POST", "/v1/entities/agent/zz/reassign", {"owner": "x"})).status, 404
        )
        self.assertError(
            await self.call("POST", "/v1/entities/agent/a1/reassign", {"tenant": "x"}),
            400,
            "invalid_request",
            "missing_field:owner",
        )
        self.assertError(
            await self.call("POST", "/v1/entities/account/acme/reassign", {"owner": "x"}),
            400,
            "invalid_request",
            "not_supported_for_type",
        )
        await self.call("DELETE", "/v1/entities/agent/a1")
        self.assertError(
            await self.call("POST", "/v1/entities/agent/a1/reassign", {"owner": "x"}),
            410,
            "revoked",
        )


class BudgetContract(EntityRouteCase):
    """POST /v1/entities/account/{owner}/budget."""

    async def test_set_and_clear(self) -> None:
        """A budget is set, pushed for each of the owner's tenants, and cleared with null."""
        await self.provision("a1")
        await self.provision("a2", tenant="team-2")
        answer = await self.call("POST", "/v1/entities/account/acme/budget", {"budget_bytes": 9})
        self.assertEqual(
            (answer.status, answer.json()),
            (200, {"type": "account", "id": "acme", "budget_bytes": 9}),
        )
        budgets = [u.body() for u in self.pushes.quotas if "account_budget_bytes" in u.body()]
        self.assertEqual([b["tenant"] for b in budgets], ["acme", "team-2"])
        answer = await self.call(
            "POST", "/api/v1/entities/account/acme/budget", {"budget_bytes": None}
        )
        self.assertIsNone(answer.json()["budget_bytes"])

    async def test_creates_account(self) -> None:
        """Setting a budget for a new owner creates the account."""
        await self.call("POST", "/v1/entities/account/newco/budget", {"budget_bytes": 1})
        self.assertEqual((await self.call("GET", "/v1/entities/account/newco")).status, 200)

    async def test_invalid(self) -> None:
        """A missing or negative budget, or a bad owner id, is 400."""
        for body in ({}, {"budget_bytes": -5}, {"budget_bytes": "9"}):
            answer = await self.call("POST", "/v1/entities/account/acme/budget", body)
            self.assertEqual(answer.status, 400, body)
        answer = await self.call("POST", "/v1/entities/account/-x/budget", {"budget_bytes": 1})
        self.assertError(answer, 400, "invalid_request", "invalid_owner")


class EnrollTokenContract(EntityRouteCase):
    """POST /v1/agents/{id}/enroll-token."""

    async def test_mint(self) -> None:
        """A token of 256 bits (unpadded base64url) is returned; only its SHA-256 is stored."""
        allocation_id = (await self.provision()).json()["allocation_id"]
        answer = await self.call("POST", "/v1/agents/a1/enroll-token")
        self.assertEqual(answer.status, 200)
        body = answer.json()
        token = body["token"]
        self.assertEqual(len(token), 43)
        self.assertNotIn("=", token)
        self.assertEqual(len(base64.urlsafe_b64decode(token + "=")), 32)
        self.assertEqual(body["agent_id"], "a1")
        self.assertEqual(body["allocation_id"], allocation_id)
        self.assertEqual(body["expires_at"], "2026-11-22T19:10:00Z")
        digest = hashlib.sha256(token.encode()).hexdigest()
        grant = await self.result(self.store.peek_enroll_token(digest, NOW))
        assert isinstance(grant, EnrollGrant)
        self.assertEqual(grant.token_id, body["token_id"])

    async def test_tokens_differ(self) -> None:
        """Each mint is a new token."""
        await self.provision()
        first = (await self.call("POST", "/v1/agents/a1/enroll-token")).json()["token"]
        second = (await self.call("POST", "/v1/agents/a1/enroll-token")).json()["token"]
        self.assertNotEqual(first, second)

    async def test_errors(self) -> None:
        """Unknown agent 404, revoked 410, bad id 400; not aliased under /api."""
        self.assertEqual((await self.call("POST", "/v1/agents/nobody/enroll-token")).status, 404)
        self.assertEqual((await self.call("POST", "/v1/agents/a%2Fb/enroll-token")).status, 404)
        self.assertError(
            await self.call("POST", "/v1/agents/.a/enroll-token"),
            400,
            "invalid_request",
            "invalid_agent_id",
        )
        await self.provision()
        self.assertEqual((await self.call("POST", "/api/v1/agents/a1/enroll-token")).status, 404)
        await self.call("DELETE", "/v1/entities/agent/a1")
        self.assertError(await self.call("POST", "/v1/agents/a1/enroll-token"), 410, "revoked")

    async def test_new_enroll_token(self) -> None:
        """The token and its digest belong together."""
        token, digest = new_enroll_token(lambda n: b"\xff" * n)
        self.assertEqual(token, "_" * 42 + "8")
        self.assertEqual(digest, hashlib.sha256(token.encode()).hexdigest())


class PurgeSweepContract(EntityRouteCase):
    """POST /v1/admin/purge-sweep."""

    async def test_unavailable_without_ca(self) -> None:
        """Without an agent CA the sweep is 503 (after authentication)."""
        self.ca_ready = False
        self.assertError(
            await self.call("POST", "/v1/admin/purge-sweep"),
            503,
            "temporarily_unavailable",
            "agent_ca_not_configured",
        )
        self.assertEqual((await self.call("POST", "/v1/admin/purge-sweep", headers={})).status, 401)

    async def test_purges_revoked(self) -> None:
        """Revoked agents on a server are purged there and marked purged; live ones are kept."""
        await self.provision("a1")
        await self.provision("a2")
        await self.place()
        await self.call("DELETE", "/v1/entities/agent/a1")
        answer = await self.call("POST", "/api/v1/admin/purge-sweep")
        self.assertEqual(answer.status, 200)
        [purged] = answer.json()["purged"]
        self.assertEqual(
            (purged["agent_id"], purged["count"], purged["bytes_freed"]), ("a1", 3, 4096)
        )
        self.assertEqual(answer.json()["failed"], [])
        self.assertEqual(
            self.plane.bodies("/control/purge-agent"),
            [{"owner": "acme", "tenant": "acme", "agent_id": "a1"}],
        )
        stored = await self.result(self.store.get_agent_allocation("a1"))
        self.assertEqual(stored.state, AllocationState.PURGED)
        self.assertEqual((await self.call("POST", "/v1/admin/purge-sweep")).json()["purged"], [])

    async def test_unplaced_purged_without_call(self) -> None:
        """An agent whose tenant never reached a server has no data: marked purged directly."""
        await self.provision()
        await self.call("DELETE", "/v1/entities/agent/a1")
        [purged] = (await self.call("POST", "/v1/admin/purge-sweep")).json()["purged"]
        self.assertEqual((purged["count"], purged["bytes_freed"]), (0, 0))
        self.assertEqual(self.plane.requests, [])

    async def test_failure_kept_for_next_sweep(self) -> None:
        """A server that cannot purge leaves the allocation revoked, listed as failed."""
        await self.provision()
        await self.place()
        await self.call("DELETE", "/v1/entities/agent/a1")
        self.plane.statuses["/control/purge-agent"] = 500
        body = (await self.call("POST", "/v1/admin/purge-sweep")).json()
        self.assertEqual(body["purged"], [])
        self.assertEqual(body["failed"][0]["error"], "dataplane_unreachable")
        stored = await self.result(self.store.get_agent_allocation("a1"))
        self.assertEqual(stored.state, AllocationState.REVOKED)
        del self.plane.statuses["/control/purge-agent"]
        self.assertEqual(
            len((await self.call("POST", "/v1/admin/purge-sweep")).json()["purged"]), 1
        )


class UsageContract(EntityRouteCase):
    """GET /v1/tenants/{owner}/usage."""

    async def test_unavailable_without_ca(self) -> None:
        """Without an agent CA usage is 503."""
        self.ca_ready = False
        self.assertEqual((await self.call("GET", "/v1/tenants/acme/usage")).status, 503)

    async def test_usage(self) -> None:
        """The server's figures are merged with the grants and the budget."""
        await self.provision("a1")
        await self.provision("a2")
        await self.call("POST", "/v1/entities/account/acme/budget", {"budget_bytes": 100})
        await self.place()
        answer = await self.call("GET", "/api/v1/tenants/acme/usage")
        self.assertEqual(answer.status, 200)
        self.assertEqual(
            answer.json(),
            {
                "owner": "acme",
                "used_bytes": 10,
                "budget_bytes": 100,
                "agents": {
                    "a1": {"used_bytes": 7, "grant_bytes": 1000, "state": "provisioned"},
                    "a2": {"used_bytes": 0, "grant_bytes": 1000, "state": "provisioned"},
                },
            },
        )
        self.assertEqual(self.plane.requests[0].args, {"owner": ["acme"]})

    async def test_unplaced_owner(self) -> None:
        """An owner with no tenant on any server uses nothing."""
        await self.provision()
        body = (await self.call("GET", "/v1/tenants/acme/usage")).json()
        self.assertEqual(body["used_bytes"], 0)
        self.assertEqual(self.plane.requests, [])

    async def test_errors(self) -> None:
        """Unknown owner 404, bad id 400, unreachable server 503."""
        self.assertEqual((await self.call("GET", "/v1/tenants/nobody/usage")).status, 404)
        self.assertEqual((await self.call("GET", "/v1/tenants/a..b/usage")).status, 400)
        await self.provision()
        await self.place()
        self.plane.reachable = False
        self.assertError(
            await self.call("GET", "/v1/tenants/acme/usage"),
            503,
            "temporarily_unavailable",
            "dataplane_unreachable",
        )
        self.flushLoggedErrors()


# Each contract on both backends: SQLite in memory, synchronously; PostgreSQL.


class ProvisionTests(ProvisionContract, SQLiteBackend):
    """Provision routes over SQLite."""


class PostgresProvisionTests(ProvisionContract, PostgresBackend):
    """Provision routes over PostgreSQL."""


class ResolveTests(ResolveContract, SQLiteBackend):
    """Resolve routes over SQLite."""


class PostgresResolveTests(ResolveContract, PostgresBackend):
    """Resolve routes over PostgreSQL."""


class QuotaTests(QuotaContract, SQLiteBackend):
    """Quota routes over SQLite."""


class PostgresQuotaTests(QuotaContract, PostgresBackend):
    """Quota routes over PostgreSQL."""


class RevokeTests(RevokeContract, SQLiteBackend):
    """Revoke routes over SQLite."""


class PostgresRevokeTests(RevokeContract, PostgresBackend):
    """Revoke routes over PostgreSQL."""


class ReassignTests(ReassignContract, SQLiteBackend):
    """Reassign routes over SQLite."""


class PostgresReassignTests(ReassignContract, PostgresBackend):
    """Reassign routes over PostgreSQL."""


class BudgetTests(BudgetContract, SQLiteBackend):
    """Budget routes over SQLite."""


class PostgresBudgetTests(BudgetContract, PostgresBackend):
    """Budget routes over PostgreSQL."""


class EnrollTokenTests(EnrollTokenContract, SQLiteBackend):
    """EnrollToken routes over SQLite."""


class PostgresEnrollTokenTests(EnrollTokenContract, PostgresBackend):
    """EnrollToken routes over PostgreSQL."""


class PurgeSweepTests(PurgeSweepContract, SQLiteBackend):
    """PurgeSweep routes over SQLite."""


class PostgresPurgeSweepTests(PurgeSweepContract, PostgresBackend):
    """PurgeSweep routes over PostgreSQL."""


class UsageTests(UsageContract, SQLiteBackend):
    """Usage routes over SQLite."""


class PostgresUsageTests(UsageContract, PostgresBackend):
    """Usage routes over PostgreSQL."""
