"""
Where each byte of an open file comes from. Pure: no I/O.

An open file's content is its I{base} (the chunk list of the version it was
opened at) overlaid with local changes kept in a spill file. L{FileLayout}
tracks, without storing any byte:

 - C{size}: the current logical size;
 - C{clean_limit}: bytes below it that were never written still equal the
   base's bytes at the same offset (it starts at the base size and only
   drops, when the file is truncated below it);
 - C{written}: the ranges written since the base (a L{RangeSet}).

A byte at offset C{p < size} is I{original} (read from the base chunks) when
C{p < clean_limit} and C{p} is not in C{written}; otherwise it is read from
the spill file, where a range never written is a hole and reads as zeros
(truncation shrinks the spill file too, so nothing stale survives there).
That is what makes truncating and extending cost nothing but bookkeeping.
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Iterator, Sequence

import attrs

from svc.chunking import ChunkRef


class RangeSet:
    """
    A set of byte offsets as sorted, disjoint, non-adjacent half-open
    ranges C{[start, end)}.
    """

    def __init__(self, ranges: Sequence[tuple[int, int]] = ()) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        for start, end in ranges:
            self.add(start, end)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(zip(self._starts, self._ends, strict=True))

    def __bool__(self) -> bool:
        return bool(self._starts)

    def __repr__(self) -> str:
        return f"RangeSet({list(self)!r})"

    @property
    def total(self) -> int:
        """The number of offsets in the set."""
        return sum(end - start for start, end in self)

    def add(self, start: int, end: int) -> None:
        """Add C{[start, end)}, merging with ranges it overlaps or touches."""
        if start < 0 or end < start:
            raise ValueError(f"bad range [{start}, {end})")
        if start == end:
            return
        # First range that ends at or after start (touching merges).
        low = bisect.bisect_left(self._ends, start)
        # Ranges starting at or before end touch or overlap.
        high = bisect.bisect_right(self._starts, end)
        if low < high:
            start = min(start, self._starts[low])
            end = max(end, self._ends[high - 1])
        self._starts[low:high] = [start]
        self._ends[low:high] = [end]

    def clip(self, limit: int) -> None:
        """Remove every offset at or above C{limit}."""
        index = bisect.bisect_left(self._ends, limit + 1)
        del self._starts[index + 1 :]
        del self._ends[index + 1 :]
        if index < len(self._starts):
            if self._starts[index] >= limit:
                del self._starts[index]
                del self._ends[index]
            else:
                self._ends[index] = min(self._ends[index], limit)

    def overlaps(self, start: int, end: int) -> bool:
        """Whether any offset of C{[start, end)} is in the set."""
        if start >= end:
            return False
        index = bisect.bisect_right(self._ends, start)
        return index < len(self._starts) and self._starts[index] < end

    def within(self, start: int, end: int) -> list[tuple[int, int]]:
        """The parts of the set inside C{[start, end)}, in order."""
        pieces = []
        index = bisect.bisect_right(self._ends, start)
        while index < len(self._starts) and self._starts[index] < end:
            pieces.append((max(start, self._starts[index]), min(end, self._ends[index])))
            index += 1
        return pieces

    @property
    def first(self) -> int | None:
        """The smallest offset in the set, L{None} when it is empty."""
        return self._starts[0] if self._starts else None

    def copy(self) -> RangeSet:
        """An independent copy."""
        other = RangeSet()
        other._starts = list(self._starts)
        other._ends = list(self._ends)
        return other


class Source(enum.Enum):
    """Where a L{Segment}'s bytes are read from."""

    ORIGINAL = "original"
    SPILL = "spill"


@attrs.frozen
class Segment:
    """C{[start, end)} of the file, read from C{source}."""

    start: int
    end: int
    source: Source

    @property
    def length(self) -> int:
        """Bytes in the segment."""
        return self.end - self.start


def _merged(segments: list[Segment]) -> list[Segment]:
    merged: list[Segment] = []
    for segment in segments:
        if merged and merged[-1].source is segment.source and merged[-1].end == segment.start:
            merged[-1] = Segment(merged[-1].start, segment.end, segment.source)
        else:
            merged.append(segment)
    return merged


def chunk_layout(sizes: Sequence[tuple[str, int]]) -> tuple[ChunkRef, ...]:
    """The L{ChunkRef}s (with file offsets) of a C{(hash, size)} chunk list."""
    refs = []
    offset = 0
    for chunk_hash, size in sizes:
        refs.append(ChunkRef(offset, size, chunk_hash))
        offset += size
    return tuple(refs)


class FileLayout:
    """
    The byte map of one open file; see the module docstring.

    @ivar base: the base version's chunks, with file offsets.
    @ivar base_size: the base version's size.
    @ivar edits: how many writes and truncations the layout has seen, ever
        (a reset does not go back): whether the content changed since a
        moment is whether this moved.
    """

    def __init__(self, base: Sequence[ChunkRef]) -> None:
        self.edits = 0
        self.reset(base)

    def reset(self, base: Sequence[ChunkRef]) -> None:
        """Forget every change: the content is C{base} again."""
        self.base: tuple[ChunkRef, ...] = tuple(base)
        self.base_size = self.base[-1].end if self.base else 0
        self._base_offsets = [ref.offset for ref in self.base]
        self._base_ends = [ref.end for ref in self.base]
        self.size = self.base_size
        self.clean_limit = self.base_size
        self.written = RangeSet()

    @property
    def dirty(self) -> bool:
        """Whether the content may differ from the base."""
        return bool(self.written) or self.size != self.base_size or self.clean_limit != self.size

    def write(self, offset: int, length: int) -> None:
        """C{length} bytes were written at C{offset} (into the spill file)."""
        if offset < 0 or length < 0:
            raise ValueError("negative offset or length")
        if length == 0:
            return
        self.edits += 1
        self.written.add(offset, offset + length)
        self.size = max(self.size, offset + length)

    def truncate(self, size: int) -> None:
        """The file was truncated or extended to C{size} (new bytes are zeros)."""
        if size < 0:
            raise ValueError("negative size")
        self.edits += 1
        if size < self.size:
            self.written.clip(size)
            self.clean_limit = min(self.clean_limit, size)
        self.size = size

    def changed(self) -> RangeSet:
        """Offsets whose byte may differ from the base's byte there."""
        changed = self.written.copy()
        if self.clean_limit < self.size:
            changed.add(self.clean_limit, self.size)
        return changed

    def segments(self, offset: int, length: int) -> list[Segment]:
        """Where to read C{[offset, offset + length)}, clipped to the size."""
        end = min(self.size, offset + length)
        segments: list[Segment] = []
        position = offset
        clean_end = min(end, self.clean_limit)
        for start, stop in self.written.within(position, clean_end):
            if position < start:
                segments.append(Segment(position, start, Source.ORIGINAL))
            segments.append(Segment(start, stop, Source.SPILL))
            position = stop
        if position < clean_end:
            segments.append(Segment(position, clean_end, Source.ORIGINAL))
            position = clean_end
        if position < end:
            segments.append(Segment(position, end, Source.SPILL))
        return _merged(segments)

    def is_hole(self, start: int, end: int) -> bool:
        """Whether C{[start, end)} is inside the file and reads as zeros never written."""
        return (
            self.clean_limit <= start and end <= self.size and not self.written.overlaps(start, end)
        )

    def base_chunks(self, start: int, end: int) -> list[ChunkRef]:
        """The base chunks overlapping C{[start, end)}, in order."""
        index = max(0, bisect.bisect_right(self._base_offsets, start) - 1)
        refs = []
        while index < len(self.base) and self.base[index].offset < end:
            if self.base[index].end > start:
                refs.append(self.base[index])
            index += 1
        return refs

    def base_index_at(self, offset: int) -> int | None:
        """The index of the base chunk starting exactly at C{offset}, if any."""
        index = bisect.bisect_left(self._base_offsets, offset)
        if index < len(self.base) and self.base[index].offset == offset:
            return index
        return None

    def first_cut(self) -> int:
        """
        Where cutting the current content starts when unchanged base chunks
        are reused (L{svc.mount.writeback.uploads.rechunk} without write-behind): the
        end of the longest run of L{reusable} base chunks from offset 0.

        Every base chunk ending before C{first_change - 1} is reusable (its
        bytes and the byte after them are unchanged and it is not the last
        one), so the walk starts at the first chunk that does not.
        """
        changed_at = self.clean_limit
        first_written = self.written.first
        if first_written is not None:
            changed_at = min(changed_at, first_written)
        index = bisect.bisect_left(self._base_ends, changed_at - 1)
        while index < len(self.base) and self.reusable(index):
            index += 1
        return self.base[index].offset if index < len(self.base) else self.base_size

    def unchanged_beyond(self, offset: int) -> bool:
        """
        Whether base bytes past the base chunk at C{offset} (past C{offset}
        itself when no base chunk starts there) may still be read as
        original: the clean limit lies beyond that chunk's end.
        """
        index = self.base_index_at(offset)
        end = self.base[index].end if index is not None else offset
        return self.clean_limit > end

    def reusable(self, index: int) -> bool:
        """
        Whether base chunk C{index} is also a chunk of the current content
        when a cut starts at its offset: its bytes and the byte after it
        (FastCDC's cut test at a boundary reads that byte) are unchanged; a
        base chunk ended by the end of the base file is reusable only if the
        file still ends there.
        """
        ref = self.base[index]
        if ref.end < self.base_size:
            return (
                ref.end < self.clean_limit
                and ref.end < self.size
                and not self.written.overlaps(ref.offset, ref.end + 1)
            )
        return (
            self.size == self.base_size
            and ref.end <= self.clean_limit
            and not self.written.overlaps(ref.offset, ref.end)
        )
