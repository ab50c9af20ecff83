"""
Tests for L{svc.mount.chunks.cache_policy}: the cache root, limits and LRU table.
"""

from __future__ import annotations

from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from svc.config import ConfigError
from svc.mount.chunks.cache_policy import (
    DEFAULT_BUDGET_BYTES,
    CacheLimits,
    CacheSlot,
    LruTable,
    cache_root_from_environ,
)


class CacheRootTests(SynchronousTestCase):
    """
    L{cache_root_from_environ}: C{$XDG_CACHE_HOME/svc} else C{$HOME/.cache/svc}.
    """

    def test_xdg(self) -> None:
        """An absolute XDG_CACHE_HOME wins over HOME."""
        root = cache_root_from_environ({"XDG_CACHE_HOME": "/x/cache", "HOME": "/home/a"})
        self.assertEqual(root, Path("/x/cache/svc"))

    def test_home(self) -> None:
        """Without XDG_CACHE_HOME the root is under HOME/.cache."""
        self.assertEqual(cache_root_from_environ({"HOME": "/home/a"}), Path("/home/a/.cache/svc"))

    def test_empty_or_relative_xdg_ignored(self) -> None:
        """An empty or relative XDG_CACHE_HOME is ignored, as the XDG spec asks."""
        for xdg in ("", "relative/cache"):
            root = cache_root_from_environ({"XDG_CACHE_HOME": xdg, "HOME": "/home/a"})
            self.assertEqual(root, Path("/home/a/.cache/svc"))

    def test_neither(self) -> None:
        """With neither variable usable the error names HOME."""
        for environ in ({}, {"HOME": ""}, {"XDG_CACHE_HOME": "rel"}):
            error = self.assertRaises(ConfigError, cache_root_from_environ, environ)
            self.assertEqual(error.variable, "HOME")

    def test_relative_home(self) -> None:
        """A relative HOME is refused, naming HOME."""
        error = self.assertRaises(ConfigError, cache_root_from_environ, {"HOME": "home/a"})
        self.assertEqual(error.variable, "HOME")


class CacheLimitsTests(SynchronousTestCase):
    """
    L{CacheLimits}: the 2 GiB default budget and its water marks.
    """

    def test_defaults(self) -> None:
        """The default budget is 2 GiB, high water 95% and low water 80% of it."""
        limits = CacheLimits.for_budget()
        self.assertEqual(limits.budget_bytes, DEFAULT_BUDGET_BYTES)
        self.assertEqual(DEFAULT_BUDGET_BYTES, 2 * 1024**3)
        self.assertEqual(limits.high_water_bytes, DEFAULT_BUDGET_BYTES * 95 // 100)
        self.assertEqual(limits.low_water_bytes, DEFAULT_BUDGET_BYTES * 80 // 100)

    def test_order_enforced(self) -> None:
        """Limits need 0 <= low <= high <= budget and a positive budget."""
        for budget, high, low in ((100, 101, 50), (100, 50, 60), (100, 50, -1), (0, 0, 0)):
            self.assertRaises(
                ValueError,
                CacheLimits,
                budget_bytes=budget,
                high_water_bytes=high,
                low_water_bytes=low,
            )
        self.assertRaises(ValueError, CacheLimits.for_budget, 0)

    def test_eviction_target(self) -> None:
        """No eviction up to high water; beyond it, room for the chunk under low water."""
        limits = CacheLimits(budget_bytes=1000, high_water_bytes=900, low_water_bytes=500)
        self.assertIsNone(limits.eviction_target(800, 100))
        self.assertEqual(limits.eviction_target(850, 100), 400)
        self.assertEqual(limits.eviction_target(850, 700), 0)

    def test_admits(self) -> None:
        """Only chunks no larger than the budget may be cached."""
        limits = CacheLimits.for_budget(1000)
        self.assertTrue(limits.admits(1000))
        self.assertFalse(limits.admits(1001))


def slot(name: str, size: int = 10) -> CacheSlot:
    return CacheSlot(name, size, 0, ready=True)


class LruTableTests(SynchronousTestCase):
    """
    L{LruTable}: order, byte total, identity-checked removal.
    """

    def test_victims_oldest_first(self) -> None:
        """Victims are the least recently added or touched, just enough to reach the target."""
        table = LruTable()
        a, b, c = slot("a"), slot("b"), slot("c")
        for s in (a, b, c):
            table.add(s)
        self.assertTrue(table.touch(a, 5))
        self.assertEqual(table.victims(10), [b, c])
        self.assertEqual(table.victims(30), [])
        self.assertEqual(table.victims(-1), [b, c, a])
        self.assertEqual(table.bytes_used, 30)

    def test_remove_by_identity(self) -> None:
        """A removed slot cannot remove or touch a later slot of the same hash."""
        table = LruTable()
        old = slot("a")
        table.add(old)
        self.assertTrue(table.remove(old))
        new = slot("a", 20)
        table.add(new)
        self.assertFalse(table.remove(old))
        self.assertFalse(table.touch(old, 9))
        self.assertIs(table.get("a"), new)
        self.assertEqual(table.bytes_used, 20)

    def test_duplicate_add(self) -> None:
        """Adding a second slot for a hash already present is a bug, refused."""
        table = LruTable()
        table.add(slot("a"))
        self.assertRaises(KeyError, table.add, slot("a"))

    def test_touch_never_goes_back(self) -> None:
        """A touch with an older time keeps the newer last-used time."""
        table = LruTable()
        s = CacheSlot("a", 1, 50, ready=True)
        table.add(s)
        table.touch(s, 10)
        self.assertEqual(s.last_used_ms, 50)
