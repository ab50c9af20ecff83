"""
Tests for C{POST /agent/enroll} (L{svc.control.enrollment},
L{svc.control.routes_enrollment}) through the HTTP app: every enroll-token
state, readiness (503), the rate limit, the minted leaf's profile and the
audit of signing events.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, cast

import attrs
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from treq.testing import StubTreq
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import deferLater
from twisted.trial.unittest import SynchronousTestCase

from svc.control.app import build_control_app
from svc.control.dataplane_client import AgentGrant, ControlCertificateKeeper
from svc.control.enrollment import (
    EnrollTokenCredential,
    format_timestamp,
    hash_token,
    new_secret_token,
    refusal_error,
)
from svc.control.revocation_push import ControlPushLoop
from svc.control.routes_enrollment import enrollment_routes
from svc.control.routes_entities import EntityDeps, entity_routes
from svc.control.settings import ControlSettings
from svc.control.store.interface import ControlStore
from svc.control.store.outcomes import EnrollOutcome, EnrollRefusal, EnrollRefusalReason
from svc.control.store.values import CertificateKind
from svc.control.test.backends import PostgresBackend, RouteBackend, SQLiteBackend, reactor
from svc.control.test.test_dataplane_client import FakeDataPlane, credentials, fake_client
from svc.control.test.test_enrollment_support import (
    GIB,
    NOW,
    SERVER_ADDR,
    SERVER_FQDN,
    SERVICE_TOKEN,
    TRUST_DOMAIN,
    Enrolled,
    EnrollmentWorld,
    RouteWorld,
    capture_logs,
)
from svc.pki import names
from svc.pki.chain import verify_chain
from svc.pki.identity import DenyList, admit_agent
from svc.pki.test.profiles import END_ENTITY_EXTENSIONS, ProfileAssertions
from svc.web.errors import ApiError

SERVICE = {"Authorization": f"Bearer {SERVICE_TOKEN}"}

if TYPE_CHECKING:
    _Profile = ProfileAssertions
else:
    _Profile = object


class EnrollContract(RouteBackend, _Profile):
    """A good enroll token yields a leaf, its key, the chain and the server."""

    async def set_up(self) -> None:
        self.world = await RouteWorld.open(self)

    async def test_response_fields(self) -> None:
        """200 carries the spec's fields plus allocation id, serial, fingerprint and server name."""
        allocation = await self.world.provision()
        answer = await self.world.enroll(await self.world.token(allocation))
        self.assertEqual(answer.status, 200, answer.body)
        body = answer.json()
        self.assertEqual(
            set(body),
            {
                "client_cert_pem",
                "client_key_pem",
                "ca_chain_pem",
                "server_addr",
                "server_name",
                "expires_at",
                "allocation_id",
                "serial",
                "agent_fingerprint",
            },
        )
        self.assertEqual(body["server_addr"], SERVER_ADDR)
        self.assertEqual(body["server_name"], SERVER_FQDN)
        self.assertEqual(body["allocation_id"], allocation.allocation_id)

    async def test_key_belongs_to_leaf(self) -> None:
        """client_key_pem is the unencrypted ed25519 key of client_cert_pem."""
        enrolled = await self.world.enrolled()
        self.assertIn("-----BEGIN PRIVATE KEY-----", enrolled.body["client_key_pem"])
        raw = (Encoding.Raw, PublicFormat.Raw)
        leaf_public = enrolled.leaf.public_key()
        self.assertEqual(
            leaf_public.public_bytes(*raw), enrolled.key.public_key().public_bytes(*raw)
        )

    async def test_leaf_profile(self) -> None:
        """The leaf: CN owner, OU tenant, SPIFFE tenant+agent SANs, clientAuth, 1 h, back-dated."""
        enrolled = await self.world.enrolled()
        leaf = enrolled.leaf
        self.assertEqual(
            leaf.subject,
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "tenant=acme"),
                    x509.NameAttribute(NameOID.COMMON_NAME, "alice"),
                ]
            ),
        )
        self.assertSans(
            leaf,
            [
                x509.UniformResourceIdentifier(f"spiffe://{TRUST_DOMAIN}/tenant/acme"),
                x509.UniformResourceIdentifier(f"spiffe://{TRUST_DOMAIN}/agent/agent-1"),
            ],
        )
        self.assertBasics(leaf, ca=False, path_length=None)
        self.assertUsage(leaf, {"digital_signature"})
        self.assertPurpose(leaf, ExtendedKeyUsageOID.CLIENT_AUTH)
        self.assertExtensions(leaf, END_ENTITY_EXTENSIONS)
        self.assertSki(leaf)
        self.assertLinked(leaf, enrolled.intermediate)
        self.assertEqual(leaf.not_valid_before_utc, NOW - timedelta(minutes=5))
        self.assertEqual(leaf.not_valid_after_utc, NOW + timedelta(hours=1))

    async def test_leaf_is_admitted_by_the_data_plane_rules(self) -> None:
        """The leaf chains to the org root and passes the data-plane admission rules."""
        enrolled = await self.world.enrolled()
        intermediate, root = enrolled.chain
        verify_chain(enrolled.leaf, [intermediate], root, NOW)
        identity = admit_agent(enrolled.leaf, intermediate, TRUST_DOMAIN, DenyList())
        self.assertEqual(
            (identity.tenant_id, identity.agent_id, identity.user_id),
            ("acme", "agent-1", "alice"),
        )
        self.assertEqual(identity.serial, enrolled.serial)

    async def test_chain_order(self) -> None:
        """ca_chain_pem is the tenant intermediate followed by the org root, nothing else."""
        enrolled = await self.world.enrolled()
        self.assertEqual(len(enrolled.chain), 2)
        intermediate, root = enrolled.chain
        ca = await self.world.result(self.world.provider.get())
        assert ca is not None
        self.assertEqual(root, ca.root)
        self.assertEqual(root.issuer, root.subject)
        intermediate.verify_directly_issued_by(root)
        ou = intermediate.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
        self.assertEqual([a.value for a in ou], ["tenant=acme"])

    async def test_expires_at_format(self) -> None:
        """expires_at is the leaf's NotAfter as RFC 3339 UTC with Z and whole seconds."""
        enrolled = await self.world.enrolled()
        self.assertEqual(enrolled.body["expires_at"], "2026-11-01T13:00:00Z")
        self.assertRegex(enrolled.body["expires_at"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")

    async def test_serial_and_fingerprint(self) -> None:
        """serial is the leaf's canonical serial; agent_fingerprint the SHA-256 of its DER."""
        enrolled = await self.world.enrolled()
        self.assertEqual(enrolled.serial, names.format_serial(enrolled.leaf.serial_number))
        self.assertRegex(enrolled.body["agent_fingerprint"], r"^[0-9a-f]{64}$")
        self.assertEqual(
            enrolled.body["agent_fingerprint"],
            hashlib.sha256(enrolled.leaf.public_bytes(Encoding.DER)).hexdigest(),
        )

    async def test_signing_events_recorded(self) -> None:
        """The leaf and the new intermediate are recorded as issued; the token names the leaf."""
        token = await self.world.token()
        enrolled = Enrolled((await self.world.enroll(token)).json())
        leaf = await self.world.result(self.world.store.find_certificate(enrolled.serial))
        self.assertEqual(leaf.kind, CertificateKind.AGENT_LEAF)
        self.assertEqual(
            (leaf.tenant_id, leaf.agent_id, leaf.subject), ("acme", "agent-1", "alice")
        )
        self.assertEqual(leaf.fingerprint, enrolled.body["agent_fingerprint"])
        self.assertEqual(leaf.not_after, NOW + timedelta(hours=1))
        intermediate = await self.world.result(
            self.world.store.find_certificate(
                names.format_serial(enrolled.intermediate.serial_number)
            )
        )
        self.assertEqual(intermediate.kind, CertificateKind.TENANT_INTERMEDIATE)
        self.assertEqual(intermediate.tenant_id, "acme")
        self.assertEqual((await self.world.token_row(token)).leaf_serial, enrolled.serial)

    async def test_signing_events_logged(self) -> None:
        """Each signing logs one ca_signed line with kind, serial, tenant, agent and not_after."""
        events = capture_logs(self)
        enrolled = await self.world.enrolled()
        signed = [e for e in events if e.get("ca_signed")]
        self.assertEqual([e["kind"] for e in signed], ["tenant_intermediate", "agent_leaf"])
        leaf_line = signed[1]
        self.assertEqual(leaf_line["serial"], enrolled.serial)
        self.assertEqual((leaf_line["tenant"], leaf_line["agent"]), ("acme", "agent-1"))
        self.assertEqual(leaf_line["not_after"], (NOW + timedelta(hours=1)).isoformat())

    async def test_intermediate_created_once_per_tenant(self) -> None:
        """A second agent of the tenant gets the same intermediate; no second one is signed."""
        first = await self.world.enrolled()
        second_allocation = await self.world.provision(agent_id="agent-2")
        second = Enrolled(
            (await self.world.enroll((await self.world.token(second_allocation)))).json()
        )
        self.assertEqual(first.intermediate, second.intermediate)
        [(count,)] = await self.sql(
            self.world.store,
            "SELECT count(*) FROM issued_certificates WHERE kind = 'tenant_intermediate'",
        )
        self.assertEqual(count, 1)

    async def test_other_tenant_other_intermediate(self) -> None:
        """Another tenant's leaf is signed by its own intermediate."""
        first = await self.world.enrolled()
        other = await self.world.provision(agent_id="agent-9", owner_id="bob", tenant_id="beta")
        second = Enrolled((await self.world.enroll((await self.world.token(other)))).json())
        self.assertNotEqual(first.intermediate, second.intermediate)
        self.assertEqual(second.leaf.subject.rfc4514_string(), "CN=bob,OU=tenant=beta")

    async def test_no_api_alias(self) -> None:
        """/agent/enroll is not served under /api."""
        token = await self.world.token()
        answer = await self.world.post_json(
            "/api/agent/enroll", None, {"Authorization": f"Bearer {token}"}
        )
        self.assertEqual(answer.status, 404)
        self.assertFalse(await self.world.token_spent(token))


class EnrollTokenStateContract(RouteBackend, _Profile):
    """Every enroll-token state other than issued is refused and leaves state unchanged."""

    async def set_up(self) -> None:
        self.world = await RouteWorld.open(self)

    async def assertError(
        self, token: str | None, status: int, code: str, description: str = ""
    ) -> None:
        answer = await self.world.enroll(token)
        self.assertEqual(answer.status, status, answer.body)
        body = answer.json()
        self.assertEqual(body["error"], code)
        self.assertEqual(body.get("error_description", ""), description)

    async def test_missing_token(self) -> None:
        """No Authorization header: 401 invalid_token with WWW-Authenticate."""
        answer = await self.world.enroll(None)
        self.assertEqual(answer.status, 401)
        self.assertEqual(answer.json(), {"error": "invalid_token"})
        self.assertEqual(answer.header("WWW-Authenticate"), "Bearer")

    async def test_unknown_token(self) -> None:
        """A token nobody issued: 401 invalid_token."""
        await self.assertError(new_secret_token(), 401, "invalid_token")

    async def test_consumed_token(self) -> None:
        """A token already spent: 401 invalid_token, and no second leaf."""
        token = await self.world.token()
        self.assertEqual((await self.world.enroll(token)).status, 200)
        await self.assertError(token, 401, "invalid_token")
        [(count,)] = await self.sql(
            self.world.store, "SELECT count(*) FROM issued_certificates WHERE kind = 'agent_leaf'"
        )
        self.assertEqual(count, 1)

    async def test_expired_token(self) -> None:
        """A token past its expiry: 401 invalid_token."""
        token = await self.world.token(ttl=timedelta(seconds=60))
        self.world.clock.advance(60)
        await self.assertError(token, 401, "invalid_token")
        self.assertFalse(await self.world.token_spent(token))

    async def test_revoked_token(self) -> None:
        """A revoked token: 401 invalid_token."""
        token = await self.world.token()
        await self.world.result(
            self.world.store.revoke_enroll_token((await self.world.token_row(token)).token_id, NOW)
        )
        await self.assertError(token, 401, "invalid_token")

    async def test_suspended_user(self) -> None:
        """The allocation's owner is suspended: 403 user_suspended, token unspent."""
        token = await self.world.token()
        await self.world.result(self.world.store.set_user_suspended("alice", True))
        await self.assertError(token, 403, "access_denied", "user_suspended")
        self.assertFalse(await self.world.token_spent(token))

    async def test_suspended_tenant(self) -> None:
        """The allocation's tenant is suspended: 403 tenant_suspended, token unspent."""
        token = await self.world.token()
        await self.world.result(self.world.store.set_tenant_suspended("acme", True))
        await self.assertError(token, 403, "access_denied", "tenant_suspended")
        self.assertFalse(await self.world.token_spent(token))

    async def test_owner_scoped_allocation(self) -> None:
        """A token bound to an allocation without an agent: 403 agent_scope_required."""
        token = await self.world.token(await self.world.provision(agent_id=None))
        await self.assertError(token, 403, "access_denied", "agent_scope_required")
        self.assertFalse(await self.world.token_spent(token))

    async def test_revoking_the_allocation_revokes_its_tokens(self) -> None:
        """After the allocation is revoked its unspent token is revoked too: 401."""
        allocation = await self.world.provision()
        token = await self.world.token(allocation)
        await self.world.result(self.world.store.revoke_allocation(allocation.allocation_id, NOW))
        await self.assertError(token, 401, "invalid_token")

    async def test_allocation_revoked_refusal(self) -> None:
        """A store refusal allocation_revoked is 410 revoked."""
        token = await self.world.token()
        real = self.world.store

        class Refusing:
            def __getattr__(self, name: str) -> Any:
                return getattr(real, name)

            def peek_enroll_token(self, token_hash: str, now: Any) -> Deferred[EnrollOutcome]:
                return succeed(EnrollRefusal(EnrollRefusalReason.ALLOCATION_REVOKED))

        self.world.serve(attrs.evolve(self.world.deps, store=cast(ControlStore, Refusing())))
        await self.assertError(token, 410, "revoked")

    async def test_tenant_not_on_allowlist(self) -> None:
        """A tenant off the allowlist: 403 tenant_not_allowed, token unspent, no intermediate."""
        world = await RouteWorld.open(self, SVC_TENANT_ALLOWLIST="other")
        token = await world.token()
        answer = await world.enroll(token)
        self.assertEqual(answer.status, 403)
        self.assertEqual(
            answer.json(), {"error": "access_denied", "error_description": "tenant_not_allowed"}
        )
        self.assertFalse(await world.token_spent(token))
        self.assertFalse((world.secrets / "ca" / "tenant" / "acme").exists())

    async def test_allowlisted_tenant(self) -> None:
        """A tenant on SVC_TENANT_ALLOWLIST enrolls."""
        world = await RouteWorld.open(self, SVC_TENANT_ALLOWLIST="other,acme")
        self.assertEqual((await world.enroll((await world.token()))).status, 200)


# Each contract on both backends: SQLite in memory, synchronously; PostgreSQL.


class EnrollTests(EnrollContract, SQLiteBackend, ProfileAssertions):
    """Enroll over SQLite."""


class PostgresEnrollTests(EnrollContract, PostgresBackend, ProfileAssertions):
    """Enroll over PostgreSQL."""


class EnrollTokenStateTests(EnrollTokenStateContract, SQLiteBackend):
    """EnrollTokenState over SQLite."""


class PostgresEnrollTokenStateTests(EnrollTokenStateContract, PostgresBackend):
    """EnrollTokenState over PostgreSQL."""


class RefusalMappingTests(SynchronousTestCase):
    """L{refusal_error} maps each store refusal to the spec's status and code."""

    def test_every_reason(self) -> None:
        """Token reasons are 401, allocation revoked 410, the others 403 with a description."""
        expected = {
            EnrollRefusalReason.UNKNOWN: (401, "invalid_token", ""),
            EnrollRefusalReason.CONSUMED: (401, "invalid_token", ""),
            EnrollRefusalReason.REVOKED: (401, "invalid_token", ""),
            EnrollRefusalReason.EXPIRED: (401, "invalid_token", ""),
            EnrollRefusalReason.ALLOCATION_REVOKED: (410, "revoked", ""),
            EnrollRefusalReason.USER_SUSPENDED: (403, "access_denied", "user_suspended"),
            EnrollRefusalReason.TENANT_SUSPENDED: (403, "access_denied", "tenant_suspended"),
            EnrollRefusalReason.AGENT_SCOPE_REQUIRED: (
                403,
                "access_denied",
                "agent_scope_required",
            ),
        }
        self.assertEqual(set(expected), set(EnrollRefusalReason))
        for reason, answer in expected.items():
            error: ApiError = refusal_error(reason)
            self.assertEqual((error.status, error.code, error.description), answer, reason)


class ReadinessContract(RouteBackend):
    """503 with Retry-After: 60 while CA material or placement is missing; the token survives."""

    async def assertNotReady(self, world: RouteWorld, token: str, description: str) -> None:
        answer = await world.enroll(token)
        self.assertEqual(answer.status, 503, answer.body)
        self.assertEqual(answer.header("Retry-After"), "60")
        self.assertEqual(
            answer.json(),
            {"error": "temporarily_unavailable", "error_description": description},
        )
        self.assertFalse(await world.token_spent(token))

    async def test_no_org_root_yet(self) -> None:
        """Without an org root: 503; after 'svc ca init' the same token enrolls, no restart."""
        world = await RouteWorld.open(self, with_root=False)
        token = await world.token()
        await self.assertNotReady(world, token, "agent_ca_not_ready")
        await world.init_root()
        self.assertEqual((await world.enroll(token)).status, 200)

    async def test_no_server_registered(self) -> None:
        """Without a data-plane server: 503; once one registers the same token enrolls."""
        world = await RouteWorld.open(self, with_server=False)
        token = await world.token()
        await self.assertNotReady(world, token, "placement_not_ready")
        await world.register_server()
        answer = await world.enroll(token)
        self.assertEqual(answer.status, 200)
        self.assertEqual(answer.json()["server_addr"], SERVER_ADDR)

    async def test_servers_full(self) -> None:
        """Every server at capacity: 503 placement_not_ready."""
        world = await RouteWorld.open(self, with_server=False)
        await world.register_server(capacity=1)
        await world.enrolled()
        other = await world.provision(agent_id="agent-b", owner_id="bob", tenant_id="beta")
        await self.assertNotReady(world, await world.token(other), "placement_not_ready")

    async def test_not_mounted_without_agent_ca(self) -> None:
        """Without an agent CA configured the enrollment routes do not exist (404)."""
        world = await RouteWorld.open(self)
        settings = ControlSettings.from_environ(
            {"DATABASE_URL": "sqlite:////x/db", "SVC_CONTROL_PLANE_TOKEN": "s" * 40}
        )
        app = build_control_app(settings, world.clock.seconds, routes=enrollment_routes(world.deps))
        resource = app.resource()
        for path in ("/agent/enroll", "/agent/renew", "/control/sign-server-cert"):
            self.assertEqual((await self.send(resource, "POST", path)).status, 404, path)


async def settled(done: Callable[[], bool], timeout: float = 5.0) -> None:
    """
    Once C{done()} holds: at once if it already does (always so over SQLite,
    where every store call has fired), else polling on the real reactor
    (the push loop's store calls over PostgreSQL finish after the response).
    """
    waited = 0.0
    while not done():
        if waited >= timeout:
            raise AssertionError(f"not settled after {timeout} s")
        await deferLater(reactor, 0.01, lambda: None)
        waited += 0.01


class GrantPushContract(RouteBackend):
    """An enrollment tells the push loop the agent's grant, for the server it was placed on."""

    async def test_enrollment_queues_grant(self) -> None:
        """A successful enrollment queues the agent's grant once and reports its tenant placed."""
        world = await RouteWorld.open(self)
        await world.enrolled()
        self.assertEqual(world.pushes.quotas, [AgentGrant("alice", "acme", "agent-1", GIB)])
        self.assertEqual(world.pushes.placed, ["acme"])

    async def test_refused_enrollment_queues_nothing(self) -> None:
        """A refused (401) or not-ready (503) enrollment queues no grant and places nothing."""
        world = await RouteWorld.open(self, with_server=False)
        token = await world.token()
        self.assertEqual((await world.enroll(new_secret_token())).status, 401)
        self.assertEqual((await world.enroll(token)).status, 503)
        self.assertEqual(world.pushes.quotas, [])
        self.assertEqual(world.pushes.placed, [])

    async def pushing_world(self) -> tuple[RouteWorld, ControlPushLoop, FakeDataPlane]:
        """
        A world with no tenant placed yet, one registered server (a fake data
        plane) and a running push loop that the enrollment and entity routes
        tell their changes.
        """
        world = await RouteWorld.open(self, with_server=False)
        await world.result(
            world.store.register_server(
                SERVER_FQDN, SERVER_ADDR, 10, world.now(), http_address="10.0.0.1:8443"
            )
        )
        plane = FakeDataPlane(SERVER_FQDN)
        client = fake_client({SERVER_FQDN: plane}, world.clock)
        keeper = ControlCertificateKeeper(lambda at: succeed(credentials()), world.now)
        loop = ControlPushLoop(world.store, world.clock, client, keeper)
        loop.startService()
        self.addCleanup(loop.stopService)
        entities = EntityDeps(world.store, world.settings, world.clock, client, loop)
        world.serve(attrs.evolve(world.deps, pushes=loop), entity_routes(entities))
        return world, loop, plane

    async def test_grant_reaches_server_placed_at_enrollment(self) -> None:
        """The grant provisioning could not deliver (tenant unplaced) reaches the server now."""
        world, loop, plane = await self.pushing_world()
        allocation = await world.provision()
        grant = AgentGrant("alice", "acme", "agent-1", GIB)
        loop.quota_changed(grant)  # what provisioning does: dropped, nowhere to send it
        await settled(lambda: loop.idle)
        self.assertEqual(plane.bodies("/control/quotas"), [])
        self.assertEqual((await world.enroll(await world.token(allocation))).status, 200)
        await settled(lambda: loop.idle)
        self.assertIn(grant.body(), plane.bodies("/control/quotas"))
        self.assertEqual(loop.pending_quotas, ())

    async def test_budget_set_before_placement_reaches_server_at_enrollment(self) -> None:
        """An account budget set while the tenant had no server reaches it at first enrollment."""
        world, loop, plane = await self.pushing_world()
        allocation = await world.provision()
        answer = await world.post_json(
            "/v1/entities/account/alice/budget", {"budget_bytes": 5 * GIB}, SERVICE
        )
        self.assertEqual(answer.status, 200, answer.body)
        await settled(lambda: loop.idle)
        self.assertEqual(plane.bodies("/control/quotas"), [])
        self.assertEqual((await world.enroll(await world.token(allocation))).status, 200)
        await settled(lambda: loop.idle)
        self.assertIn(
            {"owner": "alice", "tenant": "acme", "account_budget_bytes": 5 * GIB},
            plane.bodies("/control/quotas"),
        )
        self.assertEqual(loop.pending_quotas, ())

    async def test_every_live_grant_reaches_server_at_placement(self) -> None:
        """First placement sends every live grant of the tenant, not only the enrolling agent's."""
        world, loop, plane = await self.pushing_world()
        first = await world.provision("agent-1")
        await world.provision("agent-2")
        revoked = await world.provision("agent-3")
        await world.result(world.store.revoke_agent("agent-3", world.now()))
        self.assertEqual(revoked.agent_id, "agent-3")
        self.assertEqual((await world.enroll(await world.token(first))).status, 200)
        await settled(lambda: loop.idle)
        granted = {b["agent_id"] for b in plane.bodies("/control/quotas") if "agent_id" in b}
        self.assertEqual(granted, {"agent-1", "agent-2"}, plane.bodies("/control/quotas"))
        self.assertIn(
            {"owner": "alice", "tenant": "acme", "account_budget_bytes": None},
            plane.bodies("/control/quotas"),
        )


class RateLimitContract(RouteBackend):
    """Enrollment is limited per token: SVC_ENROLL_RATE_LIMIT (count/seconds)."""

    async def test_limit_then_retry_after(self) -> None:
        """The sixth attempt in 60 s is 429 with Retry-After; after the window it is judged anew."""
        world = await RouteWorld.open(self, SVC_ENROLL_RATE_LIMIT="5/60")
        token = new_secret_token()
        for _ in range(5):
            self.assertEqual((await world.enroll(token)).status, 401)
        world.clock.advance(20)
        answer = await world.enroll(token)
        self.assertEqual(answer.status, 429)
        self.assertEqual(answer.json(), {"error": "rate_limited"})
        self.assertEqual(answer.header("Retry-After"), "40")
        world.clock.advance(40)
        self.assertEqual((await world.enroll(token)).status, 401)

    async def test_per_token(self) -> None:
        """Another token is not limited by the first one's attempts."""
        world = await RouteWorld.open(self, SVC_ENROLL_RATE_LIMIT="1/60")
        self.assertEqual((await world.enroll(new_secret_token())).status, 401)
        self.assertEqual((await world.enroll(await world.token())).status, 200)

    async def test_limited_token_is_not_spent(self) -> None:
        """A rate-limited attempt does not touch the token; it enrolls once the window passes."""
        world = await RouteWorld.open(self, SVC_ENROLL_RATE_LIMIT="1/60", with_root=False)
        token = await world.token()
        self.assertEqual((await world.enroll(token)).status, 503)
        await world.init_root()
        self.assertEqual((await world.enroll(token)).status, 429)
        self.assertFalse(await world.token_spent(token))
        world.clock.advance(60)
        self.assertEqual((await world.enroll(token)).status, 200)


class ReadinessTests(ReadinessContract, SQLiteBackend):
    """Readiness over SQLite."""


class PostgresReadinessTests(ReadinessContract, PostgresBackend):
    """Readiness over PostgreSQL."""


class GrantPushTests(GrantPushContract, SQLiteBackend):
    """GrantPush over SQLite."""


class PostgresGrantPushTests(GrantPushContract, PostgresBackend):
    """GrantPush over PostgreSQL."""


class RateLimitTests(RateLimitContract, SQLiteBackend):
    """RateLimit over SQLite."""


class PostgresRateLimitTests(RateLimitContract, PostgresBackend):
    """RateLimit over PostgreSQL."""


class ConcurrentEnrollTests(SynchronousTestCase):
    """Two requests with one token fired before either completes mint one leaf."""

    def test_two_requests_in_flight(self) -> None:
        """Of two in-flight enrollments with the same token one is 200, the other 401."""
        world = EnrollmentWorld(self)
        token = world.token()
        stub: Any = StubTreq(world.resource)
        headers = {"Authorization": [f"Bearer {token}"]}
        first = stub.post("http://control.test/agent/enroll", headers=headers)
        second = stub.post("http://control.test/agent/enroll", headers=headers)
        stub.flush()
        codes = sorted(self.successResultOf(d).code for d in (first, second))
        self.assertEqual(codes, [200, 401])


class TokenHelperTests(SynchronousTestCase):
    """Minted tokens are >= 128 bits, token68-safe, and only their hash is kept."""

    def test_token_shape(self) -> None:
        """A token is 43 base64url characters without padding (256 random bits)."""
        token = new_secret_token()
        self.assertRegex(token, r"^[A-Za-z0-9_-]{43}$")
        self.assertEqual(len(base64.urlsafe_b64decode(token + "=")), 32)
        self.assertNotEqual(token, new_secret_token())

    def test_deterministic_source(self) -> None:
        """The random source is injectable."""
        self.assertEqual(new_secret_token(lambda n: b"\0" * n), "A" * 43)

    def test_hash(self) -> None:
        """hash_token is the SHA-256 as 64 lowercase hex digits."""
        self.assertEqual(
            hash_token("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        )

    def test_credential_repr_hides_hash(self) -> None:
        """The enroll-token principal keeps the hash out of its repr."""
        credential = EnrollTokenCredential(hash_token("secret"))
        self.assertNotIn(credential.token_hash, repr(credential))

    def test_format_timestamp(self) -> None:
        """format_timestamp converts to UTC and drops sub-seconds."""
        moment = datetime(2026, 1, 2, 5, 4, 5, 999, tzinfo=timezone(timedelta(hours=2)))
        self.assertEqual(format_timestamp(moment), "2026-01-02T03:04:05Z")
        self.assertTrue(re.fullmatch(r"\S+Z", format_timestamp(NOW)))
