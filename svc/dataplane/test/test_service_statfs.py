"""
Tests for the C{statfs} operation of L{svc.dataplane.service}: the agent's
usage and limits as the quota checks count them, over the real storage
engine, with no audit line and its own C{op} label.
"""

from __future__ import annotations

from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane.test.test_service_support import (
    ServiceFixture,
    blob,
    identity,
)
from svc.policy import PathPolicy
from svc.store.layout import TenantLocation
from svc.testing.worker import ManualWorker

TENANT_A = TenantLocation("user-1", "tenant-a")


def answer(
    used: int,
    account_used: int,
    grant: int | None = None,
    budget: int | None = None,
    available: int | None = None,
) -> dict[str, Any]:
    """A statfs answer map (the account usage is shown only with a budget)."""
    return {
        "used_bytes": used,
        "grant_bytes": grant,
        "budget_bytes": budget,
        "account_used_bytes": account_used if budget is not None else None,
        "available_bytes": available,
    }


LIMIT_KEYS = ("used_bytes", "grant_bytes", "budget_bytes", "account_used_bytes", "available_bytes")
"""The five keys the usage and limits tests look at (the footprint's are tested below)."""


def limits(reply: dict[str, Any]) -> dict[str, Any]:
    """The usage and limit keys of a statfs answer."""
    return {key: reply[key] for key in LIMIT_KEYS}


class StatfsOpsTests(SynchronousTestCase):
    """
    statfs with a grant, a budget, both and neither.
    """

    def setUp(self) -> None:
        self.fixture = ServiceFixture(self)
        self.agent = self.fixture.agent()
        self.addCleanup(self.fixture.close)

    def grant(self, agent_id: str, grant_bytes: int | None) -> None:
        """Set C{agent_id}'s grant in tenant-a."""
        engine = self.fixture.service.engine
        self.successResultOf(engine.set_agent_grant(TENANT_A, agent_id, grant_bytes))

    def budget(self, budget_bytes: int | None) -> None:
        """Set user-1's account budget."""
        self.successResultOf(self.fixture.service.engine.set_account_budget("user-1", budget_bytes))

    def test_footprint_keys(self) -> None:
        """The answer also carries the agent's footprint: uploads, retained, collectable, bounds."""
        self.grant("agent-1", 10_000)
        self.agent.put_file("f", blob("f", 1000)[1])
        reply = self.agent.ok("statfs")
        self.assertEqual(
            {key: reply[key] for key in set(reply) - set(LIMIT_KEYS)},
            {
                "uncommitted_bytes": 0,
                "retained_bytes": 0,
                "collectable_bytes": 0,
                "retained_cap_bytes": 10_000,
                "footprint_bound_bytes": 40_000,
            },
        )

    def test_neither_limit(self) -> None:
        """Without grant or budget the answer has the usage and nil limits and room."""
        self.assertEqual(limits(self.agent.ok("statfs")), answer(0, 0))
        self.agent.put_file("f", blob("f", 1000)[1])
        self.assertEqual(limits(self.agent.ok("statfs")), answer(1000, 1000))

    def test_grant(self) -> None:
        """With a grant the room is the grant less the agent's usage."""
        self.grant("agent-1", 10_000)
        self.agent.put_file("f", blob("f", 1000)[1])
        self.assertEqual(
            limits(self.agent.ok("statfs")), answer(1000, 1000, grant=10_000, available=9000)
        )

    def test_budget(self) -> None:
        """With a budget the room is the budget less the whole account's usage."""
        self.budget(5000)
        self.agent.put_file("f", blob("f", 1000)[1])
        self.assertEqual(
            limits(self.agent.ok("statfs")), answer(1000, 1000, budget=5000, available=4000)
        )

    def test_both_grant_tighter(self) -> None:
        """With both limits the grant decides when it leaves less room."""
        self.grant("agent-1", 3000)
        self.budget(10_000)
        self.agent.put_file("f", blob("f", 1000)[1])
        self.assertEqual(
            limits(self.agent.ok("statfs")),
            answer(1000, 1000, grant=3000, budget=10_000, available=2000),
        )

    def test_budget_tighter_than_grant(self) -> None:
        """Another agent's bytes use the shared budget: it then leaves less room than the grant."""
        self.grant("agent-1", 10_000)
        self.budget(4000)
        self.agent.put_file("f", blob("f", 1000)[1])
        other = self.fixture.agent(identity(agent="agent-2", serial="b2"))
        other.put_file("g", blob("g", 2000)[1])
        self.assertEqual(
            limits(self.agent.ok("statfs")),
            answer(1000, 3000, grant=10_000, budget=4000, available=1000),
        )

    def test_over_a_lowered_grant(self) -> None:
        """Usage over a grant lowered after the writes leaves 0 room, not a negative one."""
        self.agent.put_file("f", blob("f", 1000)[1])
        self.grant("agent-1", 600)
        self.assertEqual(
            limits(self.agent.ok("statfs")), answer(1000, 1000, grant=600, available=0)
        )

    def test_uploads_count_against_the_account_only(self) -> None:
        """An uploaded chunk no file names yet is account usage, not the agent's."""
        chunk_hash, data = blob("loose", 700)
        self.agent.ok("chunk_put", data, hash=chunk_hash)
        self.assertEqual(limits(self.agent.ok("statfs")), answer(0, 700))

    def test_changes_seen_at_once(self) -> None:
        """A new grant and a deleted file show in the next answer (no server-side cache)."""
        self.agent.put_file("f", blob("f", 1000)[1])
        self.grant("agent-1", 5000)
        self.assertEqual(limits(self.agent.ok("statfs"))["available_bytes"], 4000)
        self.agent.ok("manifest_delete", path="/agent-1/f")
        self.assertEqual(limits(self.agent.ok("statfs"))["used_bytes"], 0)
        self.grant("agent-1", None)
        self.assertIsNone(self.agent.ok("statfs")["available_bytes"])

    def test_not_audited_but_timed(self) -> None:
        """statfs writes no audit line and is timed under op="statfs"."""
        self.agent.ok("ping")
        lines = len(self.fixture.audit)
        self.agent.ok("statfs")
        self.agent.ok("statfs")
        self.assertEqual(len(self.fixture.audit), lines)
        self.assertEqual(
            self.fixture.sample("svc_dataplane_op_duration_seconds_count", op="statfs"), 2.0
        )

    def test_under_a_restrictive_policy(self) -> None:
        """A read-only policy that allows no path still answers statfs: it names no path."""
        self.fixture.policies[("tenant-a", "agent-1")] = PathPolicy(allow=(), readonly=True)
        self.assertEqual(limits(self.agent.ok("statfs")), answer(0, 0))


class StatfsOrderingTests(SynchronousTestCase):
    """
    statfs sees the effects of the connection's earlier requests.
    """

    def test_counts_a_pipelined_write(self) -> None:
        """A statfs sent right after a chunk and its manifest answers with the file counted."""
        worker = ManualWorker()
        fixture = ServiceFixture(self, io_worker=worker)
        agent = fixture.agent()
        _, data = blob("pipelined", 1500)
        agent.pipeline_file("f", data)
        usage = agent.request("statfs")
        self.assertNoResult(usage)
        worker.run()
        self.assertEqual(limits(dict(self.successResultOf(usage).payload)), answer(1500, 1500))
        self.successResultOf(fixture.service.engine.close())
        worker.run()
