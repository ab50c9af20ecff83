"""
Tests for the chunk cache's LRU eviction: water marks, budget, audit lines.
"""

from __future__ import annotations

import os
import random
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from svc.audit.client_events import EvictionReason
from svc.audit.names import EventName
from svc.mount.chunks.cache import EvictionRun
from svc.mount.chunks.cache_index import CHUNKS_DIR_NAME
from svc.mount.test.test_cache_support import Opened, chunk, open_cache
from svc.testing.worker import ManualWorker

# A budget of ten 100-byte chunks: eviction starts above 900, stops at 500.
LIMITS: dict[str, Any] = {"budget_bytes": 1000, "high_water": 900, "low_water": 500}


def fill(case: SynchronousTestCase, opened: Opened, seeds: range, size: int = 100) -> list[str]:
    names = []
    for seed in seeds:
        name, data = chunk(seed, size)
        case.successResultOf(opened.cache.put(name, data))
        opened.clock.advance(1)
        names.append(name)
    return names


def bytes_on_disk(opened: Opened) -> int:
    total = 0
    for directory, _, files in os.walk(opened.root / CHUNKS_DIR_NAME):
        total += sum(os.path.getsize(os.path.join(directory, name)) for name in files)
    return total


class WaterMarkTests(SynchronousTestCase):
    """
    A put that crosses the high-water mark evicts down to the low-water mark.
    """

    def test_no_eviction_up_to_high_water(self) -> None:
        """Usage may reach the high-water mark without any eviction."""
        opened = open_cache(self, **LIMITS)
        fill(self, opened, range(9))
        self.assertEqual(opened.cache.usage().bytes_used, 900)
        self.assertEqual(opened.events, [])

    def test_crossing_high_water(self) -> None:
        """Crossing high water evicts the oldest chunks to low water: one cache_evicted line."""
        opened = open_cache(self, **LIMITS)
        names = fill(self, opened, range(10))
        self.assertEqual(opened.cache.usage().bytes_used, 500)
        self.assertEqual(opened.cache.contains(names), frozenset(names[5:]))
        [event] = opened.events
        self.assertEqual(event.event, EventName.CACHE_EVICTED)
        self.assertEqual((event.path, event.allowed, event.size), ("", True, 500))
        self.assertEqual(dict(event.extra), {"chunks_reused": 5, "reason": "high_water"})
        self.assertEqual(set(opened.index_rows()), set(names[5:]))
        self.assertEqual(bytes_on_disk(opened), 500)

    def test_hysteresis(self) -> None:
        """After a run, no further eviction happens until high water is crossed again."""
        opened = open_cache(self, **LIMITS)
        fill(self, opened, range(14))
        self.assertEqual(len(opened.events), 1)
        fill(self, opened, range(14, 15))
        self.assertEqual(len(opened.events), 2)

    def test_lru_order(self) -> None:
        """A chunk read recently survives eviction; the least recently used go first."""
        opened = open_cache(self, **LIMITS)
        names = fill(self, opened, range(9))
        self.assertIsNotNone(self.successResultOf(opened.cache.get(names[0])))
        self.assertIsNotNone(self.successResultOf(opened.cache.get(names[2])))
        fill(self, opened, range(9, 10))
        survivors = opened.cache.contains(names)
        self.assertEqual(survivors, frozenset([names[0], names[2], *names[7:9]]))
        self.assertEqual(dict(opened.events[0].extra)["chunks_reused"], 5)

    def test_budget_never_exceeded(self) -> None:
        """Random chunk sizes never take usage or the files on disk over the budget."""
        opened = open_cache(self, **LIMITS)
        rng = random.Random(7)
        for seed in range(200):
            name, data = chunk(seed, rng.randrange(1, 400))
            self.successResultOf(opened.cache.put(name, data))
            usage = opened.cache.usage().bytes_used
            self.assertLessEqual(usage, 1000)
            self.assertEqual(bytes_on_disk(opened), usage)
        freed = sum(event.size or 0 for event in opened.events)
        self.assertTrue(freed > 0)

    def test_line_per_run_counts(self) -> None:
        """Each run's line carries exactly the bytes and chunk count it removed."""
        opened = open_cache(self, **LIMITS)
        fill(self, opened, range(4), size=200)
        fill(self, opened, range(4, 5), size=300)
        [event] = opened.events
        self.assertEqual((event.size, dict(event.extra)["chunks_reused"]), (600, 3))
        self.assertEqual(opened.cache.usage().bytes_used, 500)

    def test_oversized_chunk_not_cached(self) -> None:
        """A chunk larger than the budget is verified, not cached, and evicts nothing."""
        opened = open_cache(self, **LIMITS)
        names = fill(self, opened, range(3))
        big, data = chunk(99, 1001)
        self.successResultOf(opened.cache.put(big, data))
        self.assertEqual(opened.cache.contains([big, *names]), frozenset(names))
        self.assertEqual(opened.events, [])

    def test_chunk_between_low_water_and_budget(self) -> None:
        """A chunk bigger than low water but within budget empties the cache and is kept."""
        opened = open_cache(self, **LIMITS)
        fill(self, opened, range(3))
        big, data = chunk(99, 950)
        self.successResultOf(opened.cache.put(big, data))
        self.assertEqual(opened.cache.contains([big]), frozenset({big}))
        self.assertEqual(opened.cache.usage().bytes_used, 950)

    def test_read_in_flight_survives_eviction(self) -> None:
        """A read submitted before its chunk is evicted still returns the verified bytes."""
        worker = ManualWorker()
        opened = open_cache(self, worker=worker, **LIMITS)
        name, data = chunk(0)
        opened.cache.put(name, data)
        worker.run()
        getting = opened.cache.get(name)
        for seed in range(1, 10):
            opened.cache.put(*chunk(seed))
        worker.run()
        self.assertEqual(self.successResultOf(getting), data)
        self.assertNotIn(name, opened.cache.contains([name]))
        self.assertFalse(opened.file_of(name).exists())


class TrimTests(SynchronousTestCase):
    """
    L{ChunkCache.trim}: housekeeping down to low water, reason C{low_water}.
    """

    def test_trim(self) -> None:
        """trim evicts down to low water and reports the run in one low_water line."""
        opened = open_cache(self, **LIMITS)
        names = fill(self, opened, range(8))
        run = self.successResultOf(opened.cache.trim())
        self.assertEqual(run, EvictionRun(EvictionReason.LOW_WATER, 300, 3))
        self.assertEqual(opened.cache.contains(names), frozenset(names[3:]))
        [event] = opened.events
        self.assertEqual(
            (event.size, dict(event.extra)), (300, {"chunks_reused": 3, "reason": "low_water"})
        )

    def test_trim_under_low_water(self) -> None:
        """trim under the low-water mark evicts nothing and writes no line."""
        opened = open_cache(self, **LIMITS)
        fill(self, opened, range(5))
        run = self.successResultOf(opened.cache.trim())
        self.assertEqual(run, EvictionRun(EvictionReason.LOW_WATER, 0, 0))
        self.assertEqual(opened.events, [])
