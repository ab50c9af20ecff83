"""
Tests for L{svc.dataplane.drain_fences}: a new connection of an agent runs
its ordered requests only after its closed connections' received requests
ran.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane.drain_fences import FENCE_SECONDS, DrainFences
from svc.dataplane.test.test_service_support import ServiceFixture, blob, identity
from svc.testing.worker import ManualWorker
from svc.wire.errno import WireErrno

AGENT = ("tenant-a", "agent-1")


class DrainFencesTests(SynchronousTestCase):
    """The per-agent bookkeeping, on a test clock."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.fences = DrainFences(self.clock)

    def test_no_fence_without_closed_connections_running(self) -> None:
        """Nothing draining (or only another agent's, or only drained ones): no fence."""
        self.assertIsNone(self.fences.fence(AGENT))
        drained: Deferred[None] = Deferred()
        self.fences.closing(("tenant-a", "agent-2"), drained)
        self.assertIsNone(self.fences.fence(AGENT))
        done: Deferred[None] = Deferred()
        done.callback(None)
        self.fences.closing(AGENT, done)
        self.assertIsNone(self.fences.fence(AGENT))

    def test_fence_opens_when_every_drain_fired(self) -> None:
        """A fence waits for every closed connection of the agent, and leaves their results."""
        first: Deferred[None] = Deferred()
        second: Deferred[None] = Deferred()
        self.fences.closing(AGENT, first)
        self.fences.closing(AGENT, second)
        fence = self.fences.fence(AGENT)
        assert fence is not None
        first.callback(None)
        self.assertNoResult(fence)
        second.callback(None)
        self.successResultOf(fence)
        self.assertIsNone(self.successResultOf(second))
        self.assertIsNone(self.fences.fence(AGENT))

    def test_fence_opens_after_its_limit(self) -> None:
        """A drain that does not end holds a new connection at most FENCE_SECONDS (warned)."""
        self.fences.closing(AGENT, Deferred())
        fence = self.fences.fence(AGENT)
        assert fence is not None
        self.clock.advance(FENCE_SECONDS - 0.1)
        self.assertNoResult(fence)
        self.clock.advance(0.1)
        self.successResultOf(fence)


class FencedConnectionTests(SynchronousTestCase):
    """Through the service: the next connection sees what the lost one's requests did."""

    def test_next_connection_sees_the_lost_connections_commit(self) -> None:
        """
        A connection uploads a chunk (its store held in the I/O worker) and
        commits a file naming it, then is lost before either ran. The
        agent's next connection asks whether the file exists: the answer
        waits until the lost connection's commit ran, and shows the file.
        Another agent is not held.
        """
        io = ManualWorker()
        fixture = ServiceFixture(self, io_worker=io)
        lost = fixture.agent()
        other = fixture.agent(identity(agent="agent-2"))
        opened = [agent.request("head_file", path=agent.root) for agent in (lost, other)]
        io.run()  # their disks are open
        for answer in opened:
            self.successResultOf(answer)
        _, data = blob("f")
        lost.pipeline_file("f", data)
        lost.connection.closed("connection lost")
        self.assertEqual(other.errno("head_file", path="/agent-2/f"), WireErrno.ENOENT)
        asked = fixture.agent().request("head_file", path="/agent-1/f")
        self.assertNoResult(asked)
        io.run()
        self.assertEqual(self.successResultOf(asked).payload["size"], len(data))

    def test_lost_connections_requests_not_started_are_not_run(self) -> None:
        """
        The request a lost connection was running finishes; those queued
        behind it are not run (failed EBADF, audited): what the server
        keeps of the connection's requests is a prefix of them.
        """
        io = ManualWorker()
        fixture = ServiceFixture(self, io_worker=io)
        lost = fixture.agent()
        opened = lost.request("head_file", path=lost.root)
        io.run()
        self.successResultOf(opened)
        _, data = blob("f")
        _, put = lost.pipeline_file("f", data)
        queued = lost.request("dir_create", path="/agent-1/d", mode=0o755)
        lost.connection.closed("connection lost")
        io.run()
        self.successResultOf(put)
        self.assertEqual(self.failureResultOf(queued).value.errno, WireErrno.EBADF)
        self.assertEqual([e.allowed for e in fixture.events("dir_create")], [False])
        again = fixture.agent()
        self.assertEqual(again.ok("head_file", path="/agent-1/f")["size"], len(data))
        self.assertEqual(again.errno("head_file", path="/agent-1/d"), WireErrno.ENOENT)
