"""
Bulk answers and the answer budgets: a C{chunk_get} reserves its bytes
before it reads, keeps the chunk's size until its answer is sent, and a
closed connection gives everything back.
"""

from __future__ import annotations

from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane.answer_budget import AnswerLimits, ConnectionGone
from svc.dataplane.interfaces import OpReply
from svc.dataplane.test.test_service_support import ServiceFixture, blob
from svc.store.chunks import MAX_CHUNK_SIZE
from svc.testing.worker import ManualWorker

LIMITS = AnswerLimits(
    per_connection=MAX_CHUNK_SIZE, per_agent=2 * MAX_CHUNK_SIZE, server=3 * MAX_CHUNK_SIZE
)


class ChunkGetBudgetTests(SynchronousTestCase):
    """C{chunk_get} and the budgets, on a store whose reads the test runs."""

    def setUp(self) -> None:
        self.io = ManualWorker()
        self.fixture = ServiceFixture(self, io_worker=self.io, answer_limits=LIMITS)
        self.addCleanup(self.fixture.close)
        self.agent = self.fixture.agent()
        self.chunk = blob("answer", 5000)
        self.agent.request("chunk_put", self.chunk[1], hash=self.chunk[0])
        self.io.run()
        self.budgets = self.fixture.service.answer_budgets

    def get(self) -> Any:
        return self.agent.request("chunk_get", hash=self.chunk[0])

    def test_reserves_before_reading_and_keeps_the_chunk_size_until_sent(self) -> None:
        """A second chunk_get waits for room without reading; the first's sent lets it read."""
        first = self.get()
        self.assertEqual(len(self.io.queued), 1, "the first read is under way")
        self.assertEqual(self.budgets.granted, MAX_CHUNK_SIZE)
        self.io.run()
        reply: OpReply = self.successResultOf(first)
        self.assertEqual(self.budgets.granted, 5000)
        second = self.get()
        self.assertNoResult(second)
        self.assertEqual(self.io.queued, [], "no read before its reservation")
        self.assertEqual(self.agent.connection.answers.waiting, 1)
        assert reply.sent is not None
        reply.sent()
        self.assertEqual(len(self.io.queued), 1)
        self.io.run()
        self.assertEqual(bytes(self.successResultOf(second).raw), self.chunk[1])

    def test_absent_chunk_holds_nothing(self) -> None:
        """A chunk_get that fails gives its reservation back."""
        self.fixture.service.engine.read_buffers.trim()
        answer = self.agent.request("chunk_get", hash=blob("never stored")[0])
        self.io.run()
        self.failureResultOf(answer)
        self.assertEqual(self.budgets.granted, 0)

    def test_agent_budget_spans_its_connections(self) -> None:
        """The agent's connections share its budget: a third read waits for room."""
        self.agent.request(
            "manifest_put",
            path="/agent-1/f",
            expected_version=0,
            chunks=[[self.chunk[0], 5000]],
            size=5000,
            mode=0o644,
            mtime_ns=1,
        )
        self.io.run()
        others = [self.fixture.agent() for _ in range(3)]
        answers = [other.request("chunk_get", hash=self.chunk[0]) for other in others]
        self.assertEqual(len(self.io.queued), 2, "two reads under way, the third waits")
        self.assertEqual(self.budgets.agent_granted(("tenant-a", "agent-1")), 2 * MAX_CHUNK_SIZE)
        self.assertNoResult(answers[2])
        self.io.run()
        for answer in answers:
            self.assertEqual(bytes(self.successResultOf(answer).raw), self.chunk[1])

    def test_closed_connection_gives_everything_back(self) -> None:
        """Closing a connection returns what its answers hold and ends what waits."""
        first = self.get()
        self.io.run()
        self.successResultOf(first)
        second = self.get()
        self.agent.connection.closed("connection lost")
        self.io.run()
        self.assertIsInstance(self.failureResultOf(second).value, ConnectionGone)
        self.assertEqual(self.budgets.granted, 0)


class InlineBudgetTests(SynchronousTestCase):
    """A C{manifest_get} with inline chunks reserves once, for its whole raw segment."""

    def test_inline_answer_holds_its_bytes_until_sent(self) -> None:
        """The reply keeps exactly its raw segment reserved until it is sent."""
        fixture = ServiceFixture(self, answer_limits=LIMITS)
        self.addCleanup(fixture.close)
        agent = fixture.agent()
        data = blob("small", 700)
        agent.put_file("f", data[1])
        reply = agent.reply("manifest_get", path="/agent-1/f", inline_max=1000)
        self.assertEqual(reply.payload["inline"], [data[0]])
        budgets = fixture.service.answer_budgets
        self.assertEqual(budgets.granted, 700)
        assert reply.sent is not None
        reply.sent()
        self.assertEqual(budgets.granted, 0)
