"""
Calls from an llfuse worker thread onto the reactor thread
(L{ReactorCaller}): the FUSE thread waits for the answer with the llfuse
global lock released, and at most a timeout (a FUSE thread never waits
forever). L{FSError} becomes C{FUSEError(errno)}; a timeout or any other
exception is EIO (the latter logged as a bug).

Threads and timeouts: ``docs/specifications/mount-runtime.md``.
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

import llfuse
from twisted.internet.interfaces import IReactorFromThreads
from twisted.logger import Logger
from twisted.python.failure import Failure

from svc.mount.core.errors import FSError
from svc.mount.core.op_ticket import OpTicket, run_with_ticket

T = TypeVar("T")

_log = Logger()


class ReactorCaller:
    """
    Runs a function on the reactor thread from a FUSE thread and waits for
    its result, at most C{timeout} seconds, with the llfuse lock released.
    """

    def __init__(
        self,
        reactor: IReactorFromThreads,
        released: Callable[[], AbstractContextManager[Any]] = lambda: llfuse.lock_released,
    ) -> None:
        self._reactor = reactor
        self._released = released

    def call(
        self,
        timeout: float,
        what: str,
        f: Callable[..., Any],
        *args: Any,
        late: Callable[[Any], object] | None = None,
    ) -> Any:
        """
        C{f(*args)} on the reactor thread; its (Deferred's) result.

        @param late: given, on the reactor thread, a result that arrives
            after the timeout (nobody else will see it).
        @raise llfuse.FUSEError: C{FSError.errno}; EIO on timeout or a bug.
        """
        # A plain lock as the signal: held here, released by the reactor
        # when the answer is in (cheaper than an Event's condition).
        done = threading.Lock()
        done.acquire()
        box: list[object] = []
        guard = threading.Lock()
        abandoned = False

        def finished(result: object) -> None:
            with guard:
                if not abandoned:
                    box.append(result)
                    done.release()
                    return
            if late is not None and not isinstance(result, Failure):
                late(result)

        ticket = OpTicket()

        def run() -> None:
            run_with_ticket(ticket, f, *args).addBoth(finished)

        self._reactor.callFromThread(run)
        with self._released():
            answered = done.acquire(timeout=timeout)
        if not answered:
            with guard:
                answered = bool(box)
                abandoned = not answered
        if not answered:
            # What still waits for its turn must not start now (op_ticket).
            self._reactor.callFromThread(ticket.abandon)
            _log.error("{what} got no answer within {timeout}s: EIO", what=what, timeout=timeout)
            raise llfuse.FUSEError(errno.EIO)
        result = box[0]
        if isinstance(result, Failure):
            error = result.value
            if isinstance(error, FSError):
                raise llfuse.FUSEError(error.errno)
            _log.failure("{what} failed unexpectedly: EIO", result, what=what)
            raise llfuse.FUSEError(errno.EIO)
        return result

    def post(self, f: Callable[..., object], *args: Any) -> None:
        """C{f(*args)} on the reactor thread, without waiting; a failure is logged."""

        def run() -> None:
            try:
                f(*args)
            except Exception:
                _log.failure("posted call {f} failed", f=f)

        self._reactor.callFromThread(run)

    def blocking(self, f: Callable[[], T]) -> T:
        """C{f()} here, with the llfuse lock released (for blocking I/O)."""
        with self._released():
            return f()
