"""
Tests for L{svc.worker} and L{svc.testing.worker}.
"""

from __future__ import annotations

import threading

from twisted.internet import reactor
from twisted.internet.defer import Deferred, gatherResults
from twisted.trial.unittest import SynchronousTestCase, TestCase

from svc.testing.worker import ImmediateWorker
from svc.worker import ThreadWorker


class ImmediateWorkerTests(SynchronousTestCase):
    """
    Tests for L{ImmediateWorker}.
    """

    def test_result(self) -> None:
        """The callable's result is delivered already fired."""
        worker = ImmediateWorker()
        self.assertEqual(self.successResultOf(worker.submit(lambda: 3)), 3)
        self.assertEqual(worker.calls, 1)

    def test_failure(self) -> None:
        """An exception becomes a failed Deferred."""
        worker = ImmediateWorker()

        def boom() -> None:
            raise KeyError("x")

        self.failureResultOf(worker.submit(boom), KeyError)


class ThreadWorkerTests(TestCase):
    """
    Tests for L{ThreadWorker} against the real reactor.
    """

    def test_single_thread_in_order(self) -> Deferred[None]:
        """A one-thread worker runs every call on the same non-reactor thread, in order."""
        worker = ThreadWorker(reactor, "test-worker", threads=1)
        self.addCleanup(worker.stop)
        seen: list[tuple[int, int]] = []
        main = threading.get_ident()

        def record(i: int) -> int:
            seen.append((i, threading.get_ident()))
            return i

        ds: list[Deferred[int]] = [
            worker.submit(lambda i=i: record(i))  # type: ignore[misc]
            for i in range(20)
        ]

        def check(results: list[int]) -> None:
            self.assertEqual(results, list(range(20)))
            self.assertEqual([i for i, _ in seen], list(range(20)))
            threads = {t for _, t in seen}
            self.assertEqual(len(threads), 1)
            self.assertNotIn(main, threads)

        return gatherResults(ds).addCallback(check)

    def test_failure_delivered(self) -> Deferred[None]:
        """An exception on the worker thread fails the Deferred."""
        worker = ThreadWorker(reactor, "test-worker-fail")
        self.addCleanup(worker.stop)

        def boom() -> None:
            raise ValueError("nope")

        d: Deferred[None] = self.assertFailure(worker.submit(boom), ValueError)
        return d
