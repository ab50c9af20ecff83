"""
TLS under data-plane frame connections, without copying chunk bytes.

Twisted's default TLS transport (C{BufferingTLSTransport}) joins what it is
given (C{writeSequence}) and what it buffered within one reactor turn into
new C{bytes} before OpenSSL sees them. For a frame carrying a 4 MiB chunk
that is a copy into freshly allocated memory per frame, measured at about a
quarter of the server's CPU for a C{chunk_get} on our 2-vCPU machines. So
frame connections use the unbuffered L{TLSMemoryBIOProtocol}
(L{frame_tls_factory}) and L{write_frame} hands each part of a frame to it
on its own: the header and msgpack payload as one small write (one TLS
record), then the raw segment as a read-only view that OpenSSL encrypts in
place, 16 KiB at a time. Frames are written whole, one call each, so the
aggregation the buffering transport offers buys little here.

On both ends, the receive loop stops as soon as OpenSSL holds no more
received bytes (nothing decrypted and waiting, nothing in its incoming
memory BIO), instead of calling C{SSL_read} once more only to have
pyOpenSSL raise C{WantReadError}: an exception per delivery, which cost
about 2% of each reactor thread during a burst of small commits.

On the receiving side, the body of a large request (a C{chunk_put}) or
of a large reply (a C{chunk_get}'s, on the client) is decrypted by OpenSSL
straight into the lent buffer the frame decoder assembles it in (the
protocol's C{receive_target}), instead of into a temporary buffer, then a
C{bytes} per 16 KiB record, then the lent buffer: two fewer copies of every
byte on the reactor thread. This calls
C{SSL_read} through pyOpenSSL's internal bindings (pinned to 26.x in
C{setup.cfg}); without them the ordinary path is used.

Frame connections also read their socket L{RECEIVE_SIZE} bytes at a time
(Twisted reads 64 KiB). Every read costs a trip through the reactor and
the TLS layer; for a 4 MiB C{chunk_put} that was 64 trips. Measured on the 2-vCPU
machine, C{chunk_put} ran about 10% faster with 256 KiB (the raw TLS
references of C{bench/dataplane.py}, built with the same factory, gained
less). A read takes what the socket holds, so a small message is
delivered as soon as before.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from OpenSSL import SSL
from OpenSSL.SSL import Error, WantReadError, ZeroReturnError
from twisted.protocols.policies import ProtocolWrapper
from twisted.protocols.tls import TLSMemoryBIOFactory, TLSMemoryBIOProtocol
from twisted.python.failure import Failure

from svc.buffer_pool import is_immutable
from svc.timers import Timer, TimerClock
from svc.wire.frame import Buffer

__all__ = [
    "RECEIVE_SIZE",
    "WRITE_SLICE",
    "PacedFrameWriter",
    "frame_tls_factory",
    "no_delay",
    "write_frame",
]

RECEIVE_SIZE = 256 * 1024
"""The most bytes a frame connection takes from its socket per read."""

WRITE_SLICE = 512 * 1024
"""
Bytes a L{PacedFrameWriter} hands to TLS per reactor turn (about a quarter
of a millisecond of encryption here).
"""

FULL_RECORD = 2**14
"""The most plaintext one TLS record carries."""

MIN_SEND_READ_SIZE = 2**15
"""The smallest read of OpenSSL's send BIO (Twisted's size)."""

SEND_READ_SIZE = WRITE_SLICE + 64 * 1024
"""
The most bytes taken from OpenSSL's send BIO per read: a paced slice with
its record overhead in one piece.
"""


def frame_tls_factory(
    creator: Any, *, is_client: bool, wrapped: Any, clock: Any
) -> TLSMemoryBIOFactory:
    """
    A TLS factory over C{wrapped} whose connections write straight to
    OpenSSL (no aggregation, no joins); C{clock} is the reactor or a test
    clock, C{creator} the connection creator (client) or options (server).
    """
    factory = TLSMemoryBIOFactory(creator, isClient=is_client, wrappedFactory=wrapped, clock=clock)
    factory.protocol = _FrameTLSProtocol
    return factory


class _FrameTLSProtocol(TLSMemoryBIOProtocol):
    """
    Unbuffered TLS that reads its socket L{RECEIVE_SIZE} bytes at a time
    and hands the records of one write to the socket as one piece.

    Twisted's protocol moves each 16 KiB record to the TCP transport as it
    is made; the transport keeps the pieces in a list and joins them into
    one new C{bytes} before sending: a copy of every byte, on the reactor
    thread, holding the GIL (a twelfth of the mount's GIL time during a
    sequential write). Here the records of one L{write} collect in
    OpenSSL's memory BIO and leave it in one read, which the transport
    sends without a join when nothing else is queued. (The overridden
    C{_write} and C{_flushSendBIO} are Twisted's, pinned to 26.x in
    C{setup.cfg}.)
    """

    _collecting = False
    _pending_hint = 0

    def makeConnection(self, transport: Any) -> None:
        # Twisted's TCP transports read (and count their write buffer as
        # full at) C{bufferSize} bytes; other transports have no such knob.
        if isinstance(getattr(transport, "bufferSize", None), int):
            transport.bufferSize = RECEIVE_SIZE
        super().makeConnection(transport)  # type: ignore[no-untyped-call]

    def _write(self, data: Any) -> None:
        self._collecting = True
        try:
            super()._write(data)  # type: ignore[no-untyped-call]
        finally:
            self._collecting = False
        # About what the records of C{data} take (22 bytes per record).
        self._pending_hint = len(data) + len(data) // 512 + 64
        self._flushSendBIO()

    def _flushReceiveBIO(self) -> None:
        if not _READ_INTO:
            super()._flushReceiveBIO()  # type: ignore[no-untyped-call]
            return
        receiver = self.wrappedProtocol
        target_of = getattr(receiver, "receive_target", _no_target)
        # Twisted's loop, with two changes. Where the protocol offers the
        # memory its next bytes belong in (the raw segment of a large
        # request, assembled in a lent buffer), OpenSSL decrypts straight
        # into it, saving two copies of every byte and a C{bytes} per
        # record. And once OpenSSL holds no more received bytes, the loop
        # ends without the read that would only raise C{WantReadError}
        # (an exception per delivery, on both ends of every connection).
        # That is asked only after a read shorter than a full record: a
        # message's last record, most likely; during a bulk transfer the
        # question would cost more than the one exception it saves.
        # Errors end the loop as in Twisted's.
        connection = self._tlsConnection
        got = -1  # bytes the previous read gave (none yet: read)
        while not self._lostTLSConnection:
            if 0 <= got < FULL_RECORD and _exhausted(connection):
                break
            got = 0
            target = target_of()
            try:
                if target is None:
                    data = connection.recv(2**15)
                else:
                    with target:
                        count = _read_into(connection, target)
            except WantReadError:
                break
            except ZeroReturnError:
                self._shutdownTLS()  # type: ignore[no-untyped-call]
                self._tlsShutdownFinished(None)  # type: ignore[no-untyped-call]
            except Error:
                self._tlsShutdownFinished(Failure())  # type: ignore[no-untyped-call]
            else:
                got = len(data) if target is None else count
                if self._aborted:
                    continue
                if target is None:
                    ProtocolWrapper.dataReceived(self, data)  # type: ignore[no-untyped-call]
                else:
                    receiver.received_into(count)
        self._flushSendBIO()

    def _flushSendBIO(self) -> None:
        if self._collecting:
            return
        # A read as large as what is expected, so a slice leaves in one
        # piece while a small message does not cost a large allocation; a
        # short read means the BIO is empty.
        size = min(max(self._pending_hint, MIN_SEND_READ_SIZE), SEND_READ_SIZE)
        self._pending_hint = 0
        while True:
            try:
                data = self._tlsConnection.bio_read(size)
            except WantReadError:
                return  # the BIO is empty
            transport: Any = self.transport
            transport.write(data)
            if len(data) < size:
                return


def no_delay(transport: object) -> None:
    """
    Turn Nagle's algorithm off on the TCP connection under C{transport} (the
    TLS layer forwards C{setTcpNoDelay} to it; test transports lack it).
    Frames are small and pipelined: with Nagle on, a frame written while the
    previous one is unacknowledged waits for the peer's delayed ACK (up to
    40 ms on Linux).
    """
    set_no_delay = getattr(transport, "setTcpNoDelay", None)
    if callable(set_no_delay):
        set_no_delay(True)


def write_frame(transport: Any, buffers: list[Buffer]) -> None:
    """
    Write one encoded frame (L{svc.wire.frame.encode_frame}: header and
    payload, then maybe the raw segment) without joining its parts. A part
    that could change after this call (not C{bytes}, not a read-only view)
    is copied first, since TLS keeps what it cannot send yet. Views go only
    to the TLS transport (which slices them per record without copying);
    any other transport (tests) gets C{bytes}.
    """
    takes_views = isinstance(transport, TLSMemoryBIOProtocol)
    for buffer in buffers:
        if isinstance(buffer, bytes):
            transport.write(memoryview(buffer) if takes_views else buffer)
        elif takes_views and isinstance(buffer, memoryview) and buffer.readonly:
            transport.write(buffer)
        else:
            transport.write(bytes(buffer))


class PacedFrameWriter:
    """
    Writes frames to one TLS transport in order, handing at most
    L{WRITE_SLICE} bytes to TLS per reactor turn.

    Encrypting a 4 MiB chunk is several milliseconds of the reactor thread
    in one go; in a mount, every application C{write} (a FUSE call the
    reactor must answer) waited behind it while the write-behind uploaded.
    Pacing lets other work run between slices. Order is kept: a frame
    written while another is still going out follows it. Parts that could
    change (anything but C{bytes} and the views L{is_immutable} accepts) are
    copied when queued, since they are read over later turns.
    """

    def __init__(
        self, transport: Callable[[], Any], clock: TimerClock, slice_bytes: int = WRITE_SLICE
    ) -> None:
        """
        @param transport: the current TLS transport (read at each write).
        @param clock: where later slices are scheduled (C{callLater(0)}).
        """
        self._transport = transport
        self._clock = clock
        self._slice = slice_bytes
        self._parts: deque[Buffer] = deque()
        self._timer: Timer | None = None
        self._then: Callable[[], object] | None = None

    @property
    def idle(self) -> bool:
        """Whether everything written has been handed to TLS."""
        return not self._parts

    def write(self, buffers: list[Buffer]) -> None:
        """Queue one encoded frame; what fits this turn goes out now."""
        for buffer in buffers:
            kept = (
                buffer
                if isinstance(buffer, bytes)
                or (isinstance(buffer, memoryview) and is_immutable(buffer))
                else bytes(buffer)
            )
            view = memoryview(kept)
            if len(view) <= self._slice:
                self._parts.append(kept)
                continue
            for start in range(0, len(view), self._slice):
                self._parts.append(view[start : start + self._slice])
        if self._timer is None:
            self._drain()

    def after_sent(self, action: Callable[[], object]) -> None:
        """Run C{action} once everything queued has been handed to TLS (now if idle)."""
        if self.idle:
            action()
        else:
            self._then = action

    def discard(self) -> None:
        """Drop what is queued (the connection is gone or aborted)."""
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        self._parts.clear()
        self._then = None

    def _drain(self) -> None:
        self._timer = None
        budget = self._slice
        transport = self._transport()
        while self._parts and budget > 0:
            part = self._parts.popleft()
            write_frame(transport, [part])
            budget -= len(part)
        if self._parts:
            self._timer = self._clock.callLater(0, self._drain)
        elif self._then is not None:
            then, self._then = self._then, None
            then()


_lib: Any = getattr(SSL, "_lib", None)
_ffi: Any = getattr(SSL, "_ffi", None)
_READ_INTO = (
    _lib is not None
    and _ffi is not None
    and hasattr(SSL.Connection, "_raise_ssl_error")
    and hasattr(_lib, "SSL_pending")
    and hasattr(_lib, "BIO_get_mem_data")
)
"""Whether pyOpenSSL's internals that L{_read_into} and L{_exhausted} need
are there (pinned 26.x)."""


def _no_target() -> None:
    """The C{receive_target} of a protocol that offers none: no memory of its own."""
    return None


def _exhausted(connection: SSL.Connection) -> bool:
    """
    Whether C{connection} holds no received bytes to read: none decrypted
    and waiting, none in its incoming memory BIO (a partial record already
    moved into OpenSSL needs more bytes first), so C{SSL_read} could only
    ask for more.
    """
    if _lib.SSL_pending(connection._ssl) > 0:
        return False
    into = connection._into_ssl
    return into is not None and _lib.BIO_get_mem_data(into, _ffi.NULL) == 0


def _read_into(connection: SSL.Connection, target: memoryview) -> int:
    """
    C{connection.recv_into(target)} without pyOpenSSL's intermediate
    buffer: C{SSL_read} writes into C{target} itself. Raises as C{recv}.
    """
    ssl: Any = connection._ssl
    with _ffi.from_buffer(target, require_writable=True) as buffer:
        result = _lib.SSL_read(ssl, buffer, len(target))
    if result <= 0:
        connection._raise_ssl_error(ssl, result)
    return int(result)
