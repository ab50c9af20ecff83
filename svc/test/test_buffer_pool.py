"""
Tests for L{svc.buffer_pool}: buffers lent again only when nobody can see them.
"""

from __future__ import annotations

import mmap
import pickle
import threading

from twisted.trial.unittest import SynchronousTestCase

from svc.buffer_pool import BufferPool, footprint, is_immutable, page_padded


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

    def test_trim_frees_buffers_idle_since_the_previous_trim(self) -> None:
        """A buffer idle through two trims is unmapped; one lent in between is kept."""
        pool = BufferPool(4096, keep=4)
        loans = [pool.lend(), pool.lend()]
        for loan in loans:
            loan.give_back()
        self.assertEqual(pool.trim(), 0)
        reused = pool.lend()
        reused.give_back()
        self.assertEqual(pool.trim(), 1)
        self.assertEqual(pool.idle, 1)
        self.assertTrue(loans[0].buffer.closed or loans[1].buffer.closed)
        self.assertFalse(reused.buffer.closed)
        self.assertEqual(pool.trim(), 1)
        self.assertEqual(pool.idle, 0)
        self.assertTrue(reused.buffer.closed)

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


class PagePaddedTests(SynchronousTestCase):
    """
    L{page_padded}: a loan's view as page-aligned, zero-padded memory that
    C{O_DIRECT} can write from where it lies.
    """

    def test_loan_view_zero_padded_to_the_page(self) -> None:
        """The bytes after the view up to the page boundary read as zeros, whatever was there."""
        pool = BufferPool(3 * mmap.PAGESIZE, keep=1)
        loan = pool.lend()
        loan.buffer[:] = b"\xff" * len(loan.buffer)
        view = loan.view(mmap.PAGESIZE + 5)
        padded = page_padded(view)
        assert padded is not None
        self.assertEqual(len(padded), 2 * mmap.PAGESIZE)
        self.assertTrue(padded.readonly)
        self.assertEqual(bytes(padded[: len(view)]), b"\xff" * len(view))
        self.assertEqual(bytes(padded[len(view) :]), bytes(mmap.PAGESIZE - 5))
        padded.release()

    def test_whole_slice_and_cast_of_the_view(self) -> None:
        """A full-length slice or byte cast of the loan's view is still recognised."""
        loan = BufferPool(mmap.PAGESIZE, keep=1).lend()
        view = loan.view(100)
        for same in (view[:], view.cast("B"), memoryview(view)):
            padded = page_padded(same)
            assert padded is not None
            self.assertEqual(len(padded), mmap.PAGESIZE)
            padded.release()

    def test_other_views_not_padded(self) -> None:
        """A shorter slice, an offset slice, a writable view or foreign memory: None."""
        loan = BufferPool(2 * mmap.PAGESIZE, keep=1).lend()
        view = loan.view(mmap.PAGESIZE)
        self.assertIsNone(page_padded(view[:-1]))
        self.assertIsNone(page_padded(view[1:]))
        self.assertIsNone(page_padded(memoryview(loan.buffer)))
        self.assertIsNone(page_padded(memoryview(b"x" * mmap.PAGESIZE)))
        self.assertIsNone(page_padded(memoryview(mmap.mmap(-1, mmap.PAGESIZE)).toreadonly()))

    def test_reused_buffer_forgets_its_view(self) -> None:
        """A buffer lent again is not mistaken for its former view before it has a new one."""
        pool = BufferPool(mmap.PAGESIZE, keep=1)
        loan = pool.lend()
        loan.view(10)
        loan.give_back()
        again = pool.lend()
        self.assertIs(again.buffer, loan.buffer)
        with memoryview(again.buffer) as whole:
            self.assertIsNone(page_padded(whole[:10].toreadonly()))

    def test_padded_view_keeps_buffer_out_of_the_pool(self) -> None:
        """While the padded view is held, giving the loan back does not make it lendable."""
        pool = BufferPool(mmap.PAGESIZE, keep=1)
        loan = pool.lend()
        padded = page_padded(loan.view(10))
        loan.give_back()
        self.assertEqual(pool.idle, 0)
        assert padded is not None
        padded.release()


class FootprintTests(SynchronousTestCase):
    """
    L{footprint}: the memory a chunk's bytes keep alive.
    """

    def test_bytes_and_views(self) -> None:
        """Bytes count themselves; a view of bytes counts the whole object."""
        data = bytes(1000)
        self.assertEqual(footprint(data), 1000)
        self.assertEqual(footprint(memoryview(data)[10:20]), 1000)
        self.assertEqual(footprint(memoryview(data)), 1000)

    def test_other_views_count_what_they_show(self) -> None:
        """A view of other memory counts its own length."""
        self.assertEqual(footprint(memoryview(bytearray(1000))[:10]), 10)
