"""
Tests for requests the protocol gives up on (its request timeout, the
connection closing): L{svc.dataplane.connection.AgentConnection.handle}'s
answer cancelled. Order is kept either way: a request still waiting for its
turn never runs; one that has started runs to its end before the next.
"""

from __future__ import annotations

from twisted.internet.defer import CancelledError
from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane.test.test_service_support import ServiceFixture, blob
from svc.testing.worker import ManualWorker
from svc.wire.errno import WireErrno


class GivenUpRequestTests(SynchronousTestCase):
    """A connection whose commit is held in the I/O worker, and requests queued behind it."""

    def setUp(self) -> None:
        self.io = ManualWorker()
        self.fixture = ServiceFixture(self, io_worker=self.io)
        self.agent = self.fixture.agent()
        opened = self.agent.request("head_file", path=self.agent.root)
        self.io.run()
        self.successResultOf(opened)
        _, self.data = blob("f")
        # The chunk's store is held in the worker; the commit holds the
        # connection's order while it waits for it.
        _, self.commit = self.agent.pipeline_file("f", self.data)

    def test_given_up_while_waiting_never_runs_and_keeps_the_order(self) -> None:
        """
        A request given up while the commit ahead of it runs fails at once
        and never runs; the request after it still waits for the commit
        (it used to start at once, the given-up wait having released the
        commit's turn) and sees the file.
        """
        queued = self.agent.request("dir_create", path="/agent-1/d", mode=0o755, mtime_ns=1)
        later = self.agent.request("head_file", path="/agent-1/f")
        queued.cancel()
        self.failureResultOf(queued, CancelledError)
        self.assertNoResult(later)
        self.io.run()
        self.successResultOf(self.commit)
        self.assertEqual(self.successResultOf(later).payload["size"], len(self.data))
        self.assertEqual(self.agent.errno("head_file", path="/agent-1/d"), WireErrno.ENOENT)
        self.assertEqual([e.allowed for e in self.fixture.events("dir_create")], [False])

    def test_given_up_after_it_started_runs_to_its_end_first(self) -> None:
        """
        The commit given up while it runs (waiting for its chunk's store)
        fails at once for the protocol, but runs to its end, and the next
        request waits for it: it sees the file (it used to run at once and
        find nothing, and the commit was never made).
        """
        later = self.agent.request("head_file", path="/agent-1/f")
        self.commit.cancel()
        self.failureResultOf(self.commit, CancelledError)
        self.assertNoResult(later)
        self.io.run()
        self.assertEqual(self.successResultOf(later).payload["size"], len(self.data))
        self.assertEqual([e.allowed for e in self.fixture.events("manifest_put")], [True])
