"""
L{svc.frame_tls}: frames reach TLS without their chunk bytes being
copied, and arrive whole.
"""

from __future__ import annotations

from typing import Any

from OpenSSL import SSL
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.protocols.tls import BufferingTLSTransport, TLSMemoryBIOProtocol
from twisted.trial.unittest import SynchronousTestCase

from svc import frame_tls
from svc.dataplane.protocol import DataPlaneServerProtocol
from svc.dataplane.test.fakes import TLSHarness
from svc.dataplane_client.client import DataPlaneClient, DataPlaneClientProtocol
from svc.frame_tls import RECEIVE_SIZE, WRITE_SLICE, PacedFrameWriter, write_frame
from svc.wire.frame import Frame, FrameType, encode_frame


def counted_received_into(case: SynchronousTestCase, protocol_class: Any) -> list[int]:
    """
    Patch C{protocol_class.received_into} (for C{case}'s duration) to record
    each count of bytes decrypted straight into a lent buffer; the record.
    """
    counts: list[int] = []
    received_into = protocol_class.received_into

    def counting(protocol: Any, count: int) -> None:
        counts.append(count)
        received_into(protocol, count)

    case.patch(protocol_class, "received_into", counting)
    return counts


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
        for tls in (type(protocol.transport), harness.server_tls.protocol):
            self.assertTrue(issubclass(tls, TLSMemoryBIOProtocol))
            self.assertFalse(issubclass(tls, BufferingTLSTransport))

    def test_socket_read_size(self) -> None:
        """A frame connection reads its TCP transport RECEIVE_SIZE bytes at a time."""

        class TCPLike(StringTransport):
            bufferSize = 65536

        harness = TLSHarness()
        tcp = TCPLike()
        harness.server_tls.buildProtocol(None).makeConnection(tcp)
        self.assertEqual(tcp.bufferSize, RECEIVE_SIZE)
        # A transport without the knob is left alone.
        plain = StringTransport()
        harness.server_tls.buildProtocol(None).makeConnection(plain)
        self.assertFalse(hasattr(plain, "bufferSize"))

    def test_records_of_one_write_reach_the_socket_as_one_piece(self) -> None:
        """
        A paced slice's TLS records go to the TCP transport in one write
        (which it sends without joining), not one write per record.
        """
        harness = TLSHarness()
        protocol, pump = harness.connect_client(harness.agent())
        tls: Any = protocol.transport
        tcp = tls.transport
        pieces: list[int] = []
        original = tcp.write

        def counting(data: bytes) -> None:
            pieces.append(len(data))
            original(data)

        tcp.write = counting
        tls.write(memoryview(bytes(WRITE_SLICE)))
        self.assertEqual(len(pieces), 1)
        self.assertGreater(pieces[0], WRITE_SLICE)
        pump.flush()

    def test_reading_stops_once_nothing_is_left(self) -> None:
        """
        After delivering what arrived, neither end asks OpenSSL for more:
        no C{WantReadError} per delivery (only where a delivery really ends
        mid-record or holds nothing for the application, as the session
        tickets after the handshake).
        """
        raised: list[int] = []
        reads: list[int] = []
        recv = SSL.Connection.recv

        def counting(connection: SSL.Connection, size: int) -> bytes:
            reads.append(size)
            try:
                return recv(connection, size)
            except SSL.WantReadError:
                raised.append(size)
                raise

        self.patch(SSL.Connection, "recv", counting)
        harness = TLSHarness()
        protocol, pump = harness.connect_client(harness.agent())
        client = DataPlaneClient(protocol)
        pump.flush()
        before = len(raised)
        for n in range(20):
            result = client.call("echo", {"n": n}, b"x")
            pump.flush()
            self.assertEqual(self.successResultOf(result).payload, {"n": n})
        self.assertEqual(len(raised) - before, 0)
        self.assertGreaterEqual(len(reads), 40)  # each request and each reply read

    def test_bulk_records_are_read_without_asking_what_is_left(self) -> None:
        """
        A large message's full records are read one after another; whether
        anything is left is asked only after a short one (a message's end),
        not once per 16 KiB record.
        """
        asked: list[int] = []
        exhausted = frame_tls._exhausted

        def counting(connection: SSL.Connection) -> bool:
            asked.append(1)
            return exhausted(connection)

        self.patch(frame_tls, "_exhausted", counting)
        harness = TLSHarness()
        protocol, pump = harness.connect_client(harness.agent())
        client = DataPlaneClient(protocol)
        body = bytes(range(256)) * 4096  # 1 MiB: 64 records each way
        result = client.call("echo", {"n": 1}, body)
        pump.flush()
        self.assertEqual(self.successResultOf(result).raw, body)
        self.assertLess(len(asked), 32)

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

    def test_large_request_decrypted_into_its_lent_buffer(self) -> None:
        """
        The server's TLS layer decrypts a large request body straight into
        the buffer it is assembled in (no intermediate bytes), and the
        request, interleaved with small ones, arrives intact.
        """
        direct = counted_received_into(self, DataPlaneServerProtocol)
        harness = TLSHarness()
        protocol, pump = harness.connect_client(harness.agent())
        client = DataPlaneClient(protocol)
        body = bytes(range(251)) * (4 * 4177)
        results = [
            client.call("echo", {"n": 1}, b"small"),
            client.call("echo", {"n": 2}, body),
            client.call("echo", {"n": 3}, b"after"),
        ]
        pump.flush()
        replies = [self.successResultOf(result) for result in results]
        self.assertEqual(
            [(r.payload, r.raw) for r in replies],
            [({"n": 1}, b"small"), ({"n": 2}, body), ({"n": 3}, b"after")],
        )
        self.assertGreater(sum(direct), len(body) // 2)
        self.assertLess(sum(direct), len(body))


class ClientReceiveTests(SynchronousTestCase):
    """The client's large reply bodies are decrypted into a lent buffer, then copied out."""

    def test_large_reply_decrypted_into_a_lent_buffer_and_copied_out(self) -> None:
        """
        Most of a large reply's body goes from OpenSSL straight into the
        buffer it is assembled in; each reply keeps bytes of its own, so a
        later reply (reusing the buffer) leaves an earlier one intact.
        """
        direct = counted_received_into(self, DataPlaneClientProtocol)
        harness = TLSHarness()
        protocol, pump = harness.connect_client(harness.agent())
        client = DataPlaneClient(protocol)
        bodies = [bytes([n]) * (3 * 1024 * 1024 + n) for n in (1, 2)]
        replies = []
        for body in bodies:
            result = client.call("echo", {}, body)
            pump.flush()
            replies.append(self.successResultOf(result))
        self.assertEqual([reply.raw for reply in replies], bodies)
        self.assertIsInstance(replies[0].raw, bytes)
        self.assertGreater(sum(direct), len(bodies[0]))


class PacedFrameWriterTests(SynchronousTestCase):
    """
    L{PacedFrameWriter} hands at most a slice of bytes to TLS per reactor
    turn, in order, and says when everything went out.
    """

    def setUp(self) -> None:
        self.clock = Clock()
        self.transport = StringTransport()
        self.writer = PacedFrameWriter(lambda: self.transport, self.clock, slice_bytes=1000)

    def test_small_frames_go_out_at_once(self) -> None:
        """Frames within one slice are written in the same turn, in order."""
        first = encode_frame(Frame(FrameType.REQUEST, 1, {"op": "ping"}))
        second = encode_frame(Frame(FrameType.REQUEST, 2, {"op": "ping"}, b"x" * 10))
        self.writer.write(first)
        self.writer.write(second)
        self.assertEqual(self.transport.value(), b"".join(bytes(b) for b in first + second))
        self.assertTrue(self.writer.idle)

    def test_large_raw_segment_over_several_turns(self) -> None:
        """
        A raw segment larger than a slice goes out a slice per turn; a frame
        written meanwhile follows it whole; nothing is lost or reordered.
        """
        big = encode_frame(Frame(FrameType.REQUEST, 1, {"op": "put"}, bytes(range(250)) * 10))
        small = encode_frame(Frame(FrameType.REQUEST, 2, {"op": "ping"}))
        self.writer.write(big)
        first_turn = len(self.transport.value())
        self.assertLessEqual(first_turn, len(bytes(big[0])) + 1000)
        self.writer.write(small)
        self.assertEqual(len(self.transport.value()), first_turn)
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        self.clock.advance(0)
        self.assertTrue(self.writer.idle)
        expected = b"".join(bytes(b) for b in big + small)
        self.assertEqual(self.transport.value(), expected)

    def test_mutable_parts_copied_when_queued(self) -> None:
        """A mutable raw segment changed after write still goes out as it was."""
        raw = bytearray(b"a" * 3000)
        buffers = encode_frame(Frame(FrameType.REQUEST, 1, {"op": "put"}, raw))
        self.writer.write(buffers)
        raw[:] = b"b" * 3000
        while not self.writer.idle:
            self.clock.advance(0)
        self.assertTrue(self.transport.value().endswith(b"a" * 3000))

    def test_read_only_view_of_mutable_memory_copied(self) -> None:
        """A read-only view of a bytearray can still change: it is copied too."""
        raw = bytearray(b"c" * 3000)
        buffers = encode_frame(
            Frame(FrameType.REQUEST, 1, {"op": "put"}, memoryview(raw).toreadonly())
        )
        self.writer.write(buffers)
        raw[:] = b"d" * 3000
        while not self.writer.idle:
            self.clock.advance(0)
        self.assertTrue(self.transport.value().endswith(b"c" * 3000))

    def test_after_sent_waits_for_the_queue(self) -> None:
        """after_sent runs at once when idle, else once the last slice went out."""
        ran: list[int] = []
        self.writer.after_sent(lambda: ran.append(1))
        self.assertEqual(ran, [1])
        self.writer.write(encode_frame(Frame(FrameType.REQUEST, 1, {"op": "put"}, b"z" * 2500)))
        self.writer.after_sent(lambda: ran.append(2))
        self.assertEqual(ran, [1])
        while not self.writer.idle:
            self.clock.advance(0)
        self.assertEqual(ran, [1, 2])

    def test_discard_drops_the_queue(self) -> None:
        """After discard nothing more is written and no turn stays scheduled."""
        self.writer.write(encode_frame(Frame(FrameType.REQUEST, 1, {"op": "put"}, b"q" * 5000)))
        written = len(self.transport.value())
        self.writer.after_sent(lambda: self.fail("ran after discard"))
        self.writer.discard()
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.clock.advance(0)
        self.assertEqual(len(self.transport.value()), written)
        self.assertTrue(self.writer.idle)
