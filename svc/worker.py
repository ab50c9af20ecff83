"""
Running blocking work (disk, SQLite, hashing large buffers) off the reactor.

Logic objects take an L{IWorker} rather than reaching for a global thread
pool. The real one, L{ThreadWorker}, runs calls on a Twisted
L{ThreadPool} and delivers results on the reactor thread. A worker created
with one thread is also how a SQLite database gets its single writer thread.
Tests use L{svc.testing.worker.ImmediateWorker}, which runs calls inline.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorCore, IReactorFromThreads
from twisted.internet.threads import deferToThreadPool
from twisted.python.threadpool import ThreadPool

T = TypeVar("T")


class IWorker(Protocol):
    """
    Something that runs a blocking callable and reports its result later.
    """

    def submit(self, fn: Callable[[], T]) -> Deferred[T]:
        """
        Run ``fn`` and fire the result (or failure) on the reactor thread.
        """


class ThreadWorker:
    """
    An L{IWorker} backed by a L{ThreadPool} of ``threads`` threads.

    With ``threads=1`` every call runs on the same thread, in submission
    order, which is what a SQLite connection needs. When the reactor provides
    L{IReactorCore}, the pool is stopped during reactor shutdown (after queued
    work finishes), as Twisted does for its own pool, so a stopping process
    is never kept alive by idle worker threads.
    """

    def __init__(self, reactor: IReactorFromThreads, name: str, threads: int = 1) -> None:
        self._reactor = reactor
        self._pool = ThreadPool(minthreads=threads, maxthreads=threads, name=name)
        self._started = False

    def start(self) -> None:
        """
        Start the threads; idempotent.
        """
        if not self._started:
            self._pool.start()
            self._started = True
            if IReactorCore.providedBy(self._reactor):
                self._reactor.addSystemEventTrigger("during", "shutdown", self.stop)

    def stop(self) -> None:
        """
        Wait for queued work to finish and stop the threads; idempotent.
        """
        if self._started:
            self._pool.stop()
            self._started = False

    def submit(self, fn: Callable[[], T]) -> Deferred[T]:
        self.start()
        return deferToThreadPool(self._reactor, self._pool, fn)
