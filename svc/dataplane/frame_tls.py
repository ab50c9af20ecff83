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
"""

from __future__ import annotations

from typing import Any

from twisted.protocols.tls import TLSMemoryBIOFactory, TLSMemoryBIOProtocol

from svc.wire.frame import Buffer

__all__ = ["frame_tls_factory", "write_frame"]


def frame_tls_factory(
    creator: Any, *, is_client: bool, wrapped: Any, clock: Any
) -> TLSMemoryBIOFactory:
    """
    A TLS factory over C{wrapped} whose connections write straight to
    OpenSSL (no aggregation, no joins); C{clock} is the reactor or a test
    clock, C{creator} the connection creator (client) or options (server).
    """
    factory = TLSMemoryBIOFactory(creator, isClient=is_client, wrappedFactory=wrapped, clock=clock)
    factory.protocol = TLSMemoryBIOProtocol
    return factory


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
