"""
The server's frames out of one connection: in order, large ones in slices,
each slice only while the transport is taking data.

Handing a 16 MiB C{chunk_get} answer to TLS in one call makes OpenSSL
encrypt all of it into its memory BIO and Twisted's TCP transport queue all
of the ciphertext, whether or not the peer reads: a second copy of every
answer, held as long as the peer does not read, outside any budget. The
L{AnswerWriter} instead writes a frame's parts slice by slice
(L{svc.frame_tls.WRITE_SLICE}, 512 KiB) and stops while the transport has
paused it (L{pause}, called from the producer's C{pauseProducing}: Twisted's
TCP transport does that as soon as it holds more than its buffer size,
256 KiB for frame connections), going on when it resumes. So a connection
holds at most about one slice of ciphertext plus the transport's buffer;
the plaintext stays where it was (a chunk lent by the store, not copied)
until its last slice is written.

A frame is I{sent} once its last slice was handed to TLS; then its
C{then} callback runs (for an answer: the store's buffer is given back and
its answer budget released, L{svc.dataplane.answer_budget}). Frames no
larger than one slice, written when nothing is queued, go out at once even
while paused (HELLO, errors, pushes, small answers: they are what the
connection's request limits already bound). Everything written after a
queued frame waits behind it: frames never interleave.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from twisted.logger import Logger

from svc.buffer_pool import is_immutable
from svc.frame_tls import WRITE_SLICE
from svc.wire.frame import Buffer

_log = Logger()

Then = Callable[[], object]


class _Queued:
    """One frame being written: its parts, where the writing is, and its C{then}."""

    def __init__(self, parts: list[memoryview], then: Then | None) -> None:
        self.parts = deque(parts)
        self.offset = 0
        self.then = then
        self.payload = len(parts[0]) if parts else 0


def _kept(buffer: Buffer) -> memoryview:
    """A view of C{buffer} that nobody can change while it waits (a copy if needed)."""
    if isinstance(buffer, bytes):
        return memoryview(buffer)
    if isinstance(buffer, memoryview) and is_immutable(buffer):
        return buffer
    return memoryview(bytes(buffer))


class AnswerWriter:
    """
    Writes encoded frames to one connection; see the module docstring.
    """

    def __init__(self, write: Callable[[memoryview], None], slice_bytes: int = WRITE_SLICE) -> None:
        """
        @param write: hands one piece to the transport (for TLS:
            L{svc.frame_tls.write_frame} with that one piece).
        @param slice_bytes: the most bytes handed on per piece.
        """
        self._write = write
        self._slice = slice_bytes
        self._queue: deque[_Queued] = deque()
        self._paused = False
        self._pumping = False
        self._when_idle: list[Callable[[], object]] = []
        self.queued_bytes = 0
        """Bytes of queued frames not yet handed on."""
        self.queued_payload_bytes = 0
        """
        Header and payload bytes of the queued frames (their raw segments
        are left out: a server answer's raw segment is a chunk, counted in
        the answer budgets).
        """

    @property
    def idle(self) -> bool:
        """Whether every frame written has been handed on."""
        return not self._queue

    @property
    def paused(self) -> bool:
        """Whether the transport has paused this writer."""
        return self._paused

    def write(self, buffers: list[Buffer], then: Then | None = None) -> None:
        """
        Write one encoded frame (L{svc.wire.frame.encode_frame}'s buffers);
        C{then} runs once it has been handed on, or dropped (L{discard}).
        """
        size = sum(len(buffer) for buffer in buffers)
        if not self._queue and size <= self._slice:
            try:
                for buffer in buffers:
                    self._write(_kept(buffer))
            finally:
                _run(then)
            return
        queued = _Queued([_kept(buffer) for buffer in buffers], then)
        self._queue.append(queued)
        self.queued_bytes += size
        self.queued_payload_bytes += queued.payload
        self._pump()

    def pause(self) -> None:
        """The transport holds enough: write nothing more until L{resume}."""
        self._paused = True

    def resume(self) -> None:
        """The transport drained: go on writing."""
        self._paused = False
        self._pump()

    def when_idle(self, action: Callable[[], object]) -> None:
        """Run C{action} once everything queued has been handed on (now if idle)."""
        if self.idle:
            action()
        else:
            self._when_idle.append(action)

    def discard(self) -> None:
        """
        The connection is gone: drop what is queued, running each frame's
        C{then} (nothing is written any more).
        """
        queue, self._queue = self._queue, deque()
        self._when_idle.clear()
        self.queued_bytes = 0
        self.queued_payload_bytes = 0
        for queued in queue:
            queued.parts.clear()
            _run(queued.then)

    def _pump(self) -> None:
        if self._pumping:
            return  # the write below paused or resumed us: the loop sees it
        self._pumping = True
        try:
            while self._queue and not self._paused:
                self._write_slice(self._queue[0])
        finally:
            self._pumping = False
        if not self._queue and self._when_idle:
            actions, self._when_idle = self._when_idle, []
            for action in actions:
                action()

    def _write_slice(self, queued: _Queued) -> None:
        budget = self._slice
        while queued.parts and budget > 0:
            part = queued.parts[0]
            piece = part[queued.offset : queued.offset + budget]
            queued.offset += len(piece)
            budget -= len(piece)
            if queued.offset >= len(part):
                queued.parts.popleft()
                queued.offset = 0
            del part
            self.queued_bytes -= len(piece)
            self._write(piece)
            del piece
        if not queued.parts and self._queue and self._queue[0] is queued:
            self._queue.popleft()
            self.queued_payload_bytes -= queued.payload
            _run(queued.then)


def _run(then: Then | None) -> None:
    if then is None:
        return
    try:
        then()
    except Exception:
        _log.failure("a sent frame's callback failed")
