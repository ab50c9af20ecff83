"""
Tests for L{svc.chunking.buffers.BufferPool}.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from svc.chunking.buffers import STREAM_BUFFER_SIZE, BufferPool


class BufferPoolTests(SynchronousTestCase):
    """
    Lending and keeping stream buffers.
    """

    def test_lends_full_size_buffers(self) -> None:
        """A borrowed buffer is a 32 MiB bytearray."""
        with BufferPool().borrow() as buffer:
            self.assertIsInstance(buffer, bytearray)
            self.assertEqual(len(buffer), STREAM_BUFFER_SIZE)
        self.assertEqual(STREAM_BUFFER_SIZE, 32 << 20)

    def test_reuses_returned_buffer(self) -> None:
        """A returned buffer is lent again rather than a new one made."""
        pool = BufferPool()
        with pool.borrow() as first:
            pass
        with pool.borrow() as second:
            self.assertIs(second, first)

    def test_concurrent_borrowers_get_distinct_buffers(self) -> None:
        """Two borrowers at once never share a buffer, even past the kept count."""
        pool = BufferPool(keep=1)
        with pool.borrow() as first, pool.borrow() as second:
            self.assertIsNot(first, second)
            self.assertEqual(pool.kept, 0)
        self.assertEqual(pool.kept, 1)

    def test_keeps_at_most_keep(self) -> None:
        """On return, buffers beyond the kept count are dropped."""
        pool = BufferPool(keep=2)
        with pool.borrow(), pool.borrow(), pool.borrow():
            pass
        self.assertEqual(pool.kept, 2)

    def test_returned_on_error(self) -> None:
        """A buffer comes back even when the borrowing block raises."""
        pool = BufferPool()
        with self.assertRaises(KeyError), pool.borrow():
            raise KeyError("boom")
        self.assertEqual(pool.kept, 1)

    def test_rejects_keep_below_one(self) -> None:
        """keep must be at least 1."""
        self.assertRaises(ValueError, BufferPool, 0)
