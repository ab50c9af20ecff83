"""
L{svc.dataplane.frame_tls}: frames reach TLS without their chunk bytes being
copied, and arrive whole.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.testing import StringTransport
from twisted.protocols.tls import TLSMemoryBIOProtocol
from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane.client import DataPlaneClient
from svc.dataplane.frame_tls import write_frame
from svc.dataplane.test.fakes import TLSHarness
from svc.wire.frame import Frame, FrameType, encode_frame


class RecordingTLS(TLSMemoryBIOProtocol):
    """A TLS protocol that only records what it is asked to write."""

    def __init__(self) -> None:
        self.written: list[Any] = []

    def write(self, data: Any) -> None:
        self.written.append(data)


class WriteFrameTests(SynchronousTestCase):
    """
    How a frame's parts are handed to the transport.
    """

    def test_tls_gets_views_of_bytes(self) -> None:
        """To TLS, the header and a bytes raw segment go as views of the same memory."""
        raw = b"r" * 100_000
        buffers = encode_frame(Frame(FrameType.RESPONSE, 7, {"ok": True}, raw))
        tls = RecordingTLS()
        write_frame(tls, buffers)
        self.assertEqual(len(tls.written), 2)
        self.assertTrue(all(isinstance(part, memoryview) for part in tls.written))
        self.assertIs(tls.written[1].obj, raw)
        self.assertEqual(b"".join(bytes(part) for part in tls.written), b"".join(buffers))

    def test_mutable_raw_is_copied(self) -> None:
        """A raw segment that could change later (a bytearray) is copied first."""
        raw = bytearray(b"m" * 1000)
        tls = RecordingTLS()
        write_frame(tls, encode_frame(Frame(FrameType.RESPONSE, 1, {}, raw)))
        raw[:] = b"x" * 1000
        self.assertEqual(bytes(tls.written[1]), b"m" * 1000)

    def test_other_transports_get_bytes(self) -> None:
        """A transport that is not TLS (a test's StringTransport) gets bytes only."""
        transport = StringTransport()
        raw = memoryview(b"view")
        buffers = encode_frame(Frame(FrameType.RESPONSE, 1, {}, raw))
        write_frame(transport, buffers)
        self.assertEqual(transport.value(), b"".join(bytes(b) for b in buffers))


class FactoryTests(SynchronousTestCase):
    """
    The TLS factory of frame connections.
    """

    def test_unbuffered_protocol(self) -> None:
        """Both ends of a connection use the plain TLS protocol, not the joining buffered one."""
        harness = TLSHarness()
        protocol, _pump = harness.connect_client(harness.agent())
        self.assertIs(type(protocol.transport), TLSMemoryBIOProtocol)
        self.assertIs(harness.server_tls.protocol, TLSMemoryBIOProtocol)

    def test_large_raw_segment_round_trip(self) -> None:
        """A 4 MiB raw segment crosses real in-memory TLS 1.3 both ways intact."""
        harness = TLSHarness()
        protocol, pump = harness.connect_client(harness.agent())
        client = DataPlaneClient(protocol)
        body = bytes(range(256)) * (4 * 4096)
        result = client.call("echo", {"n": 1}, body)
        pump.flush()
        reply = self.successResultOf(result)
        self.assertEqual((reply.payload, reply.raw), ({"n": 1}, body))
