"""
Revoking an agent through the routes, seen by its enrollments: the service's
C{DELETE /v1/entities/...} and reassignment revoke the leaves of every
enrollment of the agent (also one that never held the mount lease) and push
at once; afterwards C{/agent/renew} and the mount-lease routes answer each
enrollment 410 C{revoked} (revoked allocation) or 401 (a deny-listed leaf of
a live allocation; 410 C{lease_lost} on the lease holder's refresh and
release when the allocation is live in the leaf's tenant). The real
agent-identity authenticator, signed requests.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from svc.control.agent_auth import sign_request
from svc.control.routes_entities import EntityDeps, entity_routes
from svc.control.routes_mounts import MountDeps, mount_routes
from svc.control.test.backends import PostgresBackend, RouteBackend, SQLiteBackend
from svc.control.test.test_dataplane_client import fake_client
from svc.control.test.test_enrollment_support import SERVICE_TOKEN, Enrolled, RouteWorld
from svc.testing.web import Answer

SERVICE = {"Authorization": f"Bearer {SERVICE_TOKEN}", "Content-Type": "application/json"}


class AgentRevocationContract(RouteBackend):
    """
    Agent-1 enrolled twice: the first enrollment holds the mount lease, the
    second (another pod) never mounted.
    """

    async def set_up(self) -> None:
        self.world = await RouteWorld.open(self)
        world = self.world
        mounts = MountDeps(
            store=world.store,
            clock=world.clock,
            pushes=world.pushes,
            lease_ttl=timedelta(seconds=120),
        )
        entities = EntityDeps(
            store=world.store,
            settings=world.settings,
            clock=world.clock,
            client=fake_client({}, world.clock),
            pushes=world.pushes,
        )
        world.serve(world.deps, [*mount_routes(mounts), *entity_routes(entities)])
        self.holder = await world.enrolled()
        self.second = await world.enrolled()
        self.allocation_id = self.holder.body["allocation_id"]
        self.assertEqual(self.second.body["allocation_id"], self.allocation_id)
        self.mount_path = f"/allocations/{self.allocation_id}/mount"
        mounted = await self.signed(self.holder, "POST", self.mount_path)
        self.assertEqual(mounted.status, 200, mounted.body)

    async def signed(self, enrolled: Enrolled, method: str, path: str) -> Answer:
        """C{method path} signed with C{enrolled}'s key (one second later each time)."""
        self.world.clock.advance(1)
        body: dict[str, Any] = sign_request(
            enrolled.key, enrolled.leaf, method, path, int(self.world.clock.seconds() * 1000)
        )
        body["ca_chain_pem"] = enrolled.body["ca_chain_pem"]
        headers = {"Content-Type": "application/json"}
        data = json.dumps(body).encode()
        return await self.send(self.world.resource, method, path, headers=headers, body=data)

    async def service(self, method: str, path: str, body: object = None) -> Answer:
        """A service-token request."""
        data = None if body is None else json.dumps(body).encode()
        return await self.send(self.world.resource, method, path, headers=SERVICE, body=data)

    async def revoked_serials(self) -> list[str]:
        """The serials of the active revocations."""
        revoked = await self.world.result(self.world.store.active_revocations(self.world.now()))
        return [r.serial for r in revoked]

    async def assertAnswers(self, enrolled: Enrolled, status: int, code: str) -> None:
        """Renewal and mount refresh with C{enrolled}'s leaf answer C{status} C{code}."""
        for method, path in (("POST", "/agent/renew"), ("POST", self.mount_path + "/refresh")):
            answer = await self.signed(enrolled, method, path)
            self.assertEqual((answer.status, answer.json()["error"]), (status, code), path)

    async def assertBothEnrollmentsListed(self) -> None:
        """The deny-list holds the leaves of both enrollments, and nothing else."""
        self.assertEqual(
            await self.revoked_serials(), sorted([self.holder.serial, self.second.serial])
        )

    async def test_revoking_the_agent_revokes_every_enrollment(self) -> None:
        """
        DELETE /v1/entities/agent/{id} lists the leaves of both enrollments,
        pushes at once, and both get 410 revoked on renewal and refresh.
        """
        pushed = self.world.pushes.revocations
        answer = await self.service("DELETE", "/v1/entities/agent/agent-1")
        self.assertEqual(answer.status, 204, answer.body)
        self.assertEqual(self.world.pushes.revocations, pushed + 1)
        await self.assertBothEnrollmentsListed()
        for enrolled in (self.second, self.holder):
            await self.assertAnswers(enrolled, 410, "revoked")
        mount = await self.signed(self.second, "POST", self.mount_path)
        self.assertEqual((mount.status, mount.json()["error"]), (410, "revoked"))

    async def test_revoking_the_account_revokes_every_enrollment(self) -> None:
        """DELETE /v1/entities/account/{owner}: both enrollments' leaves listed, both 410."""
        answer = await self.service("DELETE", "/v1/entities/account/alice")
        self.assertEqual(answer.status, 204, answer.body)
        await self.assertBothEnrollmentsListed()
        for enrolled in (self.second, self.holder):
            await self.assertAnswers(enrolled, 410, "revoked")

    async def test_reassigning_revokes_every_enrollment(self) -> None:
        """
        Reassignment lists both enrollments' leaves and pushes; the
        allocation is live (in another tenant), so they get 401.
        """
        pushed = self.world.pushes.revocations
        answer = await self.service("POST", "/v1/entities/agent/agent-1/reassign", {"owner": "bob"})
        self.assertEqual(answer.status, 200, answer.body)
        self.assertEqual(self.world.pushes.revocations, pushed + 1)
        await self.assertBothEnrollmentsListed()
        for enrolled in (self.second, self.holder):
            await self.assertAnswers(enrolled, 401, "invalid_client")

    async def test_released_leaf_of_live_allocation_is_unauthorized(self) -> None:
        """
        After a mount release the holder's deny-listed leaf gets 401 on
        renewal and acquisition and 410 lease_lost on refresh (its allocation
        is live); the second enrollment is untouched and mounts.
        """
        released = await self.signed(self.holder, "DELETE", self.mount_path)
        self.assertEqual(released.status, 204, released.body)
        self.assertEqual(await self.revoked_serials(), [self.holder.serial])
        renew = await self.signed(self.holder, "POST", "/agent/renew")
        self.assertEqual((renew.status, renew.json()["error"]), (401, "invalid_client"))
        refresh = await self.signed(self.holder, "POST", self.mount_path + "/refresh")
        self.assertEqual((refresh.status, refresh.json()["error"]), (410, "lease_lost"))
        again = await self.signed(self.holder, "POST", self.mount_path)
        self.assertEqual((again.status, again.json()["error"]), (401, "invalid_client"))
        mounted = await self.signed(self.second, "POST", self.mount_path)
        self.assertEqual(mounted.status, 200, mounted.body)


class AgentRevocationTests(AgentRevocationContract, SQLiteBackend):
    """AgentRevocation over SQLite."""


class PostgresAgentRevocationTests(AgentRevocationContract, PostgresBackend):
    """AgentRevocation over PostgreSQL."""
