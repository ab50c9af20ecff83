"""
Tests for L{svc.store.routes_queue}: group commit with one savepoint per
unit, results only after the commit, submission order, and closing.
"""

from __future__ import annotations

import sqlite3

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from svc.store.routes_queue import StoreClosed, TransactionQueue
from svc.testing.worker import ManualWorker


class _Boom(Exception):
    pass


class TransactionQueueTests(SynchronousTestCase):
    """
    Units queued while the worker is busy share one transaction.
    """

    def setUp(self) -> None:
        self.connection = sqlite3.connect(self.mktemp(), isolation_level=None)
        self.addCleanup(self.connection.close)
        self.connection.execute("PRAGMA journal_mode = WAL")
        self.connection.execute("CREATE TABLE t (k TEXT PRIMARY KEY)")
        self.statements: list[str] = []
        self.connection.set_trace_callback(self.statements.append)
        self.worker = ManualWorker()
        self.queue = TransactionQueue(self.connection, self.worker, max_batch=3)

    def insert(self, key: str) -> Deferred[int]:
        """Queue an insert of ``key``."""
        return self.queue.submit(
            lambda c: c.execute("INSERT INTO t VALUES (?)", (key,)).rowcount, writes=True
        )

    def keys(self) -> Deferred[list[str]]:
        """Queue a read of every key."""
        return self.queue.submit(
            lambda c: [k for (k,) in c.execute("SELECT k FROM t ORDER BY k")], writes=False
        )

    def commits(self) -> int:
        """How many transactions were committed."""
        return self.statements.count("COMMIT")

    def test_batch_shares_one_commit(self) -> None:
        """Units queued behind a running batch go together, in order, in one commit."""
        first = self.insert("a")
        rest = [self.insert("b"), self.insert("c"), self.insert("d")]
        self.assertEqual(len(self.worker.queued), 1)
        self.worker.run_one()
        self.assertEqual(self.successResultOf(first), 1)
        self.assertNoResult(rest[0])
        self.worker.run_one()
        self.assertEqual([self.successResultOf(d) for d in rest], [1, 1, 1])
        self.assertEqual(self.commits(), 2)

    def test_results_wait_for_commit(self) -> None:
        """No unit's result is delivered before its transaction has committed."""
        self.insert("a")
        seen_commits: list[int] = []
        later = self.insert("b")
        later.addCallback(lambda _: seen_commits.append(self.commits()))
        self.worker.run_one()
        self.assertEqual(seen_commits, [])
        self.worker.run_one()
        self.assertEqual(seen_commits, [2])

    def test_failing_unit_rolls_back_alone(self) -> None:
        """A unit that raises loses its own writes; its batch neighbours keep theirs."""
        self.insert("first")

        def half_then_fail(c: sqlite3.Connection) -> None:
            c.execute("INSERT INTO t VALUES ('partial')")
            raise _Boom()

        before = self.insert("a")
        failing = self.queue.submit(half_then_fail, writes=True)
        after = self.insert("b")
        self.worker.run_one()
        self.worker.run_one()
        self.successResultOf(before)
        self.failureResultOf(failing, _Boom)
        self.successResultOf(after)
        read = self.keys()
        self.worker.run_one()
        self.assertEqual(self.successResultOf(read), ["a", "b", "first"])

    def test_reads_see_earlier_writes(self) -> None:
        """A read queued after a write in the same batch sees it."""
        self.insert("x")
        self.insert("a")
        read = self.keys()
        self.worker.run_one()
        self.worker.run_one()
        self.assertEqual(self.successResultOf(read), ["a", "x"])

    def test_read_only_batch_opens_no_transaction(self) -> None:
        """A batch of reads runs without BEGIN or COMMIT."""
        read = self.keys()
        self.worker.run_one()
        self.assertEqual(self.successResultOf(read), [])
        self.assertNotIn("BEGIN IMMEDIATE", self.statements)

    def test_commit_failure_fails_the_batch(self) -> None:
        """If the transaction cannot commit, every unit in it fails and nothing stays."""
        # A deferred foreign key violation makes COMMIT itself fail.
        self.connection.execute("PRAGMA foreign_keys = ON")
        self.connection.execute(
            "CREATE TABLE child (p TEXT REFERENCES t (k) DEFERRABLE INITIALLY DEFERRED)"
        )
        self.insert("a")
        ok = self.insert("b")
        bad = self.queue.submit(
            lambda c: c.execute("INSERT INTO child VALUES ('nobody')").rowcount, writes=True
        )
        self.worker.run_one()
        self.worker.run_one()
        self.failureResultOf(ok, sqlite3.IntegrityError)
        self.failureResultOf(bad, sqlite3.IntegrityError)
        self.assertFalse(self.connection.in_transaction)
        read = self.keys()
        self.worker.run_one()
        self.assertEqual(self.successResultOf(read), ["a"])

    def test_early_unit_answered_before_the_commit(self) -> None:
        """
        An early unit's result arrives once it has run; its neighbours' after
        the commit, which is a second trip to the worker.
        """
        self.insert("a")
        early = self.queue.submit(
            lambda c: c.execute("INSERT INTO t VALUES ('b')").rowcount, writes=True, early=True
        )
        later = self.insert("c")
        self.worker.run_one()
        self.worker.run_one()
        self.assertEqual((self.successResultOf(early), self.commits()), (1, 1))
        self.assertNoResult(later)
        read = self.keys()
        self.worker.run_one()
        self.assertEqual((self.successResultOf(later), self.commits()), (1, 2))
        self.assertNoResult(read)
        self.worker.run_one()
        self.assertEqual(self.successResultOf(read), ["a", "b", "c"])

    def test_early_unit_alone_when_commit_fails(self) -> None:
        """A failed commit fails the units not yet answered; an early one already had its answer."""
        self.connection.execute("PRAGMA foreign_keys = ON")
        self.connection.execute(
            "CREATE TABLE child (p TEXT REFERENCES t (k) DEFERRABLE INITIALLY DEFERRED)"
        )
        self.insert("a")
        early = self.queue.submit(
            lambda c: c.execute("INSERT INTO t VALUES ('b')").rowcount, writes=True, early=True
        )
        bad = self.queue.submit(
            lambda c: c.execute("INSERT INTO child VALUES ('nobody')").rowcount, writes=True
        )
        self.worker.run_one()
        self.worker.run_one()
        self.assertEqual(self.successResultOf(early), 1)
        self.assertNoResult(bad)
        self.worker.run_one()
        self.failureResultOf(bad, sqlite3.IntegrityError)
        self.assertFalse(self.connection.in_transaction)
        read = self.keys()
        self.worker.run_one()
        self.assertEqual(self.successResultOf(read), ["a"])

    def test_close_after_pending_work(self) -> None:
        """close finishes queued work, then closes; later submissions fail."""
        self.insert("a")
        pending = self.insert("b")
        closed = self.queue.close()
        self.failureResultOf(self.insert("c"), StoreClosed)
        self.worker.run_one()
        self.worker.run_one()
        self.successResultOf(pending)
        self.assertNoResult(closed)
        self.worker.run_one()
        self.successResultOf(closed)
        self.successResultOf(self.queue.close())
        self.assertRaises(sqlite3.ProgrammingError, self.connection.execute, "SELECT 1")


class LingeringTests(SynchronousTestCase):
    """
    With a clock, a batch of early writes leaves its transaction open for
    the next batch to commit, or commits it after the linger time.
    """

    def setUp(self) -> None:
        self.connection = sqlite3.connect(self.mktemp(), isolation_level=None)
        self.addCleanup(self.connection.close)
        self.connection.execute("PRAGMA journal_mode = WAL")
        self.connection.execute("CREATE TABLE t (k TEXT PRIMARY KEY)")
        self.statements: list[str] = []
        self.connection.set_trace_callback(self.statements.append)
        self.worker = ManualWorker()
        self.clock = Clock()
        self.queue = TransactionQueue(self.connection, self.worker, clock=self.clock, linger=0.05)

    def insert(self, key: str, early: bool = False) -> Deferred[int]:
        return self.queue.submit(
            lambda c: c.execute("INSERT INTO t VALUES (?)", (key,)).rowcount,
            writes=True,
            early=early,
        )

    def commits(self) -> int:
        return self.statements.count("COMMIT")

    def test_next_commit_carries_early_work(self) -> None:
        """Early writes answered at once are committed by the next batch's one COMMIT."""
        early = self.insert("a", early=True)
        self.worker.run_one()
        self.assertEqual((self.successResultOf(early), self.commits()), (1, 0))
        self.assertTrue(self.connection.in_transaction)
        read = self.queue.submit(
            lambda c: c.execute("SELECT count(*) FROM t").fetchone()[0], writes=False
        )
        self.worker.run_one()
        self.assertEqual((self.successResultOf(read), self.commits()), (1, 0))
        durable = self.insert("b")
        self.worker.run_one()
        self.assertEqual((self.successResultOf(durable), self.commits()), (1, 1))
        self.assertEqual(self.statements.count("BEGIN IMMEDIATE"), 1)
        self.assertFalse(self.connection.in_transaction)
        self.clock.advance(1)
        self.assertEqual(self.worker.queued, [])

    def test_commit_after_linger(self) -> None:
        """Early writes with nothing after them are committed once the linger time has passed."""
        early = self.insert("a", early=True)
        self.worker.run_one()
        self.successResultOf(early)
        self.clock.advance(0.04)
        self.assertEqual(self.worker.queued, [])
        self.clock.advance(0.01)
        self.worker.run_one()
        self.assertEqual(self.commits(), 1)
        self.assertFalse(self.connection.in_transaction)

    def test_close_commits(self) -> None:
        """Closing commits early work left open before closing the connection."""
        early = self.insert("a", early=True)
        self.worker.run_one()
        self.successResultOf(early)
        closed = self.queue.close()
        self.worker.run()
        self.successResultOf(closed)
        self.assertEqual(self.commits(), 1)
        self.assertEqual(self.clock.getDelayedCalls(), [])
