"""
How a L{svc.store.manifests.ManifestStore} call reaches its ``routes.db``:
the database opened (created if needed, its schema brought up to date:
L{svc.store.routes_schema}), then every call submitted to the one
L{TransactionQueue} in order.

A mutation runs with a L{Stamp} (the time and its writer); in the same
savepoint, the answer of the mount outbox entry it names is recorded
(L{svc.store.outbox_answers}), and the retained bytes of the top it changed
are brought within their cap (L{svc.store.footprint_rows.prune_to_cap}).
When a mutation or footprint upkeep leaves chunks collectable, the
listener (the tenant's reclaim schedule) is told after the commit.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from twisted.internet.defer import Deferred

from svc.store import footprint_rows, outbox_answers
from svc.store.manifest_rows import Stamp
from svc.store.manifest_values import Writer
from svc.store.routes_queue import TransactionQueue
from svc.store.routes_schema import configure, migrate
from svc.worker import IWorker

T = TypeVar("T")

_NS_PER_SECOND = 1_000_000_000
_NS_PER_MS = 1_000_000


class WallClock(Protocol):
    """
    The part of C{IReactorTime} the store uses (a reactor or a
    L{twisted.internet.task.Clock}).
    """

    def seconds(self) -> float:
        """The current time in seconds since the epoch."""

    def callLater(
        self, delay: float, callable: Callable[..., object], *args: object, **kw: object
    ) -> Any:
        """Schedule a call (the commit of early work, L{TransactionQueue})."""


def connect(path: str | os.PathLike[str]) -> tuple[sqlite3.Connection, int]:
    """
    Open (creating if needed) the database at ``path`` and bring its schema
    up to date; the connection and its schema version. Run on the worker.
    """
    # The worker serialises every use of the connection, but a
    # thread pool may replace its thread, so thread identity is not
    # what keeps the connection safe.
    connection = sqlite3.connect(os.fspath(path), isolation_level=None, check_same_thread=False)
    try:
        configure(connection)
        version = migrate(connection)
    except BaseException:
        connection.close()
        raise
    return connection, version


class RoutesDatabase:
    """
    One open ``routes.db``, for one L{svc.store.manifests.ManifestStore};
    ``clock`` stamps every change.
    """

    def __init__(self, connection: sqlite3.Connection, worker: IWorker, clock: WallClock):
        self._queue = TransactionQueue(connection, worker, clock=clock)
        self._clock = clock
        self._collectable_listener: Callable[[], object] | None = None

    def notify_collectable(self, listener: Callable[[], object]) -> None:
        """
        Call ``listener`` (on the reactor, after the commit) whenever a
        change or a pruning leaves chunks collectable.
        """
        self._collectable_listener = listener

    def close(self) -> Deferred[None]:
        """
        Finish the work already submitted, then close the database; later
        calls fail with L{svc.store.routes_queue.StoreClosed}.
        """
        return self._queue.close()

    def submit(
        self, work: Callable[[sqlite3.Connection], T], *, writes: bool, early: bool = False
    ) -> Deferred[T]:
        """
        Queue ``work`` as it is (L{TransactionQueue.submit}).
        """
        return self._queue.submit(work, writes=writes, early=early)

    def read(self, work: Callable[[sqlite3.Connection], T]) -> Deferred[T]:
        """
        Queue the read ``work``.
        """
        return self._queue.submit(work, writes=False)

    def now_ms(self) -> int:
        """
        The time now in milliseconds, as changes are stamped.
        """
        return self._now() // _NS_PER_MS

    def _now(self) -> int:
        return round(self._clock.seconds() * _NS_PER_SECOND)

    def write(
        self,
        writer: Writer,
        work: Callable[[sqlite3.Connection, Stamp], T],
        retained_cap: tuple[str, int | None] = ("", None),
    ) -> Deferred[T]:
        """
        Run the mutation ``work``; then, when ``retained_cap`` gives a top
        and a cap, prune that top's oldest journal rows to bring its
        retained bytes within the cap, in the same savepoint.
        """
        top, cap = retained_cap

        def stamped(connection: sqlite3.Connection) -> tuple[T, int]:
            stamp = Stamp(self._now(), writer)
            position = writer.outbox
            if position is not None:
                outbox_answers.before(connection, writer.agent_id, position, stamp.at_ms)
            result = work(connection, stamp)
            if position is not None:
                outbox_answers.applied(connection, writer.agent_id, position, result, stamp.at_ms)
            grew = (
                0 if cap is None else footprint_rows.prune_to_cap(connection, top, cap, stamp.at_ms)
            )
            return result, grew

        return self._queue.submit(stamped, writes=True).addCallback(self._collectable)

    def _collectable(self, outcome: tuple[T, int]) -> T:
        result, grew = outcome
        if grew and self._collectable_listener is not None:
            self._collectable_listener()
        return result

    def maintain(self, work: Callable[[sqlite3.Connection, int], int]) -> Deferred[int]:
        """
        Run footprint upkeep ``work`` (given the time in ms) that returns
        the bytes it made collectable; tell the listener if any.
        """
        at_ms = self._now() // _NS_PER_MS

        def run(connection: sqlite3.Connection) -> tuple[int, int]:
            grew = work(connection, at_ms)
            return grew, grew

        return self._queue.submit(run, writes=True).addCallback(self._collectable)
