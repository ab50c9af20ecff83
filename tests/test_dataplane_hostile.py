"""
System tests of a real C{twist svc-dataplane} process against hostile
peers (L{tests.hostile_clients}), with its resident memory read from
C{/proc}:

  - one agent floods all 16 of its connections with pipelined
    C{chunk_get}s of a 16 MiB chunk and never reads: the server's RSS grows
    by a bounded amount (the agent's answer budget, 64 MiB, plus a slice
    and a socket buffer per connection), another tenant's agent keeps
    getting answers, and the memory goes back once the flood's connections
    close;
  - a peer opening 200 bare TCP connections a second from 127.0.0.2 for
    30 s (never starting TLS) does not keep an agent on 127.0.0.1 out.
"""

from __future__ import annotations

import os
import time

from twisted.trial.unittest import TestCase

from svc.store.chunks import MAX_CHUNK_SIZE
from tests.dataplane_harness import DataPlaneProcess, class_server, metric_sample, standard_server
from tests.hostile_clients import (
    BareConnector,
    BlockingClient,
    Flooder,
    close_all,
    put_file,
    rss_bytes,
)

MIB = 1024 * 1024

FLOOD_CONNECTIONS = 16
"""All the connections one agent may hold (C{SVC_MAX_CONNECTIONS_PER_AGENT})."""

FLOOD_REQUESTS = 32
"""Pipelined requests per connection (C{max_in_flight})."""

GROWTH_BOUND = 192 * MIB
"""
How much the flood may raise the server's RSS: the agent's answer budget
(64 MiB) plus, per connection, a 512 KiB slice of ciphertext and Twisted's
256 KiB buffer (16 MiB for 16), with room for allocator noise. Without the
budgets it was about 0.55 GiB per connection.
"""

RETURN_BOUND = 48 * MIB
"""How far above its base the RSS may stay once the flood's connections are closed."""

SETTLE_SECONDS = 6.0
"""Long enough for the server to free idle buffers (two trims, 2 s apart)."""


def settled_rss(pid: int, seconds: float = SETTLE_SECONDS) -> int:
    """The server's RSS after C{seconds} without load (the least of a few samples)."""
    time.sleep(seconds)
    samples = []
    for _ in range(5):
        samples.append(rss_bytes(pid))
        time.sleep(0.1)
    return min(samples)


class AnswerMemoryTests(TestCase):
    """A flood of unread chunk_get answers is bounded and returned."""

    timeout = 180

    def setUp(self) -> None:
        self.server: DataPlaneProcess = class_server(self, standard_server)
        assert self.server.process is not None
        self.pid = self.server.process.pid

    def client(self, tenant: str, agent: str) -> BlockingClient:
        client = BlockingClient(
            self.server.frame_address,
            self.server.pki.ssl_context(self.server.pki.agent(tenant, agent)),
        )
        self.addCleanup(client.close)
        return client

    def test_unread_chunk_gets_hold_bounded_memory(self) -> None:
        """
        16 connections x 32 unread chunk_gets of a 16 MiB chunk raise the
        RSS by at most L{GROWTH_BOUND}; another tenant's calls are answered
        meanwhile; the RSS is back near its base soon after they close.
        """
        pki = self.server.pki
        setup = self.client("tenant-a", "flood-1")
        big = put_file(setup, "/flood-1/big", os.urandom(MAX_CHUNK_SIZE))
        setup.close()
        other = self.client("tenant-b", "calm-1")
        small_data = os.urandom(MIB)
        small = put_file(other, "/calm-1/small", small_data)
        base = settled_rss(self.pid)

        context = pki.ssl_context(pki.agent("tenant-a", "flood-1"))
        flooders = [Flooder(self.server.frame_address, context) for _ in range(FLOOD_CONNECTIONS)]
        self.addCleanup(close_all, flooders)
        for flooder in flooders:
            flooder.send("chunk_get", FLOOD_REQUESTS, hash=big)
        peak = base
        latencies = []
        deadline = time.monotonic() + 8.0
        while time.monotonic() < deadline:
            started = time.monotonic()
            answer = other.call("chunk_get", hash=small)
            self.assertEqual(bytes(answer.raw), small_data)
            other.call("ping")
            latencies.append(time.monotonic() - started)
            peak = max(peak, rss_bytes(self.pid))
            time.sleep(0.05)
        self.assertGreater(len(latencies), 10)
        self.assertLess(max(latencies), 5.0)
        growth = peak - base
        self.assertLess(growth, GROWTH_BOUND, f"RSS grew by {growth / MIB:.0f} MiB")
        self.assertGreater(growth, 16 * MIB, "the flood did not reach the server")

        close_all(flooders)
        after = settled_rss(self.pid)
        self.assertLess(
            after - base,
            RETURN_BOUND,
            f"RSS {after / MIB:.0f} MiB after the flood, {base / MIB:.0f} MiB before",
        )
        other.call("ping")


class PendingConnectionTests(TestCase):
    """Bare TCP connections from one peer do not lock agents out."""

    timeout = 180

    def setUp(self) -> None:
        self.server: DataPlaneProcess = class_server(self, standard_server)

    def test_agent_connects_through_a_bare_connection_flood(self) -> None:
        """
        While 127.0.0.2 opens 200 bare connections a second for 30 s, an
        agent on 127.0.0.1 connects and pings every few seconds, to the end.
        """
        attacker = BareConnector(self.server.frame_address, "127.0.0.2", rate=200, seconds=30)
        attacker.start()
        self.addCleanup(attacker.stop)
        context = self.server.pki.ssl_context(self.server.pki.agent("tenant-a", "steady-1"))
        started = time.monotonic()
        rounds = []
        while time.monotonic() - started < 30:
            time.sleep(2.5)
            agent = BlockingClient(self.server.frame_address, context, source="127.0.0.1")
            try:
                agent.call("ping")
            finally:
                agent.close()
            rounds.append(time.monotonic() - started)
        self.assertGreater(attacker.opened, 4000, "the flood was too slow to mean anything")
        self.assertGreaterEqual(rounds[-1], 25.0)
        refused = metric_sample(
            self.server.metrics_text(),
            "svc_dataplane_connections_refused_total",
            reason="address_limit",
        )
        assert refused is not None
        self.assertGreater(refused, 1000)
        self.assertNotIn("Traceback", self.server.log_text())
        log_lines = self.server.log_text().count("connection refused (address_limit)")
        self.assertLess(log_lines, 40, "refusals are logged at a bounded rate")
