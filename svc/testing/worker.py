"""
An L{svc.worker.IWorker} that runs calls inline, for synchronous tests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

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
