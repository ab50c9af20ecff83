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

    def test_stop_waits_for_queued_work(self) -> Deferred[None]:
        """stop returns once every call submitted before it has run; their results follow."""
        worker = ThreadWorker(reactor, "test-worker-stop", threads=2)
        ran: list[int] = []
        release = threading.Event()

        def first() -> int:
            release.wait(10)
            ran.append(0)
            return 0

        def later(i: int) -> int:
            ran.append(i)
            return i

        ds: list[Deferred[int]] = [worker.submit(first)]
        ds += [worker.submit(lambda i=i: later(i)) for i in range(1, 6)]  # type: ignore[misc]
        release.set()
        worker.stop()
        self.assertEqual(sorted(ran), list(range(6)))
        self.assertEqual(
            [t.name for t in threading.enumerate() if "test-worker-stop" in t.name], []
        )
        return gatherResults(ds).addCallback(
            lambda results: self.assertEqual(results, list(range(6)))
        )

    def test_threads_named_and_restartable(self) -> Deferred[None]:
        """Calls run on threads named after the worker; a stopped worker starts again."""
        worker = ThreadWorker(reactor, "test-worker-named", threads=1)
        self.addCleanup(worker.stop)
        first = worker.submit(lambda: threading.current_thread().name)
        worker.stop()
        second = worker.submit(lambda: threading.current_thread().name)
        return gatherResults([first, second]).addCallback(
            lambda names: self.assertEqual(names, ["test-worker-named-0"] * 2)
        )

    def test_no_threads_refused(self) -> None:
        """A worker of no threads would never run anything: refused at once."""
        self.assertRaises(ValueError, ThreadWorker, reactor, "none", threads=0)
