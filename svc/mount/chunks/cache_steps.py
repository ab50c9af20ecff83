"""
The chunk cache's disk steps, in the order its table changed.

L{svc.mount.chunks.cache.ChunkCache} changes its in-memory L{LruTable} first and
then submits the disk step that makes the files and the index agree;
L{DiskSteps} submits every step to the cache's one serial worker, so the
steps run in the table's order. It also writes the chunks themselves: one
chunk per step for a caller that waits (L{DiskSteps.write}), or, for the
chunks the mount uploads, which nobody waits for, a batch of them in one
step at most L{BATCH_DELAY_SECONDS} later (L{DiskSteps.batch}), so closing
many small files costs one worker call and one index transaction per batch
instead of per file. Every other step writes the waiting batch first, so
steps still follow the table's order. A read of a chunk still being written
waits for its step (L{DiskSteps.written}).

Call it only from the reactor thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Protocol, TypeVar

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from svc.mount.chunks.cache_index import CacheDisk
from svc.mount.chunks.cache_policy import CacheSlot, LruTable
from svc.worker import IWorker

__all__ = [
    "BATCH_DELAY_SECONDS",
    "BATCH_MAX_BYTES",
    "BATCH_MAX_CHUNKS",
    "CacheClock",
    "DiskSteps",
    "TimerCall",
]

T = TypeVar("T")

BATCH_DELAY_SECONDS: Final = 0.05
"""How long a chunk given to L{DiskSteps.batch} waits for others to share its disk step."""

BATCH_MAX_CHUNKS: Final = 64
"""A batch of L{DiskSteps.batch} chunks is written at once when it holds this many..."""

BATCH_MAX_BYTES: Final = 1 << 20
"""... or this many bytes."""


class TimerCall(Protocol):
    """The part of C{IDelayedCall} the cache uses."""

    def active(self) -> bool:
        """Whether the call is still pending."""

    def cancel(self) -> None:
        """Stop the pending call."""


class CacheClock(Protocol):
    """
    The part of C{IReactorTime} the cache uses (a reactor or a
    L{twisted.internet.task.Clock}).
    """

    def seconds(self) -> float:
        """Now, in seconds since the epoch: audit timestamps and recency."""

    def callLater(
        self, delay: float, callable: Callable[..., object], *args: object, **kw: object
    ) -> Any:
        """Schedule a batch (chunks, recency); returns a L{TimerCall}."""


class DiskSteps:
    """
    The disk steps of one chunk cache, over its L{CacheDisk}, its serial
    worker and its table; see the module docstring.
    """

    def __init__(
        self, disk: CacheDisk, worker: IWorker, clock: CacheClock, table: LruTable, log: Logger
    ) -> None:
        """
        @param log: the cache's logger (a batch that could not be written
            is logged there).
        """
        self._disk = disk
        self._worker = worker
        self._clock = clock
        self._table = table
        self._log = log
        self._put_waiters: dict[CacheSlot, list[Deferred[bytes | None]]] = {}
        self._batch: list[tuple[CacheSlot, bytes | memoryview]] = []
        self._batch_bytes = 0
        self._batch_call: TimerCall | None = None

    def submit(self, step: Callable[[], T]) -> Deferred[T]:
        """
        Submit a disk step, after the waiting batch's, so disk steps keep
        the order in which the table changed.
        """
        self.write_batch()
        return self._worker.submit(step)

    def write(self, slot: CacheSlot, data: bytes | memoryview) -> Deferred[None]:
        """
        Write C{data} as the chunk of C{slot} (just added to the table, not
        ready) in a step of its own; the slot is ready once it is written,
        and removed from the table if it was not stored or the step failed.
        """
        name = slot.hash
        now_ms = slot.last_used_ms
        writing = self.submit(lambda: self._disk.write(name, data, now_ms))

        def written(stored: bool) -> None:
            slot.ready = True
            if not stored:
                self._table.remove(slot)
            self._wake_put_waiters(slot, data)

        def refused(failure: Failure) -> Failure:
            self._table.remove(slot)
            self._wake_put_waiters(slot, None)
            return failure

        return writing.addCallbacks(written, refused)

    def batch(self, slot: CacheSlot, data: bytes | memoryview) -> None:
        """
        Write C{data} as the chunk of C{slot} (just added to the table, not
        ready) in the waiting batch's step: within L{BATCH_DELAY_SECONDS},
        or at once once L{BATCH_MAX_CHUNKS} or L{BATCH_MAX_BYTES} wait.
        """
        self._batch.append((slot, data))
        self._batch_bytes += len(data)
        if len(self._batch) >= BATCH_MAX_CHUNKS or self._batch_bytes >= BATCH_MAX_BYTES:
            self.write_batch()
        elif self._batch_call is None:
            self._batch_call = self._clock.callLater(BATCH_DELAY_SECONDS, self.write_batch)

    def written(self, slot: CacheSlot) -> Deferred[bytes | None]:
        """
        The bytes of the chunk of C{slot} (not ready) once its write step
        ends: L{None} if the step failed, or a batched chunk was not stored.
        A waiting batch is written at once.
        """
        waiter: Deferred[bytes | None] = Deferred()
        self._put_waiters.setdefault(slot, []).append(waiter)
        self.write_batch()  # it may be waiting there: written now
        return waiter

    def write_batch(self) -> None:
        """Submit the disk step that writes the chunks L{batch} left waiting."""
        if self._batch_call is not None and self._batch_call.active():
            self._batch_call.cancel()
        self._batch_call = None
        batch, self._batch, self._batch_bytes = self._batch, [], 0
        if not batch:
            return
        chunks = [(slot.hash, data, slot.last_used_ms) for slot, data in batch]

        def written(stored: list[bool]) -> None:
            for (slot, data), ok in zip(batch, stored, strict=True):
                slot.ready = True
                if not ok:
                    self._table.remove(slot)
                self._wake_put_waiters(slot, data if ok else None)

        def failed(failure: Failure) -> None:
            self._log.failure("Chunk cache could not write a batch", failure)
            for slot, _data in batch:
                self._table.remove(slot)
                self._wake_put_waiters(slot, None)

        self._worker.submit(lambda: self._disk.write_many(chunks)).addCallbacks(written, failed)

    def _wake_put_waiters(self, slot: CacheSlot, data: bytes | memoryview | None) -> None:
        waiters = self._put_waiters.pop(slot, [])
        if not waiters:
            return
        # Readers get bytes.
        value = bytes(data) if isinstance(data, memoryview) else data
        for waiter in waiters:
            waiter.callback(value)
