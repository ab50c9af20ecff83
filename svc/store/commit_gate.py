"""
A tenant storage's commit gate: a shared/exclusive lock of Deferreds.

Manifest commits hold it shared, so any number run at once (their database
work is ordered by the routes queue, which also lets them share one
transaction: group commit). Garbage collection and purge hold it
exclusively before they delete chunks, so no commit can name a chunk being
deleted (``docs/specifications/storage-engine.md``, "Commit rules").

Waiters are served in arrival order, and a waiting exclusive holder stops
later shared ones from entering (they queue behind it), so a steady stream
of commits cannot keep a sweep waiting forever. A wait cancelled before it
is granted takes nothing.
"""

from __future__ import annotations

from collections import deque

import attrs
from twisted.internet.defer import Deferred


@attrs.define(eq=False)
class _Waiter:
    exclusive: bool
    granted: Deferred[None]


class CommitGate:
    """See the module docstring."""

    def __init__(self) -> None:
        self._shared = 0
        self._exclusive = False
        self._waiting: deque[_Waiter] = deque()
        self._granting = False

    @property
    def holders(self) -> int:
        """How many hold the gate now (shared holders, or 1 exclusive)."""
        return 1 if self._exclusive else self._shared

    def acquire_shared(self) -> Deferred[None]:
        """Fires once the gate is held shared; give it back with L{release_shared}."""
        if not self._exclusive and not self._waiting:
            self._shared += 1
            granted: Deferred[None] = Deferred()
            granted.callback(None)
            return granted
        return self._wait(exclusive=False)

    def acquire_exclusive(self) -> Deferred[None]:
        """Fires once the gate is held alone; give it back with L{release_exclusive}."""
        if not self._exclusive and self._shared == 0 and not self._waiting:
            self._exclusive = True
            granted: Deferred[None] = Deferred()
            granted.callback(None)
            return granted
        return self._wait(exclusive=True)

    def release_shared(self) -> None:
        """Give back one shared hold."""
        if self._shared <= 0:
            raise RuntimeError("the commit gate is not held shared")
        self._shared -= 1
        self._grant()

    def release_exclusive(self) -> None:
        """Give back the exclusive hold."""
        if not self._exclusive:
            raise RuntimeError("the commit gate is not held exclusively")
        self._exclusive = False
        self._grant()

    def _wait(self, *, exclusive: bool) -> Deferred[None]:
        def cancelled(granted: Deferred[None]) -> None:
            # Only a waiter still queued can be cancelled: a granted one has fired.
            self._waiting.remove(waiter)
            self._grant()

        waiter = _Waiter(exclusive, Deferred(cancelled))
        self._waiting.append(waiter)
        return waiter.granted

    def _grant(self) -> None:
        """
        Admit the waiters at the head of the queue that may enter now. A
        waiter admitted runs at once and may give the gate back before its
        callback returns: that release's own admitting is left to the loop
        already running here, so many such waiters do not nest.
        """
        if self._granting:
            return
        self._granting = True
        try:
            while self._waiting and not self._exclusive:
                head = self._waiting[0]
                if head.exclusive:
                    if self._shared:
                        return
                    self._exclusive = True
                else:
                    self._shared += 1
                self._waiting.popleft()
                head.granted.callback(None)
        finally:
            self._granting = False
