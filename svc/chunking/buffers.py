"""
Reusable stream buffers.

A fresh 32 MiB buffer is not free: the kernel must fault in and zero its pages,
which on the project's virtual machines costs about 30 ms, as much as cutting
and hashing 30 MB. Code that cuts many files (the mount client flushing, the
data plane) keeps a L{BufferPool} and passes it to the cutting functions, so
each stream borrows a warm buffer instead.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

from svc.chunking.core import MAX_CHUNK_SIZE

STREAM_BUFFER_SIZE: Final = 2 * MAX_CHUNK_SIZE
"""Bytes buffered per stream being cut (32 MiB)."""


class BufferPool:
    """
    A thread-safe stock of L{STREAM_BUFFER_SIZE}-byte buffers.

    Borrowing never blocks: when every kept buffer is in use a new one is
    made, and on return at most C{keep} buffers are kept (so give it the
    number of threads that cut at once).
    """

    def __init__(self, keep: int = 1) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self._keep = keep
        self._free: list[bytearray] = []
        self._lock = threading.Lock()

    @property
    def kept(self) -> int:
        """
        How many idle buffers the pool holds now.
        """
        with self._lock:
            return len(self._free)

    @contextmanager
    def borrow(self) -> Iterator[bytearray]:
        """
        Lend a buffer for the duration of a C{with} block.

        Whatever was written into it by an earlier borrower is still there;
        views of it must not outlive the block.
        """
        with self._lock:
            buffer = self._free.pop() if self._free else None
        if buffer is None:
            buffer = bytearray(STREAM_BUFFER_SIZE)
        try:
            yield buffer
        finally:
            with self._lock:
                if len(self._free) < self._keep:
                    self._free.append(buffer)
