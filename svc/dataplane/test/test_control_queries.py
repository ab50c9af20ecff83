"""
Tests for L{svc.dataplane.control_queries}: the data plane's questions to
the real control-plane routes (L{svc.control.routes_dataplane}, SQLite in
memory, through C{StubTreq}), and to a control plane that misbehaves.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any, cast

from klein import Klein
from treq.testing import StubTreq
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.server import Request

from svc.control.routes_dataplane import DataPlaneQueryDeps, dataplane_query_routes
from svc.control.test.backends import SQLiteBackend
from svc.control.test.test_enrollment_support import SERVER_FQDN, SERVICE_TOKEN, RouteWorld
from svc.dataplane.control_queries import ControlQueries, ControlQueryFailed
from svc.pki.identity import DenyList
from svc.store.layout import TenantLocation

CONTROL_URL = "http://control.test/"
ALICE = TenantLocation("alice", "acme")


class AgainstControlPlaneTests(SQLiteBackend):
    """The calls against the real control-plane routes."""

    async def set_up(self) -> None:
        self.world = world = await RouteWorld.open(self)
        world.serve(
            world.deps, dataplane_query_routes(DataPlaneQueryDeps(world.store, world.clock.seconds))
        )
        self.stub: Any = StubTreq(world.resource)

    def queries(self, token: str = SERVICE_TOKEN, fqdn: str = SERVER_FQDN) -> ControlQueries:
        return ControlQueries(self.stub, CONTROL_URL, token, fqdn, self.world.clock)

    def answer(self, call: Deferred[Any]) -> Any:
        self.stub.flush()
        return self.successResultOf(call)

    async def test_revocations(self) -> None:
        """The active set, as a deny-list."""
        store, now = self.world.store, self.world.now()
        await store.add_revocation("1f3a", now + timedelta(hours=1), now)
        deny = self.answer(self.queries().revocations())
        self.assertEqual(deny, DenyList.of([("1f3a", now + timedelta(hours=1))]))

    async def test_placed(self) -> None:
        """An enrolled agent is placed on its server, not on another, not as another owner."""
        await self.world.enrolled()
        self.assertTrue(self.answer(self.queries().placed(ALICE, "agent-1")))
        self.assertFalse(self.answer(self.queries().placed(ALICE, "agent-2")))
        mallory = TenantLocation("mallory", "acme")
        self.assertFalse(self.answer(self.queries().placed(mallory, "agent-1")))
        other = self.queries(fqdn="other.test")
        self.assertFalse(self.answer(other.placed(ALICE, "agent-1")))

    async def test_refused(self) -> None:
        """A wrong token is a failure naming the status."""
        call = self.queries(token="x" * 40).placed(ALICE, "agent-1")
        self.stub.flush()
        failure = self.failureResultOf(call, ControlQueryFailed)
        self.assertIn("status 401", str(failure.value))


class MisbehavingControlPlane:
    """Answers as told: hang, a status, or a body."""

    app = Klein()

    def __init__(self) -> None:
        self.hang = False
        self.status = 200
        self.body: bytes = b"{}"

    @app.route("/control/<path:rest>", methods=["GET"])
    def answer(self, request: Request, rest: str) -> Any:
        if self.hang:
            return Deferred()
        request.setResponseCode(self.status)
        return self.body


class FailureTests(SynchronousTestCase):
    """Every way of not answering is L{ControlQueryFailed}."""

    def setUp(self) -> None:
        self.control = MisbehavingControlPlane()
        self.stub: Any = StubTreq(self.control.app.resource())
        self.clock = Clock()
        self.queries = ControlQueries(
            cast(Any, self.stub), CONTROL_URL, SERVICE_TOKEN, SERVER_FQDN, self.clock, timeout=5.0
        )

    def failed(self, call: Deferred[Any]) -> str:
        self.stub.flush()
        return str(self.failureResultOf(call, ControlQueryFailed).value)

    def test_timeout(self) -> None:
        """No answer within the timeout fails the call (it never hangs)."""
        self.control.hang = True
        call = self.queries.revocations()
        self.stub.flush()
        self.assertNoResult(call)
        self.clock.advance(5)
        self.assertIn("no answer", self.failed(call))

    def test_bad_answers(self) -> None:
        """Non-JSON, a non-object, a body without the fields: each a clear failure."""
        for body, expected in [
            (b"<html>", "not JSON"),
            (b"[]", "not a JSON object"),
            (b"{}", "no boolean 'placed'"),
            (json.dumps({"placed": "yes"}).encode(), "no boolean 'placed'"),
        ]:
            self.control.body = body
            self.assertIn(expected, self.failed(self.queries.placed(ALICE, "agent-1")))
        self.control.body = b'{"revocations": [{"serial": "zz"}], "generated_at": "x"}'
        self.assertIn("unusable revocation set", self.failed(self.queries.revocations()))

    def test_error_status(self) -> None:
        """A status other than 200 names it and the error body."""
        self.control.status = 503
        self.control.body = b'{"error": "temporarily_unavailable"}'
        message = self.failed(self.queries.revocations())
        self.assertIn("status 503: temporarily_unavailable", message)
