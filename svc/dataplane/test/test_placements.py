"""
Tests for L{svc.dataplane.placements} (the placement file, the record, the
check with its remembered misses) and for the data-plane service refusing
an identity that is not placed on it.
"""

from __future__ import annotations

import json
from pathlib import Path

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane.errors import NotPlaced, PlacementUnconfirmed
from svc.dataplane.http import DataPlaneHttp
from svc.dataplane.placements import (
    PLACED_FILE,
    PlacementFileError,
    PlacementRecord,
    Placements,
    Verdict,
    parse_placed,
    render_placed,
)
from svc.dataplane.service import DENIED_GOAWAY_REASON
from svc.dataplane.test.test_http_support import HttpFixture
from svc.dataplane.test.test_service_support import ServiceFixture, admitted
from svc.store.layout import TenantLocation
from svc.testing.worker import ImmediateWorker
from svc.wire.errno import WireErrno

ACME = TenantLocation("alice", "acme")
"""Tenant acme of owner alice (its files under C{alice/acme/})."""
MALLORY_ACME = TenantLocation("mallory", "acme")
"""The same tenant id under another owner: a different identity."""


class PlacementFileTests(SynchronousTestCase):
    """
    The C{placed.json} document.
    """

    def test_round_trip(self) -> None:
        """Agents are written sorted and once each, versioned, and parse back."""
        raw = render_placed(["b", "a", "b"])
        self.assertEqual(raw, b'{"version":1,"agents":["a","b"]}\n')
        self.assertEqual(parse_placed(raw, "f"), frozenset({"a", "b"}))

    def test_malformed(self) -> None:
        """Anything but the documented format is refused, naming the file."""
        for raw in (
            b"{",
            b"[]",
            b'{"version":2,"agents":[]}',
            b'{"version":1}',
            b'{"version":1,"agents":{}}',
            b'{"version":1,"agents":[".."]}',
            b'{"version":1,"agents":[1]}',
        ):
            error = self.assertRaises(PlacementFileError, parse_placed, raw, "placed.json")
            self.assertIn("placed.json", str(error))


class PlacementRecordTests(SynchronousTestCase):
    """
    L{PlacementRecord}: one file per tenant location, cached once seen.
    """

    def setUp(self) -> None:
        self.root = Path(self.mktemp())
        self.record = PlacementRecord(self.root, ImmediateWorker())

    def contains(self, location: TenantLocation, agent_id: str) -> bool:
        return bool(
            self.successResultOf(Deferred.fromCoroutine(self.record.contains(location, agent_id)))
        )

    def test_add_persists_per_location(self) -> None:
        """An added agent is in its tenant's file, not in another owner's."""
        self.successResultOf(Deferred.fromCoroutine(self.record.add(ACME, "agent-1")))
        self.assertTrue(self.contains(ACME, "agent-1"))
        self.assertFalse(self.contains(ACME, "agent-2"))
        self.assertFalse(self.contains(MALLORY_ACME, "agent-1"))
        path = self.root / "alice" / "acme" / PLACED_FILE
        self.assertEqual(json.loads(path.read_bytes()), {"version": 1, "agents": ["agent-1"]})
        self.assertEqual(path.stat().st_mode & 0o777, 0o600)
        fresh = PlacementRecord(self.root, ImmediateWorker())
        self.assertTrue(
            self.successResultOf(Deferred.fromCoroutine(fresh.contains(ACME, "agent-1")))
        )

    def test_lookup_creates_nothing(self) -> None:
        """Looking up an identity of an unknown owner creates no directory."""
        self.assertFalse(self.contains(MALLORY_ACME, "agent-1"))
        self.assertFalse((self.root / "mallory").exists())

    def test_remove(self) -> None:
        """A removed agent is not placed; removing from a tenant without a file writes none."""
        self.successResultOf(Deferred.fromCoroutine(self.record.add(ACME, "agent-1")))
        self.successResultOf(Deferred.fromCoroutine(self.record.remove(ACME, "agent-1")))
        self.assertFalse(self.contains(ACME, "agent-1"))
        self.successResultOf(Deferred.fromCoroutine(self.record.remove(MALLORY_ACME, "agent-1")))
        self.assertFalse((self.root / "mallory").exists())

    def test_unreadable_file(self) -> None:
        """A corrupt file fails the look-up rather than answering either way."""
        path = self.root / "alice" / "acme" / PLACED_FILE
        path.parent.mkdir(parents=True)
        path.write_text("{")
        failure = self.failureResultOf(
            Deferred.fromCoroutine(self.record.contains(ACME, "agent-1"))
        )
        failure.trap(PlacementFileError)


class ControlPlaneAnswers:
    """A scripted control plane: the next answers, and the questions asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[TenantLocation, str]] = []
        self.answers: list[Deferred[bool]] = []

    def __call__(self, location: TenantLocation, agent_id: str) -> Deferred[bool]:
        self.asked.append((location, agent_id))
        return self.answers.pop(0)


class PlacementsTests(SynchronousTestCase):
    """
    L{Placements.check}: the record first, then a remembered miss, then the
    control plane.
    """

    def setUp(self) -> None:
        self.root = Path(self.mktemp())
        self.clock = Clock()
        self.control = ControlPlaneAnswers()
        self.placements = Placements(
            PlacementRecord(self.root, ImmediateWorker()), self.clock, self.control, miss_ttl=10.0
        )

    def check(self, location: TenantLocation = ACME, agent_id: str = "agent-1") -> Verdict:
        verdict: Verdict = self.successResultOf(
            Deferred.fromCoroutine(self.placements.check(location, agent_id))
        )
        return verdict

    def test_placed_by_push(self) -> None:
        """An identity a push placed is served without asking the control plane."""
        self.successResultOf(Deferred.fromCoroutine(self.placements.place(ACME, "agent-1")))
        self.assertEqual(self.check(), Verdict.PLACED)
        self.assertEqual(self.control.asked, [])

    def test_yes_is_recorded(self) -> None:
        """A control plane's yes is recorded on disk: the next check asks nothing."""
        self.control.answers.append(succeed(True))
        self.assertEqual(self.check(), Verdict.PLACED)
        self.assertEqual(self.check(), Verdict.PLACED)
        self.assertEqual(self.control.asked, [(ACME, "agent-1")])
        self.assertTrue((self.root / "alice" / "acme" / PLACED_FILE).exists())

    def test_no_is_remembered_briefly(self) -> None:
        """A no is remembered for the miss TTL, then asked again; a push ends it at once."""
        self.control.answers += [succeed(False), succeed(False)]
        self.assertEqual(self.check(MALLORY_ACME), Verdict.NOT_PLACED)
        self.clock.advance(9.5)
        self.assertEqual(self.check(MALLORY_ACME), Verdict.NOT_PLACED)
        self.assertEqual(len(self.control.asked), 1)
        self.clock.advance(0.5)
        self.assertEqual(self.check(MALLORY_ACME), Verdict.NOT_PLACED)
        self.assertEqual(len(self.control.asked), 2)
        self.successResultOf(Deferred.fromCoroutine(self.placements.place(MALLORY_ACME, "agent-1")))
        self.assertEqual(self.check(MALLORY_ACME), Verdict.PLACED)
        self.assertFalse((self.root / "alice").exists())

    def test_no_answer_is_unconfirmed(self) -> None:
        """A control plane that cannot answer gives UNCONFIRMED, remembered like a no."""
        self.control.answers += [fail(TimeoutError("no answer")), succeed(True)]
        self.assertEqual(self.check(), Verdict.UNCONFIRMED)
        self.assertEqual(self.check(), Verdict.UNCONFIRMED)
        self.clock.advance(10)
        self.assertEqual(self.check(), Verdict.PLACED)

    def test_concurrent_checks_share_one_question(self) -> None:
        """Checks of one identity while a question is open wait for its answer."""
        answer: Deferred[bool] = Deferred()
        self.control.answers.append(answer)
        first = Deferred.fromCoroutine(self.placements.check(ACME, "agent-1"))
        second = Deferred.fromCoroutine(self.placements.check(ACME, "agent-1"))
        self.assertNoResult(first)
        self.assertNoResult(second)
        answer.callback(True)
        self.assertEqual(self.successResultOf(first), Verdict.PLACED)
        self.assertEqual(self.successResultOf(second), Verdict.PLACED)
        self.assertEqual(len(self.control.asked), 1)

    def test_without_control_plane(self) -> None:
        """With static certificates only the record counts."""
        placements = Placements(PlacementRecord(self.root, ImmediateWorker()), self.clock)
        checking = Deferred.fromCoroutine(placements.check(ACME, "agent-1"))
        self.assertEqual(self.successResultOf(checking), Verdict.NOT_PLACED)

    def test_misses_are_bounded(self) -> None:
        """At most max_misses are remembered; the oldest is forgotten first."""
        placements = Placements(
            PlacementRecord(self.root, ImmediateWorker()), self.clock, self.control, max_misses=2
        )
        self.control.answers += [succeed(False) for _ in range(4)]
        for agent in ("a1", "a2", "a3", "a1"):
            self.successResultOf(Deferred.fromCoroutine(placements.check(ACME, agent)))
        self.assertEqual([a for _, a in self.control.asked], ["a1", "a2", "a3", "a1"])


class ServiceRefusalTests(SynchronousTestCase):
    """
    The data-plane service serves only placed identities: a leaf of tenant
    acme naming another owner is refused when it first opens its storage.
    """

    def setUp(self) -> None:
        self.root = Path(self.mktemp())
        self.control = ControlPlaneAnswers()
        self.fixture = ServiceFixture(self, self.root, placements=self.placements_for())
        self.addCleanup(self.fixture.close)

    def placements_for(self) -> Placements:
        # The fixture's clock does not exist yet: misses are timed on a clock of their own.
        return Placements(PlacementRecord(self.root, ImmediateWorker()), Clock(), self.control)

    def test_placed_identity_served(self) -> None:
        """The placed identity works and is asked about once."""
        self.control.answers.append(succeed(True))
        alice = self.fixture.agent(admitted(tenant="acme", user="alice"))
        alice.put_file("f", b"x")
        self.assertEqual(alice.ok("manifest_get", path="/agent-1/f")["size"], 1)
        self.assertEqual(self.control.asked, [(ACME, "agent-1")])

    def test_unplaced_owner_refused(self) -> None:
        """
        Every request of an unplaced identity fails EACCES (reason
        not_placed); its connections get GOAWAY; nothing is created under
        the owner it names; the failed request is audited.
        """
        self.control.answers.append(succeed(False))
        mallory = self.fixture.agent(admitted(tenant="acme", user="mallory", serial="b1"))
        other = self.fixture.agent(admitted(tenant="acme", user="mallory", serial="b2"))
        error = mallory.error("list", path="/agent-1")
        self.assertIsInstance(error, NotPlaced)
        self.assertEqual((error.errno, error.details), (WireErrno.EACCES, {"reason": "not_placed"}))
        line = self.fixture.last()
        self.assertEqual((line.event, line.allowed), ("list_entries", False))
        self.assertEqual(mallory.sink.disconnects, [DENIED_GOAWAY_REASON])
        self.assertEqual(other.sink.disconnects, [DENIED_GOAWAY_REASON])
        self.assertEqual(other.errno("head_file", path="/agent-1"), WireErrno.EACCES)
        self.assertFalse((self.root / "mallory").exists())
        self.assertEqual(len(self.control.asked), 1)

    def test_other_owner_not_closed(self) -> None:
        """Refusing one owner's identity leaves the placed owner's connection of the agent open."""
        self.control.answers += [succeed(True), succeed(False)]
        alice = self.fixture.agent(admitted(tenant="acme", user="alice"))
        alice.put_file("f", b"x")
        mallory = self.fixture.agent(admitted(tenant="acme", user="mallory", serial="b1"))
        self.assertEqual(mallory.errno("list", path="/agent-1"), WireErrno.EACCES)
        self.assertEqual(alice.sink.disconnects, [])

    def test_unconfirmed_is_eagain(self) -> None:
        """No answer from the control plane is EAGAIN and the connection stays open."""
        self.control.answers.append(fail(TimeoutError("no answer")))
        alice = self.fixture.agent(admitted(tenant="acme", user="alice"))
        error = alice.error("list", path="/agent-1")
        self.assertIsInstance(error, PlacementUnconfirmed)
        self.assertEqual(error.errno, WireErrno.EAGAIN)
        self.assertEqual(alice.sink.disconnects, [])


class PushedPlacementTests(SynchronousTestCase):
    """
    The control plane's pushes keep the record: an agent grant (any value)
    places its agent, a purge removes it.
    """

    def setUp(self) -> None:
        f = self.f = HttpFixture(self)
        self.placements = Placements(
            PlacementRecord(f.store.engine.roots.metadata_root, ImmediateWorker()), f.clock
        )
        f.http = DataPlaneHttp(
            engine=f.store.engine,
            registry=f.registry,
            audit_log=f.audit_log,
            emit=f.emitted.append,
            current_deny_list=lambda: f.deny_list,
            merge_deny_list=f.revocations.merge,
            org_root=f.pki.root.cert,
            trust_domain=f.pki.trust_domain,
            now=f.clock.seconds,
            io=ImmediateWorker(),
            verified_chain=lambda _request: f.chain,
            clock=f.clock,
            placements=self.placements,
        )
        f.resource = f.http.resource()
        f.as_control()

    def placed(self, location: TenantLocation, agent_id: str) -> Verdict:
        verdict: Verdict = self.successResultOf(
            Deferred.fromCoroutine(self.placements.check(location, agent_id))
        )
        return verdict

    def test_grant_places(self) -> None:
        """A grant push, also one lifting the grant (null), places the agent of that owner."""
        for agent_id, grant in (("agent-1", 1024), ("agent-2", None)):
            body = {"owner": "alice", "tenant": "acme", "agent_id": agent_id, "grant_bytes": grant}
            self.assertEqual(self.f.call("PUT", "/control/quotas", body=body).status, 204)
            self.assertEqual(self.placed(ACME, agent_id), Verdict.PLACED)
        self.assertEqual(self.placed(MALLORY_ACME, "agent-1"), Verdict.NOT_PLACED)

    def test_budget_places_nobody(self) -> None:
        """An account budget names no agent and places none."""
        body = {"owner": "alice", "tenant": "acme", "account_budget_bytes": 10}
        self.assertEqual(self.f.call("PUT", "/control/quotas", body=body).status, 204)
        self.assertEqual(self.placed(ACME, "agent-1"), Verdict.NOT_PLACED)

    def test_purge_removes(self) -> None:
        """Purging an agent's data removes its placement."""
        body = {"owner": "alice", "tenant": "acme", "agent_id": "agent-1", "grant_bytes": 5}
        self.f.call("PUT", "/control/quotas", body=body)
        purge = {"owner": "alice", "tenant": "acme", "agent_id": "agent-1"}
        self.assertEqual(self.f.call("POST", "/control/purge-agent", body=purge).status, 200)
        self.assertEqual(self.placed(ACME, "agent-1"), Verdict.NOT_PLACED)
