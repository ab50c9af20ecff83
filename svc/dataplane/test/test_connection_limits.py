"""
The server's connection limits: admitted connections, admitted connections
of one agent, and connections not yet admitted (server-wide, per source
address, handshake timeout), over real in-memory TLS 1.3.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry
from twisted.logger import capturedLogs
from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane.factory import ServerLimits
from svc.dataplane.rate_limited_log import DEFAULT_BURST, DEFAULT_INTERVAL
from svc.dataplane.test.fakes import TLSHarness
from svc.dataplane_client.client import DataPlaneClientProtocol
from svc.metrics import DataPlaneMetrics


def admitted(protocol: DataPlaneClientProtocol) -> bool:
    """Whether the server sent HELLO on this connection."""
    return protocol.hello is not None


class AgentLimitTests(SynchronousTestCase):
    """
    At most C{max_connections_per_agent} admitted connections per agent.
    """

    def setUp(self) -> None:
        self.harness = TLSHarness(ServerLimits(max_connections_per_agent=2))

    def connect(self, agent: str = "agent-1", tenant: str = "tenant-a") -> DataPlaneClientProtocol:
        protocol, _pump = self.harness.connect_client(self.harness.agent(tenant, agent))
        return protocol

    def test_one_more_is_dropped_before_hello(self) -> None:
        """The agent's third connection is dropped after its handshake, before HELLO."""
        first, second, third = self.connect(), self.connect(), self.connect()
        self.assertEqual([admitted(p) for p in (first, second, third)], [True, True, False])
        self.assertEqual(len(self.harness.service.handlers), 2, "the service never saw it")
        self.assertEqual(self.harness.factory.refused_for_limits, 1)

    def test_other_agents_unaffected(self) -> None:
        """Another agent, or the same agent id in another tenant, has its own count."""
        self.connect(), self.connect()
        self.assertTrue(admitted(self.connect("agent-2")))
        self.assertTrue(admitted(self.connect("agent-1", "tenant-b")))

    def test_room_again_after_a_close(self) -> None:
        """Once one of the agent's connections closed, a new one is admitted."""
        first, pump = self.harness.connect_client(self.harness.agent("tenant-a", "agent-1"))
        self.connect()
        transport: Any = first.transport
        transport.loseConnection()
        pump.flush()
        self.assertTrue(admitted(self.connect()))


class ServerLimitTests(SynchronousTestCase):
    """
    At most C{max_connections} admitted connections.
    """

    def test_one_more_is_dropped_before_hello(self) -> None:
        """A connection over the server's limit is dropped after its handshake, before HELLO."""
        harness = TLSHarness(ServerLimits(max_connections=2))
        results = [harness.connect_client(harness.agent("tenant-a", f"a{n}"))[0] for n in range(3)]
        self.assertEqual([admitted(p) for p in results], [True, True, False])
        self.assertEqual(harness.factory.active_connections, 2)
        self.assertEqual(harness.factory.refused_for_limits, 1)


class PendingLimitTests(SynchronousTestCase):
    """
    Connections not yet admitted have their own budget, server-wide and per
    source address, and a handshake timeout; they do not count against
    C{max_connections}.
    """

    def harness(self, **limits: Any) -> TLSHarness:
        self.registry = CollectorRegistry()
        return TLSHarness(ServerLimits(**limits), metrics=DataPlaneMetrics(self.registry))

    def refused(self, reason: str) -> float | None:
        return self.registry.get_sample_value(
            "svc_dataplane_connections_refused_total", {"reason": reason}
        )

    def test_per_address_cap(self) -> None:
        """One address holds at most its share of handshakes; another address still connects."""
        harness = self.harness(max_pending_per_address=2)
        bare = [harness.connect_bare("10.0.0.9")[0] for _ in range(3)]
        self.assertEqual([p.state.value for p in bare], ["handshaking", "handshaking", "closed"])
        self.assertEqual(harness.factory.pending_connections, 2)
        protocol, _ = harness.connect_client(harness.agent(), host="10.0.0.1")
        self.assertTrue(admitted(protocol))
        self.assertEqual(harness.factory.refusals["address_limit"], 1)
        self.assertEqual(self.refused("address_limit"), 1)

    def test_server_wide_cap(self) -> None:
        """Beyond max_pending_connections a connection is closed at once, whatever its address."""
        harness = self.harness(max_pending_connections=2)
        bare = [harness.connect_bare(f"10.0.0.{n}")[0] for n in range(3)]
        self.assertEqual(bare[2].state.value, "closed")
        self.assertEqual(self.refused("pending_limit"), 1)

    def test_handshakes_do_not_count_against_max_connections(self) -> None:
        """Pending connections leave max_connections to admitted ones; one more is dropped."""
        harness = self.harness(max_connections=1)
        for n in range(3):
            harness.connect_bare(f"10.0.1.{n}")
        first, _ = harness.connect_client(harness.agent("tenant-a", "a1"))
        second, _ = harness.connect_client(harness.agent("tenant-a", "a2"))
        self.assertEqual([admitted(first), admitted(second)], [True, False])
        self.assertEqual(self.refused("connection_limit"), 1)

    def test_handshake_timeout(self) -> None:
        """A peer that never finishes TLS is dropped at the handshake timeout, and counted."""
        harness = self.harness(handshake_timeout=4)
        protocol, pump = harness.connect_bare("10.0.0.9")
        harness.clock.advance(3.9)
        self.assertEqual(harness.factory.pending_connections, 1)
        harness.clock.advance(0.1)
        pump.flush()
        self.assertEqual(protocol.state.value, "closed")
        self.assertEqual(harness.factory.pending_connections, 0)
        self.assertEqual(self.refused("handshake_timeout"), 1)

    def test_default_handshake_timeout_is_short(self) -> None:
        """By default a connection has ten seconds to be admitted."""
        self.assertEqual(ServerLimits().handshake_timeout, 10.0)

    def test_refusals_logged_at_a_bounded_rate(self) -> None:
        """A flood of refusals writes a few lines per interval, the next one counting the rest."""
        harness = self.harness(max_pending_per_address=1)
        harness.connect_bare("10.0.0.9")
        with capturedLogs() as events:
            for _ in range(50):
                harness.connect_bare("10.0.0.9")
            harness.clock.advance(DEFAULT_INTERVAL)
            harness.connect_bare("10.0.0.9")
        lines = [e for e in events if e.get("reason") == "address_limit"]
        self.assertEqual(len(lines), DEFAULT_BURST + 1)
        self.assertEqual(lines[-1]["suppressed"], 50 - DEFAULT_BURST)
        self.assertEqual(self.refused("address_limit"), 51)
