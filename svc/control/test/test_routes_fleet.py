"""
Tests for L{svc.control.routes_fleet}: the operator's fleet routes, through
the real app assembly, on both store backends, with fake data-plane servers.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.task import Clock
from twisted.web.resource import Resource

from svc.control.app import build_control_app
from svc.control.routes_fleet import FleetDeps, fleet_routes
from svc.control.routing import Feature
from svc.control.settings import ControlSettings
from svc.control.test.backends import PostgresBackend, RouteBackend, SQLiteBackend, json_body
from svc.control.test.test_dataplane_client import FakeDataPlane, fake_client
from svc.control.test.test_routes_entities import ENVIRON, FQDN, NOW, SERVICE
from svc.testing.web import Answer


class FleetRouteCase(RouteBackend):
    """An app with the fleet routes over a fresh store and one fake data plane."""

    async def set_up(self) -> None:
        self.clock = Clock()
        self.clock.advance(NOW.timestamp())
        self.store = await self.open_control_store()
        self.plane = FakeDataPlane(FQDN)
        self.ca_ready = True
        deps = FleetDeps(self.store, self.clock, fake_client({FQDN: self.plane}, self.clock))
        app = build_control_app(
            ControlSettings.from_environ(ENVIRON),
            self.clock.seconds,
            fleet_routes(deps),
            ready=lambda feature: feature is not Feature.AGENT_CA or self.ca_ready,
        )
        self.resource: Resource = app.resource()

    async def call(self, method: str, path: str, body: object = None, **kw: Any) -> Answer:
        headers = kw.get("headers", SERVICE)
        return await self.send(self.resource, method, path, headers=headers, body=json_body(body))

    async def allocation(self, agent: str, owner: str = "acme") -> str:
        done = await self.result(
            self.store.provision(
                agent_id=agent, owner_id=owner, tenant_id=owner, grant_bytes=1000, now=NOW
            )
        )
        allocation_id: str = done.allocation.allocation_id
        return allocation_id

    async def place(self, tenant: str = "acme") -> None:
        """Register the server and place C{tenant} (provisioned before) on it."""
        await self.result(self.store.register_server(FQDN, "10.0.0.1:7443", 10, NOW))
        await self.result(self.store.place_tenant(tenant, NOW))


class FleetContract(FleetRouteCase):
    """The four routes."""

    async def test_service_token_required(self) -> None:
        """Every route is 401 without the service token."""
        for method, path in (
            ("GET", "/v1/admin/allocations"),
            ("POST", "/v1/admin/allocations/abc/purge"),
            ("GET", "/v1/admin/servers"),
            ("POST", "/v1/admin/servers/dp1.test/gc"),
            ("GET", "/api/v1/admin/servers"),
        ):
            answer = await self.call(method, path, headers={})
            self.assertEqual(answer.status, 401, (method, path))

    async def test_allocations_paged(self) -> None:
        """Pages by allocation id; next is the last id of a full page, else null."""
        ids = sorted([await self.allocation(f"a{n}", owner=f"o{n}") for n in range(3)])
        first = await self.call("GET", "/v1/admin/allocations?limit=2")
        self.assertEqual(first.status, 200, first.body)
        body = first.json()
        self.assertEqual([a["allocation_id"] for a in body["allocations"]], ids[:2])
        self.assertEqual(body["next"], ids[1])
        entry = body["allocations"][0]
        self.assertEqual(
            sorted(entry),
            sorted(
                [
                    "allocation_id",
                    "agent_id",
                    "owner",
                    "tenant",
                    "grant_bytes",
                    "state",
                    "created_at",
                    "revoked_at",
                    "purged_at",
                ]
            ),
        )
        self.assertEqual((entry["state"], entry["revoked_at"]), ("provisioned", None))
        second = await self.call("GET", f"/v1/admin/allocations?limit=2&after={ids[1]}")
        self.assertEqual(
            ([a["allocation_id"] for a in second.json()["allocations"]], second.json()["next"]),
            (ids[2:], None),
        )

    async def test_allocations_by_state(self) -> None:
        """state= keeps one state; a bad state or limit is 400."""
        await self.allocation("a1")
        revoked = await self.allocation("a2")
        await self.result(self.store.revoke_allocation(revoked, NOW))
        answer = await self.call("GET", "/v1/admin/allocations?state=revoked")
        listed = answer.json()["allocations"]
        self.assertEqual([(a["allocation_id"], a["state"]) for a in listed], [(revoked, "revoked")])
        for query in ("state=gone", "limit=0", "limit=1001", "limit=x", "after=../x"):
            answer = await self.call("GET", f"/v1/admin/allocations?{query}")
            self.assertEqual(answer.status, 400, query)

    async def test_purge_one(self) -> None:
        """A revoked allocation is erased on its server and marked purged; again is a no-op."""
        allocation = await self.allocation("a1")
        await self.place()
        await self.result(self.store.revoke_allocation(allocation, NOW))
        answer = await self.call("POST", f"/v1/admin/allocations/{allocation}/purge")
        self.assertEqual(answer.status, 200, answer.body)
        self.assertEqual(
            answer.json(),
            {
                "allocation_id": allocation,
                "agent_id": "a1",
                "owner": "acme",
                "tenant": "acme",
                "count": 3,
                "bytes_freed": 4096,
                "state": "purged",
            },
        )
        self.assertEqual(
            self.plane.bodies("/control/purge-agent"),
            [{"owner": "acme", "tenant": "acme", "agent_id": "a1"}],
        )
        again = await self.call("POST", f"/v1/admin/allocations/{allocation}/purge")
        self.assertEqual((again.json()["count"], again.json()["state"]), (0, "purged"))
        self.assertEqual(len(self.plane.bodies("/control/purge-agent")), 1)

    async def test_purge_refusals(self) -> None:
        """A live allocation is 409 not_revoked, an unknown one 404, an unreachable server 503."""
        live = await self.allocation("a1")
        await self.place()
        answer = await self.call("POST", f"/v1/admin/allocations/{live}/purge")
        self.assertEqual((answer.status, answer.json()["error"]), (409, "not_revoked"))
        answer = await self.call("POST", "/v1/admin/allocations/nope/purge")
        self.assertEqual(answer.status, 404)
        await self.result(self.store.revoke_allocation(live, NOW))
        self.plane.reachable = False
        answer = await self.call("POST", f"/v1/admin/allocations/{live}/purge")
        self.assertEqual(
            (answer.status, answer.json()["error_description"]), (503, "dataplane_unreachable")
        )
        stored = await self.result(self.store.get_allocation(live))
        self.assertEqual(stored.state.value, "revoked")

    async def test_servers(self) -> None:
        """The registered servers, with their addresses and times."""
        self.assertEqual((await self.call("GET", "/v1/admin/servers")).json(), {"servers": []})
        await self.allocation("a1")
        await self.place()
        [server] = (await self.call("GET", "/v1/admin/servers")).json()["servers"]
        self.assertEqual(
            (server["fqdn"], server["address"], server["capacity"]),
            (FQDN, "10.0.0.1:7443", 10),
        )
        self.assertEqual(server["registered_at"], "2026-11-22T19:00:00Z")

    async def test_gc(self) -> None:
        """POST .../gc runs one cycle on that server and answers its totals."""
        await self.allocation("a1")
        await self.place()
        answer = await self.call("POST", f"/v1/admin/servers/{FQDN}/gc")
        self.assertEqual(answer.status, 200, answer.body)
        self.assertEqual(
            answer.json(),
            {
                "fqdn": FQDN,
                "tenants": 2,
                "count": 5,
                "bytes_freed": 5000,
                "kept_young": 1,
                "dry_run": False,
            },
        )
        self.assertEqual(len(self.plane.bodies("/control/gc")), 1)

    async def test_gc_refusals(self) -> None:
        """Unknown server 404, unreachable 503, CA not ready 503, bad name 400."""
        answer = await self.call("POST", f"/v1/admin/servers/{FQDN}/gc")
        self.assertEqual(
            (answer.status, answer.json()["error_description"]), (404, "unknown_server")
        )
        await self.allocation("a1")
        await self.place()
        self.plane.reachable = False
        answer = await self.call("POST", f"/v1/admin/servers/{FQDN}/gc")
        self.assertEqual(answer.status, 503)
        answer = await self.call("POST", "/v1/admin/servers/Bad_Name!/gc")
        self.assertEqual(answer.status, 400)
        self.ca_ready = False
        answer = await self.call("POST", f"/v1/admin/servers/{FQDN}/gc")
        self.assertEqual(
            (answer.status, answer.json()["error_description"]), (503, "agent_ca_not_configured")
        )


class FleetTests(FleetContract, SQLiteBackend):
    """The fleet routes over SQLite."""


class PostgresFleetTests(FleetContract, PostgresBackend):
    """The fleet routes over PostgreSQL."""
