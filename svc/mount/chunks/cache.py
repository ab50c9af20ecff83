"""
The mount client's local chunk cache: verified chunk bytes kept on disk
under a byte budget, evicted least-recently-used first.

    cache = await ChunkCache.open(root, worker, reactor, emit=audit_sink.emit)
    data = await cache.fetch(chunk_hash, client.chunk_get)

Every hit is re-hashed with BLAKE3 before it is returned; a file that fails
is dropped, audited as C{cache_corrupt} and reported as a miss, so corrupt
bytes are never served. L{ChunkCache.fetch} refetches through the caller's
fetcher and coalesces concurrent fetches of one chunk.

Threading: call L{ChunkCache} only from the reactor thread. Every blocking
step (file I/O, hashing, SQLite) runs on the one worker passed to
L{ChunkCache.open}, which must run calls one at a time in submission order
(L{svc.worker.ThreadWorker} with C{threads=1}; C{ImmediateWorker} in
tests). The in-memory L{LruTable} is the authority while the cache is open:
each operation changes it before submitting its disk step, and the serial
worker applies the disk steps in the same order, so the table, the files
and the index agree without locks. Lookups that miss never touch the worker.

Writes: L{ChunkCache.put} writes one chunk per disk step, for a caller
that waits (a fetched chunk is returned once it is verified and stored);
L{ChunkCache.put_soon}, for the chunks the mount uploads, which nobody
waits for, gathers them into one disk step per batch. The disk steps, in
the table's order, and those batches are L{svc.mount.chunks.cache_steps}.

Recency: a hit moves the chunk to the most-recently-used end of the table
at once; the index row's C{last_used_ms} is written later, in one batch,
C{recency_flush_seconds} after the first unflushed hit (and at
L{ChunkCache.close}): L{svc.mount.chunks.cache_recency}.

The format, eviction policy and audit lines are specified in
C{docs/specifications/chunk-cache.md}.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Final

import attrs
from twisted.internet.defer import Deferred, fail, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure

from svc.audit.client_events import EvictionReason, cache_corrupt_event, cache_evicted_event
from svc.audit.events import AuditEvent
from svc.buffer_pool import is_immutable
from svc.mount.chunks.cache_index import (
    CacheDisk,
    CacheInUse,
    ChunkBytesMismatch,
    CorruptChunk,
    ReadResult,
)
from svc.mount.chunks.cache_policy import (
    DEFAULT_BUDGET_BYTES,
    CacheLimits,
    CacheSlot,
    LruTable,
    cache_root_from_environ,
    check_chunk_hash,
)
from svc.mount.chunks.cache_recency import RecencyLog
from svc.mount.chunks.cache_steps import CacheClock, DiskSteps
from svc.worker import IWorker

__all__ = [
    "DEFAULT_BUDGET_BYTES",
    "RECENCY_FLUSH_SECONDS",
    "CacheClosed",
    "CacheInUse",
    "CacheLimits",
    "CacheUsage",
    "ChunkBytesMismatch",
    "ChunkCache",
    "EvictionRun",
    "cache_root_from_environ",
]

RECENCY_FLUSH_SECONDS: Final = 30.0
"""Default delay between the first unflushed hit and the batch that records it."""


class CacheClosed(RuntimeError):
    """The cache was used after L{ChunkCache.close}."""


@attrs.frozen
class CacheUsage:
    """What the cache holds (including chunks still being written) and its limits."""

    bytes_used: int
    chunk_count: int
    limits: CacheLimits


@attrs.frozen
class EvictionRun:
    """One eviction run: why, how many bytes and chunks it removed."""

    reason: EvictionReason
    bytes_freed: int
    chunks_evicted: int


def _ms(seconds: float) -> int:
    return int(seconds * 1000)


class ChunkCache:
    """
    The chunk cache of one mount client. Build it with L{ChunkCache.open}.
    """

    log = Logger()

    def __init__(
        self,
        disk: CacheDisk,
        rows_lru_first: Iterable[tuple[str, int, int]],
        worker: IWorker,
        clock: CacheClock,
        limits: CacheLimits,
        emit: Callable[[AuditEvent], object],
        recency_flush_seconds: float,
    ) -> None:
        self._disk = disk
        self._clock = clock
        self._limits = limits
        self._emit = emit
        self._table = LruTable()
        for name, size, last_used_ms in rows_lru_first:
            self._table.add(CacheSlot(name, size, last_used_ms, ready=True))
        self._steps = DiskSteps(disk, worker, clock, self._table, self.log)
        self._recency = RecencyLog(clock, recency_flush_seconds, self._table, self._record_use)
        self._fetches: dict[str, list[Deferred[bytes]]] = {}
        self._closed = False

    @classmethod
    def open(
        cls,
        root: Path,
        worker: IWorker,
        clock: CacheClock,
        *,
        emit: Callable[[AuditEvent], object],
        budget_bytes: int = DEFAULT_BUDGET_BYTES,
        high_water: int | None = None,
        low_water: int | None = None,
        recency_flush_seconds: float = RECENCY_FLUSH_SECONDS,
    ) -> Deferred[ChunkCache]:
        """
        Open (creating if needed) the cache at C{root} and reconcile its
        index with its files. Water marks default to 95% and 80% of
        C{budget_bytes}; bad limits raise L{ValueError} at once. If the
        reconciled cache is above the high-water mark (the budget was
        lowered, or files were adopted), it is trimmed before the result
        fires. Fails with L{CacheInUse} if another open cache holds C{root}.
        """
        limits = CacheLimits.for_budget(budget_bytes, high_water=high_water, low_water=low_water)
        if recency_flush_seconds <= 0:
            raise ValueError(f"recency_flush_seconds must be positive, got {recency_flush_seconds}")

        async def opening() -> ChunkCache:
            disk, _report, rows = await worker.submit(lambda: CacheDisk.open(Path(root)))
            cache = cls(
                disk,
                ((row.hash, row.size, row.last_used_ms) for row in rows),
                worker,
                clock,
                limits,
                emit,
                recency_flush_seconds,
            )
            if cache._table.bytes_used > limits.high_water_bytes:
                await cache.trim()
            return cache

        return Deferred.fromCoroutine(opening())

    # Queries -----------------------------------------------------------------

    def usage(self) -> CacheUsage:
        """Bytes and chunks held now, counting chunks still being written."""
        return CacheUsage(self._table.bytes_used, len(self._table), self._limits)

    def contains(self, hashes: Iterable[str]) -> frozenset[str]:
        """
        The members of C{hashes} the cache holds or is storing. A later
        L{get} of one may still miss (eviction, a corrupt file).
        """
        self._check_open()
        return frozenset(h for h in map(check_chunk_hash, hashes) if h in self._table)

    # Reads -------------------------------------------------------------------

    def get(self, chunk_hash: str) -> Deferred[bytes | None]:
        """
        The chunk's bytes, re-hashed and verified on the worker, or L{None}
        on a miss. A cached file that fails verification is removed, audited
        (C{cache_corrupt}) and reported as a miss. A chunk whose store is in
        progress is answered when the store finishes.
        """
        try:
            self._check_open()
            name = check_chunk_hash(chunk_hash)
        except (CacheClosed, ValueError):
            return fail()
        slot = self._table.get(name)
        if slot is None:
            return succeed(None)
        if not slot.ready:
            return self._steps.written(slot)
        reading = self._steps.submit(lambda: self._disk.read(name, slot.size))
        return reading.addCallback(self._read_done, slot)

    def _read_done(self, result: ReadResult, slot: CacheSlot) -> bytes | None:
        if isinstance(result, bytes):
            if self._table.touch(slot, _ms(self._clock.seconds())):
                self._recency.note(slot.hash)
            return result
        # The worker already removed the file and row; forget the slot
        # unless something replaced it since.
        self._table.remove(slot)
        self._recency.forget(slot.hash)
        if isinstance(result, CorruptChunk):
            self.log.warn("Cached chunk {hash} failed BLAKE3 verification; dropped", hash=slot.hash)
            self._emit(
                cache_corrupt_event(
                    ts=self._clock.seconds(), chunk_hash=slot.hash, size=result.size
                )
            )
        else:
            self.log.warn(
                "Cached chunk {hash} unreadable ({reason}); dropped",
                hash=slot.hash,
                reason=result.reason,
            )
        return None

    def fetch(self, chunk_hash: str, fetcher: Callable[[str], Deferred[bytes]]) -> Deferred[bytes]:
        """
        The chunk's bytes from the cache, or else from C{fetcher(chunk_hash)},
        verified and stored before they are returned. Concurrent fetches of
        one chunk share a single C{fetcher} call. Fails with
        L{ChunkBytesMismatch} if the fetched bytes do not hash to
        C{chunk_hash} (nothing is cached), or with the fetcher's failure.
        """
        try:
            self._check_open()
            name = check_chunk_hash(chunk_hash)
        except (CacheClosed, ValueError):
            return fail()
        result: Deferred[bytes] = Deferred()
        waiters = self._fetches.get(name)
        if waiters is not None:
            waiters.append(result)
            return result
        self._fetches[name] = [result]

        async def fetching() -> bytes:
            cached = await self.get(name)
            if cached is not None:
                return cached
            data = await fetcher(name)
            await self.put(name, data)
            return data

        def deliver(outcome: bytes | Failure) -> None:
            for waiter in self._fetches.pop(name):
                if isinstance(outcome, Failure):
                    waiter.errback(outcome)
                else:
                    waiter.callback(outcome)

        Deferred.fromCoroutine(fetching()).addBoth(deliver)
        return result

    # Writes ------------------------------------------------------------------

    def put(self, chunk_hash: str, data: bytes | memoryview) -> Deferred[None]:
        """
        Cache C{data} (C{bytes}, or a view that cannot change:
        L{svc.buffer_pool.is_immutable}) as chunk C{chunk_hash}. The bytes are always hashed on
        the worker first and refused with L{ChunkBytesMismatch} if they do
        not match; a chunk already held is not written again. Caching is
        best effort: a chunk larger than the budget, or a disk or index
        failure (logged), leaves the chunk uncached and still succeeds. May
        start an eviction run (reason C{high_water}) to make room.
        """
        try:
            self._check_open()
            name = check_chunk_hash(chunk_hash)
            if not isinstance(data, bytes) and not (
                isinstance(data, memoryview) and is_immutable(data)
            ):
                raise TypeError(f"chunk data must be immutable bytes, got {type(data).__name__}")
        except (CacheClosed, ValueError, TypeError):
            return fail()
        size = len(data)
        if name in self._table or not self._limits.admits(size):
            return self._steps.submit(lambda: self._disk.verify(name, data))
        return self._steps.write(self._new_slot(name, size), data)

    def put_soon(self, chunk_hash: str, data: bytes | memoryview) -> None:
        """
        Cache C{data} as chunk C{chunk_hash} as L{put} does, for a chunk
        nobody waits for (one the mount just uploaded), sharing one disk
        step (one worker call, one index transaction) with the others put
        this way (L{DiskSteps.batch}). Meanwhile the chunk
        counts as held; a L{get} of it, and any other disk step, writes the
        batch at once. Failures (a mismatch, a bad name included) are
        logged; a chunk already held, or larger than the budget, is skipped,
        and nothing is cached once the cache is closed.
        """
        if self._closed:
            return
        try:
            name = check_chunk_hash(chunk_hash)
            if not isinstance(data, bytes) and not (
                isinstance(data, memoryview) and is_immutable(data)
            ):
                raise TypeError(f"chunk data must be immutable bytes, got {type(data).__name__}")
        except (ValueError, TypeError) as err:
            self.log.warn("Chunk cache refused {hash}: {error}", hash=chunk_hash, error=str(err))
            return
        size = len(data)
        if name in self._table or not self._limits.admits(size):
            return
        self._steps.batch(self._new_slot(name, size), data)

    def _new_slot(self, name: str, size: int) -> CacheSlot:
        """A slot for a chunk about to be written, room made for it first."""
        target = self._limits.eviction_target(self._table.bytes_used, size)
        if target is not None:
            self._evict(target, EvictionReason.HIGH_WATER)
        slot = CacheSlot(name, size, _ms(self._clock.seconds()), ready=False)
        self._table.add(slot)
        return slot

    def discard(self, chunk_hash: str) -> Deferred[None]:
        """Remove the chunk from the cache if it is there."""
        try:
            self._check_open()
            name = check_chunk_hash(chunk_hash)
        except (CacheClosed, ValueError):
            return fail()
        slot = self._table.get(name)
        if slot is None:
            return succeed(None)
        self._table.remove(slot)
        self._recency.forget(name)
        return self._steps.submit(lambda: self._disk.delete([name]))

    # Eviction ----------------------------------------------------------------

    def trim(self) -> Deferred[EvictionRun]:
        """
        Evict least-recently-used chunks until usage is at or under the
        low-water mark (reason C{low_water}); nothing if it already is.
        Run by L{open} when the cache starts above the high-water mark, and
        available to the mount for housekeeping.
        """
        if self._closed:
            return fail(CacheClosed("chunk cache is closed"))
        return self._evict(self._limits.low_water_bytes, EvictionReason.LOW_WATER)

    def _evict(self, target_bytes: int, reason: EvictionReason) -> Deferred[EvictionRun]:
        """
        Remove the least recently used chunks to bring usage to
        C{target_bytes}; one C{cache_evicted} line once their files are gone
        (none if nothing was evicted).
        """
        victims = self._table.victims(target_bytes)
        if not victims:
            return succeed(EvictionRun(reason, 0, 0))
        for slot in victims:
            self._table.remove(slot)
            self._recency.forget(slot.hash)
        run = EvictionRun(reason, sum(slot.size for slot in victims), len(victims))
        names = [slot.hash for slot in victims]

        def deleted(_: None) -> EvictionRun:
            self.log.info(
                "Chunk cache evicted {count} chunks ({bytes} bytes, {reason})",
                count=run.chunks_evicted,
                bytes=run.bytes_freed,
                reason=reason.value,
            )
            self._emit(
                cache_evicted_event(
                    ts=self._clock.seconds(),
                    bytes_freed=run.bytes_freed,
                    chunks_evicted=run.chunks_evicted,
                    reason=reason,
                )
            )
            return run

        return self._steps.submit(lambda: self._disk.delete(names)).addCallback(deleted)

    # Recency and lifetime ----------------------------------------------------

    def _record_use(self, uses: list[tuple[str, int]]) -> None:
        """Write the recency L{RecencyLog} flushes."""
        self._steps.submit(lambda: self._disk.record_use(uses)).addErrback(
            lambda failure: self.log.failure("Chunk cache recency flush failed", failure)
        )

    def close(self) -> Deferred[None]:
        """
        Write pending recency, close the index and release the cache root.
        Runs after every disk step already submitted; idempotent.
        """
        if self._closed:
            return succeed(None)
        self._closed = True
        uses = self._recency.stop()

        def closing() -> None:
            try:
                if uses:
                    self._disk.record_use(uses)
            finally:
                self._disk.close()

        return self._steps.submit(closing)

    def _check_open(self) -> None:
        if self._closed:
            raise CacheClosed("chunk cache is closed")
