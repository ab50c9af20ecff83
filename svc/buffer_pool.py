"""
Large page-aligned buffers lent out and reused only once nothing can see them.

Two hot paths of the data plane move 4 MiB chunks through memory:

- C{chunk_get} reads a chunk file (with C{O_DIRECT},
  L{svc.direct_io.DirectReader}) into a buffer, hashes it, and hands a view
  of it to TLS, which encrypts it at once;
- C{chunk_put}'s bytes arrive in 16 to 32 KiB TLS records; the frame decoder
  copies them into one buffer as they arrive (L{svc.wire.decoder}).

A fresh 4 MiB buffer per chunk costs about a thousand page faults and the
zeroing of every page; and holding a body's received pieces until it is
whole, then freeing them together, makes C{malloc} give memory back and
fault it in again for every frame (OpenSSL's record buffers included). On
the project's 2-vCPU machines each was a fifth or more of the server's CPU
for those operations. A L{BufferPool} keeps a few buffers and lends them
again.

Reuse must never change bytes somebody still reads. So a buffer goes back
to the pool only when no view of it exists anywhere: L{Loan.give_back}
releases the loan's own view (any other reference to that view object then
raises C{ValueError} instead of reading reused memory) and asks the
mapping whether any buffer export remains (a slice taken by somebody, a C
library holding it): C{mmap.resize} refuses while one does. A buffer still
seen is simply left to the garbage collector and the pool makes a new one
later. Forgetting to give a loan back is therefore safe too; it only costs
a fresh buffer. The lender writes a buffer only before handing out its
read-only view, so such a view is as immutable as one of C{bytes}
(L{is_immutable}): the chunk store keeps it without a defensive copy.
"""

from __future__ import annotations

import mmap
import threading

__all__ = ["BufferPool", "LentBuffer", "Loan", "footprint", "is_immutable", "page_padded"]


class LentBuffer(mmap.mmap):
    """
    The buffers a L{BufferPool} lends. Its lender writes one only before
    handing out the read-only L{Loan.view}, and it is never reused while
    any view of it exists: so a read-only view of one is as immutable as a
    view of C{bytes} (L{is_immutable}).
    """

    shown = -1
    """How many bytes from the start the loan's view shows (-1 before it exists)."""

    idle_at_trim = False
    """Whether it was already idle at its pool's last L{BufferPool.trim}."""


def is_immutable(view: memoryview) -> bool:
    """
    Whether nothing can change the bytes C{view} shows while it exists:
    a view of C{bytes}, or a read-only view of a L{LentBuffer}.
    """
    owner = view.obj
    return isinstance(owner, bytes) or (view.readonly and isinstance(owner, LentBuffer))


def footprint(data: bytes | memoryview) -> int:
    """
    The memory C{data} keeps alive: a view of C{bytes} holds the whole
    object, however little of it it shows.
    """
    if isinstance(data, memoryview) and isinstance(data.obj, bytes):
        return max(data.nbytes, len(data.obj))
    return len(data)


def page_padded(view: memoryview) -> memoryview | None:
    """
    If C{view} is exactly a loan's view (L{Loan.view}), the same bytes
    followed by the zeros L{Loan.view} wrote up to the next page boundary,
    as a read-only view starting at the page-aligned start of the buffer;
    otherwise C{None}. Made for C{O_DIRECT} writes
    (L{svc.direct_io.DirectWriter}), which then need no aligned copy.
    Release the result when done.

    Only the lender makes views of a L{LentBuffer}, and its one view starts
    at offset 0: so a read-only view of one that is as long as the loan's
    view is that view or a whole slice of it. While C{view} exists the
    buffer cannot be lent again, so the zeros stay zeros.
    """
    owner = view.obj
    if not (
        isinstance(owner, LentBuffer)
        and view.readonly
        and view.c_contiguous
        and view.nbytes == owner.shown
    ):
        return None
    with memoryview(owner) as whole:
        return whole[: _page_rounded(owner.shown)].toreadonly()


def _page_rounded(length: int) -> int:
    return -(-length // mmap.PAGESIZE) * mmap.PAGESIZE


class Loan:
    """
    One buffer lent by a L{BufferPool}: fill C{buffer} (writable, page
    aligned), expose its first bytes with L{view}, then L{give_back}.
    """

    def __init__(self, pool: BufferPool, buffer: LentBuffer) -> None:
        self._pool = pool
        self.buffer = buffer
        self._view: memoryview | None = None
        self._returned = False

    def view(self, length: int) -> memoryview:
        """
        A read-only view of the buffer's first C{length} bytes. Call it at
        most once per loan; it stops working at L{give_back}. The bytes
        after it up to the next page boundary are set to zero first (see
        L{page_padded}).
        """
        if self._view is not None:
            raise RuntimeError("a loan has one view")
        if not 0 <= length <= len(self.buffer):
            raise ValueError(f"{length} bytes do not fit a buffer of {len(self.buffer)}")
        padded = _page_rounded(length)
        if padded > length:
            self.buffer[length:padded] = bytes(padded - length)
        self.buffer.shown = length
        with memoryview(self.buffer) as whole:
            self._view = whole[:length].toreadonly()
        return self._view

    def give_back(self) -> None:
        """
        End the loan. The buffer is lent again only if nothing can see it
        any more; otherwise it is dropped. Idempotent; thread-safe.
        """
        if self._returned:
            return
        self._returned = True
        view, self._view = self._view, None
        if view is not None:
            try:
                view.release()
            except BufferError:
                return  # A C library still holds it: never reuse.
        self._pool._take_back(self.buffer)


class BufferPool:
    """
    Anonymous mappings of C{size} bytes (rounded up to whole pages, hence
    aligned for C{O_DIRECT}); at most C{keep} idle ones are kept. Thread-safe:
    loans are usually taken on a worker thread and given back on the
    reactor's.
    """

    def __init__(self, size: int, keep: int) -> None:
        if size <= 0:
            raise ValueError(f"buffer size {size} is not positive")
        if keep < 0:
            raise ValueError(f"keep {keep} is negative")
        self.size = _page_rounded(size)
        self._keep = keep
        self._idle: list[LentBuffer] = []
        self._lock = threading.Lock()
        self.created = 0
        """Buffers made so far (a figure for tests and benchmarks)."""

    @property
    def idle(self) -> int:
        """Buffers waiting to be lent."""
        with self._lock:
            return len(self._idle)

    def trim(self) -> int:
        """
        Free the idle buffers that were idle already at the previous call
        and were not lent since; how many were freed. Called every few
        seconds, it keeps the buffers a steady load reuses and gives a
        burst's memory back to the system two calls after it ends (an
        idle buffer still holds the pages of the largest chunk it carried).
        """
        with self._lock:
            stale = [buffer for buffer in self._idle if buffer.idle_at_trim]
            self._idle = [buffer for buffer in self._idle if not buffer.idle_at_trim]
            for buffer in self._idle:
                buffer.idle_at_trim = True
        for buffer in stale:
            buffer.close()
        return len(stale)

    def lend(self) -> Loan:
        """A buffer of L{size} bytes: an idle one, else a new one."""
        with self._lock:
            if self._idle:
                return Loan(self, self._idle.pop())
            self.created += 1
        return Loan(self, LentBuffer(-1, self.size))

    def _take_back(self, buffer: LentBuffer) -> None:
        try:
            # Refused (BufferError) while any export of the mapping exists:
            # the exact test for "nobody can see these bytes any more".
            buffer.resize(self.size)
        except BufferError:
            return
        buffer.shown = -1
        buffer.idle_at_trim = False
        with self._lock:
            if len(self._idle) < self._keep:
                self._idle.append(buffer)
                return
        buffer.close()
