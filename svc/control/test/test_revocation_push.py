"""
Tests for L{svc.control.revocation_push}: the push loop on a C{Clock}, an
in-memory store and fake data-plane servers.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from svc.control.dataplane_client import (
    AccountBudget,
    AgentGrant,
    ControlCertificateKeeper,
    ControlCredentials,
    DataPlaneClient,
    DataPlaneTarget,
)
from svc.control.revocation_push import ControlPushLoop, NoPushes
from svc.control.test.test_dataplane_client import FakeDataPlane, credentials, fake_client
from svc.pki.issuance import issue_control_cert
from svc.testing.control_store import memory_control_store
from svc.testing.pki import shared_test_pki

START = datetime(2026, 11, 22, 19, 0, 0, tzinfo=UTC)
INTERVAL = 60
ONE = "one.dataplane.test"
TWO = "two.dataplane.test"
PUSHED = "/control/cert-revocations"


def pushed_serials(plane: FakeDataPlane) -> list[list[str]]:
    """The serials of each revocation push a plane received, in order."""
    return [[r["serial"] for r in body["revocations"]] for body in plane.bodies(PUSHED)]


class ControlPushLoopTests(SynchronousTestCase):
    """Revocation pushes and quota retries."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(START.timestamp())
        self.store = memory_control_store()
        self.planes = {ONE: FakeDataPlane(ONE), TWO: FakeDataPlane(TWO)}
        for index, fqdn in enumerate(self.planes):
            self.successResultOf(
                self.store.register_server(fqdn, f"10.0.0.{index}:7443", 10, self.now())
            )
        self.keeper = ControlCertificateKeeper(lambda at: succeed(credentials()), self.now)
        self.loop = self.make_loop(fake_client(self.planes, self.clock), self.keeper)

    def make_loop(
        self, client: DataPlaneClient, keeper: ControlCertificateKeeper | None
    ) -> ControlPushLoop:
        loop = ControlPushLoop(self.store, self.clock, client, keeper, interval=INTERVAL)
        self.addCleanup(self.stop, loop)
        return loop

    def stop(self, loop: ControlPushLoop) -> None:
        if loop.running:
            self.successResultOf(loop.stopService())
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.clock.seconds(), UTC)

    def revoke(self, serial: str, lifetime: timedelta = timedelta(hours=1)) -> None:
        self.successResultOf(self.store.add_revocation(serial, self.now() + lifetime, self.now()))

    def provision_and_place(self, tenant: str = "acme") -> str:
        """Provision agent a1 in C{tenant} and place the tenant; the server's FQDN."""
        self.successResultOf(
            self.store.provision(
                agent_id="a1", owner_id="acme", tenant_id=tenant, grant_bytes=1, now=self.now()
            )
        )
        placement: Any = self.successResultOf(self.store.place_tenant(tenant, self.now()))
        fqdn: str = placement.server.fqdn
        return fqdn

    def test_first_round_at_start(self) -> None:
        """Starting the loop pushes the active set to every registered server at once."""
        self.revoke("aa")
        self.loop.startService()
        for plane in self.planes.values():
            self.assertEqual(pushed_serials(plane), [["aa"]])

    def test_pushes_every_interval(self) -> None:
        """A revocation added quietly reaches every server within one interval, not before."""
        self.loop.startService()
        self.revoke("bb")
        self.clock.advance(INTERVAL - 1)
        self.assertEqual(pushed_serials(self.planes[ONE]), [[]])
        self.clock.advance(1)
        for plane in self.planes.values():
            self.assertEqual(pushed_serials(plane), [[], ["bb"]])

    def test_revocations_changed_pushes_now(self) -> None:
        """revocations_changed pushes immediately, without waiting for the interval."""
        self.loop.startService()
        self.revoke("cc")
        self.loop.revocations_changed()
        self.assertEqual(pushed_serials(self.planes[TWO]), [[], ["cc"]])

    def test_ignored_while_stopped(self) -> None:
        """A stopped loop pushes nothing when told about a change."""
        self.revoke("cc")
        self.loop.revocations_changed()
        self.assertEqual(self.planes[ONE].requests, [])

    def test_expired_revocations_pruned(self) -> None:
        """Revocations of expired certificates are deleted and not pushed."""
        self.revoke("01d", timedelta(seconds=30))
        self.revoke("ae", timedelta(hours=1))
        self.loop.startService()
        self.clock.advance(INTERVAL)
        self.assertEqual(pushed_serials(self.planes[ONE]), [["01d", "ae"], ["ae"]])
        remaining = self.successResultOf(self.store.active_revocations(START))
        self.assertEqual([r.serial for r in remaining], ["ae"])

    def test_failing_server_retried(self) -> None:
        """A server that cannot be reached does not stop the others and gets the set next round."""
        self.planes[ONE].reachable = False
        self.revoke("dd")
        self.loop.startService()
        self.assertEqual(pushed_serials(self.planes[TWO]), [["dd"]])
        self.assertEqual(len(self.flushLoggedErrors()), 0)
        self.planes[ONE].reachable = True
        self.clock.advance(INTERVAL)
        self.assertEqual(pushed_serials(self.planes[ONE]), [["dd"]])

    def test_error_status_retried(self) -> None:
        """A server answering an error gets the set again next round."""
        self.planes[ONE].statuses[PUSHED] = 503
        self.loop.startService()
        del self.planes[ONE].statuses[PUSHED]
        self.clock.advance(INTERVAL)
        self.assertEqual(len(self.planes[ONE].bodies(PUSHED)), 2)

    def test_without_ca_only_prunes(self) -> None:
        """Without control credentials nothing is sent, but expired rows are pruned."""
        loop = self.make_loop(fake_client(self.planes, self.clock), None)
        self.revoke("01d", timedelta(seconds=1))
        loop.startService()
        self.clock.advance(INTERVAL)
        self.assertEqual(self.planes[ONE].requests, [])
        self.assertEqual(self.successResultOf(self.store.prune_revocations(self.now())), 0)

    def test_certificate_issued_and_renewed(self) -> None:
        """The first round issues the control certificate; a round after two thirds renews it."""
        pki = shared_test_pki()
        issued: list[datetime] = []

        def issue(at: datetime) -> Deferred[ControlCredentials]:
            issued.append(at)
            pair = issue_control_cert(pki.root, pki.trust_domain, at)
            return succeed(ControlCredentials(pair.cert, pair.key, pki.root.cert))

        keeper = ControlCertificateKeeper(issue, self.now)
        loop = self.make_loop(fake_client(self.planes, self.clock), keeper)
        loop.startService()
        self.assertEqual(issued, [START])
        first = keeper.current()
        assert first is not None
        self.clock.advance((first.renew_at - self.now()).total_seconds() + INTERVAL)
        self.assertEqual(len(issued), 2)

    def test_renewal_failure_logged(self) -> None:
        """A failed renewal is logged and the round still runs."""

        def broken(at: datetime) -> Deferred[ControlCredentials]:
            raise RuntimeError("CA unavailable")

        loop = self.make_loop(
            fake_client(self.planes, self.clock), ControlCertificateKeeper(broken, self.now)
        )
        loop.startService()
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        self.assertEqual(len(self.planes[ONE].bodies(PUSHED)), 1)

    def test_rounds_do_not_overlap(self) -> None:
        """A change during a round runs one more round after it, never two at once."""
        gates: list[Deferred[Any]] = []

        class Gate:
            def request(self, method: str, url: str, **kwargs: Any) -> Deferred[Any]:
                d: Deferred[Any] = Deferred()
                gates.append(d)
                return d

        def gated(target: DataPlaneTarget, creds: ControlCredentials) -> Any:
            return Gate()

        client = DataPlaneClient(credentials, gated, self.clock)
        loop = self.make_loop(client, self.keeper)
        loop.startService()
        self.assertEqual(len(gates), 2)
        loop.revocations_changed()
        loop.revocations_changed()
        self.assertEqual(len(gates), 2)
        for gate in gates[:2]:
            gate.errback(ConnectionRefusedError())
        self.assertEqual(len(gates), 4)
        for gate in gates[2:]:
            gate.errback(ConnectionRefusedError())
        self.assertEqual(len(gates), 4)

    def test_stop_waits_for_round(self) -> None:
        """stopService fires only once the round in progress has finished."""
        hanging: Deferred[Any] = Deferred()

        class Hanging:
            def request(self, method: str, url: str, **kwargs: Any) -> Deferred[Any]:
                return hanging

        client = DataPlaneClient(credentials, lambda t, c: Hanging(), self.clock)
        loop = ControlPushLoop(self.store, self.clock, client, self.keeper, interval=INTERVAL)
        loop.startService()
        stopped = loop.stopService()
        self.assertNoResult(stopped)
        hanging.errback(ConnectionRefusedError())
        self.successResultOf(stopped)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_quota_sent_to_tenant_server(self) -> None:
        """A grant change goes at once to the server the tenant is placed on."""
        fqdn = self.provision_and_place()
        self.loop.startService()
        self.loop.quota_changed(AgentGrant("acme", "acme", "a1", 99))
        self.assertEqual(
            self.planes[fqdn].bodies("/control/quotas"),
            [{"owner": "acme", "tenant": "acme", "agent_id": "a1", "grant_bytes": 99}],
        )
        self.assertEqual(self.loop.pending_quotas, ())

    def test_quota_for_unplaced_tenant_dropped(self) -> None:
        """A change for a tenant no server holds is dropped: nothing to update."""
        self.loop.startService()
        self.loop.quota_changed(AccountBudget("acme", "nowhere", 5))
        self.assertEqual(self.loop.pending_quotas, ())
        for plane in self.planes.values():
            self.assertEqual(plane.bodies("/control/quotas"), [])

    def test_quota_retried_newest_wins(self) -> None:
        """An undelivered update stays queued, superseded by a newer one, until delivered."""
        fqdn = self.provision_and_place()
        self.planes[fqdn].reachable = False
        self.loop.startService()
        self.loop.quota_changed(AgentGrant("acme", "acme", "a1", 1))
        self.loop.quota_changed(AgentGrant("acme", "acme", "a1", 2))
        self.assertEqual(self.loop.pending_quotas, (AgentGrant("acme", "acme", "a1", 2),))
        self.planes[fqdn].reachable = True
        self.clock.advance(INTERVAL)
        self.assertEqual(
            [b["grant_bytes"] for b in self.planes[fqdn].bodies("/control/quotas")], [2]
        )
        self.assertEqual(self.loop.pending_quotas, ())

    def test_quota_queued_while_stopped(self) -> None:
        """An update queued before start is delivered by the first round."""
        fqdn = self.provision_and_place()
        self.loop.quota_changed(AgentGrant("acme", "acme", "a1", 7))
        self.assertEqual(self.planes[fqdn].requests, [])
        self.loop.startService()
        self.assertEqual(len(self.planes[fqdn].bodies("/control/quotas")), 1)


class NoPushesTests(SynchronousTestCase):
    """The do-nothing notices."""

    def test_accepts_notices(self) -> None:
        """NoPushes accepts both notices and does nothing."""
        pushes = NoPushes()
        pushes.revocations_changed()
        pushes.quota_changed(AgentGrant("o", "t", "a", 1))
