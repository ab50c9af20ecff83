"""
What a server connection holds for a peer that does not read: answers go
out in slices only while the transport takes them, and requests read while
it is paused wait to start.
"""

from __future__ import annotations

from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane.factory import ServerLimits
from svc.dataplane.interfaces import OpReply
from svc.dataplane.test.test_protocol import ServerConnection, request
from svc.frame_tls import WRITE_SLICE
from svc.wire.decoder import FrameDecoder
from svc.wire.frame import FRAMES_TO_CLIENT, FrameType

RAW = bytes(range(256)) * (3 * WRITE_SLICE // 256)
"""Three slices of answer bytes."""


class PausingTransport(StringTransport):
    """
    A transport that, like Twisted's TCP one, pauses its producer once it
    holds more than C{room} bytes, and resumes it when the test drains it.
    """

    room = 64 * 1024

    def write(self, data: bytes) -> None:
        super().write(data)
        if len(self.value()) > self.room and self.producer is not None:
            self.producer.pauseProducing()

    def drain(self) -> bytes:
        """The peer read everything held: hand it over and resume the producer."""
        data: bytes = self.value()
        self.clear()
        if self.producer is not None:
            self.producer.resumeProducing()
        return data


class Connection(ServerConnection):
    """A L{ServerConnection} over a L{PausingTransport}."""

    transport: PausingTransport

    def __init__(self, limits: ServerLimits | None = None) -> None:
        super().__init__(limits, transport=PausingTransport())


class SlicedAnswerTests(SynchronousTestCase):
    """Large answers are handed on as the transport drains."""

    def test_large_answer_in_slices_sent_after_the_last(self) -> None:
        """A 1.5 MiB answer goes one slice per drain; its sent runs only after the last slice."""
        conn = Connection()
        conn.send(request(1, "hold"))
        sent: list[bool] = []
        conn.handler.held[0].deferred.callback(
            OpReply({"n": 1}, RAW, sent=lambda: sent.append(True))
        )
        self.assertLess(len(conn.transport.value()), WRITE_SLICE + 1024)
        self.assertEqual(sent, [])
        received = conn.transport.drain() + conn.transport.drain()
        self.assertEqual(sent, [])
        received += conn.transport.drain()
        self.assertEqual(sent, [True])
        [answer] = FrameDecoder(accept=FRAMES_TO_CLIENT).feed(received + conn.transport.value())
        self.assertEqual(bytes(answer.raw), RAW)

    def test_nothing_written_while_paused(self) -> None:
        """An answer completed while the transport is paused waits for it to resume."""
        conn = Connection()
        conn.send(request(1, "hold"))
        conn.protocol.pauseProducing()
        conn.handler.held[0].deferred.callback(OpReply({}, RAW))
        self.assertEqual(conn.transport.value(), b"")
        conn.protocol.resumeProducing()
        self.assertGreater(len(conn.transport.value()), 0)

    def test_lost_connection_releases_queued_answers(self) -> None:
        """A connection lost with an answer half written runs its sent (the chunk is released)."""
        conn = Connection()
        conn.send(request(1, "hold"))
        sent: list[bool] = []
        conn.handler.held[0].deferred.callback(OpReply({}, RAW, sent=lambda: sent.append(True)))
        conn.lose()
        self.assertEqual(sent, [True])

    def test_close_waits_for_the_answers_to_go_out(self) -> None:
        """After GOAWAY the TLS close waits until the answered frames are handed on."""
        conn = Connection()
        conn.send(request(1, "hold"))
        conn.protocol.go_away("shutdown")
        conn.handler.held[0].deferred.callback(OpReply({}, RAW))
        self.assertFalse(conn.transport.disconnecting)
        while not conn.transport.disconnecting:
            conn.transport.drain()
        self.assertIsNone(conn.transport.producer)

    def test_close_timeout_covers_a_peer_that_does_not_read(self) -> None:
        """A peer that never takes the last answer is aborted at the close timeout."""
        conn = Connection(ServerLimits(close_timeout=3))
        conn.send(request(1, "hold"))
        conn.protocol.go_away("shutdown")
        conn.handler.held[0].deferred.callback(OpReply({}, RAW))
        conn.clock.advance(3)
        self.assertTrue(conn.transport.disconnected)


class HeldRequestTests(SynchronousTestCase):
    """
    Requests read while the transport is paused wait, undecoded, for a turn
    after it resumes (L{svc.dataplane.protocol}: nothing starts while the
    peer does not read).
    """

    def test_requests_wait_while_paused_then_start_in_order(self) -> None:
        """Nothing read while paused starts until the transport resumes; then all, in order."""
        conn = Connection()
        conn.protocol.pauseProducing()
        conn.send(request(1, "echo", x=1), request(2, "hold"), request(3, "echo", x=3))
        self.assertEqual(conn.handler.handled, [])
        self.assertEqual(conn.protocol.in_flight, 0)
        conn.protocol.resumeProducing()
        conn.clock.advance(0)
        self.assertEqual([op for op, _, _ in conn.handler.handled], ["echo", "hold", "echo"])
        self.assertEqual(
            [f.request_id for f in conn.frames() if f.type is FrameType.RESPONSE], [1, 3]
        )

    def test_waiting_requests_are_not_refused(self) -> None:
        """Requests waiting to start are not in flight: none is refused EAGAIN meanwhile."""
        conn = Connection(ServerLimits(max_in_flight=2))
        conn.protocol.pauseProducing()
        conn.send(request(1, "echo"), request(2, "echo"), request(3, "echo"))
        self.assertEqual(conn.frames(), [])
        conn.protocol.resumeProducing()
        conn.clock.advance(0)
        self.assertEqual(
            [f.request_id for f in conn.frames() if f.type is FrameType.RESPONSE], [1, 2, 3]
        )

    def test_waiting_requests_never_run_after_goaway(self) -> None:
        """Requests still waiting when the server goes away are neither run nor answered."""
        conn = Connection()
        conn.protocol.pauseProducing()
        conn.send(request(1, "echo"))
        conn.protocol.go_away("shutdown")
        conn.protocol.resumeProducing()
        conn.clock.advance(0)
        self.assertEqual(conn.handler.handled, [])
        self.assertNotIn(1, [f.request_id for f in conn.frames()])

    def test_queued_payloads_hold_requests_back(self) -> None:
        """While more than max_payload bytes of answers wait to be sent, new requests wait."""
        conn = Connection(ServerLimits(max_payload=1000))
        conn.send(request(1, "hold"), request(2, "hold"))
        conn.protocol.pauseProducing()
        conn.handler.held[0].deferred.callback(OpReply({}, RAW))
        conn.handler.held[1].deferred.callback(OpReply({"pad": "x" * 1200}))
        conn.send(request(3, "echo"))
        conn.protocol.resumeProducing()
        self.assertEqual(len(conn.handler.handled), 2)
        for _ in range(100):
            if len(conn.handler.handled) == 3:
                break
            conn.transport.drain()
            conn.clock.advance(0)  # the request waiting for its turn
        self.assertEqual(len(conn.handler.handled), 3)
