"""
The mount client's chunk cache, pure part: where the cache lives, its byte
budget and water marks, and the least-recently-used table that decides what
is evicted. Nothing here does I/O; L{svc.mount.chunks.cache} drives it and
C{docs/specifications/chunk-cache.md} describes the whole cache.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Final

import attrs

from svc.config import ConfigError

GIB: Final = 1024**3

DEFAULT_BUDGET_BYTES: Final = 2 * GIB
"""The specification's default client cache budget."""

HIGH_WATER_PERCENT: Final = 95
"""Default high-water mark, in percent of the budget."""

LOW_WATER_PERCENT: Final = 80
"""Default low-water mark, in percent of the budget."""

CACHE_DIR_NAME: Final = "svc"
"""The directory under C{$XDG_CACHE_HOME} (or C{$HOME/.cache})."""

_HASH: Final = re.compile(r"[0-9a-f]{64}")


def is_chunk_hash(value: object) -> bool:
    """Whether C{value} is a chunk name: 64 lowercase hex digits (BLAKE3-256)."""
    return isinstance(value, str) and _HASH.fullmatch(value) is not None


def check_chunk_hash(value: str) -> str:
    """Return C{value} if it is a chunk hash, else raise L{ValueError}."""
    if not is_chunk_hash(value):
        raise ValueError(f"not a chunk hash: {value!r:.80}")
    return value


def cache_root_from_environ(environ: Mapping[str, str]) -> Path:
    """
    The cache root: C{$XDG_CACHE_HOME/svc}, else C{$HOME/.cache/svc}.

    As the XDG base directory specification asks, an unset, empty or
    relative C{XDG_CACHE_HOME} is ignored. C{HOME} must then be an absolute
    path; otherwise a L{ConfigError} names the variable at fault.
    """
    xdg = environ.get("XDG_CACHE_HOME", "")
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / CACHE_DIR_NAME
    home = environ.get("HOME", "")
    if not home:
        raise ConfigError(
            "HOME", "is not set and XDG_CACHE_HOME is not an absolute path: no cache root"
        )
    if not Path(home).is_absolute():
        raise ConfigError("HOME", f"must be an absolute path for the cache root, got {home!r}")
    return Path(home) / ".cache" / CACHE_DIR_NAME


def _positive(_i: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{attribute.name} must be a positive int, got {value!r}")


@attrs.frozen
class CacheLimits:
    """
    The byte budget and the two water marks, with
    C{0 <= low_water_bytes <= high_water_bytes <= budget_bytes}.

    A store that would take usage above C{high_water_bytes} first evicts
    down to C{low_water_bytes}; a chunk larger than C{budget_bytes} is never
    cached.
    """

    budget_bytes: int = attrs.field(validator=_positive)
    high_water_bytes: int
    low_water_bytes: int

    def __attrs_post_init__(self) -> None:
        for value in (self.high_water_bytes, self.low_water_bytes):
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"water marks must be ints, got {value!r}")
        if not 0 <= self.low_water_bytes <= self.high_water_bytes <= self.budget_bytes:
            raise ValueError(
                "cache limits need 0 <= low_water <= high_water <= budget, got "
                f"low_water={self.low_water_bytes} high_water={self.high_water_bytes} "
                f"budget={self.budget_bytes}"
            )

    @classmethod
    def for_budget(
        cls,
        budget_bytes: int = DEFAULT_BUDGET_BYTES,
        *,
        high_water: int | None = None,
        low_water: int | None = None,
    ) -> CacheLimits:
        """
        Limits for C{budget_bytes}; a water mark left out defaults to
        L{HIGH_WATER_PERCENT} or L{LOW_WATER_PERCENT} of the budget.
        """
        _positive(None, attrs.fields(cls).budget_bytes, budget_bytes)
        return cls(
            budget_bytes=budget_bytes,
            high_water_bytes=(
                budget_bytes * HIGH_WATER_PERCENT // 100 if high_water is None else high_water
            ),
            low_water_bytes=(
                budget_bytes * LOW_WATER_PERCENT // 100 if low_water is None else low_water
            ),
        )

    def admits(self, size: int) -> bool:
        """Whether a chunk of C{size} bytes may be cached at all."""
        return size <= self.budget_bytes

    def eviction_target(self, bytes_used: int, incoming: int) -> int | None:
        """
        Before storing C{incoming} bytes on top of C{bytes_used}: L{None}
        when usage stays at or under the high-water mark, else the usage the
        chunks already cached must be brought down to so that usage after
        the store is at or under the low-water mark.
        """
        if bytes_used + incoming <= self.high_water_bytes:
            return None
        return max(0, self.low_water_bytes - incoming)


@attrs.define(eq=False)
class CacheSlot:
    """
    One chunk the cache holds or is storing (C{ready} false while its file
    is being written). Compared by identity: a slot that was removed and a
    later slot for the same hash are different slots.
    """

    hash: str
    size: int
    last_used_ms: int
    ready: bool


class LruTable:
    """
    The cache's chunks in least-recently-used order, with their byte total.

    Adding or touching a slot makes it the most recently used; L{victims}
    walks from the least recently used end.
    """

    def __init__(self) -> None:
        self._slots: OrderedDict[str, CacheSlot] = OrderedDict()
        self._bytes = 0

    @property
    def bytes_used(self) -> int:
        """The total size of every slot, ready or not."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, chunk_hash: object) -> bool:
        return chunk_hash in self._slots

    def __iter__(self) -> Iterator[CacheSlot]:
        """Slots from least to most recently used."""
        return iter(list(self._slots.values()))

    def get(self, chunk_hash: str) -> CacheSlot | None:
        """The slot for C{chunk_hash}, if any."""
        return self._slots.get(chunk_hash)

    def add(self, slot: CacheSlot) -> None:
        """Add C{slot} as the most recently used; its hash must be absent."""
        if slot.hash in self._slots:
            raise KeyError(f"chunk {slot.hash} already has a slot")
        self._slots[slot.hash] = slot
        self._bytes += slot.size

    def touch(self, slot: CacheSlot, now_ms: int) -> bool:
        """
        Record a use of C{slot} at C{now_ms}, making it the most recently
        used; false (and nothing changes) if C{slot} is no longer in the table.
        """
        if self._slots.get(slot.hash) is not slot:
            return False
        slot.last_used_ms = max(slot.last_used_ms, now_ms)
        self._slots.move_to_end(slot.hash)
        return True

    def remove(self, slot: CacheSlot) -> bool:
        """Remove C{slot}; false if it is no longer in the table."""
        if self._slots.get(slot.hash) is not slot:
            return False
        del self._slots[slot.hash]
        self._bytes -= slot.size
        return True

    def victims(self, target_bytes: int) -> list[CacheSlot]:
        """
        The least recently used slots whose removal brings the total to
        C{target_bytes} or below (all of them if it cannot be reached).
        Nothing is removed.
        """
        chosen: list[CacheSlot] = []
        remaining = self._bytes
        for slot in self._slots.values():
            if remaining <= target_bytes:
                break
            chosen.append(slot)
            remaining -= slot.size
        return chosen
