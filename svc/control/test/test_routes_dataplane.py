"""
Tests for L{svc.control.routes_dataplane}: what a data-plane server asks the
control plane with the service token (the active revocation set, whether an
identity is placed on it), on both store backends, and the pure placement
decision.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from svc.control.routes_dataplane import (
    DataPlaneQueryDeps,
    PlacementQuery,
    PlacementVerdict,
    dataplane_query_routes,
    placement_of,
)
from svc.control.store.values import Allocation, AllocationState, Placement, Server
from svc.control.test.backends import PostgresBackend, RouteBackend, SQLiteBackend
from svc.control.test.test_enrollment_support import (
    NOW,
    SERVER_ADDR,
    SERVER_FQDN,
    SERVICE_TOKEN,
    RouteWorld,
)
from svc.testing.web import Answer

AUTH = {"Authorization": f"Bearer {SERVICE_TOKEN}"}


class DataPlaneQueryContract(RouteBackend):
    """The two routes answer as control-dataplane.md says."""

    async def set_up(self) -> None:
        self.world = await RouteWorld.open(self)
        world = self.world
        world.serve(
            world.deps, dataplane_query_routes(DataPlaneQueryDeps(world.store, world.clock.seconds))
        )

    async def get(self, path: str, headers: dict[str, str] | None = None) -> Answer:
        return await self.send(
            self.world.resource, "GET", path, headers=AUTH if headers is None else headers
        )

    async def placement(self, **query: str) -> Answer:
        params = {"fqdn": SERVER_FQDN, "owner": "alice", "tenant": "acme", "agent_id": "agent-1"}
        params.update(query)
        text = "&".join(f"{k}={v}" for k, v in params.items() if v != "-")
        return await self.get(f"/control/placement?{text}")

    async def test_revocations(self) -> None:
        """200: the active set in the push's body; expired entries left out."""
        store, now = self.world.store, self.world.now()
        await store.add_revocation("1f3a", now + timedelta(hours=1), now)
        await store.add_revocation("ab", now + timedelta(minutes=5), now)
        await store.add_revocation("e0", now - timedelta(seconds=1), now)
        answer = await self.get("/control/cert-revocations")
        self.assertEqual(answer.status, 200, answer.body)
        body = answer.json()
        self.assertEqual(body["generated_at"], "2026-11-01T12:00:00Z")
        self.assertEqual(
            sorted(body["revocations"], key=lambda e: e["serial"]),
            [
                {"serial": "1f3a", "not_after": "2026-11-01T13:00:00Z"},
                {"serial": "ab", "not_after": "2026-11-01T12:05:00Z"},
            ],
        )

    async def test_service_token_required(self) -> None:
        """Both routes are 401 without the service token."""
        for path in ("/control/cert-revocations", "/control/placement?fqdn=x"):
            answer = await self.get(path, headers={})
            self.assertEqual(answer.status, 401, answer.body)
            answer = await self.get(path, headers={"Authorization": "Bearer " + "x" * 40})
            self.assertEqual(answer.status, 401, answer.body)

    async def test_enrolled_agent_placed(self) -> None:
        """An enrolled agent is placed on its tenant's server, and only as itself."""
        await self.world.enrolled()
        answer = await self.placement()
        self.assertEqual(answer.status, 200, answer.body)
        self.assertEqual(answer.json(), {"placed": True, "reason": "placed"})
        cases: list[tuple[dict[str, str], str]] = [
            ({"owner": "mallory"}, "other_owner_or_tenant"),
            ({"tenant": "other"}, "other_owner_or_tenant"),
            ({"fqdn": "elsewhere.test"}, "placed_on_another_server"),
            ({"agent_id": "agent-9"}, "unknown_agent"),
        ]
        for query, reason in cases:
            answer = await self.placement(**query)
            self.assertEqual(answer.json(), {"placed": False, "reason": reason}, query)

    async def test_fqdn_case_insensitive(self) -> None:
        """The server's name is compared lower-cased."""
        await self.world.enrolled()
        answer = await self.placement(fqdn=SERVER_FQDN.upper())
        self.assertEqual(answer.json()["placed"], True)

    async def test_not_yet_placed(self) -> None:
        """A provisioned agent whose tenant has no server is not placed."""
        await self.world.provision()
        self.assertEqual((await self.placement()).json()["reason"], "tenant_not_placed")

    async def test_revoked_allocation(self) -> None:
        """An agent whose allocation was revoked is no longer placed."""
        await self.world.enrolled()
        allocation = await self.world.store.get_agent_allocation("agent-1")
        await self.world.store.revoke_allocation(allocation.allocation_id, self.world.now())
        self.assertEqual((await self.placement()).json()["reason"], "allocation_not_live")

    async def test_bad_query(self) -> None:
        """Each parameter is required once and checked: 400 missing_/bad_<name>."""
        for query, description in [
            ({"fqdn": "-"}, "missing_fqdn"),
            ({"agent_id": "-"}, "missing_agent_id"),
            ({"fqdn": "not a host"}, "bad_fqdn"),
            ({"owner": "../x"}, "bad_owner"),
            ({"tenant": ".."}, "bad_tenant"),
        ]:
            answer = await self.placement(**query)
            self.assertEqual(answer.status, 400, answer.body)
            self.assertEqual(answer.json()["error_description"], description)


class DataPlaneQueryTests(DataPlaneQueryContract, SQLiteBackend):
    """The data-plane queries over SQLite."""


class PostgresDataPlaneQueryTests(DataPlaneQueryContract, PostgresBackend):
    """The data-plane queries over PostgreSQL."""


def allocation(**changes: Any) -> Allocation:
    values: dict[str, Any] = {
        "allocation_id": "al-1",
        "agent_id": "agent-1",
        "owner_id": "alice",
        "tenant_id": "acme",
        "grant_bytes": 1,
        "state": AllocationState.PROVISIONED,
        "created_at": NOW,
    }
    values.update(changes)
    return Allocation(**values)


def placement(tenant_id: str = "acme", fqdn: str = SERVER_FQDN) -> Placement:
    server = Server("srv-1", fqdn, SERVER_ADDR, 10, NOW, NOW)
    return Placement(tenant_id, server, NOW)


class PlacementOfTests(SynchronousTestCase):
    """
    L{placement_of}: the decision, in the order of its checks.
    """

    QUERY = PlacementQuery(SERVER_FQDN, "alice", "acme", "agent-1")

    def test_verdicts(self) -> None:
        """Each way of not being placed has its reason; all conditions together are placed."""
        q = self.QUERY
        self.assertEqual(placement_of(q, allocation(), placement()), PlacementVerdict.PLACED)
        self.assertEqual(placement_of(q, None, placement()), PlacementVerdict.UNKNOWN_AGENT)
        revoked = allocation(state=AllocationState.REVOKED, revoked_at=NOW)
        self.assertEqual(placement_of(q, revoked, placement()), PlacementVerdict.NOT_LIVE)
        self.assertEqual(
            placement_of(q, allocation(owner_id="bob"), placement()),
            PlacementVerdict.OTHER_IDENTITY,
        )
        self.assertEqual(
            placement_of(q, allocation(tenant_id="labs"), placement()),
            PlacementVerdict.OTHER_IDENTITY,
        )
        self.assertEqual(placement_of(q, allocation(), None), PlacementVerdict.TENANT_NOT_PLACED)
        self.assertEqual(
            placement_of(q, allocation(), placement(fqdn="other.test")),
            PlacementVerdict.OTHER_SERVER,
        )
        self.assertEqual(
            placement_of(q, allocation(), placement(tenant_id="labs")),
            PlacementVerdict.OTHER_SERVER,
        )
