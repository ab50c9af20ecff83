"""
Tests for L{svc.control.agent_auth}: the C{AGENT_IDENTITY} authenticator's
three proofs (TLS client certificate, signed request, fingerprint), the
proof message format and the replay guard.
"""

from __future__ import annotations

import io
import json
from collections.abc import Awaitable, Mapping
from datetime import timedelta
from typing import Any, cast

from cryptography import x509
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import ISSLTransport
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.server import Request
from zope.interface import implementer  # type: ignore[import-untyped]

from svc.control.agent_auth import (
    AgentIdentityAuthenticator,
    AgentPrincipal,
    AgentProof,
    ReplayGuard,
    proof_message,
    route_path,
    sign_request,
)
from svc.control.ca import AgentCAProvider
from svc.control.store.values import MountHolder
from svc.control.test.backends import PostgresBackend, RouteBackend, SQLiteBackend
from svc.control.test.test_enrollment_support import NOW, TRUST_DOMAIN, RouteWorld
from svc.pki import names
from svc.pki.filesystem import FilesystemCA
from svc.testing.pki import forge_leaf
from svc.testing.worker import ImmediateWorker
from svc.web.errors import ApiError


async def retire(world: RouteWorld, certificate: Any) -> None:
    """Deny-list C{certificate}'s serial (an intermediate retired by rotation)."""
    await world.result(
        world.store.add_revocation(
            names.format_serial(certificate.serial_number),
            certificate.not_valid_after_utc,
            NOW,
        )
    )


def unrecorded_agent_leaf(intermediate: Any) -> Any:
    """A well-formed leaf of agent-1 (tenant acme) under C{intermediate}, never recorded."""
    return forge_leaf(
        intermediate,
        NOW,
        uris=[f"spiffe://{TRUST_DOMAIN}/tenant/acme", f"spiffe://{TRUST_DOMAIN}/agent/agent-1"],
        common_name="alice",
        ou="tenant=acme",
    )


class FakeHandle:
    """The peer-certificate part of a pyOpenSSL connection (server side)."""

    def __init__(self, leaf: x509.Certificate | None, chain: list[x509.Certificate]) -> None:
        self.leaf = leaf
        self.chain = chain

    def get_peer_certificate(self, *, as_cryptography: bool) -> x509.Certificate | None:
        assert as_cryptography
        return self.leaf

    def get_peer_cert_chain(self, *, as_cryptography: bool) -> list[x509.Certificate] | None:
        assert as_cryptography
        return self.chain


@implementer(ISSLTransport)
class FakeTLSTransport:
    """A TLS transport whose peer presented C{leaf} and C{chain}."""

    def __init__(self, leaf: x509.Certificate | None, chain: list[x509.Certificate]) -> None:
        self.handle = FakeHandle(leaf, chain)

    def getHandle(self) -> FakeHandle:
        return self.handle


class FakeRequest:
    """The parts of a request the authenticator reads."""

    def __init__(
        self,
        *,
        transport: object = None,
        body: Mapping[str, Any] | None = None,
        path: bytes = b"/allocations/a1/mount",
    ) -> None:
        self.transport = transport
        self.method = b"POST"
        self.path = path
        raw = b"" if body is None else json.dumps(body).encode()
        self.content = io.BytesIO(raw)
        self.headers = {b"content-type": b"application/json"} if body is not None else {}

    def getHeader(self, name: bytes) -> bytes | None:
        return self.headers.get(name.lower())


async def refusal(authenticated: Awaitable[AgentPrincipal]) -> ApiError:
    """The L{ApiError} C{authenticated} fails with (anything else fails the test)."""
    try:
        principal = await authenticated
    except ApiError as error:
        return error
    raise AssertionError(f"authenticated as {principal!r}, expected an ApiError")


class AuthenticatorContract(RouteBackend):
    """The authenticator over an enrolled agent."""

    async def set_up(self) -> None:
        self.world = await RouteWorld.open(self)
        self.enrolled = await self.world.enrolled()
        self.authenticator = AgentIdentityAuthenticator(
            self.world.store, self.world.provider, self.world.clock.seconds, 65536
        )

    def authenticate(self, request: FakeRequest) -> Deferred[AgentPrincipal]:
        return Deferred.fromCoroutine(self.authenticator.authenticate(cast(Request, request)))

    async def principal(self, request: FakeRequest) -> AgentPrincipal:
        return await self.authenticate(request)

    async def refused(self, request: FakeRequest) -> ApiError:
        return await refusal(self.authenticate(request))

    def tls(self, leaf: x509.Certificate, *chain: x509.Certificate) -> FakeRequest:
        return FakeRequest(transport=FakeTLSTransport(leaf, list(chain)))

    def acme_intermediate(self) -> Any:
        ca = FilesystemCA(self.world.secrets, TRUST_DOMAIN, self.world.settings.ca_kek)
        return ca.tenant_intermediate("acme", NOW)

    async def test_tls_client_certificate(self) -> None:
        """A verified peer chain gives the leaf's tenant, agent, owner, serial and fingerprint."""
        principal = await self.principal(self.tls(self.enrolled.leaf, self.enrolled.intermediate))
        self.assertEqual(
            principal,
            AgentPrincipal(
                tenant_id="acme",
                agent_id="agent-1",
                user_id="alice",
                serial=self.enrolled.serial,
                not_after=NOW + timedelta(hours=1),
                fingerprint=self.enrolled.body["agent_fingerprint"],
                proof=AgentProof.TLS_CLIENT_CERT,
            ),
        )
        self.assertTrue(principal.possession_proven)
        self.assertEqual(
            principal.mount_holder(),
            MountHolder(
                "agent-1",
                self.enrolled.serial,
                NOW + timedelta(hours=1),
                self.enrolled.body["agent_fingerprint"],
            ),
        )

    async def test_tls_chain_including_leaf(self) -> None:
        """A peer chain that repeats the leaf (client-side order) is accepted too."""
        request = self.tls(self.enrolled.leaf, self.enrolled.leaf, self.enrolled.intermediate)
        self.assertEqual((await self.principal(request)).serial, self.enrolled.serial)

    async def test_tls_without_intermediate(self) -> None:
        """A leaf without its intermediate: 401 invalid_client."""
        error = await self.refused(self.tls(self.enrolled.leaf))
        self.assertEqual((error.status, error.code), (401, "invalid_client"))

    async def test_tls_expired(self) -> None:
        """An expired leaf over TLS: 401 invalid_client."""
        self.world.clock.advance(3601)
        error = await self.refused(self.tls(self.enrolled.leaf, self.enrolled.intermediate))
        self.assertEqual(error.code, "invalid_client")

    async def test_tls_retired_intermediate(self) -> None:
        """A leaf whose intermediate serial is revoked (rotation): 401."""
        intermediate = self.enrolled.intermediate
        await retire(self.world, intermediate)
        error = await self.refused(self.tls(self.enrolled.leaf, intermediate))
        self.assertEqual(error.code, "invalid_client")

    async def test_tenant_only_certificate(self) -> None:
        """A leaf with a tenant SAN but no agent SAN: 403 agent_scope_required."""
        intermediate = self.acme_intermediate()
        leaf = forge_leaf(
            intermediate,
            NOW,
            uris=[f"spiffe://{TRUST_DOMAIN}/tenant/acme"],
            common_name="alice",
            ou="tenant=acme",
        )
        error = await self.refused(self.tls(leaf.cert, intermediate.cert))
        self.assertEqual(
            (error.status, error.code, error.description),
            (403, "access_denied", "agent_scope_required"),
        )

    async def test_unrecorded_leaf(self) -> None:
        """A well-formed leaf under our intermediate that was never recorded as issued: 401."""
        intermediate = self.acme_intermediate()
        leaf = unrecorded_agent_leaf(intermediate)
        error = await self.refused(self.tls(leaf.cert, intermediate.cert))
        self.assertEqual(error.code, "invalid_client")

    async def test_tls_without_client_certificate_falls_back_to_body(self) -> None:
        """A TLS connection without a client certificate may still use the body fields."""
        request = FakeRequest(
            transport=FakeTLSTransport(None, []),
            body={"agent_fingerprint": self.enrolled.body["agent_fingerprint"]},
        )
        self.assertEqual((await self.principal(request)).proof, AgentProof.FINGERPRINT)

    async def test_tls_without_ca(self) -> None:
        """With no open CA a certificate cannot be checked: 503 Retry-After 60."""
        authenticator = AgentIdentityAuthenticator(
            self.world.store, AgentCAProvider.fixed(None), self.world.clock.seconds, 65536
        )
        request = self.tls(self.enrolled.leaf, self.enrolled.intermediate)
        error = await refusal(authenticator.authenticate(cast(Request, request)))
        self.assertEqual((error.status, error.headers["Retry-After"]), (503, "60"))

    async def test_signed_request_via_api_prefix(self) -> None:
        """A signed request sent under /api verifies against the bare path."""
        body = sign_request(
            self.enrolled.key,
            self.enrolled.leaf,
            "POST",
            "/allocations/a1/mount",
            int(self.world.clock.seconds() * 1000),
        )
        body["ca_chain_pem"] = self.enrolled.body["ca_chain_pem"]
        principal = await self.principal(FakeRequest(body=body, path=b"/api/allocations/a1/mount"))
        self.assertEqual(principal.proof, AgentProof.SIGNED_REQUEST)
        self.assertEqual(principal.serial, self.enrolled.serial)

    async def test_fingerprint(self) -> None:
        """agent_fingerprint finds the recorded leaf; it proves no possession."""
        fingerprint = self.enrolled.body["agent_fingerprint"]
        principal = await self.principal(FakeRequest(body={"agent_fingerprint": fingerprint}))
        self.assertEqual(
            (principal.tenant_id, principal.agent_id, principal.user_id, principal.serial),
            ("acme", "agent-1", "alice", self.enrolled.serial),
        )
        self.assertEqual(principal.not_after, NOW + timedelta(hours=1))
        self.assertFalse(principal.possession_proven)

    async def test_fingerprint_refusals(self) -> None:
        """Unknown, malformed, non-leaf fingerprints are 401 invalid_client."""
        intermediate_record = await self.world.result(
            self.world.store.find_certificate(
                names.format_serial(self.enrolled.intermediate.serial_number)
            )
        )
        intermediate_fingerprint = intermediate_record.fingerprint
        for fingerprint in (
            "0" * 64,
            self.enrolled.body["agent_fingerprint"].upper(),
            "abc",
            intermediate_fingerprint,
        ):
            error = await self.refused(FakeRequest(body={"agent_fingerprint": fingerprint}))
            self.assertEqual((error.status, error.code), (401, "invalid_client"), fingerprint)

    async def test_fingerprint_of_expired_leaf(self) -> None:
        """The fingerprint of an expired leaf: 401."""
        self.world.clock.advance(3600)
        error = await self.refused(
            FakeRequest(body={"agent_fingerprint": self.enrolled.body["agent_fingerprint"]})
        )
        self.assertEqual(error.code, "invalid_client")

    async def test_fingerprint_of_revoked_leaf(self) -> None:
        """The fingerprint of a revoked leaf: 401."""
        await self.world.result(
            self.world.store.add_revocation(self.enrolled.serial, NOW + timedelta(hours=1), NOW)
        )
        error = await self.refused(
            FakeRequest(body={"agent_fingerprint": self.enrolled.body["agent_fingerprint"]})
        )
        self.assertEqual(error.code, "invalid_client")

    def signed(self, timestamp_s: float | None = None) -> FakeRequest:
        """A request signed with the enrolled leaf's key."""
        seconds = self.world.clock.seconds() if timestamp_s is None else timestamp_s
        body = sign_request(
            self.enrolled.key,
            self.enrolled.leaf,
            "POST",
            "/allocations/a1/mount",
            int(seconds * 1000),
        )
        body["ca_chain_pem"] = self.enrolled.body["ca_chain_pem"]
        return FakeRequest(body=body)

    def by_fingerprint(self) -> FakeRequest:
        """A request naming the enrolled leaf by fingerprint."""
        return FakeRequest(body={"agent_fingerprint": self.enrolled.body["agent_fingerprint"]})

    def each_proof(self) -> list[FakeRequest]:
        """The enrolled leaf's requests by each of the three proofs."""
        return [
            self.tls(self.enrolled.leaf, self.enrolled.intermediate),
            self.signed(),
            self.by_fingerprint(),
        ]

    async def revoke_allocation(self) -> None:
        """Revoke the enrolled agent's allocation (which deny-lists its leaves)."""
        allocation_id = self.enrolled.body["allocation_id"]
        await self.world.result(self.world.store.revoke_allocation(allocation_id, NOW))

    async def revoke_leaf(self) -> None:
        """Deny-list the enrolled leaf alone."""
        await self.world.result(
            self.world.store.add_revocation(self.enrolled.serial, NOW + timedelta(hours=1), NOW)
        )

    async def assertRefusedWith(self, request: FakeRequest, status: int, code: str) -> None:
        """C{request} is refused with C{status} and C{code}."""
        error = await self.refused(request)
        self.assertEqual((error.status, error.code), (status, code))

    async def assertEveryProofRefused(self, status: int, code: str) -> None:
        """Each kind of proof of the enrolled leaf is refused with C{status} and C{code}."""
        for request in self.each_proof():
            await self.assertRefusedWith(request, status, code)

    async def test_denied_leaf_of_revoked_allocation_is_gone(self) -> None:
        """A leaf deny-listed because its allocation was revoked: 410 revoked, by each proof."""
        await self.revoke_allocation()
        await self.assertEveryProofRefused(410, "revoked")

    async def test_denied_leaf_of_purged_allocation_is_gone(self) -> None:
        """A deny-listed leaf of a purged allocation is 410 revoked as well."""
        await self.revoke_allocation()
        allocation_id = self.enrolled.body["allocation_id"]
        await self.world.result(self.world.store.mark_purged(allocation_id, NOW))
        await self.assertEveryProofRefused(410, "revoked")

    async def test_denied_leaf_of_live_allocation_is_unauthorized(self) -> None:
        """A deny-listed leaf of a live allocation (a released mount): 401, by each proof."""
        await self.revoke_leaf()
        await self.assertEveryProofRefused(401, "invalid_client")

    async def test_revoked_allocation_with_valid_leaf_authenticates(self) -> None:
        """A leaf not on the deny-list authenticates; the route answers for the allocation."""
        await self.revoke_allocation()
        await self.sql(self.world.store, "DELETE FROM cert_revocations")
        principal = await self.principal(self.tls(self.enrolled.leaf, self.enrolled.intermediate))
        self.assertEqual(principal.serial, self.enrolled.serial)

    async def test_denied_leaf_refused_for_more_is_unauthorized(self) -> None:
        """
        A deny-listed leaf of a revoked allocation that fails another check
        too (retired intermediate, stale proof, expired) is 401.
        """
        await self.revoke_allocation()
        intermediate = self.enrolled.intermediate
        await retire(self.world, intermediate)
        await self.assertRefusedWith(
            self.tls(self.enrolled.leaf, intermediate), 401, "invalid_client"
        )
        await self.assertRefusedWith(
            self.signed(self.world.clock.seconds() - 61), 401, "invalid_client"
        )
        self.world.clock.advance(3601)
        for request in (self.signed(), self.by_fingerprint()):
            await self.assertRefusedWith(request, 401, "invalid_client")

    async def test_denied_unrecorded_leaf_of_revoked_allocation_is_unauthorized(self) -> None:
        """A deny-listed leaf the control plane never recorded issuing stays 401."""
        intermediate = self.acme_intermediate()
        leaf = unrecorded_agent_leaf(intermediate)
        serial = names.format_serial(leaf.cert.serial_number)
        await self.world.result(
            self.world.store.add_revocation(serial, leaf.cert.not_valid_after_utc, NOW)
        )
        await self.revoke_allocation()
        await self.assertRefusedWith(self.tls(leaf.cert, intermediate.cert), 401, "invalid_client")

    async def test_denied_leaf_of_reassigned_agent_is_unauthorized(self) -> None:
        """
        After a reassignment the old tenant's leaves are deny-listed: 401,
        also once the allocation (now in another tenant) is revoked.
        """
        await self.world.result(
            self.world.store.reassign_agent("agent-1", owner_id="bob", tenant_id="beta", now=NOW)
        )
        await self.assertEveryProofRefused(401, "invalid_client")
        await self.revoke_allocation()
        self.world.clock.advance(1)  # a new proof, not a replayed one
        await self.assertEveryProofRefused(401, "invalid_client")

    async def test_nothing(self) -> None:
        """No certificate and no body field: 401 invalid_client without WWW-Authenticate."""
        error = await self.refused(FakeRequest(body={"force": True}))
        self.assertEqual((error.status, error.code), (401, "invalid_client"))
        self.assertNotIn("WWW-Authenticate", error.headers)

    async def test_body_left_readable(self) -> None:
        """The handler can still read the body the authenticator looked at."""
        request = FakeRequest(
            body={"agent_fingerprint": self.enrolled.body["agent_fingerprint"], "force": True}
        )
        await self.principal(request)
        self.assertEqual(json.loads(request.content.read())["force"], True)


class ProofFormatTests(SynchronousTestCase):
    """The signed-request format is fixed: clients in other languages build it."""

    def test_message(self) -> None:
        """The message is the context, method, path, serial and timestamp, newline-separated."""
        self.assertEqual(
            proof_message("post", "/agent/renew", "1f3a", 1767225600000),
            b"svc-agent-proof-v1\nPOST\n/agent/renew\n1f3a\n1767225600000",
        )

    def test_route_path(self) -> None:
        """The signed path drops an /api prefix and nothing else."""
        self.assertEqual(route_path(b"/api/agent/renew"), "/agent/renew")
        self.assertEqual(route_path(b"/agent/renew"), "/agent/renew")
        self.assertEqual(route_path(b"/apiary"), "/apiary")


class ReplayGuardTests(SynchronousTestCase):
    """Each signature is accepted once within the window; memory is bounded."""

    def test_once(self) -> None:
        """The second use of a signature is refused."""
        guard = ReplayGuard(window_seconds=120)
        self.assertTrue(guard.first_use(b"a", 0))
        self.assertFalse(guard.first_use(b"a", 119))
        self.assertTrue(guard.first_use(b"b", 119))

    def test_forgets_after_window(self) -> None:
        """After the window a signature is forgotten (its timestamp is stale anyway)."""
        guard = ReplayGuard(window_seconds=120)
        guard.first_use(b"a", 0)
        self.assertTrue(guard.first_use(b"a", 120))

    def test_capacity(self) -> None:
        """At most capacity signatures are kept; the oldest goes first."""
        guard = ReplayGuard(window_seconds=120, capacity=2)
        for signature in (b"a", b"b", b"c"):
            guard.first_use(signature, 0)
        self.assertTrue(guard.first_use(b"a", 1))
        self.assertFalse(guard.first_use(b"c", 1))


class WorkerUseContract(RouteBackend):
    """The fixture's CA runs its blocking work on the injected worker."""

    async def test_worker_used(self) -> None:
        """Opening the CA and creating an intermediate go through the worker."""
        world = await RouteWorld.open(self)
        worker = world.worker
        assert isinstance(worker, ImmediateWorker)
        before = worker.calls
        await world.enrolled()
        self.assertGreater(worker.calls, before)


# Each contract on both backends: SQLite in memory, synchronously; PostgreSQL.


class AuthenticatorTests(AuthenticatorContract, SQLiteBackend):
    """Authenticator over SQLite."""


class PostgresAuthenticatorTests(AuthenticatorContract, PostgresBackend):
    """Authenticator over PostgreSQL."""


class WorkerUseTests(WorkerUseContract, SQLiteBackend):
    """WorkerUse over SQLite."""


class PostgresWorkerUseTests(WorkerUseContract, PostgresBackend):
    """WorkerUse over PostgreSQL."""
