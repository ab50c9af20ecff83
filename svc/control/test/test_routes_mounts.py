"""
Tests for L{svc.control.routes_mounts}: the mount-lease flows through the
real app assembly and an in-memory store, with a stand-in agent-identity
authenticator (and with the real one, by fingerprint and by signed requests
across a renewal of the leaf).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
from twisted.internet.task import Clock
from twisted.web.resource import Resource
from twisted.web.server import Request

from svc.control.agent_auth import AgentIdentityAuthenticator, sign_request
from svc.control.app import build_control_app
from svc.control.ca import AgentCAProvider
from svc.control.dataplane_client import SessionFence
from svc.control.http import Authenticator
from svc.control.routes_entities import EntityDeps, entity_routes
from svc.control.routes_mounts import MountDeps, mount_routes
from svc.control.routing import AuthKind
from svc.control.settings import ControlSettings
from svc.control.store.values import CertificateKind, IssuedCertificate
from svc.control.test.backends import PostgresBackend, RouteBackend, SQLiteBackend, json_body
from svc.control.test.test_dataplane_client import fake_client
from svc.control.test.test_enrollment_support import Enrolled, RouteWorld
from svc.control.test.test_routes_entities import ENVIRON, SERVICE, RecordedPushes
from svc.sessions import PREFIX, parse_epoch
from svc.testing.web import Answer
from svc.web.errors import INVALID_CLIENT, InvalidCredential

NOW = datetime(2026, 11, 22, 19, 0, 0, tzinfo=UTC)
LEAF_EXPIRY = NOW + timedelta(hours=1)
TTL = 120
SERVER_ADDR = "dp1.test:7443"


@attrs.frozen
class Caller:
    """A stand-in agent principal (the attributes of AgentPrincipal)."""

    tenant_id: str
    agent_id: str
    user_id: str
    serial: str
    not_after: datetime
    fingerprint: str | None = None


class StubAgentAuthenticator:
    """Returns the test's current caller, or refuses with 401 invalid_client."""

    def __init__(self) -> None:
        self.caller: Caller | None = None

    async def authenticate(self, request: Request) -> Caller:
        if self.caller is None:
            raise InvalidCredential(INVALID_CLIENT)
        return self.caller


ENROLLMENT_1 = Caller("acme", "a1", "acme", "a1a1", LEAF_EXPIRY)
ENROLLMENT_2 = Caller("acme", "a1", "acme", "b2b2", LEAF_EXPIRY)


class MountRouteCase(RouteBackend):
    """An app with entity and mount routes, one agent provisioned, one server."""

    async def set_up(self) -> None:
        self.clock = Clock()
        self.clock.advance(NOW.timestamp())
        self.store = await self.open_control_store()
        self.pushes = RecordedPushes()
        self.auth = StubAgentAuthenticator()
        settings = ControlSettings.from_environ(ENVIRON)
        entities = EntityDeps(
            store=self.store,
            settings=settings,
            clock=self.clock,
            client=fake_client({}, self.clock),
            pushes=self.pushes,
        )
        mounts = MountDeps(
            store=self.store,
            clock=self.clock,
            pushes=self.pushes,
            lease_ttl=timedelta(seconds=TTL),
        )
        agent = self.authenticator()
        holder = (
            agent.for_lease_holder() if isinstance(agent, AgentIdentityAuthenticator) else agent
        )
        self.resource: Resource = build_control_app(
            settings,
            self.clock.seconds,
            [*entity_routes(entities), *mount_routes(mounts)],
            {AuthKind.AGENT_IDENTITY: agent, AuthKind.LEASE_HOLDER: holder},
        ).resource()
        body = {"type": "agent", "id": "a1", "owner": "acme", "grant_bytes": 10}
        provisioned = await self.post_json("/v1/entities", body, SERVICE)
        self.allocation_id = provisioned.json()["allocation_id"]
        await self.register_server()

    def authenticator(self) -> Authenticator:
        return self.auth

    async def register_server(self) -> None:
        await self.result(self.store.register_server("dp1.test", SERVER_ADDR, 10, NOW))

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.clock.seconds(), UTC)

    async def post_json(self, path: str, body: object, headers: dict[str, str]) -> Answer:
        return await self.send(self.resource, "POST", path, headers=headers, body=json_body(body))

    async def mount(
        self,
        caller: Caller | None = ENROLLMENT_1,
        body: object = None,
        *,
        path: str = "",
        method: str = "POST",
        allocation_id: str | None = None,
    ) -> Answer:
        self.auth.caller = caller
        target = f"/allocations/{allocation_id or self.allocation_id}/mount{path}"
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data else {}
        return await self.send(self.resource, method, target, headers=headers, body=data)

    async def refresh(self, caller: Caller = ENROLLMENT_1) -> Answer:
        return await self.mount(caller, path="/refresh")

    async def release(self, caller: Caller = ENROLLMENT_1) -> Answer:
        return await self.mount(caller, method="DELETE")

    def assertError(self, answer: Answer, status: int, code: str) -> None:
        self.assertEqual((answer.status, answer.json()["error"]), (status, code), answer.body)


class AcquireContract(MountRouteCase):
    """POST /allocations/{id}/mount."""

    async def test_granted(self) -> None:
        """A first mount is granted with the lease times, a mount session id and the server."""
        answer = await self.mount()
        self.assertEqual(answer.status, 200)
        body = answer.json()
        self.assertTrue(body.pop("session_id").startswith(PREFIX))
        self.assertEqual(
            body,
            {
                "allocation_id": self.allocation_id,
                "agent_id": "a1",
                "bound_at": "2026-11-22T19:00:00Z",
                "lease_expires_at": "2026-11-22T19:02:00Z",
                "ttl_seconds": TTL,
                "server_addr": SERVER_ADDR,
            },
        )
        self.assertEqual(answer.header("Svc-API-Version"), "1")
        self.assertIsNotNone(answer.header("X-Request-ID"))

    async def test_already_mounted(self) -> None:
        """The same enrollment mounting again is 409 already_mounted with the lease times."""
        await self.mount()
        answer = await self.mount()
        self.assertEqual(
            (answer.status, answer.json()),
            (
                409,
                {
                    "error": "already_mounted",
                    "bound_at": "2026-11-22T19:00:00Z",
                    "lease_expires_at": "2026-11-22T19:02:00Z",
                },
            ),
        )

    async def test_lease_live(self) -> None:
        """Another enrollment is 409 lease_live with the incumbent's bound_at and expiry."""
        await self.mount()
        self.clock.advance(30)
        answer = await self.mount(ENROLLMENT_2)
        self.assertEqual(
            (answer.status, answer.json()),
            (
                409,
                {
                    "error": "lease_live",
                    "bound_at": "2026-11-22T19:00:00Z",
                    "lease_expires_at": "2026-11-22T19:02:00Z",
                },
            ),
        )

    async def test_force_takes_over(self) -> None:
        """With force true another enrollment takes the live lease with a new session."""
        first = (await self.mount()).json()
        self.clock.advance(30)
        answer = await self.mount(ENROLLMENT_2, {"force": True})
        self.assertEqual(answer.status, 200)
        self.assertNotEqual(answer.json()["session_id"], first["session_id"])
        self.assertEqual(answer.json()["bound_at"], "2026-11-22T19:00:30Z")
        self.assertError(await self.refresh(ENROLLMENT_1), 410, "lease_lost")
        self.assertEqual((await self.refresh(ENROLLMENT_2)).status, 200)

    async def test_force_demotes_the_incumbent_without_revoking_it(self) -> None:
        """
        A forced takeover leaves the displaced enrollment's leaf valid (it may
        keep reading; its refresh is refused and its session fenced).
        """
        await self.mount()
        self.clock.advance(30)
        self.assertEqual((await self.mount(ENROLLMENT_2, {"force": True})).status, 200)
        self.assertEqual(await self.result(self.store.active_revocations(self.now())), ())
        self.assertEqual(self.pushes.revocations, 0)

    async def test_every_grant_fences_older_sessions(self) -> None:
        """
        Every grant has the tenant's server fence the agent's older sessions
        (the push loop is told the new epoch); a refused acquisition, nothing.
        """
        first = (await self.mount()).json()
        self.assertError(await self.mount(ENROLLMENT_2), 409, "lease_live")
        self.clock.advance(30)
        second = (await self.mount(ENROLLMENT_2, {"force": True})).json()
        self.assertEqual(
            self.pushes.fences,
            [
                SessionFence("acme", "acme", "a1", parse_epoch(first["session_id"])),
                SessionFence("acme", "acme", "a1", parse_epoch(second["session_id"])),
            ],
        )
        self.assertGreater(self.pushes.fences[1].epoch, self.pushes.fences[0].epoch)

    async def test_grants_without_takeover_do_not_push(self) -> None:
        """A first grant, the holder's forced re-grant and taking an expired lease push nothing."""
        await self.mount()
        await self.mount(ENROLLMENT_1, {"force": True})
        self.clock.advance(TTL)
        self.assertEqual((await self.mount(ENROLLMENT_2)).status, 200)
        self.assertEqual(await self.result(self.store.active_revocations(self.now())), ())
        self.assertEqual(self.pushes.revocations, 0)

    async def test_force_false_is_default(self) -> None:
        """force false behaves as no force."""
        await self.mount()
        self.assertError(await self.mount(ENROLLMENT_2, {"force": False}), 409, "lease_live")

    async def test_expired_lease_free(self) -> None:
        """Once the incumbent's lease expires another enrollment mounts without force."""
        await self.mount()
        self.clock.advance(TTL)
        self.assertEqual((await self.mount(ENROLLMENT_2)).status, 200)

    async def test_wrong_agent(self) -> None:
        """A leaf of another agent, or of the agent in another tenant, is 409 wrong_agent."""
        other_agent = Caller("acme", "a2", "acme", "c3", LEAF_EXPIRY)
        other_tenant = Caller("globex", "a1", "acme", "d4", LEAF_EXPIRY)
        self.assertError(await self.mount(other_agent), 409, "wrong_agent")
        self.assertError(await self.mount(other_tenant, {"force": True}), 409, "wrong_agent")

    async def test_insufficient_capacity(self) -> None:
        """With no server room for the tenant the mount is 409 insufficient_capacity."""
        body = {"type": "agent", "id": "z1", "owner": "zeta", "grant_bytes": 1}
        allocation = (await self.post_json("/v1/entities", body, SERVICE)).json()["allocation_id"]
        await self.result(self.store.register_server("dp1.test", SERVER_ADDR, 1, NOW))
        await self.mount()  # places acme: the server is now full
        caller = Caller("zeta", "z1", "zeta", "e5", LEAF_EXPIRY)
        self.assertError(
            await self.mount(caller, allocation_id=allocation), 409, "insufficient_capacity"
        )

    async def test_unknown_and_revoked(self) -> None:
        """An unknown allocation is 404; a revoked one 410 revoked."""
        self.assertEqual((await self.mount(allocation_id="0" * 32)).status, 404)
        await self.send(self.resource, "DELETE", "/v1/entities/agent/a1", headers=SERVICE)
        self.assertError(await self.mount(), 410, "revoked")
        self.assertError(await self.refresh(), 410, "revoked")
        self.assertError(await self.release(), 410, "revoked")

    async def test_bad_force(self) -> None:
        """A non-boolean force is 400."""
        answer = await self.mount(body={"force": "yes"})
        self.assertEqual(
            (answer.status, answer.json()["error_description"]), (400, "invalid_force")
        )

    async def test_no_identity(self) -> None:
        """Without an agent identity the routes are 401 invalid_client."""
        self.assertError(await self.mount(None), 401, "invalid_client")

    async def test_not_under_api(self) -> None:
        """The mount routes are not aliased under /api."""
        self.auth.caller = ENROLLMENT_1
        answer = await self.send(
            self.resource, "POST", f"/api/allocations/{self.allocation_id}/mount"
        )
        self.assertEqual(answer.status, 404)


class RefreshContract(MountRouteCase):
    """POST /allocations/{id}/mount/refresh."""

    async def test_extends(self) -> None:
        """The holder's refresh moves the expiry to now + TTL and keeps the session."""
        session = (await self.mount()).json()["session_id"]
        self.clock.advance(100)
        answer = await self.refresh()
        self.assertEqual(answer.status, 200)
        self.assertEqual(answer.json()["lease_expires_at"], "2026-11-22T19:03:40Z")
        self.assertEqual(answer.json()["bound_at"], "2026-11-22T19:00:00Z")
        self.assertEqual(answer.json()["session_id"], session)

    async def test_not_holder(self) -> None:
        """A caller that never held the lease, or after release, gets 410 lease_lost."""
        self.assertError(await self.refresh(), 410, "lease_lost")
        await self.mount()
        self.assertError(await self.refresh(ENROLLMENT_2), 410, "lease_lost")
        await self.release()
        self.assertError(await self.refresh(), 410, "lease_lost")


class ReleaseContract(MountRouteCase):
    """DELETE /allocations/{id}/mount."""

    async def test_release_revokes_leaf(self) -> None:
        """Release is 204, records the leaf serial in cert_revocations and pushes at once."""
        await self.mount()
        answer = await self.release()
        self.assertEqual((answer.status, answer.body), (204, b""))
        active = await self.result(self.store.active_revocations(self.now()))
        self.assertEqual([(r.serial, r.not_after) for r in active], [("a1a1", LEAF_EXPIRY)])
        self.assertEqual(self.pushes.revocations, 1)
        lease = await self.result(self.store.get_mount_lease(self.allocation_id))
        self.assertIsNone(lease)

    async def test_not_holder(self) -> None:
        """Releasing a lease one does not hold is 410 lease_lost and revokes nothing."""
        await self.mount()
        self.assertError(await self.release(ENROLLMENT_2), 410, "lease_lost")
        self.assertEqual(await self.result(self.store.active_revocations(self.now())), ())
        self.assertEqual(self.pushes.revocations, 0)

    async def test_mount_after_release(self) -> None:
        """After a release a new enrollment mounts without force."""
        await self.mount()
        await self.release()
        self.assertEqual((await self.mount(ENROLLMENT_2)).status, 200)


class FingerprintIdentityContract(MountRouteCase):
    """The mount routes with the real agent-identity authenticator."""

    def authenticator(self) -> Authenticator:
        return AgentIdentityAuthenticator(
            self.store, AgentCAProvider.fixed(None), self.clock.seconds, 65536
        )

    async def test_mount_by_fingerprint(self) -> None:
        """An agent_fingerprint of a recorded leaf mounts, and the leaf is revoked on release."""
        fingerprint = "f" * 64
        leaf = IssuedCertificate(
            serial="abc123",
            kind=CertificateKind.AGENT_LEAF,
            subject="acme",
            not_after=LEAF_EXPIRY,
            issued_at=NOW,
            tenant_id="acme",
            agent_id="a1",
            fingerprint=fingerprint,
        )
        await self.result(self.store.record_certificate(leaf))
        answer = await self.mount(body={"agent_fingerprint": fingerprint, "force": False})
        self.assertEqual(answer.status, 200)
        answer = await self.mount(body={"agent_fingerprint": fingerprint}, method="DELETE")
        self.assertEqual(answer.status, 204)
        active = await self.result(self.store.active_revocations(self.now()))
        self.assertEqual([r.serial for r in active], ["abc123"])
        answer = await self.mount(body={"agent_fingerprint": fingerprint})
        self.assertError(answer, 401, "invalid_client")

    async def test_force_unmounted_holder_lease_lost(self) -> None:
        """Owner-forced unmount: the holder's refresh and release are 410 lease_lost."""
        fingerprint = "e" * 64
        leaf = IssuedCertificate(
            serial="def456",
            kind=CertificateKind.AGENT_LEAF,
            subject="acme",
            not_after=LEAF_EXPIRY,
            issued_at=NOW,
            tenant_id="acme",
            agent_id="a1",
            fingerprint=fingerprint,
        )
        await self.result(self.store.record_certificate(leaf))
        identity = {"agent_fingerprint": fingerprint}
        self.assertEqual((await self.mount(body=identity)).status, 200)
        ended = await self.result(self.store.force_unmount(self.allocation_id, "acme", self.now()))
        self.assertIsNotNone(ended)
        self.assertError(await self.mount(body=identity, path="/refresh"), 410, "lease_lost")
        self.assertError(await self.mount(body=identity, method="DELETE"), 410, "lease_lost")
        self.assertError(await self.mount(body=identity), 401, "invalid_client")


# Each contract on both backends: SQLite in memory, synchronously; PostgreSQL.


class AcquireTests(AcquireContract, SQLiteBackend):
    """Acquire over SQLite."""


class PostgresAcquireTests(AcquireContract, PostgresBackend):
    """Acquire over PostgreSQL."""


class RefreshTests(RefreshContract, SQLiteBackend):
    """Refresh over SQLite."""


class PostgresRefreshTests(RefreshContract, PostgresBackend):
    """Refresh over PostgreSQL."""


class ReleaseTests(ReleaseContract, SQLiteBackend):
    """Release over SQLite."""


class PostgresReleaseTests(ReleaseContract, PostgresBackend):
    """Release over PostgreSQL."""


class FingerprintIdentityTests(FingerprintIdentityContract, SQLiteBackend):
    """FingerprintIdentity over SQLite."""


class PostgresFingerprintIdentityTests(FingerprintIdentityContract, PostgresBackend):
    """FingerprintIdentity over PostgreSQL."""


class RenewedLeafContract(RouteBackend):
    """
    The mount routes beside the enrollment routes, with the real
    agent-identity authenticator and signed requests: a renewal keeps the
    lease.
    """

    async def set_up(self) -> None:
        self.world = await RouteWorld.open(self)
        mounts = MountDeps(
            store=self.world.store,
            clock=self.world.clock,
            pushes=self.world.pushes,
            lease_ttl=timedelta(seconds=TTL),
        )
        self.world.serve(self.world.deps, mount_routes(mounts))
        self.enrolled = await self.world.enrolled()
        self.mount_path = f"/allocations/{self.enrolled.body['allocation_id']}/mount"

    async def signed(self, enrolled: Enrolled, method: str, path: str) -> Answer:
        """C{method path} signed with C{enrolled}'s key."""
        body: dict[str, Any] = sign_request(
            enrolled.key, enrolled.leaf, method, path, int(self.world.clock.seconds() * 1000)
        )
        body["ca_chain_pem"] = enrolled.body["ca_chain_pem"]
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        return await self.send(self.world.resource, method, path, headers=headers, body=data)

    async def renewed(self, enrolled: Enrolled) -> Enrolled:
        """The enrollment C{POST /agent/renew} answers for C{enrolled}."""
        answer = await self.signed(enrolled, "POST", "/agent/renew")
        self.assertEqual(answer.status, 200, answer.body)
        return Enrolled(answer.json())

    async def test_refresh_with_renewed_leaf(self) -> None:
        """After a renewal the new leaf refreshes the same lease and session; the old one cannot."""
        acquired = await self.signed(self.enrolled, "POST", self.mount_path)
        self.assertEqual(acquired.status, 200, acquired.body)
        self.world.clock.advance(60)
        renewed = await self.renewed(self.enrolled)
        self.world.clock.advance(30)
        answer = await self.signed(renewed, "POST", self.mount_path + "/refresh")
        self.assertEqual(answer.status, 200, answer.body)
        self.assertEqual(answer.json()["session_id"], acquired.json()["session_id"])
        self.assertEqual(answer.json()["bound_at"], acquired.json()["bound_at"])
        self.assertEqual(answer.json()["lease_expires_at"], "2026-11-01T12:03:30Z")
        stale = await self.signed(self.enrolled, "POST", self.mount_path + "/refresh")
        self.assertEqual((stale.status, stale.json()["error"]), (410, "lease_lost"))

    async def test_lease_follows_successive_renewals(self) -> None:
        """A lease outlives its first leaf: renewed twice, the latest leaf refreshes, releases."""
        session = (await self.signed(self.enrolled, "POST", self.mount_path)).json()["session_id"]
        leaf = middle = self.enrolled
        for _ in range(2):
            self.world.clock.advance(50 * 60)
            middle, leaf = leaf, await self.renewed(leaf)
            answer = await self.signed(leaf, "POST", self.mount_path + "/refresh")
            self.assertEqual((answer.status, answer.json()["session_id"]), (200, session))
        self.assertEqual((await self.signed(leaf, "DELETE", self.mount_path)).status, 204)
        revoked = await self.world.result(self.world.store.active_revocations(self.world.now()))
        self.assertEqual([r.serial for r in revoked], sorted([middle.serial, leaf.serial]))

    async def test_release_revokes_leaves_renewed_from(self) -> None:
        """Releasing with a renewed leaf revokes the leaf the mount started with, and pushes."""
        acquired = await self.signed(self.enrolled, "POST", self.mount_path)
        self.assertEqual(acquired.status, 200, acquired.body)
        self.world.clock.advance(40 * 60)
        renewed = await self.renewed(self.enrolled)
        released = await self.signed(renewed, "DELETE", self.mount_path)
        self.assertEqual(released.status, 204, released.body)
        revoked = await self.world.result(self.world.store.active_revocations(self.world.now()))
        self.assertEqual(
            [r.serial for r in revoked], sorted([self.enrolled.serial, renewed.serial])
        )
        self.assertGreaterEqual(self.world.pushes.revocations, 1)
        stale = await self.signed(self.enrolled, "POST", "/agent/renew")
        self.assertEqual(stale.status, 401, stale.body)

    async def test_force_unmount_then_refresh_is_lease_lost(self) -> None:
        """Owner-forced unmount: the holder's signed refresh and release are 410 lease_lost."""
        acquired = await self.signed(self.enrolled, "POST", self.mount_path)
        self.assertEqual(acquired.status, 200, acquired.body)
        allocation_id = self.enrolled.body["allocation_id"]
        allocation = await self.world.result(self.world.store.get_allocation(allocation_id))
        ended = await self.world.result(
            self.world.store.force_unmount(allocation_id, allocation.owner_id, self.world.now())
        )
        self.assertIsNotNone(ended)
        refresh = await self.signed(self.enrolled, "POST", self.mount_path + "/refresh")
        self.assertEqual((refresh.status, refresh.json()["error"]), (410, "lease_lost"))
        release = await self.signed(self.enrolled, "DELETE", self.mount_path)
        self.assertEqual((release.status, release.json()["error"]), (410, "lease_lost"))
        again = await self.signed(self.enrolled, "POST", self.mount_path)
        self.assertEqual((again.status, again.json()["error"]), (401, "invalid_client"))
        renew = await self.signed(self.enrolled, "POST", "/agent/renew")
        self.assertEqual(renew.status, 401, renew.body)

    async def test_renewal_without_lease(self) -> None:
        """Renewing a leaf holding no lease mints the leaf and leaves the allocation unmounted."""
        renewed = await self.renewed(self.enrolled)
        lease = await self.world.result(
            self.world.store.get_mount_lease(self.enrolled.body["allocation_id"])
        )
        self.assertIsNone(lease)
        self.assertEqual((await self.signed(renewed, "POST", self.mount_path)).status, 200)


class RenewedLeafTests(RenewedLeafContract, SQLiteBackend):
    """RenewedLeaf over SQLite."""


class PostgresRenewedLeafTests(RenewedLeafContract, PostgresBackend):
    """RenewedLeaf over PostgreSQL."""
