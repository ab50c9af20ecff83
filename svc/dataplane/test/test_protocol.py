"""
The data-plane server protocol without TLS: a L{StringTransport}, a fixed
admission and the scripted fake service, so each connection rule is pinned
on plain frames.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import ITransport
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import capturedLogs
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from svc.buffer_pool import BufferPool
from svc.dataplane.factory import ServerLimits
from svc.dataplane.interfaces import OpReply
from svc.dataplane.protocol import ConnectionState, DataPlaneServerProtocol
from svc.dataplane.test.fakes import FAKE_OPS, ScriptedConnectionHandler, ScriptedDataPlaneService
from svc.pki.errors import AdmissionRefused, RefusalReason
from svc.pki.identity import AgentIdentity
from svc.wire.control import GoAway, goaway_frame, read_error, read_goaway, read_hello
from svc.wire.decoder import LEND_RAW_FROM, FrameDecoder
from svc.wire.errno import WireErrno
from svc.wire.frame import FRAMES_TO_CLIENT, MAX_RAW_SIZE, Frame, FrameType, encode_frame

IDENTITY = AgentIdentity(
    tenant_id="tenant-a",
    agent_id="agent-1",
    user_id="user-1",
    serial="1a2b",
    subject="CN=user-1",
    not_after=datetime(2030, 1, 1, tzinfo=UTC),
)


def request(request_id: int, op: str, raw: bytes = b"", **payload: object) -> Frame:
    """A REQUEST frame."""
    return Frame(FrameType.REQUEST, request_id, {**payload, "op": op}, raw)


def wire(*frames: Frame) -> bytes:
    """C{frames} encoded back to back."""
    return b"".join(bytes(b) for f in frames for b in encode_frame(f))


def admit(_transport: ITransport) -> AgentIdentity:
    """An admission that admits everyone as L{IDENTITY}."""
    return IDENTITY


def refuse(_transport: ITransport) -> AgentIdentity:
    """An admission that refuses everyone."""
    raise AdmissionRefused(RefusalReason.DENIED_SERIAL, "1a2b")


class ServerConnection:
    """One server protocol on a L{StringTransport}, admitted unless told not to."""

    def __init__(
        self,
        limits: ServerLimits | None = None,
        admission: object = admit,
        admitted: bool = True,
        raw_buffers: BufferPool | None = None,
        transport: StringTransport | None = None,
    ) -> None:
        self.clock = Clock()
        self.service = ScriptedDataPlaneService()
        self.limits = limits or ServerLimits()
        self.transport = transport or StringTransport()
        self.protocol = DataPlaneServerProtocol(
            service=self.service,
            admission=admission,  # type: ignore[arg-type]
            clock=self.clock,
            limits=self.limits,
            new_connection_id=lambda: "conn-1",
            commands=FAKE_OPS,
            raw_buffers=raw_buffers,
        )
        self.protocol.makeConnection(self.transport)
        self._decoder = FrameDecoder(accept=FRAMES_TO_CLIENT)
        if admitted:
            self.protocol.handshakeCompleted()
            hello = self.frames()
            assert [f.type for f in hello] == [FrameType.HELLO], hello

    @property
    def handler(self) -> ScriptedConnectionHandler:
        """The one handler the service made."""
        [handler] = self.service.handlers
        return handler

    def send(self, *frames: Frame) -> None:
        """Deliver C{frames} in one read."""
        self.protocol.dataReceived(wire(*frames))

    def send_in_records(self, *frames: Frame) -> None:
        """Deliver C{frames} in 16 KiB reads, as TLS records arrive."""
        data = wire(*frames)
        for start in range(0, len(data), 16384):
            self.protocol.dataReceived(data[start : start + 16384])

    def frames(self) -> list[Frame]:
        """The frames written since the last call."""
        data = self.transport.value()
        self.transport.clear()
        return self._decoder.feed(data)

    def lose(self) -> None:
        """The transport reports the connection gone."""
        self.protocol.connectionLost(Failure(ConnectionDone()))


def errno_of(frame: Frame) -> WireErrno:
    """The errno of an ERROR frame."""
    return read_error(frame).errno


class AdmissionTests(SynchronousTestCase):
    """
    What happens between the handshake and the first frame.
    """

    def test_hello_is_the_first_frame(self) -> None:
        """An admitted connection gets HELLO with the configured limits before anything."""
        limits = ServerLimits(max_in_flight=7, max_payload=1000, server_name="svc-test")
        conn = ServerConnection(limits, admitted=False)
        self.assertEqual(conn.transport.value(), b"")
        conn.protocol.handshakeCompleted()
        [hello] = conn.frames()
        info = read_hello(hello)
        self.assertEqual(
            (info.versions, info.max_in_flight, info.max_payload, info.server),
            ((1,), 7, 1000, "svc-test"),
        )
        self.assertEqual(conn.handler.identity, IDENTITY)
        self.assertEqual(conn.handler.connection_id, "conn-1")
        self.assertIs(conn.handler.sink, conn.protocol)

    def test_refused_peer_gets_no_byte(self) -> None:
        """A refused peer is aborted without a byte written and never reaches the service."""
        conn = ServerConnection(admission=refuse, admitted=False)
        with capturedLogs() as events:
            conn.protocol.handshakeCompleted()
        self.assertEqual(conn.transport.value(), b"")
        self.assertTrue(conn.transport.disconnected)
        self.assertEqual(conn.service.handlers, [])
        self.assertTrue(any(e.get("reason") == "admission" for e in events))
        conn.lose()
        self.assertEqual(conn.service.handlers, [])

    def test_bytes_before_admission_discarded(self) -> None:
        """Bytes read before admission are never executed."""
        conn = ServerConnection(admitted=False)
        conn.send(request(1, "echo"))
        conn.protocol.handshakeCompleted()
        self.assertEqual(conn.handler.handled, [])

    def test_handshake_timeout(self) -> None:
        """A connection that never completes its handshake is aborted."""
        conn = ServerConnection(limits=ServerLimits(handshake_timeout=5), admitted=False)
        conn.clock.advance(5)
        self.assertTrue(conn.transport.disconnected)
        self.assertEqual(conn.transport.value(), b"")


class TCPTransport(StringTransport):
    """A L{StringTransport} that records C{setTcpNoDelay}."""

    no_delay: bool | None = None

    def setTcpNoDelay(self, enabled: bool) -> None:
        self.no_delay = enabled


class NoDelayTests(SynchronousTestCase):
    """The server turns Nagle's algorithm off: pipelined answers are not held back."""

    def test_no_delay_on_connection(self) -> None:
        """setTcpNoDelay(True) is called on a TCP transport as the connection is made."""
        transport = TCPTransport()
        protocol = DataPlaneServerProtocol(
            service=ScriptedDataPlaneService(),
            admission=admit,
            clock=Clock(),
            limits=ServerLimits(),
            new_connection_id=lambda: "conn-1",
            commands=FAKE_OPS,
        )
        protocol.makeConnection(transport)
        self.assertIs(transport.no_delay, True)


class RequestTests(SynchronousTestCase):
    """
    Requests in, answers out.
    """

    def test_echo(self) -> None:
        """A request's answer carries the reply payload and raw segment under its id."""
        conn = ServerConnection()
        conn.send(request(5, "echo", b"bytes", size=3))
        [answer] = conn.frames()
        self.assertEqual(
            (answer.type, answer.request_id, answer.payload, bytes(answer.raw)),
            (FrameType.RESPONSE, 5, {"size": 3}, b"bytes"),
        )
        self.assertEqual(conn.handler.handled, [("echo", {"op": "echo", "size": 3}, b"bytes")])

    def test_pipelined_answers_in_completion_order(self) -> None:
        """Requests run together; each answer carries its own id, in completion order."""
        conn = ServerConnection()
        conn.send(request(1, "hold"), request(2, "hold"), request(3, "hold"))
        self.assertEqual(len(conn.handler.held), 3)
        for index, tag in [(2, "c"), (0, "a"), (1, "b")]:
            conn.handler.held[index].deferred.callback(OpReply({"tag": tag}))
        self.assertEqual(
            [(f.request_id, f.payload["tag"]) for f in conn.frames()],
            [(3, "c"), (1, "a"), (2, "b")],
        )

    def test_eagain_beyond_max_in_flight(self) -> None:
        """A request beyond max_in_flight is answered EAGAIN and not executed."""
        conn = ServerConnection(ServerLimits(max_in_flight=2))
        conn.send(request(1, "hold"), request(2, "hold"), request(3, "echo"))
        [answer] = conn.frames()
        self.assertEqual((answer.request_id, errno_of(answer)), (3, WireErrno.EAGAIN))
        self.assertEqual([op for op, _, _ in conn.handler.handled], ["hold", "hold"])

    def test_unknown_op(self) -> None:
        """An unknown op is answered ENOSYS without reaching the service."""
        conn = ServerConnection()
        conn.send(request(1, "frobnicate"))
        [answer] = conn.frames()
        self.assertEqual(errno_of(answer), WireErrno.ENOSYS)
        self.assertEqual(conn.handler.handled, [])

    def test_push_op_as_request(self) -> None:
        """A push name sent as a request (lease_revoke, changed) is ENOSYS, never executed."""
        conn = ServerConnection()
        conn.send(request(1, "lease_revoke"), request(2, "changed"))
        answers = conn.frames()
        self.assertEqual(
            [(a.type, a.request_id, errno_of(a)) for a in answers],
            [(FrameType.ERROR, 1, WireErrno.ENOSYS), (FrameType.ERROR, 2, WireErrno.ENOSYS)],
        )
        self.assertEqual(conn.handler.handled, [])

    def test_errno_exception(self) -> None:
        """An exception with a WireErrno becomes ERROR with its errno, message, details."""
        conn = ServerConnection()
        conn.send(request(4, "refuse", errno=int(WireErrno.ESTALE)))
        [answer] = conn.frames()
        info = read_error(answer)
        self.assertEqual(
            (answer.request_id, info.errno, info.message, dict(info.details)),
            (4, WireErrno.ESTALE, "refused by script", {"why": "scripted"}),
        )

    def test_bug_is_eio_and_logged(self) -> None:
        """Any other exception is logged as a failure and answered EIO, generically."""
        conn = ServerConnection()
        conn.send(request(1, "crash"))
        [answer] = conn.frames()
        info = read_error(answer)
        self.assertEqual((info.errno, info.message), (WireErrno.EIO, "internal server error"))
        self.assertEqual(len(self.flushLoggedErrors(ZeroDivisionError)), 1)

    def test_unencodable_reply_is_eio(self) -> None:
        """A reply the codec refuses is logged as a bug and answered EIO."""
        conn = ServerConnection()
        conn.send(request(1, "hold"))
        conn.handler.held[0].deferred.callback(OpReply({"bad": {1, 2}}))
        [answer] = conn.frames()
        self.assertEqual(errno_of(answer), WireErrno.EIO)
        self.assertEqual(len(self.flushLoggedErrors()), 1)

    def test_reply_sent_callback_after_the_frame_is_written(self) -> None:
        """
        A reply's C{sent} runs once, after its frame was handed to the
        transport (so lent chunk bytes are released only then), and also
        when the reply could not be encoded.
        """
        conn = ServerConnection()
        conn.send(request(1, "hold"), request(2, "hold"))
        written_at_sent: list[bytes] = []

        def sent() -> None:
            written_at_sent.append(conn.transport.value())

        conn.handler.held[0].deferred.callback(OpReply({"n": 1}, b"chunk bytes", sent=sent))
        [answer] = conn.frames()
        self.assertEqual(bytes(answer.raw), b"chunk bytes")
        self.assertEqual(len(written_at_sent), 1)
        self.assertEqual(FrameDecoder().feed(written_at_sent[0]), [answer])
        conn.handler.held[1].deferred.callback(OpReply({"bad": {1, 2}}, b"x", sent=sent))
        self.assertEqual(errno_of(conn.frames()[0]), WireErrno.EIO)
        self.assertEqual(len(written_at_sent), 2)
        self.assertEqual(len(self.flushLoggedErrors()), 1)

    def test_lent_raw_given_back_once_answered(self) -> None:
        """
        A large raw segment assembled in a lent buffer goes back to the pool
        when its request is answered, and the handler's view of it stays
        readable until then; later requests reuse the buffer.
        """
        pool = BufferPool(MAX_RAW_SIZE, keep=2)
        conn = ServerConnection(raw_buffers=pool)
        body = b"\x17" * (LEND_RAW_FROM + 100)
        for request_id in (1, 2, 3):
            conn.send_in_records(request(request_id, "hold", body))
            self.assertEqual(pool.idle, 0)
            self.assertEqual(conn.handler.handled[-1][2], body)
            conn.handler.held[-1].deferred.callback(OpReply({"n": request_id}))
            self.assertEqual(pool.idle, 1)
        self.assertEqual(pool.created, 1)
        self.assertEqual([f.request_id for f in conn.frames()], [1, 2, 3])

    def test_lent_raw_given_back_when_refused_or_timed_out(self) -> None:
        """
        A lent raw segment goes back when its request is refused unexecuted
        (EAGAIN, ENOSYS) and when it times out.
        """
        pool = BufferPool(MAX_RAW_SIZE, keep=4)
        conn = ServerConnection(ServerLimits(max_in_flight=1, request_timeout=10), raw_buffers=pool)
        body = b"\x42" * LEND_RAW_FROM
        conn.send_in_records(request(1, "hold", body))
        conn.send_in_records(request(2, "hold", body))
        self.assertEqual(errno_of(conn.frames()[0]), WireErrno.EAGAIN)
        self.assertEqual(pool.idle, 1)
        conn.clock.advance(10)
        self.assertEqual(errno_of(conn.frames()[0]), WireErrno.ETIMEDOUT)
        self.assertEqual(pool.idle, 2)
        conn.send_in_records(request(3, "frobnicate", body))
        self.assertEqual(errno_of(conn.frames()[0]), WireErrno.ENOSYS)
        self.assertEqual((pool.created, pool.idle), (2, 2))

    def test_duplicate_request_id_drops(self) -> None:
        """Reusing an unanswered id drops the connection; running work is cancelled."""
        conn = ServerConnection()
        conn.send(request(1, "hold"), request(1, "echo"))
        frames = conn.frames()
        self.assertEqual([f.type for f in frames], [FrameType.GOAWAY])
        self.assertEqual(read_goaway(frames[0]).reason, "protocol_error")
        self.assertTrue(conn.transport.disconnecting)
        self.assertTrue(conn.handler.held[0].cancelled)
        self.assertEqual(len(conn.handler.handled), 1)

    def test_request_timeout(self) -> None:
        """An unanswered request gets ETIMEDOUT and is cancelled; a late answer is dropped."""
        conn = ServerConnection(ServerLimits(request_timeout=10))
        conn.send(request(1, "hold"))
        conn.clock.advance(9)
        self.assertEqual(conn.frames(), [])
        conn.clock.advance(1)
        [answer] = conn.frames()
        self.assertEqual(errno_of(answer), WireErrno.ETIMEDOUT)
        self.assertTrue(conn.handler.held[0].cancelled)
        self.assertEqual(conn.protocol.in_flight, 0)


class TimeoutTests(SynchronousTestCase):
    """
    Idle connections.
    """

    def test_idle_timeout(self) -> None:
        """A connection with nothing to do for idle_timeout gets GOAWAY idle_timeout and closes."""
        conn = ServerConnection(ServerLimits(idle_timeout=60))
        conn.clock.advance(59)
        self.assertFalse(conn.transport.disconnecting)
        conn.clock.advance(1)
        [goaway] = conn.frames()
        self.assertEqual(read_goaway(goaway).reason, "idle_timeout")
        self.assertTrue(conn.transport.disconnecting)

    def test_requests_reset_idle_timer(self) -> None:
        """The idle clock restarts when the last request is answered, and not while one runs."""
        conn = ServerConnection(ServerLimits(idle_timeout=60, request_timeout=500))
        conn.clock.advance(50)
        conn.send(request(1, "hold"))
        conn.clock.advance(100)
        self.assertFalse(conn.transport.disconnecting)
        conn.handler.held[0].deferred.callback(OpReply())
        conn.clock.advance(59)
        self.assertFalse(conn.transport.disconnecting)
        conn.clock.advance(1)
        self.assertTrue(conn.transport.disconnecting)


class BackPressureTests(SynchronousTestCase):
    """
    Reading stops while too much is unanswered or the write buffer is full.
    """

    def test_in_flight_limit_pauses_reading(self) -> None:
        """Reaching max_in_flight pauses the transport; an answer resumes it."""
        conn = ServerConnection(ServerLimits(max_in_flight=2))
        conn.send(request(1, "hold"))
        self.assertEqual(conn.transport.producerState, "producing")
        conn.send(request(2, "hold"))
        self.assertEqual(conn.transport.producerState, "paused")
        conn.handler.held[0].deferred.callback(OpReply())
        self.assertEqual(conn.transport.producerState, "producing")

    def test_unanswered_bytes_pause_reading(self) -> None:
        """Unanswered raw bytes above the bound pause reading until below the low mark."""
        limits = ServerLimits(pause_reading_above=1000, resume_reading_below=500)
        conn = ServerConnection(limits)
        conn.send(request(1, "hold", b"x" * 600))
        self.assertEqual(conn.transport.producerState, "producing")
        conn.send(request(2, "hold", b"x" * 600))
        self.assertEqual(conn.transport.producerState, "paused")
        conn.handler.held[0].deferred.callback(OpReply())
        self.assertEqual(conn.transport.producerState, "paused")
        conn.handler.held[1].deferred.callback(OpReply())
        self.assertEqual(conn.transport.producerState, "producing")

    def test_full_write_buffer_pauses_reading(self) -> None:
        """When the transport pauses us as a producer, reading pauses until it resumes us."""
        conn = ServerConnection()
        self.assertIs(conn.transport.producer, conn.protocol)
        conn.protocol.pauseProducing()
        self.assertEqual(conn.transport.producerState, "paused")
        conn.protocol.resumeProducing()
        self.assertEqual(conn.transport.producerState, "producing")


class SinkTests(SynchronousTestCase):
    """
    The service's side of the connection: push and disconnect.
    """

    def test_push(self) -> None:
        """push sends a PUSH frame with id 0 and the op in its payload."""
        conn = ServerConnection()
        conn.handler.sink.push("lease_revoke", {"lease_id": "l1"})
        [push] = conn.frames()
        self.assertEqual(
            (push.type, push.request_id, push.payload),
            (FrameType.PUSH, 0, {"lease_id": "l1", "op": "lease_revoke"}),
        )

    def test_changed_dropped_while_peer_not_reading(self) -> None:
        """With the write buffer full, changed pushes are dropped; lease_revoke still goes."""
        conn = ServerConnection()
        conn.protocol.pauseProducing()
        conn.handler.sink.push("changed", {"paths": ["/agent-1/f"], "session_id": None})
        conn.handler.sink.push("lease_revoke", {"lease_id": "l1"})
        conn.protocol.resumeProducing()
        conn.handler.sink.push("changed", {"paths": ["/agent-1/g"], "session_id": None})
        self.assertEqual(
            [push.payload["op"] for push in conn.frames()], ["lease_revoke", "changed"]
        )
        self.assertEqual(conn.protocol.pushes_dropped, 1)

    def test_disconnect_drains(self) -> None:
        """disconnect sends GOAWAY, executes nothing new, answers what it read, then closes."""
        conn = ServerConnection()
        conn.send(request(1, "hold"))
        conn.handler.sink.disconnect("credentials_expired")
        conn.send(request(2, "echo"))
        [goaway] = conn.frames()
        self.assertEqual(read_goaway(goaway).reason, "credentials_expired")
        self.assertEqual(len(conn.handler.handled), 1)
        self.assertFalse(conn.transport.disconnecting)
        conn.handler.held[0].deferred.callback(OpReply())
        [answer] = conn.frames()
        self.assertEqual((answer.type, answer.request_id), (FrameType.RESPONSE, 1))
        self.assertTrue(conn.transport.disconnecting)
        self.assertIsNone(conn.transport.producer)

    def test_drain_timeout(self) -> None:
        """Requests still running at the drain timeout get ETIMEDOUT, then the connection closes."""
        conn = ServerConnection(ServerLimits(drain_timeout=5))
        conn.send(request(1, "hold"))
        conn.protocol.go_away("shutdown")
        conn.frames()
        conn.clock.advance(5)
        [answer] = conn.frames()
        self.assertEqual(errno_of(answer), WireErrno.ETIMEDOUT)
        self.assertTrue(conn.handler.held[0].cancelled)
        self.assertTrue(conn.transport.disconnecting)

    def test_close_timeout_aborts(self) -> None:
        """A close the peer does not complete is aborted after close_timeout."""
        conn = ServerConnection(ServerLimits(close_timeout=3))
        conn.protocol.go_away("shutdown")
        self.assertFalse(conn.transport.disconnected)
        conn.clock.advance(3)
        self.assertTrue(conn.transport.disconnected)

    def test_client_goaway(self) -> None:
        """After a client GOAWAY the server answers what it read and closes."""
        conn = ServerConnection()
        conn.send(request(1, "hold"), goaway_frame(GoAway("shutdown")))
        self.assertFalse(conn.transport.disconnecting)
        conn.handler.held[0].deferred.callback(OpReply())
        self.assertEqual([f.type for f in conn.frames()], [FrameType.RESPONSE])
        self.assertTrue(conn.transport.disconnecting)

    def test_close_op(self) -> None:
        """The close op is answered, with a GOAWAY; later requests are not run; then close."""
        conn = ServerConnection()
        conn.send(request(1, "close"), request(2, "echo"))
        frames = conn.frames()
        self.assertEqual(
            sorted((f.type, f.request_id) for f in frames),
            [(FrameType.RESPONSE, 1), (FrameType.GOAWAY, 0)],
        )
        self.assertEqual([op for op, _, _ in conn.handler.handled], ["close"])
        self.assertTrue(conn.transport.disconnecting)

    def test_closed_called_once(self) -> None:
        """
        connectionLost tells the handler exactly once, and does not cancel
        running requests: they finish (so the connection's order holds), and
        their answers go nowhere.
        """
        conn = ServerConnection()
        conn.send(request(1, "hold"))
        lost = conn.protocol.when_lost()
        conn.lose()
        conn.lose()
        self.assertEqual(len(conn.handler.closed_reasons), 1)
        self.assertFalse(conn.handler.held[0].cancelled)
        conn.handler.held[0].deferred.callback(OpReply())
        self.assertEqual(conn.frames(), [])
        self.assertIsNone(self.successResultOf(lost))
        self.assertEqual(conn.protocol.state, ConnectionState.CLOSED)
        self.assertEqual(conn.clock.getDelayedCalls(), [])

    def test_connection_lines_are_debug(self) -> None:
        """Admission, a client's GOAWAY and the close are per-connection lines: debug only."""
        with capturedLogs() as events:
            conn = ServerConnection()
            conn.send(goaway_frame(GoAway("shutdown")))
            conn.lose()
        lines = [e for e in events if "connection_id" in e]
        self.assertGreaterEqual(len(lines), 3)
        self.assertEqual({e["log_level"].name for e in lines}, {"debug"})

    def test_push_after_close_ignored(self) -> None:
        """A push to a closed connection writes nothing."""
        conn = ServerConnection()
        conn.lose()
        conn.handler.sink.push("lease_revoke", {})
        self.assertEqual(conn.transport.value(), b"")


def _is_bug(event: Mapping[str, object]) -> bool:
    return "log_failure" in event or str(event.get("log_level")) in {
        "LogLevel.error",
        "LogLevel.critical",
    }


class MalformedInputTests(SynchronousTestCase):
    """
    Garbage from a client only ever drops that client, quietly.
    """

    @settings(max_examples=300, deadline=None)
    @given(st.binary(min_size=1, max_size=200), st.integers(min_value=1, max_value=200))
    def test_random_bytes(self, garbage: bytes, split: int) -> None:
        """Random bytes after HELLO never log a bug; the connection survives or is dropped."""
        conn = ServerConnection()
        with capturedLogs() as events:
            conn.protocol.dataReceived(garbage[:split])
            conn.protocol.dataReceived(garbage[split:])
            conn.lose()
        self.assertEqual([e for e in events if _is_bug(e)], [])
        self.assertEqual(len(conn.handler.closed_reasons), 1)

    @settings(max_examples=100, deadline=None)
    @given(st.binary(min_size=1, max_size=60))
    def test_garbage_after_valid_request(self, garbage: bytes) -> None:
        """A request read before garbage is answered; the garbage only ever drops the link."""
        conn = ServerConnection()
        with capturedLogs() as events:
            conn.protocol.dataReceived(wire(request(1, "echo")))
            conn.protocol.dataReceived(b"SVCW\x01" + garbage)
        self.assertEqual([e for e in events if _is_bug(e)], [])
        types = [f.type for f in conn.frames()]
        expected = [FrameType.RESPONSE]
        if conn.transport.disconnecting:
            expected.append(FrameType.GOAWAY)
        self.assertEqual(types, expected)
