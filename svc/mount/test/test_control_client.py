"""
Tests for L{svc.mount.control.control_client}: the mount client against the real
control-plane enrollment and mount-lease routes (real agent-identity
authenticator, in-memory store, filesystem CA), served in-process through
L{StubTreq}.
"""

from __future__ import annotations

import json
from collections.abc import Coroutine
from datetime import timedelta
from typing import Any, TypeVar

import attrs
from treq.testing import StubTreq
from twisted.internet.defer import Deferred, fail
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.interfaces import IOpenSSLClientConnectionCreator
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.resource import Resource
from twisted.web.server import Request

from svc.control.routes_mounts import MountDeps, mount_routes
from svc.control.test.test_enrollment_support import SERVER_ADDR, SERVER_FQDN, EnrollmentWorld
from svc.mount.control.control_client import (
    AlreadyMounted,
    ControlPlaneError,
    InvalidResponse,
    LeaseLive,
    LeaseLost,
    MountControlClient,
    MountLease,
    RateLimited,
    Revoked,
    Unauthorized,
    Unavailable,
    Unreachable,
)
from svc.mount.control.credentials import AgentCredentials, leaf_fingerprint
from svc.pki import names

T = TypeVar("T")
TTL = 120
BASE_URL = "http://control.test"


class RecordingHttp:
    """A treq-style client that records each request and forwards it to a StubTreq."""

    def __init__(self, stub: Any) -> None:
        self.stub = stub
        self.requests: list[tuple[str, str, dict[bytes, list[bytes]], bytes | None]] = []

    def request(self, method: str, url: str, **kwargs: Any) -> Deferred[Any]:
        """Record, then forward."""
        self.requests.append((method, url, dict(kwargs["headers"]), kwargs.get("data")))
        result: Deferred[Any] = self.stub.request(method, url, **kwargs)
        return result


class ControlClientCase(SynchronousTestCase):
    """A control plane with enrollment and mount routes, and a client of it."""

    def world(self, **kwargs: Any) -> EnrollmentWorld:
        """A control plane built with C{kwargs}; the client talks to it from now on."""
        world = EnrollmentWorld(self, **kwargs)
        mounts = MountDeps(
            store=world.store,
            clock=world.clock,
            pushes=world.pushes,
            lease_ttl=timedelta(seconds=TTL),
        )
        world.serve(world.deps, mount_routes(mounts))
        self.stub: Any = StubTreq(world.resource)
        self.http = RecordingHttp(self.stub)
        self.client = MountControlClient(world.clock, BASE_URL + "/", http=self.http)
        return world

    def setUp(self) -> None:
        self.w = self.world()

    def drive(self, coroutine: Coroutine[Any, Any, T]) -> Deferred[T]:
        """Run C{coroutine} until the in-memory exchange settles."""
        d = Deferred.fromCoroutine(coroutine)
        for _ in range(20):
            if d.called:
                break
            self.stub.flush()
        return d

    def ok(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """The result of C{coroutine}, which must succeed."""
        return self.successResultOf(self.drive(coroutine))

    def refused(self, coroutine: Coroutine[Any, Any, Any], kind: type[Exception]) -> Any:
        """The error C{coroutine} fails with, which must be a C{kind}."""
        return self.failureResultOf(self.drive(coroutine), kind).value

    def enroll(self, allocation: Any = None) -> AgentCredentials:
        """Enroll with a fresh token (for a new allocation unless one is given)."""
        return self.ok(self.client.enroll(self.w.token(allocation)))

    def acquire(self, creds: AgentCredentials, force: bool = False) -> MountLease:
        """A granted lease."""
        return self.ok(self.client.acquire_mount(creds, force=force))


class EnrollTests(ControlClientCase):
    """MountControlClient.enroll and the credentials it returns."""

    def test_enroll(self) -> None:
        """Enrollment returns a checked leaf, key and chain with the placement."""
        allocation = self.w.provision()
        creds = self.enroll(allocation)
        leaf = creds.leaf()
        self.assertEqual(creds.serial, names.format_serial(leaf.serial_number))
        self.assertEqual(creds.agent_fingerprint, leaf_fingerprint(leaf))
        self.assertEqual(leaf.public_key(), creds.key().public_key())
        self.assertEqual(creds.allocation_id, allocation.allocation_id)
        self.assertEqual((creds.server_name, creds.server_addr), (SERVER_FQDN, SERVER_ADDR))
        self.assertEqual(creds.not_after, self.w.now() + timedelta(hours=1))
        intermediates, root = creds.intermediates_and_root()
        self.assertEqual(len(intermediates), 1)
        self.assertEqual(root.issuer, root.subject)
        self.assertNotIn("PRIVATE KEY", repr(creds))
        self.assertTrue(IOpenSSLClientConnectionCreator.providedBy(creds.client_tls()))

    def test_request_headers(self) -> None:
        """Enrollment posts the Bearer token and Svc-API-Version: 1 to /agent/enroll."""
        token = self.w.token()
        self.ok(self.client.enroll(token))
        [(method, url, headers, _data)] = self.http.requests
        self.assertEqual((method, url), ("POST", BASE_URL + "/agent/enroll"))
        self.assertEqual(headers[b"Svc-API-Version"], [b"1"])
        self.assertEqual(headers[b"Authorization"], [f"Bearer {token}".encode()])

    def test_spent_token(self) -> None:
        """A token spent already is Unauthorized with the server's code."""
        token = self.w.token()
        self.ok(self.client.enroll(token))
        error = self.refused(self.client.enroll(token), Unauthorized)
        self.assertEqual((error.status, error.code), (401, "invalid_token"))

    def test_unavailable(self) -> None:
        """No data-plane server yet is Unavailable with the server's Retry-After."""
        self.w = self.world(with_server=False)
        error = self.refused(self.client.enroll(self.w.token()), Unavailable)
        self.assertEqual(
            (error.status, error.description, error.retry_after),
            (503, "placement_not_ready", 60.0),
        )


class LeaseTests(ControlClientCase):
    """Acquire, refresh and release of the mount lease with signed requests."""

    def setUp(self) -> None:
        super().setUp()
        self.allocation = self.w.provision()
        self.creds = self.enroll(self.allocation)

    def test_acquire(self) -> None:
        """A first acquisition grants a lease with a session, its times and the server."""
        lease = self.acquire(self.creds)
        self.assertEqual(
            attrs.evolve(lease, session_id=""),
            MountLease(
                self.allocation.allocation_id,
                "",
                self.w.now(),
                self.w.now() + timedelta(seconds=TTL),
                TTL,
                SERVER_ADDR,
            ),
        )
        self.assertTrue(lease.session_id.startswith("mount:"))
        [_, (method, url, headers, data)] = self.http.requests
        expected_url = f"{BASE_URL}/allocations/{self.allocation.allocation_id}/mount"
        self.assertEqual((method, url), ("POST", expected_url))
        self.assertEqual(headers[b"Svc-API-Version"], [b"1"])
        assert data is not None
        self.assertEqual(json.loads(data)["force"], False)

    def test_lease_live_then_force(self) -> None:
        """Another enrollment gets LeaseLive with the incumbent's times; force takes over."""
        first = self.acquire(self.creds)
        self.w.clock.advance(30)
        other = self.enroll(self.allocation)
        error = self.refused(self.client.acquire_mount(other), LeaseLive)
        self.assertNotIsInstance(error, AlreadyMounted)
        self.assertEqual(
            (error.status, error.code, error.bound_at, error.lease_expires_at),
            (409, "lease_live", first.bound_at, first.lease_expires_at),
        )
        taken = self.acquire(other, force=True)
        self.assertNotEqual(taken.session_id, first.session_id)
        error = self.refused(self.client.refresh_mount(self.creds), LeaseLost)
        self.assertEqual((error.status, error.code), (410, "lease_lost"))

    def test_already_mounted(self) -> None:
        """The holder acquiring again gets AlreadyMounted; force re-grants a new session."""
        first = self.acquire(self.creds)
        error = self.refused(self.client.acquire_mount(self.creds), AlreadyMounted)
        self.assertEqual(error.lease_expires_at, first.lease_expires_at)
        again = self.acquire(self.creds, force=True)
        self.assertNotEqual(again.session_id, first.session_id)

    def test_refresh(self) -> None:
        """A refresh extends the lease and keeps its session and bound_at."""
        first = self.acquire(self.creds)
        self.w.clock.advance(60)
        refreshed = self.ok(self.client.refresh_mount(self.creds))
        self.assertEqual(
            (refreshed.session_id, refreshed.bound_at, refreshed.lease_expires_at),
            (first.session_id, first.bound_at, self.w.now() + timedelta(seconds=TTL)),
        )
        self.assertIsNone(refreshed.server_addr)

    def test_requests_in_one_millisecond(self) -> None:
        """Two refreshes at the same clock time are both accepted (no replayed proof)."""
        first = self.acquire(self.creds)
        for _ in range(2):
            refreshed = self.ok(self.client.refresh_mount(self.creds))
            self.assertEqual(refreshed.session_id, first.session_id)

    def test_release(self) -> None:
        """A release succeeds; the released leaf is revoked and no longer accepted."""
        self.acquire(self.creds)
        self.assertIsNone(self.ok(self.client.release_mount(self.creds)))
        revoked = self.w.result(self.w.store.active_revocations(self.w.now()))
        self.assertEqual([r.serial for r in revoked], [self.creds.serial])
        error = self.refused(self.client.acquire_mount(self.creds), Unauthorized)
        self.assertEqual(error.code, "invalid_client")

    def test_release_not_held(self) -> None:
        """Releasing a lease one does not hold is LeaseLost."""
        self.refused(self.client.release_mount(self.creds), LeaseLost)

    def test_revoked_allocation(self) -> None:
        """A revoked allocation is Revoked."""
        self.w.result(self.w.store.revoke_allocation(self.allocation.allocation_id, self.w.now()))
        error = self.refused(self.client.acquire_mount(self.creds), Revoked)
        self.assertEqual((error.status, error.code), (410, "revoked"))

    def test_other_conflict(self) -> None:
        """Another 409 (an allocation of another agent) is a plain ControlPlaneError."""
        other = self.w.provision(agent_id="agent-2")
        wrong = attrs.evolve(self.creds, allocation_id=other.allocation_id)
        error = self.refused(self.client.acquire_mount(wrong), ControlPlaneError)
        self.assertNotIsInstance(error, LeaseLive)
        self.assertEqual(
            (error.status, error.code, dict(error.body)),
            (409, "wrong_agent", {"error": "wrong_agent"}),
        )


class RenewTests(ControlClientCase):
    """MountControlClient.renew: a new leaf to which the lease moves."""

    def test_lease_follows_renewal(self) -> None:
        """After a renewal the new leaf refreshes the same session; the old one lost it."""
        creds = self.enroll()
        lease = self.acquire(creds)
        self.w.clock.advance(60)
        renewed = self.ok(self.client.renew(creds))
        self.assertNotEqual(renewed.serial, creds.serial)
        self.assertNotEqual(renewed.key_pem, creds.key_pem)
        self.assertEqual(renewed.allocation_id, creds.allocation_id)
        self.assertEqual(renewed.not_after, self.w.now() + timedelta(hours=1))
        refreshed = self.ok(self.client.refresh_mount(renewed))
        self.assertEqual(
            (refreshed.session_id, refreshed.bound_at), (lease.session_id, lease.bound_at)
        )
        self.refused(self.client.refresh_mount(creds), LeaseLost)
        self.assertIsNone(self.ok(self.client.release_mount(renewed)))

    def test_rate_limited(self) -> None:
        """A renewal over the limit is RateLimited with the server's Retry-After."""
        self.w = self.world(SVC_ENROLL_RATE_LIMIT="1/60")
        creds = self.enroll()
        self.ok(self.client.renew(creds))
        error = self.refused(self.client.renew(creds), RateLimited)
        self.assertEqual((error.status, error.code, error.retry_after), (429, "rate_limited", 60.0))


class JsonResource(Resource):
    """Answers every request with a fixed status and body."""

    isLeaf = True

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__()
        self.status = status
        self.body = body

    def render(self, request: Request) -> bytes:
        """The fixed answer."""
        request.setResponseCode(self.status)
        return self.body


class FailingHttp:
    """A treq-style client whose connections are refused."""

    def request(self, method: str, url: str, **kwargs: Any) -> Deferred[Any]:
        """Fail at once."""
        return fail(ConnectionRefusedError())


class TransportTests(SynchronousTestCase):
    """Answers that are not the routes' and connections that fail."""

    def client(self, status: int, body: bytes) -> tuple[MountControlClient, Any]:
        """A client of a server answering C{status} and C{body} to everything."""
        stub: Any = StubTreq(JsonResource(status, body))
        return MountControlClient(EnrollmentWorld(self).clock, BASE_URL, http=stub), stub

    def test_invalid_enrollment_answer(self) -> None:
        """A 200 that is not an enrollment response is InvalidResponse."""
        client, stub = self.client(200, b'{"serial": "1"}')
        d = Deferred.fromCoroutine(client.enroll("t"))
        stub.flush()
        error = self.failureResultOf(d, InvalidResponse).value
        self.assertEqual((error.status, error.code), (200, "invalid_response"))

    def test_non_json_error(self) -> None:
        """A non-JSON error answer is a ControlPlaneError named after its status."""
        client, stub = self.client(502, b"<html>bad gateway</html>")
        d = Deferred.fromCoroutine(client.enroll("t"))
        stub.flush()
        error = self.failureResultOf(d, ControlPlaneError).value
        self.assertEqual((error.status, error.code, dict(error.body)), (502, "http_502", {}))

    def test_unreachable(self) -> None:
        """A refused connection is Unreachable (status 0), a kind of Unavailable."""
        client = MountControlClient(object(), BASE_URL, http=FailingHttp())
        d = Deferred.fromCoroutine(client.enroll("t"))
        error = self.failureResultOf(d, Unreachable).value
        self.assertIsInstance(error, Unavailable)
        self.assertEqual((error.status, error.code), (0, "unreachable"))
