"""
Tests for L{svc.buffer_pool}: buffers lent again only when nobody can see them.
"""

from __future__ import annotations

import mmap
import pickle
import threading

from twisted.trial.unittest import SynchronousTestCase

from svc.buffer_pool import BufferPool, is_immutable


class BufferPoolTests(SynchronousTestCase):
    """
    A L{BufferPool} reuses a buffer after its loan ends, unless a view of
    it is still held anywhere.
    """

    def test_size_rounded_to_whole_pages(self) -> None:
        """Buffers are page aligned and a whole number of pages long."""
        pool = BufferPool(mmap.PAGESIZE + 1, keep=1)
        loan = pool.lend()
        self.assertEqual(len(loan.buffer), 2 * mmap.PAGESIZE)
        self.assertEqual(pool.size, 2 * mmap.PAGESIZE)

    def test_given_back_buffer_lent_again(self) -> None:
        """A loan given back with nothing else holding it serves the next loan."""
        pool = BufferPool(4096, keep=2)
        first = pool.lend()
        first.buffer[:3] = b"abc"
        self.assertEqual(bytes(first.view(3)), b"abc")
        first.give_back()
        self.assertEqual(pool.idle, 1)
        second = pool.lend()
        self.assertIs(second.buffer, first.buffer)
        self.assertEqual((pool.created, pool.idle), (1, 0))

    def test_released_view_refuses_use(self) -> None:
        """After give_back the loan's view raises instead of showing reused bytes."""
        pool = BufferPool(4096, keep=1)
        loan = pool.lend()
        view = loan.view(10)
        loan.give_back()
        with self.assertRaises(ValueError):
            bytes(view)

    def test_view_is_read_only(self) -> None:
        """The view handed out cannot be written through."""
        loan = BufferPool(4096, keep=1).lend()
        view = loan.view(10)
        self.assertTrue(view.readonly)
        with self.assertRaises(TypeError):
            view[0] = 1

    def test_held_slice_keeps_buffer_out_of_the_pool(self) -> None:
        """
        A slice of the view kept by somebody keeps its bytes: the buffer is
        dropped, not lent again, and the slice still reads what was there.
        """
        pool = BufferPool(4096, keep=2)
        loan = pool.lend()
        loan.buffer[:4] = b"keep"
        kept = loan.view(4)[1:]
        loan.give_back()
        self.assertEqual(pool.idle, 0)
        other = pool.lend()
        self.assertIsNot(other.buffer, loan.buffer)
        other.buffer[:4] = b"XXXX"
        self.assertEqual(bytes(kept), b"eep")

    def test_exported_view_keeps_buffer_out_of_the_pool(self) -> None:
        """
        A buffer export of the view itself (as C code holding it takes: here
        a C{PickleBuffer}) makes its release fail: the buffer is dropped.
        """
        pool = BufferPool(4096, keep=2)
        loan = pool.lend()
        view = loan.view(8)
        holder = pickle.PickleBuffer(view)
        loan.give_back()
        self.assertEqual(pool.idle, 0)
        self.assertEqual(bytes(holder.raw()), bytes(8))
        holder.release()

    def test_other_view_of_the_view_keeps_buffer_out_of_the_pool(self) -> None:
        """A memoryview made from the view (sharing its buffer) also prevents reuse."""
        pool = BufferPool(4096, keep=2)
        loan = pool.lend()
        other = memoryview(loan.view(8))
        loan.give_back()
        self.assertEqual(pool.idle, 0)
        self.assertEqual(bytes(other), bytes(8))

    def test_keeps_at_most_keep_idle(self) -> None:
        """Loans given back beyond C{keep} idle buffers are unmapped."""
        pool = BufferPool(4096, keep=1)
        loans = [pool.lend(), pool.lend()]
        for loan in loans:
            loan.give_back()
        self.assertEqual(pool.idle, 1)
        self.assertTrue(loans[1].buffer.closed)

    def test_give_back_is_idempotent(self) -> None:
        """Giving a loan back twice returns its buffer once."""
        pool = BufferPool(4096, keep=4)
        loan = pool.lend()
        loan.give_back()
        loan.give_back()
        self.assertEqual(pool.idle, 1)

    def test_one_view_per_loan(self) -> None:
        """A loan has one view, of at most the buffer's length."""
        pool = BufferPool(4096, keep=1)
        loan = pool.lend()
        with self.assertRaises(ValueError):
            loan.view(4097)
        loan.view(4096)
        with self.assertRaises(RuntimeError):
            loan.view(1)

    def test_lent_and_given_back_on_other_threads(self) -> None:
        """Loans taken on worker threads and given back on this one are all reusable."""
        pool = BufferPool(4096, keep=8)
        loans = []

        def borrow() -> None:
            loans.append(pool.lend())

        threads = [threading.Thread(target=borrow) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for loan in loans:
            loan.give_back()
        self.assertEqual((pool.created, pool.idle), (4, 4))

    def test_bad_arguments(self) -> None:
        """A pool needs a positive size and a non-negative keep."""
        with self.assertRaises(ValueError):
            BufferPool(0, keep=1)
        with self.assertRaises(ValueError):
            BufferPool(4096, keep=-1)


class IsImmutableTests(SynchronousTestCase):
    """
    L{is_immutable}: which views the chunk store may keep without a copy.
    """

    def test_views_of_bytes_and_lent_buffers(self) -> None:
        """Views of bytes, and read-only views of lent buffers, cannot change."""
        self.assertTrue(is_immutable(memoryview(b"abc")[1:]))
        loan = BufferPool(4096, keep=1).lend()
        self.assertTrue(is_immutable(loan.view(10)))

    def test_views_that_may_change(self) -> None:
        """A writable view of a lent buffer, or any view of other mutable memory, may change."""
        loan = BufferPool(4096, keep=1).lend()
        self.assertFalse(is_immutable(memoryview(loan.buffer)))
        self.assertFalse(is_immutable(memoryview(bytearray(b"abc")).toreadonly()))
        self.assertFalse(is_immutable(memoryview(mmap.mmap(-1, 4096)).toreadonly()))
