"""
Tests for L{svc.chunking.off_reactor.chunk_file}.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from functools import cache
from typing import TypeVar

from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from svc.chunking.buffers import BufferPool
from svc.chunking.core import chunk_bytes
from svc.chunking.off_reactor import chunk_file
from svc.chunking.test.inputs import MiB, xof
from svc.testing.worker import ImmediateWorker

T = TypeVar("T")


@cache
def _data() -> bytes:
    return xof(b"off reactor", 45 * MiB + 3)


class ChunkFileTests(SynchronousTestCase):
    """
    L{chunk_file} runs the cut on the worker and fires with the chunks.
    """

    def setUp(self) -> None:
        self.path = self.mktemp()
        with open(self.path, "wb") as handle:
            handle.write(_data())
        self.worker = ImmediateWorker()

    def test_sequential(self) -> None:
        """With parallel=1 the whole file is cut in one job."""
        refs = self.successResultOf(chunk_file(self.worker, self.path))
        self.assertEqual(refs, chunk_bytes(_data()))
        self.assertEqual(self.worker.calls, 1)

    def test_parallel(self) -> None:
        """With parallel=3 the file is cut in three range jobs and joined: same chunks."""
        refs = self.successResultOf(
            chunk_file(self.worker, self.path, parallel=3, min_segment=10 * MiB)
        )
        self.assertEqual(refs, chunk_bytes(_data()))
        # One stat, three ranges, one join.
        self.assertEqual(self.worker.calls, 5)

    def test_pooled_buffers(self) -> None:
        """With a pool, both ways give the same chunks and leave the buffers kept."""
        pool = BufferPool(keep=2)
        sequential = self.successResultOf(chunk_file(self.worker, self.path, pool=pool))
        parallel = self.successResultOf(
            chunk_file(self.worker, self.path, parallel=2, min_segment=10 * MiB, pool=pool)
        )
        self.assertEqual(sequential, chunk_bytes(_data()))
        self.assertEqual(parallel, sequential)
        # Files this large are mapped, not read: no buffer is borrowed.
        self.assertEqual(pool.kept, 0)

    def test_parallel_small_file(self) -> None:
        """A file too small to split is cut in one job after the size check."""
        refs = self.successResultOf(chunk_file(self.worker, self.path, parallel=4))
        self.assertEqual(refs, chunk_bytes(_data()))
        self.assertEqual(self.worker.calls, 2)

    def test_missing_file(self) -> None:
        """A missing file fails the Deferred with FileNotFoundError, either way."""
        missing = self.mktemp()
        self.failureResultOf(chunk_file(self.worker, missing), FileNotFoundError)
        self.failureResultOf(chunk_file(self.worker, missing, parallel=2), FileNotFoundError)

    def test_range_failure(self) -> None:
        """A file gone after the size check fails the Deferred; no failure is left unhandled."""
        path = self.path

        class VanishingWorker(ImmediateWorker):
            def submit(self, fn: Callable[[], T]) -> Deferred[T]:
                result = super().submit(fn)
                if self.calls == 1:
                    os.remove(path)
                return result

        result = chunk_file(VanishingWorker(), path, parallel=2, min_segment=10 * MiB)
        self.failureResultOf(result, FileNotFoundError)
        del result
        gc.collect()
        self.assertEqual(self.flushLoggedErrors(), [])

    def test_rejects_parallel_below_one(self) -> None:
        """parallel must be at least 1."""
        self.assertRaises(ValueError, chunk_file, self.worker, self.path, parallel=0)
