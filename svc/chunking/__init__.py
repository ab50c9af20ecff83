"""
Content-defined chunking: FastCDC 2020 boundaries (1 MiB / 4 MiB / 16 MiB),
each chunk named by the lowercase hex BLAKE3-256 of its bytes.

The algorithm is specified in ``docs/specifications/chunking.md``. This
package namespace imports nothing from Twisted; the reactor-facing helper is
L{svc.chunking.off_reactor.chunk_file}.
"""

from __future__ import annotations

from svc.chunking.buffers import STREAM_BUFFER_SIZE, BufferPool
from svc.chunking.core import (
    AVG_CHUNK_SIZE,
    MAX_CHUNK_SIZE,
    MIN_CHUNK_SIZE,
    NORMALIZATION_LEVEL,
    ChunkRef,
    chunk_bytes,
    chunk_hash,
)
from svc.chunking.segments import join_segments, plan_segments
from svc.chunking.stream import (
    ChunkMismatch,
    chunk_range,
    chunk_stream,
    iter_chunk_views,
    iter_chunks,
    read_chunk,
)

__all__ = [
    "AVG_CHUNK_SIZE",
    "MAX_CHUNK_SIZE",
    "MIN_CHUNK_SIZE",
    "NORMALIZATION_LEVEL",
    "STREAM_BUFFER_SIZE",
    "BufferPool",
    "ChunkMismatch",
    "ChunkRef",
    "chunk_bytes",
    "chunk_hash",
    "chunk_range",
    "chunk_stream",
    "iter_chunk_views",
    "iter_chunks",
    "join_segments",
    "plan_segments",
    "read_chunk",
]
