"""
Tests for L{svc.mount.chunks.cache.ChunkCache}: storing, verified reads, fetching
with coalescing, and what runs in which order on the worker.
"""

from __future__ import annotations

import os

from twisted.internet.defer import Deferred, fail, succeed
from twisted.trial.unittest import SynchronousTestCase

from svc.audit.names import EventName
from svc.mount.chunks.cache import RECENCY_FLUSH_SECONDS, CacheClosed, ChunkBytesMismatch
from svc.mount.chunks.cache_steps import BATCH_DELAY_SECONDS, BATCH_MAX_BYTES, BATCH_MAX_CHUNKS
from svc.mount.test.test_cache_support import chunk, open_cache
from svc.testing.worker import ImmediateWorker, ManualWorker


class StoreAndReadTests(SynchronousTestCase):
    """
    L{ChunkCache.put}, L{ChunkCache.get}, L{ChunkCache.contains},
    L{ChunkCache.discard} and L{ChunkCache.usage}.
    """

    def test_round_trip(self) -> None:
        """A stored chunk is read back with the same bytes, from its layout path."""
        opened = open_cache(self)
        name, data = chunk(1)
        self.assertIsNone(self.successResultOf(opened.cache.put(name, data)))
        self.assertEqual(self.successResultOf(opened.cache.get(name)), data)
        self.assertEqual(opened.file_of(name).read_bytes(), data)
        self.assertEqual(opened.file_of(name).parent.name, name[:2])
        self.assertEqual(opened.index_rows()[name][0], len(data))

    def test_files_private(self) -> None:
        """Chunk files are mode 0600 and leave no temporary file behind."""
        opened = open_cache(self)
        name, data = chunk(1)
        self.successResultOf(opened.cache.put(name, data))
        self.assertEqual(os.stat(opened.file_of(name)).st_mode & 0o777, 0o600)
        self.assertEqual(os.listdir(opened.file_of(name).parent), [name])

    def test_miss_without_worker(self) -> None:
        """A chunk never stored is a miss answered without a trip to the worker."""
        worker = ImmediateWorker()
        opened = open_cache(self, worker=worker)
        calls = worker.calls
        self.assertIsNone(self.successResultOf(opened.cache.get(chunk(9)[0])))
        self.assertEqual(worker.calls, calls)

    def test_usage_and_contains(self) -> None:
        """Usage counts the bytes and chunks held; contains names the held subset."""
        opened = open_cache(self)
        (a, data_a), (b, data_b), (c, _) = chunk(1, 100), chunk(2, 40), chunk(3)
        self.successResultOf(opened.cache.put(a, data_a))
        self.successResultOf(opened.cache.put(b, data_b))
        usage = opened.cache.usage()
        self.assertEqual((usage.bytes_used, usage.chunk_count), (140, 2))
        self.assertEqual(opened.cache.contains([a, c, b]), frozenset({a, b}))

    def test_discard(self) -> None:
        """Discarding a chunk removes its file, row and bytes from usage."""
        opened = open_cache(self)
        name, data = chunk(1)
        self.successResultOf(opened.cache.put(name, data))
        self.successResultOf(opened.cache.discard(name))
        self.assertIsNone(self.successResultOf(opened.cache.get(name)))
        self.assertFalse(opened.file_of(name).exists())
        self.assertEqual(opened.index_rows(), {})
        self.assertEqual(opened.cache.usage().bytes_used, 0)

    def test_put_refuses_mismatch(self) -> None:
        """Bytes that do not hash to the name are refused and nothing is stored."""
        opened = open_cache(self)
        name, _ = chunk(1)
        _, other = chunk(2)
        failure = self.failureResultOf(opened.cache.put(name, other), ChunkBytesMismatch)
        self.assertEqual(failure.value.expected, name)
        self.assertFalse(opened.file_of(name).exists())
        self.assertEqual(opened.cache.contains([name]), frozenset())
        self.assertEqual(opened.cache.usage().bytes_used, 0)

    def test_put_refuses_mismatch_when_present(self) -> None:
        """Wrong bytes are refused even for a chunk already held, which stays intact."""
        opened = open_cache(self)
        name, data = chunk(1)
        self.successResultOf(opened.cache.put(name, data))
        self.failureResultOf(opened.cache.put(name, chunk(2)[1]), ChunkBytesMismatch)
        self.assertEqual(self.successResultOf(opened.cache.get(name)), data)

    def test_put_present_is_noop(self) -> None:
        """Storing a chunk already held leaves usage and its file unchanged."""
        opened = open_cache(self)
        name, data = chunk(1)
        self.successResultOf(opened.cache.put(name, data))
        inode = os.stat(opened.file_of(name)).st_ino
        self.successResultOf(opened.cache.put(name, data))
        self.assertEqual(os.stat(opened.file_of(name)).st_ino, inode)
        self.assertEqual(opened.cache.usage().bytes_used, len(data))

    def test_rejects_bad_names(self) -> None:
        """A name that is not 64 lowercase hex digits is refused before any file access."""
        opened = open_cache(self)
        for bad in ("../../etc/passwd", "AB" * 32, "ab" * 31):
            self.failureResultOf(opened.cache.get(bad), ValueError)
            self.failureResultOf(opened.cache.put(bad, b"x"), ValueError)
        self.assertRaises(ValueError, opened.cache.contains, ["zz"])

    def test_put_requires_bytes(self) -> None:
        """Mutable buffers are refused, so the worker never reads changing bytes."""
        opened = open_cache(self)
        name, data = chunk(1)
        self.failureResultOf(opened.cache.put(name, bytearray(data)), TypeError)  # type: ignore[arg-type]
        self.failureResultOf(opened.cache.put(name, memoryview(bytearray(data))), TypeError)

    def test_put_takes_a_view_of_bytes(self) -> None:
        """A view of part of a larger bytes object is cached as exactly the bytes it shows."""
        opened = open_cache(self)
        name, data = chunk(1)
        larger = b"before" + data + b"after"
        self.successResultOf(opened.cache.put(name, memoryview(larger)[6 : 6 + len(data)]))
        self.assertEqual(self.successResultOf(opened.cache.get(name)), data)

    def test_closed(self) -> None:
        """After close every operation fails with CacheClosed."""
        opened = open_cache(self)
        name, data = chunk(1)
        self.successResultOf(opened.cache.close())
        self.failureResultOf(opened.cache.get(name), CacheClosed)
        self.failureResultOf(opened.cache.put(name, data), CacheClosed)
        self.failureResultOf(opened.cache.discard(name), CacheClosed)
        self.failureResultOf(opened.cache.trim(), CacheClosed)
        self.failureResultOf(opened.cache.fetch(name, lambda h: succeed(data)), CacheClosed)


class VerificationTests(SynchronousTestCase):
    """
    Every hit is re-hashed; corrupt files are dropped, audited and refetched.
    """

    def corrupt(self, path: os.PathLike[str], offset: int = 10) -> None:
        with open(path, "r+b") as f:
            f.seek(offset)
            byte = f.read(1)
            f.seek(offset)
            f.write(bytes([byte[0] ^ 0x01]))

    def test_flipped_byte_is_a_miss(self) -> None:
        """One flipped byte: get misses, the file and row go, and one cache_corrupt line."""
        opened = open_cache(self)
        name, data = chunk(1)
        self.successResultOf(opened.cache.put(name, data))
        self.corrupt(opened.file_of(name))
        self.assertIsNone(self.successResultOf(opened.cache.get(name)))
        self.assertFalse(opened.file_of(name).exists())
        self.assertEqual(opened.index_rows(), {})
        self.assertEqual(opened.cache.usage().bytes_used, 0)
        [event] = opened.events
        self.assertEqual(event.event, EventName.CACHE_CORRUPT)
        self.assertEqual(
            (event.path, event.size, event.allowed, event.command), (name, len(data), False, None)
        )
        self.assertEqual((event.agent_pid, event.uid, event.gid), (None, None, None))

    def test_fetch_refetches_corrupt(self) -> None:
        """fetch over a corrupt file returns the fetcher's good bytes and caches them again."""
        opened = open_cache(self)
        name, data = chunk(1)
        self.successResultOf(opened.cache.put(name, data))
        self.corrupt(opened.file_of(name))
        calls: list[str] = []

        def fetcher(h: str) -> Deferred[bytes]:
            calls.append(h)
            return succeed(data)

        self.assertEqual(self.successResultOf(opened.cache.fetch(name, fetcher)), data)
        self.assertEqual(calls, [name])
        self.assertEqual(opened.event_names(), [EventName.CACHE_CORRUPT])
        self.assertEqual(opened.file_of(name).read_bytes(), data)
        self.assertEqual(self.successResultOf(opened.cache.get(name)), data)

    def test_truncated_and_grown(self) -> None:
        """A file shorter or longer than the chunk is corrupt too."""
        opened = open_cache(self)
        (a, data_a), (b, data_b) = chunk(1), chunk(2)
        self.successResultOf(opened.cache.put(a, data_a))
        self.successResultOf(opened.cache.put(b, data_b))
        opened.file_of(a).write_bytes(data_a[:-1])
        opened.file_of(b).write_bytes(data_b + b"\0")
        self.assertIsNone(self.successResultOf(opened.cache.get(a)))
        self.assertIsNone(self.successResultOf(opened.cache.get(b)))
        self.assertEqual(opened.event_names(), [EventName.CACHE_CORRUPT] * 2)

    def test_missing_file(self) -> None:
        """A file removed behind the cache's back is a plain miss, not audited as corrupt."""
        opened = open_cache(self)
        name, data = chunk(1)
        self.successResultOf(opened.cache.put(name, data))
        opened.file_of(name).unlink()
        self.assertIsNone(self.successResultOf(opened.cache.get(name)))
        self.assertEqual(opened.events, [])
        self.assertEqual(opened.index_rows(), {})
        self.assertEqual(opened.cache.contains([name]), frozenset())


class FetchTests(SynchronousTestCase):
    """
    L{ChunkCache.fetch}: cache first, then the fetcher, verified, coalesced.
    """

    def test_hit_skips_fetcher(self) -> None:
        """A cached chunk is returned without calling the fetcher."""
        opened = open_cache(self)
        name, data = chunk(1)
        self.successResultOf(opened.cache.put(name, data))
        result = opened.cache.fetch(name, lambda h: fail(AssertionError("fetched")))
        self.assertEqual(self.successResultOf(result), data)

    def test_miss_fetches_and_stores(self) -> None:
        """A miss calls the fetcher once and caches what it returned."""
        opened = open_cache(self)
        name, data = chunk(1)
        self.assertEqual(
            self.successResultOf(opened.cache.fetch(name, lambda h: succeed(data))), data
        )
        self.assertEqual(opened.file_of(name).read_bytes(), data)

    def test_coalesced(self) -> None:
        """Two concurrent fetches of one chunk make one fetcher call and both get the bytes."""
        opened = open_cache(self)
        name, data = chunk(1)
        pending: list[Deferred[bytes]] = []

        def fetcher(h: str) -> Deferred[bytes]:
            pending.append(Deferred())
            return pending[-1]

        first = opened.cache.fetch(name, fetcher)
        second = opened.cache.fetch(name, fetcher)
        self.assertNoResult(first)
        self.assertNoResult(second)
        self.assertEqual(len(pending), 1)
        pending[0].callback(data)
        self.assertEqual(self.successResultOf(first), data)
        self.assertEqual(self.successResultOf(second), data)
        self.assertEqual(opened.cache.contains([name]), frozenset({name}))

    def test_failure_reaches_every_waiter(self) -> None:
        """A fetcher failure fails every coalesced fetch; the next fetch tries again."""
        opened = open_cache(self)
        name, data = chunk(1)
        pending: list[Deferred[bytes]] = []

        def fetcher(h: str) -> Deferred[bytes]:
            pending.append(Deferred())
            return pending[-1]

        first, second = opened.cache.fetch(name, fetcher), opened.cache.fetch(name, fetcher)
        pending[0].errback(ConnectionError("lost"))
        self.failureResultOf(first, ConnectionError)
        self.failureResultOf(second, ConnectionError)
        third = opened.cache.fetch(name, fetcher)
        self.assertEqual(len(pending), 2)
        pending[1].callback(data)
        self.assertEqual(self.successResultOf(third), data)

    def test_wrong_bytes_refused(self) -> None:
        """Fetched bytes that do not hash to the name fail the fetch and are not cached."""
        opened = open_cache(self)
        name, _ = chunk(1)
        result = opened.cache.fetch(name, lambda h: succeed(chunk(2)[1]))
        self.failureResultOf(result, ChunkBytesMismatch)
        self.assertEqual(opened.cache.contains([name]), frozenset())
        self.assertFalse(opened.file_of(name).exists())


class OrderingTests(SynchronousTestCase):
    """
    Operations that overlap on a serial worker keep table, files and index in step.
    """

    def test_get_waits_for_pending_put(self) -> None:
        """A get during a put is answered with the stored bytes once the put finishes."""
        worker = ManualWorker()
        opened = open_cache(self, worker=worker)
        name, data = chunk(1)
        putting = opened.cache.put(name, data)
        getting = opened.cache.get(name)
        self.assertNoResult(getting)
        worker.run()
        self.successResultOf(putting)
        self.assertEqual(self.successResultOf(getting), data)

    def test_get_during_refused_put_misses(self) -> None:
        """A get waiting on a put that is refused is a miss."""
        worker = ManualWorker()
        opened = open_cache(self, worker=worker)
        name, _ = chunk(1)
        putting = opened.cache.put(name, chunk(2)[1])
        getting = opened.cache.get(name)
        worker.run()
        self.failureResultOf(putting, ChunkBytesMismatch)
        self.assertIsNone(self.successResultOf(getting))

    def test_discard_during_read(self) -> None:
        """A read submitted before a discard still returns the verified bytes; then it is gone."""
        worker = ManualWorker()
        opened = open_cache(self, worker=worker)
        name, data = chunk(1)
        opened.cache.put(name, data)
        worker.run()
        getting = opened.cache.get(name)
        discarding = opened.cache.discard(name)
        worker.run()
        self.assertEqual(self.successResultOf(getting), data)
        self.successResultOf(discarding)
        self.assertFalse(opened.file_of(name).exists())
        self.assertEqual(opened.cache.contains([name]), frozenset())

    def test_discard_then_put_during_corrupt_read(self) -> None:
        """A corrupt read overtaken by discard and a fresh put leaves the fresh chunk cached."""
        worker = ManualWorker()
        opened = open_cache(self, worker=worker)
        name, data = chunk(1)
        opened.cache.put(name, data)
        worker.run()
        opened.file_of(name).write_bytes(b"junk")
        getting = opened.cache.get(name)
        opened.cache.discard(name)
        putting = opened.cache.put(name, data)
        worker.run()
        self.assertIsNone(self.successResultOf(getting))
        self.successResultOf(putting)
        self.assertEqual(opened.cache.contains([name]), frozenset({name}))
        self.assertEqual(opened.file_of(name).read_bytes(), data)
        self.assertEqual(opened.cache.usage().bytes_used, len(data))


class RecencyFlushTests(SynchronousTestCase):
    """
    Hits update the index in batches, not one SQLite write per hit.
    """

    def test_hits_batched(self) -> None:
        """Hits reach the index only when the flush delay has passed, in one batch."""
        opened = open_cache(self)
        (a, data_a), (b, data_b) = chunk(1), chunk(2)
        self.successResultOf(opened.cache.put(a, data_a))
        self.successResultOf(opened.cache.put(b, data_b))
        opened.clock.advance(5)
        self.successResultOf(opened.cache.get(a))
        self.successResultOf(opened.cache.get(b))
        self.assertEqual(opened.index_rows()[a][1], 0)
        self.assertEqual(len(opened.clock.getDelayedCalls()), 1)
        opened.clock.advance(RECENCY_FLUSH_SECONDS)
        rows = opened.index_rows()
        self.assertEqual((rows[a][1], rows[b][1]), (5000, 5000))
        self.assertEqual(opened.clock.getDelayedCalls(), [])

    def test_close_flushes(self) -> None:
        """Close writes unflushed recency and leaves no delayed call behind."""
        opened = open_cache(self)
        name, data = chunk(1)
        self.successResultOf(opened.cache.put(name, data))
        opened.clock.advance(7)
        self.successResultOf(opened.cache.get(name))
        self.successResultOf(opened.cache.close())
        self.assertEqual(opened.clock.getDelayedCalls(), [])
        self.assertEqual(opened.index_rows()[name][1], 7000)


class PutSoonTests(SynchronousTestCase):
    """
    L{ChunkCache.put_soon} gathers the chunks the mount uploads into one
    disk step per batch, without breaking the table's order.
    """

    def test_batch_written_after_the_delay_in_one_step(self) -> None:
        """Chunks put within the delay are written by one worker call, then read back."""
        worker = ImmediateWorker()
        opened = open_cache(self, worker=worker)
        chunks = [chunk(seed) for seed in range(5)]
        calls = worker.calls
        for name, data in chunks:
            opened.cache.put_soon(name, data)
        self.assertEqual(worker.calls, calls)
        self.assertEqual(
            opened.cache.contains([name for name, _ in chunks]), {n for n, _ in chunks}
        )
        self.assertEqual(opened.index_rows(), {})
        opened.clock.advance(BATCH_DELAY_SECONDS)
        self.assertEqual(worker.calls, calls + 1)
        self.assertEqual(opened.clock.getDelayedCalls(), [])
        self.assertEqual(sorted(opened.index_rows()), sorted(name for name, _ in chunks))
        for name, data in chunks:
            self.assertEqual(opened.file_of(name).read_bytes(), data)
            self.assertEqual(self.successResultOf(opened.cache.get(name)), data)

    def test_full_batch_written_at_once(self) -> None:
        """A batch reaching its chunk or byte limit is written without waiting."""
        worker = ImmediateWorker()
        opened = open_cache(self, worker=worker)
        for seed in range(BATCH_MAX_CHUNKS):
            opened.cache.put_soon(*chunk(seed))
        self.assertEqual(len(opened.index_rows()), BATCH_MAX_CHUNKS)
        big_name, big = chunk(1000, BATCH_MAX_BYTES)
        opened.cache.put_soon(big_name, big)
        self.assertIn(big_name, opened.index_rows())
        self.assertEqual(opened.clock.getDelayedCalls(), [])

    def test_get_of_a_waiting_chunk_writes_the_batch(self) -> None:
        """A get of a chunk still waiting writes the batch at once and answers its bytes."""
        worker = ManualWorker()
        opened = open_cache(self, worker=worker)
        name, data = chunk(1)
        opened.cache.put_soon(name, data)
        getting = opened.cache.get(name)
        self.assertNoResult(getting)
        worker.run()
        self.assertEqual(self.successResultOf(getting), data)
        self.assertEqual(opened.clock.getDelayedCalls(), [])

    def test_discard_of_a_waiting_chunk_follows_its_write(self) -> None:
        """
        A discard of a chunk still waiting removes it for good: its write is
        submitted first, so no file or row is left behind.
        """
        worker = ManualWorker()
        opened = open_cache(self, worker=worker)
        name, data = chunk(1)
        opened.cache.put_soon(name, data)
        discarding = opened.cache.discard(name)
        worker.run()
        self.successResultOf(discarding)
        self.assertFalse(opened.file_of(name).exists())
        self.assertEqual(opened.index_rows(), {})
        self.assertEqual(opened.cache.contains([name]), frozenset())
        self.assertEqual(opened.cache.usage().bytes_used, 0)

    def test_refused_chunk_is_dropped_and_the_rest_stored(self) -> None:
        """Bytes that do not match their name are not cached; the batch's others are."""
        opened = open_cache(self)
        (good, data), (bad, _) = chunk(1), chunk(2)
        opened.cache.put_soon(bad, chunk(3)[1])
        opened.cache.put_soon(good, data)
        opened.clock.advance(BATCH_DELAY_SECONDS)
        self.assertEqual(opened.cache.contains([good, bad]), frozenset({good}))
        self.assertEqual(sorted(opened.index_rows()), [good])
        self.assertFalse(opened.file_of(bad).exists())

    def test_close_writes_the_waiting_batch(self) -> None:
        """Closing writes the chunks still waiting and leaves no delayed call behind."""
        opened = open_cache(self)
        name, data = chunk(1)
        opened.cache.put_soon(name, data)
        self.successResultOf(opened.cache.close())
        self.assertEqual(opened.clock.getDelayedCalls(), [])
        self.assertEqual(opened.file_of(name).read_bytes(), data)
        self.assertIn(name, opened.index_rows())
        opened.cache.put_soon(*chunk(2))  # closed: nothing happens
        self.assertEqual(len(opened.index_rows()), 1)
