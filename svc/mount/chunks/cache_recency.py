"""
The chunk cache's recency, written later in one batch.

A hit moves the chunk to the most-recently-used end of the cache's table at
once (L{svc.mount.chunks.cache.ChunkCache}); L{RecencyLog} remembers which chunks
were hit, and their index rows' C{last_used_ms} are written in one disk
step C{delay} seconds after the first unflushed hit (and when the cache
closes), so a read-heavy workload does not write SQLite per hit. Losing
unflushed recency (a crash) only makes eviction order after the restart
slightly stale.

Call it only from the reactor thread.
"""

from __future__ import annotations

from collections.abc import Callable

from svc.mount.chunks.cache_policy import LruTable
from svc.mount.chunks.cache_steps import CacheClock, TimerCall

__all__ = ["RecencyLog"]


class RecencyLog:
    """The chunks hit since the last flush; see the module docstring."""

    def __init__(
        self,
        clock: CacheClock,
        delay: float,
        table: LruTable,
        flush: Callable[[list[tuple[str, int]]], object],
    ) -> None:
        """
        @param table: the cache's table, where each hit chunk's
            C{last_used_ms} is read when it is flushed.
        @param flush: writes C{(hash, last_used_ms)} pairs to the index.
        """
        self._clock = clock
        self._delay = delay
        self._table = table
        self._flush = flush
        self._used: set[str] = set()
        self._flush_call: TimerCall | None = None

    def note(self, name: str) -> None:
        """Chunk C{name} was hit: flushed within C{delay}."""
        self._used.add(name)
        if self._flush_call is None:
            self._flush_call = self._clock.callLater(self._delay, self._flush_recency)

    def forget(self, name: str) -> None:
        """Chunk C{name} left the cache: nothing to flush for it."""
        self._used.discard(name)

    def stop(self) -> list[tuple[str, int]]:
        """No flush from now on; the C{(hash, last_used_ms)} pairs not flushed yet."""
        if self._flush_call is not None and self._flush_call.active():
            self._flush_call.cancel()
        self._flush_call = None
        return self._recent_uses()

    def _recent_uses(self) -> list[tuple[str, int]]:
        uses = []
        for name in sorted(self._used):
            slot = self._table.get(name)
            if slot is not None:
                uses.append((name, slot.last_used_ms))
        self._used.clear()
        return uses

    def _flush_recency(self) -> None:
        self._flush_call = None
        uses = self._recent_uses()
        if uses:
            self._flush(uses)
