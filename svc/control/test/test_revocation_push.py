"""
Tests for L{svc.control.revocation_push}: the push loop on a C{Clock}, an
in-memory store and fake data-plane servers.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, cast

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from svc.control.dataplane_client import (
    AccountBudget,
    AgentGrant,
    ControlCertificateKeeper,
    ControlCredentials,
    DataPlaneClient,
    DataPlaneTarget,
    SessionFence,
)
from svc.control.revocation_push import (
    ControlPushLoop,
    NoPushes,
    QuotaKey,
    tenant_quotas,
    unsuperseded,
)
from svc.control.store.interface import ControlStore
from svc.control.store.values import Allocation, AllocationState, Placement, Tenant, User
from svc.control.test.test_dataplane_client import FakeDataPlane, credentials, fake_client
from svc.pki.issuance import issue_control_cert
from svc.testing.control_store import memory_control_store
from svc.testing.pki import shared_test_pki

START = datetime(2026, 11, 22, 19, 0, 0, tzinfo=UTC)
INTERVAL = 60
ONE = "one.dataplane.test"
TWO = "two.dataplane.test"
PUSHED = "/control/cert-revocations"
QUOTAS = "/control/quotas"
RECONCILE = 3


def pushed_serials(plane: FakeDataPlane) -> list[list[str]]:
    """The serials of each revocation push a plane received, in order."""
    return [[r["serial"] for r in body["revocations"]] for body in plane.bodies(PUSHED)]


class PushLoopCase(SynchronousTestCase):
    """A push loop over an in-memory store, with two registered fake servers."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(START.timestamp())
        self.store: ControlStore = memory_control_store()
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
        loop = ControlPushLoop(
            self.store, self.clock, client, keeper, interval=INTERVAL, reconcile_every=RECONCILE
        )
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

    def provision(self, agent: str = "a1", tenant: str = "acme", grant: int = 1) -> None:
        """Provision C{agent} of owner acme in C{tenant}."""
        self.successResultOf(
            self.store.provision(
                agent_id=agent, owner_id="acme", tenant_id=tenant, grant_bytes=grant, now=self.now()
            )
        )

    def place(self, tenant: str = "acme") -> str:
        """Place C{tenant}; the server's FQDN."""
        placement: Any = self.successResultOf(self.store.place_tenant(tenant, self.now()))
        fqdn: str = placement.server.fqdn
        return fqdn

    def provision_and_place(self, tenant: str = "acme") -> str:
        """Provision agent a1 in C{tenant} and place the tenant; the server's FQDN."""
        self.provision(tenant=tenant)
        return self.place(tenant)

    def set_budget(self, budget: int | None) -> None:
        """Set acme's account budget in the store."""
        self.successResultOf(self.store.set_account_budget("acme", budget, self.now()))

    def other(self, fqdn: str) -> str:
        """The FQDN of the other server."""
        return TWO if fqdn == ONE else ONE


class ControlPushLoopTests(PushLoopCase):
    """Revocation pushes and quota retries."""

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
        self.loop.startService()
        fqdn = self.provision_and_place()
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
        self.loop.startService()
        fqdn = self.provision_and_place()
        self.planes[fqdn].reachable = False
        self.loop.quota_changed(AgentGrant("acme", "acme", "a1", 1))
        self.loop.quota_changed(AgentGrant("acme", "acme", "a1", 2))
        self.assertEqual(self.loop.pending_quotas, (AgentGrant("acme", "acme", "a1", 2),))
        self.planes[fqdn].reachable = True
        self.clock.advance(INTERVAL)
        self.assertEqual(
            [b["grant_bytes"] for b in self.planes[fqdn].bodies("/control/quotas")], [2]
        )
        self.assertEqual(self.loop.pending_quotas, ())

    def test_session_fence_sent_and_retried(self) -> None:
        """
        A grant's session fence goes at once to the tenant's server; one not
        delivered stays queued, a newer epoch superseding it, until delivered.
        """
        self.loop.startService()
        fqdn = self.provision_and_place()
        self.loop.session_granted(SessionFence("acme", "acme", "a1", 3))
        self.assertEqual(
            self.planes[fqdn].bodies("/control/session-epochs"),
            [{"owner": "acme", "tenant": "acme", "agent_id": "a1", "epoch": 3}],
        )
        self.planes[fqdn].reachable = False
        self.loop.session_granted(SessionFence("acme", "acme", "a1", 4))
        self.loop.session_granted(SessionFence("acme", "acme", "a1", 5))
        self.assertEqual(self.loop.pending_quotas, (SessionFence("acme", "acme", "a1", 5),))
        self.planes[fqdn].reachable = True
        self.clock.advance(INTERVAL)
        self.assertEqual(
            [b["epoch"] for b in self.planes[fqdn].bodies("/control/session-epochs")], [3, 5]
        )
        self.assertEqual(self.loop.pending_quotas, ())

    def test_refused_session_fence_dropped(self) -> None:
        """
        A server refusing the session fence (an older one, without the call)
        has it dropped, not retried, and still gets its quota updates.
        """
        self.loop.startService()
        fqdn = self.provision_and_place()
        self.planes[fqdn].statuses["/control/session-epochs"] = 404
        self.loop.session_granted(SessionFence("acme", "acme", "a1", 3))
        self.loop.quota_changed(AgentGrant("acme", "acme", "a1", 9))
        self.assertEqual(self.loop.pending_quotas, ())
        self.assertEqual(len(self.planes[fqdn].bodies("/control/quotas")), 1)
        self.assertEqual(len(self.flushLoggedErrors()), 0)

    def test_quota_queued_while_stopped(self) -> None:
        """An update queued before start is delivered by the first round."""
        self.provision()
        self.loop.quota_changed(AgentGrant("acme", "acme", "a1", 7))
        fqdn = self.place()
        self.loop.startService()
        # The first round reads the placed tenant from the database too; the
        # value read replaces the queued one (the database is the truth).
        self.assertEqual(
            self.planes[fqdn].bodies("/control/quotas"), [grant_body("a1", 1), budget_body(None)]
        )
        self.assertEqual(self.loop.pending_quotas, ())


class GatedStore:
    """
    A store whose C{get_tenant} waits for the test (C{gate}) or fails
    (C{broken}), and whose C{list_placements} fails on demand
    (C{listing_broken}); every other call goes to the real one.
    """

    def __init__(self, store: ControlStore) -> None:
        self._store = store
        self.gate: Deferred[None] | None = None
        self.broken = False
        self.listing_broken = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def list_placements(self) -> Deferred[tuple[Placement, ...]]:
        if self.listing_broken:
            return fail(RuntimeError("database down"))
        return self._store.list_placements()

    def get_tenant(self, tenant_id: str) -> Deferred[Tenant]:
        if self.broken:
            return fail(RuntimeError("database down"))
        if self.gate is None:
            return self._store.get_tenant(tenant_id)
        gate, self.gate = self.gate, None
        return gate.addCallback(lambda _: self._store.get_tenant(tenant_id))


def budget_body(budget: int | None, tenant: str = "acme") -> dict[str, Any]:
    """The body of an account budget update for acme."""
    return {"owner": "acme", "tenant": tenant, "account_budget_bytes": budget}


def grant_body(agent: str, grant: int, tenant: str = "acme") -> dict[str, Any]:
    """The body of an agent grant update for acme."""
    return {"owner": "acme", "tenant": tenant, "agent_id": agent, "grant_bytes": grant}


class TenantSyncTests(PushLoopCase):
    """Whole-tenant quota reads: at placement, at registration and every reconcile round."""

    def quotas(self, fqdn: str) -> list[Any]:
        """The quota bodies server C{fqdn} received, oldest first."""
        return self.planes[fqdn].bodies(QUOTAS)

    def gated(self) -> tuple[GatedStore, ControlPushLoop]:
        """A loop over a L{GatedStore} of the test's store."""
        gated = GatedStore(self.store)
        self.store = cast(ControlStore, gated)
        return gated, self.make_loop(fake_client(self.planes, self.clock), self.keeper)

    def test_budget_set_before_placement_sent_once_placed(self) -> None:
        """A budget set while no server held the tenant is dropped, then sent when it is placed."""
        self.provision()
        self.set_budget(500)
        self.loop.startService()
        self.loop.quota_changed(AccountBudget("acme", "acme", 500))
        self.assertEqual(self.loop.pending_quotas, ())
        fqdn = self.place()
        self.loop.tenant_placed("acme")
        self.assertEqual(self.quotas(fqdn), [budget_body(500), grant_body("a1", 1)])
        self.assertEqual(self.quotas(self.other(fqdn)), [])
        self.assertTrue(self.loop.idle)

    def test_placement_sends_budget_and_every_live_grant(self) -> None:
        """The server gets the budget (none: null) and each live grant of the tenant only."""
        self.provision("a1", grant=10)
        self.provision("a2", grant=20)
        self.provision("a3", grant=30)
        self.successResultOf(self.store.revoke_agent("a3", self.now()))
        self.provision("b1", tenant="team", grant=40)
        fqdn = self.place()
        self.loop.startService()
        self.loop.tenant_placed("acme")
        self.assertEqual(
            self.quotas(fqdn), [budget_body(None), grant_body("a1", 10), grant_body("a2", 20)]
        )

    def test_placement_queued_while_stopped(self) -> None:
        """A placement reported before start is read and sent by the first round."""
        fqdn = self.provision_and_place()
        self.loop.tenant_placed("acme")
        self.assertEqual(self.quotas(fqdn), [])
        self.loop.startService()
        self.assertEqual(self.quotas(fqdn), [budget_body(None), grant_body("a1", 1)])

    def test_known_tenant_not_read_again(self) -> None:
        """A tenant already read is not read again when reported placed; reconciling does that."""
        fqdn = self.provision_and_place()
        self.loop.startService()
        self.loop.tenant_placed("acme")
        self.loop.tenant_placed("acme")
        self.assertEqual(len(self.quotas(fqdn)), 2)
        self.assertEqual(self.loop.placed_tenants, {"acme"})

    def test_tenant_read_even_when_an_update_was_delivered(self) -> None:
        """A tenant that got only a single update so far is still read whole when placed."""
        fqdn = self.provision_and_place()
        self.set_budget(5)
        self.loop.startService()
        self.loop.quota_changed(AgentGrant("acme", "acme", "a1", 1))
        self.loop.tenant_placed("acme")
        self.assertIn(budget_body(5), self.quotas(fqdn))

    def test_reconcile_resends_current_quotas(self) -> None:
        """Every reconcile_every intervals a known tenant's current quotas are sent again."""
        fqdn = self.provision_and_place()
        self.loop.startService()
        self.loop.tenant_placed("acme")
        self.set_budget(7)  # no notice: as if the update had been lost
        self.clock.advance(INTERVAL * (RECONCILE - 1))
        self.assertEqual(len(self.quotas(fqdn)), 2)
        self.clock.advance(INTERVAL)
        self.assertEqual(self.quotas(fqdn)[2:], [budget_body(7), grant_body("a1", 1)])
        self.clock.advance(INTERVAL * RECONCILE)
        self.assertEqual(len(self.quotas(fqdn)), 6)

    def test_reconcile_knows_tenants_of_delivered_updates(self) -> None:
        """A tenant that got an update through this loop is reconciled too."""
        self.loop.startService()
        fqdn = self.provision_and_place()
        self.loop.quota_changed(AgentGrant("acme", "acme", "a1", 1))
        self.clock.advance(INTERVAL * RECONCILE)
        self.assertEqual(
            self.quotas(fqdn), [grant_body("a1", 1), budget_body(None), grant_body("a1", 1)]
        )

    def test_unreachable_server_converges(self) -> None:
        """A server unreachable at placement gets the tenant's quotas once it answers."""
        fqdn = self.provision_and_place()
        self.planes[fqdn].reachable = False
        self.loop.startService()
        self.loop.tenant_placed("acme")
        self.assertEqual(len(self.loop.pending_quotas), 2)
        self.planes[fqdn].reachable = True
        self.clock.advance(INTERVAL)
        self.assertEqual(self.quotas(fqdn), [budget_body(None), grant_body("a1", 1)])
        self.assertEqual(self.loop.pending_quotas, ())

    def test_failing_server_skipped_for_the_round(self) -> None:
        """After one failed update a server gets no more that round; all arrive once it answers."""
        fqdn = self.provision_and_place()
        self.planes[fqdn].statuses[QUOTAS] = 503
        self.loop.startService()
        self.loop.tenant_placed("acme")
        self.assertEqual(len(self.quotas(fqdn)), 1)
        self.assertEqual(len(self.loop.pending_quotas), 2)
        del self.planes[fqdn].statuses[QUOTAS]
        self.clock.advance(INTERVAL)
        self.assertEqual(self.quotas(fqdn)[1:], [budget_body(None), grant_body("a1", 1)])
        self.assertEqual(self.loop.pending_quotas, ())

    def test_registration_resends_that_servers_tenants(self) -> None:
        """A server that registers again gets its known tenants' quotas; the other one nothing."""
        fqdn = self.provision_and_place()
        self.provision("b1", tenant="team", grant=4)
        other = self.place("team")
        self.assertEqual(other, self.other(fqdn))
        self.loop.startService()
        self.loop.tenant_placed("acme")
        self.loop.tenant_placed("team")
        self.loop.server_registered(fqdn)
        self.assertEqual(self.quotas(fqdn), [budget_body(None), grant_body("a1", 1)] * 2)
        self.assertEqual(
            self.quotas(other), [budget_body(None, "team"), grant_body("b1", 4, "team")]
        )

    def test_registration_of_server_without_known_tenants(self) -> None:
        """A registration of a server holding no known tenant sends nothing."""
        self.loop.startService()
        self.loop.server_registered(ONE)
        self.assertEqual(self.quotas(ONE), [])

    def test_change_during_read_wins(self) -> None:
        """A budget change queued while the tenant is read is not overwritten by the older read."""
        gated, loop = self.gated()
        loop.startService()
        fqdn = self.provision_and_place()
        self.set_budget(5)
        gate: Deferred[None] = Deferred()
        gated.gate = gate
        loop.tenant_placed("acme")
        loop.quota_changed(AccountBudget("acme", "acme", 9))  # committed after the read's snapshot
        self.assertEqual(self.quotas(fqdn), [])
        gate.callback(None)
        self.assertEqual(self.quotas(fqdn), [budget_body(9), grant_body("a1", 1)])
        self.assertTrue(loop.idle)

    def test_database_failure_retried(self) -> None:
        """A tenant whose read fails is read again next round."""
        gated, loop = self.gated()
        fqdn = self.provision_and_place()
        gated.broken = True
        loop.startService()
        loop.tenant_placed("acme")
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        self.assertFalse(loop.idle)
        gated.broken = False
        self.clock.advance(INTERVAL)
        self.assertEqual(self.quotas(fqdn), [budget_body(None), grant_body("a1", 1)])
        self.assertTrue(loop.idle)

    def test_start_sends_every_placed_tenant(self) -> None:
        """
        After a restart (no notice at all) the first round sends each placed
        tenant's whole quotas to its server, and reconciling knows them.
        """
        fqdn = self.provision_and_place()
        self.provision("b1", tenant="team", grant=4)
        other = self.place("team")
        self.provision("c1", tenant="unplaced", grant=3)
        self.set_budget(11)
        self.loop.startService()
        self.assertEqual(self.quotas(fqdn), [budget_body(11), grant_body("a1", 1)])
        self.assertEqual(self.quotas(other), [budget_body(11, "team"), grant_body("b1", 4, "team")])
        self.assertEqual(self.loop.placed_tenants, {"acme", "team"})
        self.assertTrue(self.loop.idle)

    def test_listing_placements_retried(self) -> None:
        """When the placements cannot be listed, quota work waits and the next round retries."""
        gated, loop = self.gated()
        fqdn = self.provision_and_place()
        gated.listing_broken = True
        loop.startService()
        loop.quota_changed(AgentGrant("acme", "acme", "a1", 3))
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 2)
        self.assertEqual(self.quotas(fqdn), [])
        self.assertFalse(loop.idle)
        gated.listing_broken = False
        self.clock.advance(INTERVAL)
        self.assertEqual(self.quotas(fqdn), [grant_body("a1", 1), budget_body(None)])
        self.assertTrue(loop.idle)

    def test_reconcile_every_at_least_one(self) -> None:
        """A reconcile period below one interval is refused."""
        client = fake_client(self.planes, self.clock)
        with self.assertRaises(ValueError):
            ControlPushLoop(self.store, self.clock, client, self.keeper, reconcile_every=0)

    def test_unknown_tenant_forgotten(self) -> None:
        """A tenant the database does not know is dropped and not reconciled."""
        self.loop.startService()
        self.loop.tenant_placed("ghost")
        self.assertEqual(self.loop.placed_tenants, frozenset())
        self.assertTrue(self.loop.idle)
        for plane in self.planes.values():
            self.assertEqual(plane.bodies(QUOTAS), [])


NOW = datetime(2026, 11, 22, tzinfo=UTC)


def allocation(agent: str | None, tenant: str = "acme", live: bool = True) -> Allocation:
    """An allocation of owner acme with a grant of 100."""
    state = AllocationState.PROVISIONED if live else AllocationState.REVOKED
    return Allocation(f"al-{agent}-{tenant}", agent, "acme", tenant, 100, state, NOW)


class TenantQuotasTests(SynchronousTestCase):
    """The pure rule for what a tenant's server must hold."""

    def test_budget_then_live_agent_grants(self) -> None:
        """The budget comes first, then each live agent's grant by agent id; others are left out."""
        owner = User("acme", "Acme", 500, False, NOW)
        allocations = [
            allocation("b"),
            allocation("a"),
            allocation("dead", live=False),
            allocation(None),
            allocation("elsewhere", tenant="team"),
        ]
        self.assertEqual(
            tenant_quotas(Tenant("acme", "acme", False, NOW), owner, allocations),
            (
                AccountBudget("acme", "acme", 500),
                AgentGrant("acme", "acme", "a", 100),
                AgentGrant("acme", "acme", "b", 100),
            ),
        )

    def test_no_budget_is_sent_as_none(self) -> None:
        """An owner without a budget yields a budget update of None (lifting a stale one)."""
        owner = User("acme", "Acme", None, False, NOW)
        self.assertEqual(
            tenant_quotas(Tenant("team", "acme", False, NOW), owner, []),
            (AccountBudget("acme", "team", None),),
        )

    def test_other_owner_refused(self) -> None:
        """Reading a tenant with a user that does not own it is a bug: ValueError."""
        with self.assertRaises(ValueError):
            tenant_quotas(
                Tenant("acme", "acme", False, NOW), User("bob", "Bob", None, False, NOW), []
            )


class UnsupersededTests(SynchronousTestCase):
    """The pure rule for queueing what was read without losing a newer change."""

    def test_kept_when_queue_unchanged(self) -> None:
        """Read updates are kept for keys untouched during the read, queued or not."""
        old = AccountBudget("acme", "acme", 1)
        read = (AccountBudget("acme", "acme", 2), AgentGrant("acme", "acme", "a1", 3))
        queue: dict[QuotaKey, Any] = {old.key: old}
        self.assertEqual(unsuperseded(read, queue, dict(queue)), read)

    def test_dropped_when_newer_queued(self) -> None:
        """A key given a new update during the read (replaced or new) keeps that update."""
        old = AccountBudget("acme", "acme", 1)
        newer = AccountBudget("acme", "acme", 9)
        grant = AgentGrant("acme", "acme", "a1", 4)
        read = (AccountBudget("acme", "acme", 2), AgentGrant("acme", "acme", "a1", 3))
        self.assertEqual(unsuperseded(read, {old.key: old}, {old.key: newer, grant.key: grant}), ())


class NoPushesTests(SynchronousTestCase):
    """The do-nothing notices."""

    def test_accepts_notices(self) -> None:
        """NoPushes accepts every notice and does nothing."""
        pushes = NoPushes()
        pushes.revocations_changed()
        pushes.quota_changed(AgentGrant("o", "t", "a", 1))
        pushes.tenant_placed("t")
        pushes.server_registered("dp.test")
        pushes.session_granted(SessionFence("o", "t", "a", 1))
