"""
Cutting one file on several threads with the same result as one sequential cut.

Content-defined cutting is sequential by nature: where a chunk ends depends on
where it began. But a cut started at an arbitrary offset falls back into step
with the real sequence of boundaries after a chunk or two, because from any
real boundary onwards the sequence depends only on the bytes. So a large file
is split into ranges (L{plan_segments}); each range is cut speculatively from
its first byte (L{svc.chunking.stream.chunk_range}) on its own thread; then
L{join_segments} walks the real boundaries from offset 0, splicing in a range's
chunks as soon as a real boundary coincides with one of its boundaries and
re-cutting sequentially only across each seam until that happens.

The result is exactly the sequential cut (tested against it); only the speed
depends on how quickly the seams fall into step (on random data, within one or
two chunks; on degenerate data, such as a long run of one byte value, maybe
never, in which case the seam is re-cut to the end of the range: slower, still
correct).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Final

from svc.chunking.buffers import BufferPool
from svc.chunking.core import MAX_CHUNK_SIZE, ChunkRef
from svc.chunking.stream import StrPath, iter_chunk_views

MIN_SEGMENT_SIZE: Final = 8 * MAX_CHUNK_SIZE
"""
Smallest range worth a thread of its own (128 MiB): the seam costs about one
to three chunks of repeated work, so ranges must be much longer than that.
"""


def plan_segments(
    size: int, parts: int, *, min_segment: int = MIN_SEGMENT_SIZE
) -> list[tuple[int, int]]:
    """
    Split C{[0, size)} into at most C{parts} contiguous C{(start, stop)}
    ranges, each at least C{min_segment} long; always at least one range.
    """
    if size < 0:
        raise ValueError(f"size must be non-negative, got {size}")
    if parts < 1:
        raise ValueError(f"parts must be at least 1, got {parts}")
    if min_segment < 1:
        raise ValueError(f"min_segment must be positive, got {min_segment}")
    count = max(1, min(parts, size // min_segment))
    bounds = [size * index // count for index in range(count + 1)]
    return list(itertools.pairwise(bounds))


def join_segments(
    path: StrPath, pieces: Sequence[Sequence[ChunkRef]], *, pool: BufferPool | None = None
) -> list[ChunkRef]:
    """
    Reconcile the speculative cuts of consecutive ranges into the file's real
    chunk sequence.

    @param pieces: for each range in order, the result of
        C{chunk_range(path, start, stop)}; the first range must start at 0.
        The file must not have changed since they were cut.
    @param pool: where to borrow the buffer for re-cutting across seams.
    @return: exactly what L{svc.chunking.stream.chunk_stream} gives for the
        whole file.
    """
    if not pieces:
        return []
    result: list[ChunkRef] = list(pieces[0])
    position = result[-1].end if result else 0
    for piece in pieces[1:]:
        if not piece or position >= piece[-1].end:
            # The real sequence already reaches past this whole range.
            continue
        starts = {ref.offset: index for index, ref in enumerate(piece)}
        if position not in starts:
            # Re-cut across the seam until a real boundary meets one of the
            # range's boundaries (or the range is used up).
            for ref, _view in iter_chunk_views(path, start=position, pool=pool):
                result.append(ref)
                position = ref.end
                if position in starts or position >= piece[-1].end:
                    break
        if position in starts:
            result.extend(piece[starts[position] :])
            position = result[-1].end
    return result
