"""
Chunking files from reactor code: the blocking work runs on an injected
L{IWorker}, the result arrives as a L{Deferred}.
"""

from __future__ import annotations

import os
from functools import partial

from twisted.internet.defer import Deferred

from svc.chunking.buffers import BufferPool
from svc.chunking.core import ChunkRef
from svc.chunking.segments import MIN_SEGMENT_SIZE, join_segments, plan_segments
from svc.chunking.stream import StrPath, chunk_range, chunk_stream
from svc.worker import IWorker


def _file_size(path: StrPath) -> int:
    return os.stat(path).st_size


def chunk_file(
    worker: IWorker,
    path: StrPath,
    *,
    parallel: int = 1,
    min_segment: int = MIN_SEGMENT_SIZE,
    pool: BufferPool | None = None,
) -> Deferred[list[ChunkRef]]:
    """
    Cut the regular file at C{path} and name its chunks, off the reactor.

    With C{parallel=1} the whole file is read and cut in one job on
    C{worker}. With C{parallel=N} a file of at least C{2 * min_segment}
    bytes is split into up to N ranges submitted as separate jobs (give the
    worker at least N threads for them to run at once), then reconciled by
    one more job (L{svc.chunking.segments.join_segments}). Either way the
    result is the file's exact chunk sequence. The file must not change
    while it is being cut.

    Give a L{BufferPool} kept for the life of the caller (with C{keep} at
    least the worker's thread count) to reuse stream buffers across calls.

    @return: a L{Deferred} firing with the chunks in file order, or failing
        with the L{OSError} raised opening or reading the file.
    """
    if parallel < 1:
        raise ValueError(f"parallel must be at least 1, got {parallel}")
    if parallel == 1:
        return worker.submit(partial(chunk_stream, path, pool=pool))

    async def cut_in_ranges() -> list[ChunkRef]:
        size = await worker.submit(partial(_file_size, path))
        plan = plan_segments(size, parallel, min_segment=min_segment)
        if len(plan) == 1:
            return await worker.submit(partial(chunk_stream, path, pool=pool))
        jobs = [
            worker.submit(partial(chunk_range, path, start, stop, pool=pool))
            for start, stop in plan
        ]
        try:
            pieces = [await job for job in jobs]
        finally:
            # If one range failed, the others' outcomes are not interesting;
            # consume them so they are not reported as unhandled.
            for job in jobs:
                job.addErrback(lambda _failure: None)
        return await worker.submit(partial(join_segments, path, pieces, pool=pool))

    return Deferred.fromCoroutine(cut_in_ranges())
