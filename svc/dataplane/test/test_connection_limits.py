"""
The server's connection limits: connections open at once, and admitted
connections of one agent, over real in-memory TLS 1.3.
"""

from __future__ import annotations

from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane.factory import ServerLimits
from svc.dataplane.test.fakes import TLSHarness
from svc.dataplane_client.client import DataPlaneClientProtocol


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
    At most C{max_connections} open connections, handshakes included.
    """

    def test_one_more_is_closed_at_once(self) -> None:
        """A connection over the server's limit is closed before its TLS handshake."""
        harness = TLSHarness(ServerLimits(max_connections=2))
        results = [harness.connect_client(harness.agent("tenant-a", f"a{n}"))[0] for n in range(3)]
        self.assertEqual([admitted(p) for p in results], [True, True, False])
        self.assertEqual(harness.factory.active_connections, 2)
        self.assertEqual(harness.factory.refused_for_limits, 1)
