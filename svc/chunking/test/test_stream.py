"""
Tests for L{svc.chunking.stream}: bounded-memory cutting of files and streams.
"""

from __future__ import annotations

import io
import os
import threading
from functools import cache

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from svc.chunking.buffers import STREAM_BUFFER_SIZE, BufferPool
from svc.chunking.core import MAX_CHUNK_SIZE, chunk_bytes, chunk_hash
from svc.chunking.stream import (
    MAPPED_MIN_SIZE,
    ChunkMismatch,
    chunk_range,
    chunk_stream,
    iter_chunk_views,
    iter_chunks,
    read_chunk,
)
from svc.chunking.test.inputs import MiB, contents, xof

big_inputs = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])


MIN_PLUS_SOME = MiB + 200_000


@cache
def _large() -> bytes:
    # 40 MiB: more than one stream buffer, so the window refills and compacts.
    return xof(b"stream tests", 40 * MiB + 12345)


class ScheduledReader:
    """
    A reader whose C{readinto} returns at most the next size of a repeating
    schedule, to put stream boundaries at odd places. Records the largest
    buffer it was handed.
    """

    def __init__(self, data: bytes, schedule: list[int]) -> None:
        self._source = io.BytesIO(data)
        self._schedule = schedule
        self._calls = 0
        self.largest_request = 0

    def readinto(self, buffer: memoryview) -> int:
        self.largest_request = max(self.largest_request, len(buffer))
        limit = self._schedule[self._calls % len(self._schedule)]
        self._calls += 1
        return self._source.readinto(buffer[:limit])


class StreamMatchesMemoryTests(SynchronousTestCase):
    """
    Streaming gives exactly the chunks that in-memory cutting gives.
    """

    @big_inputs
    @given(
        contents(),
        st.lists(st.integers(min_value=1, max_value=9 * MiB), min_size=1, max_size=6),
    )
    def test_odd_read_sizes(self, data: bytes, schedule: list[int]) -> None:
        """Any pattern of short reads yields the in-memory chunks."""
        assume(len(data) < 4 * MiB or sum(schedule) // len(schedule) >= 4096)
        self.assertEqual(chunk_stream(ScheduledReader(data, schedule)), chunk_bytes(data))

    def test_tiny_reads(self) -> None:
        """Reads of 1 to 7 bytes at a time still yield the in-memory chunks."""
        data = xof(b"tiny reads", MIN_PLUS_SOME)
        reader = ScheduledReader(data, [1, 7, 3, 5])
        self.assertEqual(chunk_stream(reader), chunk_bytes(data))

    def test_large_stream(self) -> None:
        """A stream longer than the buffer is cut like the whole input in memory."""
        data = _large()
        reader = ScheduledReader(data, [3 * MiB + 1, 5 * MiB - 7])
        self.assertEqual(chunk_stream(reader), chunk_bytes(data))

    def test_buffer_bounded(self) -> None:
        """Reading a stream never asks for more than the stream buffer's size."""
        reader = ScheduledReader(_large(), [64 * MiB])
        chunk_stream(reader)
        self.assertEqual(STREAM_BUFFER_SIZE, 2 * MAX_CHUNK_SIZE)
        self.assertLessEqual(reader.largest_request, STREAM_BUFFER_SIZE)
        self.assertGreater(reader.largest_request, MAX_CHUNK_SIZE)

    def test_short_stream_small_buffer(self) -> None:
        """A short stream of unknown length is read without a full-size buffer."""
        reader = ScheduledReader(b"abc", [100])
        self.assertEqual(chunk_stream(reader), chunk_bytes(b"abc"))
        self.assertLessEqual(reader.largest_request, 1 * MiB)

    def test_non_blocking_reader(self) -> None:
        """A reader that reports no data yet (None) is an error, not an end of input."""

        class NotReady:
            def readinto(self, buffer: memoryview) -> int | None:
                return None

        self.assertRaises(BlockingIOError, chunk_stream, NotReady())

    def test_empty_stream(self) -> None:
        """An empty stream has no chunks."""
        self.assertEqual(chunk_stream(io.BytesIO(b"")), [])


class PathTests(SynchronousTestCase):
    """
    Cutting files named by path.
    """

    def _write(self, data: bytes) -> str:
        path: str = self.mktemp()
        with open(path, "wb") as handle:
            handle.write(data)
        return path

    def test_path_matches_memory(self) -> None:
        """A file cut by path gives the in-memory chunks."""
        data = _large()
        self.assertEqual(chunk_stream(self._write(data)), chunk_bytes(data))

    def test_small_and_empty_files(self) -> None:
        """Small files are one chunk; an empty file has none."""
        self.assertEqual(chunk_stream(self._write(b"")), [])
        self.assertEqual(chunk_stream(self._write(b"x")), chunk_bytes(b"x"))

    def test_start_offset(self) -> None:
        """Cutting from an offset cuts the rest of the file, reporting file offsets."""
        data = _large()
        path = self._write(data)
        start = 7 * MiB + 3
        expected = [(ref.offset + start, ref.length, ref.hash) for ref in chunk_bytes(data[start:])]
        got = [(ref.offset, ref.length, ref.hash) for ref, _ in iter_chunk_views(path, start=start)]
        self.assertEqual(got, expected)

    def test_start_offset_with_reader(self) -> None:
        """For a reader, the start offset is added to the reported offsets."""
        data = xof(b"reader start", 3 * MiB)
        reader = io.BytesIO(data)
        reader.seek(100)
        refs = [ref for ref, _ in iter_chunk_views(reader, start=100)]
        self.assertEqual(refs[0].offset, 100)
        self.assertEqual(refs[-1].end, len(data))

    def test_mapped_threshold(self) -> None:
        """Files just under, at and over the mapping threshold cut as in memory, from any start."""
        data = xof(b"mapped threshold", MAPPED_MIN_SIZE + 3)
        path = self._write(data)
        for start in (0, 1, 2, 3, 4):
            expected = [
                (ref.offset + start, ref.length, ref.hash) for ref in chunk_bytes(data[start:])
            ]
            got = [
                (ref.offset, ref.length, ref.hash) for ref, _ in iter_chunk_views(path, start=start)
            ]
            self.assertEqual(got, expected)
        self.assertEqual(list(iter_chunk_views(path, start=len(data))), [])
        self.assertEqual(list(iter_chunk_views(path, start=len(data) + 10)), [])

    def test_mapped_views_released_after_advance(self) -> None:
        """A mapped chunk's view is released when the iterator moves on, so the map can close."""
        data = xof(b"mapped views", 3 * MAX_CHUNK_SIZE)
        views = []
        for ref, view in iter_chunk_views(self._write(data)):
            self.assertEqual(view, data[ref.offset : ref.end])
            views.append(view)
        self.assertGreater(len(views), 1)
        for view in views:
            with self.assertRaises(ValueError):
                len(view)

    def test_kept_slices_stay_valid(self) -> None:
        """A slice the caller keeps of a mapped chunk's view still reads its bytes afterwards."""
        data = xof(b"kept slices", 3 * MAX_CHUNK_SIZE)
        kept = [(ref, view[:16]) for ref, view in iter_chunk_views(self._write(data))]
        for ref, head in kept:
            self.assertEqual(bytes(head), data[ref.offset : ref.offset + 16])

    def test_fifo_is_read_not_mapped(self) -> None:
        """A named pipe cannot be mapped: it is read like a stream, with the same chunks."""
        data = xof(b"fifo", 3 * MiB + 5)
        path: str = self.mktemp()
        os.mkfifo(path)
        writer = threading.Thread(target=lambda: open(path, "wb").write(data))
        writer.start()
        try:
            self.assertEqual(chunk_stream(path), chunk_bytes(data))
        finally:
            writer.join()

    def test_missing_file(self) -> None:
        """A missing file raises FileNotFoundError."""
        with self.assertRaises(FileNotFoundError):
            chunk_stream(self.mktemp())

    def test_directory(self) -> None:
        """A directory raises IsADirectoryError."""
        path: str = self.mktemp()
        os.mkdir(path)
        with self.assertRaises(IsADirectoryError):
            chunk_stream(path)

    def test_chunk_range(self) -> None:
        """A range cut from 0 is a prefix of the file's chunks ending at or after the stop."""
        data = _large()
        path = self._write(data)
        full = chunk_bytes(data)
        stop = full[2].offset + 1
        self.assertEqual(chunk_range(path, 0, stop), full[:3])
        self.assertEqual(chunk_range(path, 0, len(data) * 2), full)
        self.assertEqual(chunk_range(path, 0, full[2].offset), full[:2])


class PooledBufferTests(SynchronousTestCase):
    """
    Streams borrow their buffer from a L{BufferPool} when given one.
    """

    def test_pooled_matches_memory(self) -> None:
        """With a pool, readers and small files cut exactly as in memory, buffer after buffer."""
        data = _large()
        pool = BufferPool(keep=1)
        expected = chunk_bytes(data)
        self.assertEqual(chunk_stream(io.BytesIO(data), pool=pool), expected)
        self.assertEqual(pool.kept, 1)
        # The second stream reuses the first one's (dirty) buffer.
        reader = ScheduledReader(data, [5 * MiB + 3])
        self.assertEqual(chunk_stream(reader, pool=pool), expected)
        self.assertEqual(chunk_stream(io.BytesIO(b"short"), pool=pool), chunk_bytes(b"short"))
        small = self.mktemp()
        with open(small, "wb") as handle:
            handle.write(data[: MAPPED_MIN_SIZE - 1])
        self.assertEqual(chunk_stream(small, pool=pool), chunk_bytes(data[: MAPPED_MIN_SIZE - 1]))
        self.assertEqual(pool.kept, 1)

    def test_mapped_files_borrow_nothing(self) -> None:
        """A regular file of at least MAPPED_MIN_SIZE bytes is mapped: the pool stays unused."""
        data = _large()
        path = self.mktemp()
        with open(path, "wb") as handle:
            handle.write(data)
        pool = BufferPool(keep=1)
        self.assertEqual(chunk_stream(path, pool=pool), chunk_bytes(data))
        self.assertEqual(pool.kept, 0)

    def test_abandoned_iteration_returns_buffer(self) -> None:
        """Closing an iterator early gives its buffer back to the pool."""
        pool = BufferPool(keep=2)
        iterator = iter_chunk_views(io.BytesIO(_large()), pool=pool)
        next(iterator)
        self.assertEqual(pool.kept, 0)
        iterator.close()
        self.assertEqual(pool.kept, 1)


class ChunkBytesOutTests(SynchronousTestCase):
    """
    Iterators that hand out chunk bytes.
    """

    def test_iter_chunks_bytes(self) -> None:
        """iter_chunks yields kept bytes that match each name and rebuild the input."""
        data = _large()
        pairs = list(iter_chunks(io.BytesIO(data)))
        self.assertEqual([ref for ref, _ in pairs], chunk_bytes(data))
        for ref, chunk in pairs:
            self.assertIsInstance(chunk, bytes)
            self.assertEqual(chunk_hash(chunk), ref.hash)
        self.assertEqual(b"".join(chunk for _, chunk in pairs), data)

    def test_views_valid_until_next(self) -> None:
        """Each view holds its chunk's bytes while the iterator has not moved on."""
        data = _large()
        for ref, view in iter_chunk_views(io.BytesIO(data)):
            self.assertEqual(len(view), ref.length)
            self.assertEqual(view, data[ref.offset : ref.end])


class ReadChunkTests(SynchronousTestCase):
    """
    L{read_chunk} reads a chunk back and checks its name.
    """

    def setUp(self) -> None:
        self.data = xof(b"read back", 9 * MiB)
        self.path = self.mktemp()
        with open(self.path, "wb") as handle:
            handle.write(self.data)
        self.refs = chunk_bytes(self.data)

    def test_reads_back(self) -> None:
        """Every chunk reads back from the path and from an open file."""
        with open(self.path, "rb") as handle:
            for ref in self.refs:
                expected = self.data[ref.offset : ref.end]
                self.assertEqual(read_chunk(self.path, ref), expected)
                self.assertEqual(read_chunk(handle, ref), expected)

    def test_changed_bytes(self) -> None:
        """A chunk whose bytes changed since cutting raises ChunkMismatch."""
        ref = self.refs[1]
        with open(self.path, "r+b") as handle:
            handle.seek(ref.offset + 10)
            handle.write(b"!")
        error = self.assertRaises(ChunkMismatch, read_chunk, self.path, ref)
        self.assertEqual(error.expected, ref)
        self.assertEqual(error.actual_length, ref.length)
        self.assertNotEqual(error.actual_hash, ref.hash)

    def test_truncated_file(self) -> None:
        """A chunk cut short by truncation raises ChunkMismatch with the length found."""
        ref = self.refs[-1]
        os.truncate(self.path, ref.end - 5)
        error = self.assertRaises(ChunkMismatch, read_chunk, self.path, ref)
        self.assertEqual(error.actual_length, ref.length - 5)

    def test_unseekable(self) -> None:
        """A reader without seek is refused."""
        reader = ScheduledReader(self.data, [MiB])
        self.assertRaises(TypeError, read_chunk, reader, self.refs[0])
