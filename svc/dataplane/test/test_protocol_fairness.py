"""
Issue 34, items 2 and 3 at the protocol: a request's payload is decoded
within its operation's declared limits, and one connection cannot hold the
reactor (a bounded number of frames per turn, nothing started while the
peer does not read).
"""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane.factory import DEFAULT_FRAMES_PER_TURN, ServerLimits
from svc.dataplane.test.test_protocol import ServerConnection, errno_of, request, wire
from svc.wire.errno import WireErrno
from svc.wire.frame import FrameType, encode_frame

MILLION_EMPTY_MAPS = b"\xdd" + (1_000_000).to_bytes(4, "big") + b"\x80" * 1_000_000


def ping_with(*pairs: bytes) -> bytes:
    """A REQUEST frame (id 1) whose payload is a map of C{pairs}, already encoded."""
    count = len(pairs) // 2
    payload = b"\xdf" + count.to_bytes(4, "big") + b"".join(pairs)
    header = bytes(encode_frame(request(1, "ping"))[0][:20])
    return header[:12] + len(payload).to_bytes(4, "big") + header[16:] + payload


def next_turn(clock: Clock) -> None:
    """
    Run the one call due now, as the reactor's next turn would (a L{Clock}'s
    C{advance(0)} would also run the calls that one schedules).
    """
    due = [call for call in clock.calls if call.time <= clock.seconds()]
    [call] = due
    clock.calls.remove(call)
    call.func(*call.args, **call.kw)


class BoundedDecodingTests(SynchronousTestCase):
    """A request's map costs what its operation allows, not what the frame allows."""

    def test_megabyte_ping_is_refused_unread(self) -> None:
        """A 1 MiB ping holding a million empty maps is answered EPROTO and counted."""
        conn = ServerConnection()
        conn.protocol.dataReceived(ping_with(b"\xa2op\xa4ping", b"\xa1x", MILLION_EMPTY_MAPS))
        [answer] = conn.frames()
        self.assertEqual((answer.type, errno_of(answer)), (FrameType.ERROR, WireErrno.EPROTO))
        self.assertEqual(conn.handler.handled, [])
        [refusal] = conn.handler.refusals
        self.assertEqual(refusal.reason, "too_large")
        self.assertEqual(conn.protocol.state.value, "open")

    def test_no_op_is_refused_and_the_connection_carries_on(self) -> None:
        """A map without an op is EPROTO; the next request is served as usual."""
        conn = ServerConnection()
        conn.protocol.dataReceived(ping_with(b"\xa1x", b"\x01"))
        conn.send(request(2, "ping"))
        refused, answered = conn.frames()
        self.assertEqual(errno_of(refused), WireErrno.EPROTO)
        self.assertEqual((answered.type, answered.request_id), (FrameType.RESPONSE, 2))

    def test_op_after_a_large_value_is_found(self) -> None:
        """An op after other keys is found by skipping their values."""
        conn = ServerConnection()
        conn.protocol.dataReceived(ping_with(b"\xa1x", b"\x01", b"\xa2op", b"\xa4ping"))
        [answer] = conn.frames()
        self.assertEqual(answer.type, FrameType.RESPONSE)

    def test_malformed_goaway_is_a_protocol_error(self) -> None:
        """A client GOAWAY beyond its small limits drops the connection."""
        conn = ServerConnection()
        payload = b"\x82\xa6reason\xa8shutdown\xa1x" + MILLION_EMPTY_MAPS[:5] + b"\x80" * 10
        bad = payload[:1] + payload[1:]
        header = bytes(encode_frame(request(1, "ping"))[0][:20])
        frame = header[:5] + bytes([6]) + header[6:8] + b"\0\0\0\0"
        frame += (len(bad)).to_bytes(4, "big") + b"\0\0\0\0" + bad
        conn.protocol.dataReceived(frame)
        self.assertTrue(conn.transport.disconnecting)


class FairnessTests(SynchronousTestCase):
    """One connection yields the reactor after a bounded amount of work per read."""

    def test_one_read_is_served_over_several_turns(self) -> None:
        """Pings pipelined in one read are started C{frames_per_turn} per reactor turn."""
        conn = ServerConnection()
        conn.send(*(request(n, "ping") for n in range(1, 101)))
        per_turn = DEFAULT_FRAMES_PER_TURN
        self.assertEqual(len(conn.handler.handled), per_turn)
        self.assertEqual(conn.transport.producerState, "paused")
        turns = 1
        while len(conn.handler.handled) < 100:
            next_turn(conn.clock)
            turns += 1
            self.assertLessEqual(len(conn.handler.handled), per_turn * turns)
        self.assertEqual(turns, -(-100 // per_turn))
        self.assertEqual(len(conn.frames()), 100)
        self.assertEqual(conn.transport.producerState, "producing")

    def test_turn_size_is_configurable(self) -> None:
        """C{frames_per_turn} sets how many frames one turn starts."""
        conn = ServerConnection(ServerLimits(frames_per_turn=3))
        conn.send(*(request(n, "ping") for n in range(1, 8)))
        self.assertEqual(len(conn.handler.handled), 3)
        next_turn(conn.clock)
        self.assertEqual(len(conn.handler.handled), 6)

    def test_nothing_starts_while_the_peer_does_not_read(self) -> None:
        """With the transport's buffer full, received requests wait unstarted."""
        conn = ServerConnection()
        conn.protocol.pauseProducing()
        conn.send(*(request(n, "ping") for n in range(1, 6)))
        conn.clock.advance(0)
        self.assertEqual(conn.handler.handled, [])
        conn.protocol.resumeProducing()
        conn.clock.advance(0)
        self.assertEqual(len(conn.handler.handled), 5)

    def test_frames_left_after_goaway_are_not_run(self) -> None:
        """Requests still waiting for a turn when the server goes away never run."""
        conn = ServerConnection(ServerLimits(frames_per_turn=2))
        conn.protocol.dataReceived(wire(*(request(n, "ping") for n in range(1, 6))))
        conn.protocol.go_away("shutdown")
        conn.clock.advance(0)
        self.assertEqual(len(conn.handler.handled), 2)

    def test_large_payloads_end_a_turn_early(self) -> None:
        """A turn ends once its frames' payloads reach C{payload_bytes_per_turn}."""
        conn = ServerConnection(ServerLimits(payload_bytes_per_turn=100))
        conn.send(*(request(n, "echo", pad="x" * 60) for n in range(1, 6)))
        self.assertEqual(len(conn.handler.handled), 2)
        next_turn(conn.clock)
        self.assertEqual(len(conn.handler.handled), 4)
