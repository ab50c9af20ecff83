"""
L{svc.worker.IWorker}s for synchronous tests: one that runs calls inline,
one that holds them until the test runs them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from twisted.internet.defer import Deferred, fail, succeed

T = TypeVar("T")


class ImmediateWorker:
    """
    Runs each submitted callable at once on the calling thread and returns an
    already-fired L{Deferred}. ``calls`` counts submissions.
    """

    def __init__(self) -> None:
        self.calls = 0

    def submit(self, fn: Callable[[], T]) -> Deferred[T]:
        self.calls += 1
        try:
            result = fn()
        except BaseException:
            return fail()
        return succeed(result)


class ManualWorker:
    """
    An L{svc.worker.IWorker} that holds each call until the test runs it,
    standing in for a busy worker thread: L{run_one} runs the oldest, L{run}
    every held call in order (including those submitted meanwhile).
    ``queued`` holds the calls not run yet.
    """

    def __init__(self) -> None:
        self.queued: list[tuple[Callable[[], Any], Deferred[Any]]] = []

    def submit(self, fn: Callable[[], T]) -> Deferred[T]:
        deferred: Deferred[T] = Deferred()
        self.queued.append((fn, deferred))
        return deferred

    def run_one(self) -> None:
        """Run the oldest held call and deliver its outcome."""
        fn, deferred = self.queued.pop(0)
        try:
            result = fn()
        except Exception:
            deferred.errback()
        else:
            deferred.callback(result)

    def run(self) -> None:
        """Run every held call, including those submitted meanwhile."""
        while self.queued:
            self.run_one()
