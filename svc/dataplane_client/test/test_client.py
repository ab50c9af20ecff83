"""
The data-plane client: against the real server protocol over in-memory TLS
1.3 (L{TLSHarness}), and against hand-written frames on a L{StringTransport}
for the server misbehaviours the real server never shows.
"""

from __future__ import annotations

from collections.abc import Mapping

from twisted.internet.defer import CancelledError
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.test.iosim import ConnectionCompleter, IOPump
from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane.factory import ServerLimits, listen_dataplane
from svc.dataplane.interfaces import OpReply
from svc.dataplane.test.fakes import TLSHarness
from svc.dataplane_client.client import (
    DataPlaneClient,
    DataPlaneClientProtocol,
    Reply,
    connect_dataplane,
)
from svc.dataplane_client.errors import (
    AdmissionFailed,
    CallTimedOut,
    ConnectionGoingAway,
    NotExecuted,
    OutcomeUnknown,
    ProtocolViolation,
    RemoteError,
    VersionUnsupported,
)
from svc.frame_tls import WRITE_SLICE
from svc.wire.control import GoAway, Hello, goaway_frame, hello_frame, read_goaway
from svc.wire.decoder import FrameDecoder
from svc.wire.errno import WireErrno
from svc.wire.errors import CodecError
from svc.wire.frame import FRAMES_TO_SERVER, Frame, FrameType, encode_frame


def connected(
    limits: ServerLimits | None = None, **options: object
) -> tuple[TLSHarness, DataPlaneClient, IOPump]:
    """A harness and an admitted client on it, plus the pump."""
    harness = TLSHarness(limits)
    protocol, pump = harness.connect_client(harness.agent(), **options)
    return harness, DataPlaneClient(protocol), pump


class CallTests(SynchronousTestCase):
    """
    Calls and their answers.
    """

    def test_call(self) -> None:
        """A call fires with the reply's payload and raw segment as bytes."""
        _harness, client, pump = connected()
        result = client.call("echo", {"n": 1}, b"abc")
        pump.flush()
        reply = self.successResultOf(result)
        self.assertEqual(reply, Reply({"n": 1}, b"abc"))
        self.assertIsInstance(reply.raw, bytes)
        self.assertEqual(client.hello.max_in_flight, 32)

    def test_remote_error(self) -> None:
        """An ERROR answer fails the call with RemoteError carrying errno and details."""
        _harness, client, pump = connected()
        result = client.call("refuse", {"errno": int(WireErrno.ESTALE)})
        pump.flush()
        error = self.failureResultOf(result, RemoteError).value
        assert isinstance(error, RemoteError)
        self.assertEqual(
            (error.errno, dict(error.details)), (WireErrno.ESTALE, {"why": "scripted"})
        )

    def test_pipelined_out_of_order(self) -> None:
        """Calls answered out of order each get their own answer."""
        harness, client, pump = connected()
        calls = [client.call("hold", {"i": i}) for i in range(3)]
        pump.flush()
        held = harness.service.handlers[0].held
        self.assertEqual(len(held), 3)
        for i in (2, 0, 1):
            held[i].deferred.callback(OpReply({"i": held[i].payload["i"]}))
            pump.flush()
        self.assertEqual([self.successResultOf(c).payload["i"] for c in calls], [0, 1, 2])

    def test_queues_beyond_max_in_flight(self) -> None:
        """
        The client never exceeds the server's max_in_flight, less one slot kept
        for the silence check's ping; extra calls wait their turn.
        """
        harness, client, pump = connected(ServerLimits(max_in_flight=3))
        calls = [client.call("hold", {"i": i}) for i in range(5)]
        pump.flush()
        handler = harness.service.handlers[0]
        self.assertEqual(len(handler.held), 2)
        answered = 0
        while answered < 5:
            handler.held[answered].deferred.callback(OpReply({"i": answered}))
            answered += 1
            pump.flush()
        self.assertEqual([self.successResultOf(c).payload["i"] for c in calls], list(range(5)))

    def test_every_slot_used_without_silence_checks(self) -> None:
        """With no silence check, no slot is kept: max_in_flight requests go out."""
        harness, client, pump = connected(ServerLimits(max_in_flight=3), silence_check=None)
        for i in range(5):
            client.call("hold", {"i": i})
        pump.flush()
        self.assertEqual(len(harness.service.handlers[0].held), 3)

    def test_one_slot_limit_is_used(self) -> None:
        """A server allowing one request in flight gets one: no slot can be kept."""
        harness, client, pump = connected(ServerLimits(max_in_flight=1))
        client.call("hold")
        client.call("hold")
        pump.flush()
        self.assertEqual(len(harness.service.handlers[0].held), 1)

    def test_payload_over_server_limit(self) -> None:
        """A raw segment over the server's advertised max_raw fails the call, sending nothing."""
        harness, client, pump = connected(ServerLimits(max_raw=10))
        self.failureResultOf(client.call("echo", {}, b"x" * 11), CodecError)
        pump.flush()
        self.assertEqual(harness.service.handlers[0].handled, [])
        fitting = client.call("echo", {}, b"x" * 10)
        pump.flush()
        self.successResultOf(fitting)

    def test_call_timeout_in_flight(self) -> None:
        """A sent call times out with CallTimedOut(sent); the late answer is dropped."""
        harness, client, pump = connected()
        result = client.call("hold", timeout=5)
        pump.flush()
        harness.clock.advance(5)
        error = self.failureResultOf(result, CallTimedOut).value
        assert isinstance(error, CallTimedOut)
        self.assertTrue(error.sent)
        harness.service.handlers[0].held[0].deferred.callback(OpReply())
        pump.flush()
        after = client.call("echo")
        pump.flush()
        self.successResultOf(after)

    def test_call_timeout_queued(self) -> None:
        """A call queued at its timeout fails CallTimedOut(not sent) and is never sent."""
        harness, client, pump = connected(ServerLimits(max_in_flight=1))
        client.call("hold")
        queued = client.call("echo", timeout=3)
        pump.flush()
        harness.clock.advance(3)
        error = self.failureResultOf(queued, CallTimedOut).value
        assert isinstance(error, CallTimedOut)
        self.assertFalse(error.sent)
        harness.service.handlers[0].held[0].deferred.callback(OpReply())
        pump.flush()
        self.assertEqual([op for op, _, _ in harness.service.handlers[0].handled], ["hold"])

    def test_cancel(self) -> None:
        """Cancelling a call's Deferred stops waiting for it."""
        _harness, client, pump = connected()
        result = client.call("hold")
        pump.flush()
        result.cancel()
        self.failureResultOf(result, CancelledError)


class SilenceTests(SynchronousTestCase):
    """
    A connection with requests in flight whose server says nothing is ended,
    so that its calls fail instead of waiting out their timeouts on a
    connection that will never answer (a stopped machine, a dropped network).
    """

    def setUp(self) -> None:
        self.clock = Clock()
        self.transport = StringTransport()
        self.protocol = DataPlaneClientProtocol(self.clock, silence_check=10)
        self.protocol.makeConnection(self.transport)
        self.protocol.dataReceived(wire(hello_frame(Hello())))
        self.client = DataPlaneClient(self.protocol)

    def sent_ops(self) -> list[str]:
        return [str(frame.payload["op"]) for frame in frames_sent(self.transport)]

    def wait(self, seconds: int) -> None:
        """Let C{seconds} pass, a second at a time (as a reactor would)."""
        self.clock.pump([1] * seconds)

    def lose(self) -> None:
        """What the reactor does once an aborted transport is gone."""
        self.assertTrue(self.transport.disconnecting)
        self.protocol.connectionLost(None)

    def test_silent_server_gets_a_ping_then_the_connection_ends(self) -> None:
        """
        A silent check sends a ping; the next silent one ends the connection:
        the call in flight fails with an unknown outcome, saying why.
        """
        running = self.client.call("manifest_put", {"path": "/a"}, timeout=600)
        self.clock.advance(10)
        self.assertEqual(self.sent_ops(), ["manifest_put", "ping"])
        self.assertFalse(self.transport.disconnecting)
        self.clock.advance(10)
        self.lose()
        error = self.failureResultOf(running, OutcomeUnknown).value
        self.assertIn("said nothing for 20s (not even to a ping)", str(error))

    def test_queued_call_of_a_silent_connection_was_not_executed(self) -> None:
        """A call still queued when a silent connection ends was never sent."""
        # HELLO's max_in_flight is 32: 31 go out, one slot is the ping's.
        running = [self.client.call("hold", timeout=600) for _ in range(31)]
        queued = self.client.call("hold", timeout=600)
        self.wait(20)
        self.lose()
        for call in running:
            self.failureResultOf(call, OutcomeUnknown)
        self.failureResultOf(queued, NotExecuted)

    def test_any_bytes_received_keep_the_connection(self) -> None:
        """A server that sends anything between checks (a push here) is alive."""
        running = self.client.call("hold", timeout=600)
        for _ in range(10):
            self.clock.advance(10)
            self.protocol.dataReceived(wire(Frame(FrameType.PUSH, 0, {"op": "changed"})))
        self.assertFalse(self.transport.disconnecting)
        self.assertEqual(self.sent_ops(), ["hold", "ping"])
        self.assertNoResult(running)

    def test_answered_ping_keeps_the_connection(self) -> None:
        """A ping's answer counts: the connection lives on while the request runs."""
        running = self.client.call("hold", timeout=600)
        for _ in range(10):
            self.clock.advance(10)
            sent = frames_sent(self.transport)
            if sent and sent[-1].payload["op"] == "ping":
                self.transport.clear()
                self.protocol.dataReceived(wire(Frame(FrameType.RESPONSE, sent[-1].request_id, {})))
        self.assertFalse(self.transport.disconnecting)
        self.assertNoResult(running)

    def test_idle_connection_is_not_checked(self) -> None:
        """Nothing in flight, nothing expected: no ping, however long the quiet."""
        answered = self.client.call("ping")
        [frame] = frames_sent(self.transport)
        self.protocol.dataReceived(wire(Frame(FrameType.RESPONSE, frame.request_id, {})))
        self.successResultOf(answered)
        self.transport.clear()
        self.clock.advance(1000)
        self.assertEqual(self.transport.value(), b"")
        self.assertFalse(self.transport.disconnecting)

    def test_no_ping_after_goaway_third_silent_check_ends(self) -> None:
        """
        After the server's GOAWAY no request may be sent, ping included: the
        third silent check in a row ends the connection.
        """
        running = self.client.call("hold", timeout=600)
        self.protocol.dataReceived(wire(goaway_frame(GoAway("shutdown"))))
        self.transport.clear()
        self.wait(30)  # the GOAWAY was heard before the first check
        self.assertEqual(self.transport.value(), b"")
        self.assertFalse(self.transport.disconnecting)
        self.wait(10)
        self.lose()
        self.failureResultOf(running, ConnectionGoingAway)

    def test_silence_check_off(self) -> None:
        """With no silence check, a silent connection waits for the call's own timeout."""
        protocol = DataPlaneClientProtocol(self.clock, silence_check=None)
        transport = StringTransport()
        protocol.makeConnection(transport)
        protocol.dataReceived(wire(hello_frame(Hello())))
        running = DataPlaneClient(protocol).call("hold", timeout=100)
        self.clock.advance(99)
        self.assertFalse(transport.disconnecting)
        self.assertEqual(len(frames_sent(transport)), 1)
        self.assertNoResult(running)
        self.clock.advance(1)
        self.failureResultOf(running, CallTimedOut)

    def test_live_server_answers_ping_during_a_long_request(self) -> None:
        """
        Against the real server protocol: a request held for minutes leaves
        the connection open (the server answers the pings at once, the
        request still running).
        """
        harness, client, pump = connected(ServerLimits(request_timeout=1000), silence_check=10)
        running = client.call("hold", timeout=600)
        for _ in range(20):
            harness.clock.advance(10)
            pump.flush()
        handler = harness.service.handlers[0]
        self.assertEqual([op for op, _, _ in handler.handled].count("ping"), 10)
        handler.held[0].deferred.callback(OpReply({"done": True}))
        pump.flush()
        self.assertEqual(self.successResultOf(running).payload, {"done": True})


class PushTests(SynchronousTestCase):
    """
    Server pushes.
    """

    def test_push_delivered(self) -> None:
        """A lease_revoke push reaches the callback; an unknown push is ignored."""
        harness, client, pump = connected()
        seen: list[tuple[str, Mapping[str, object], bytes]] = []
        client.on_push(lambda op, payload, raw: seen.append((op, payload, raw)))
        sink = harness.service.handlers[0].sink
        sink.push("lease_revoke", {"lease_id": "l1"})
        sink.push("future_push", {})
        pump.flush()
        self.assertEqual(seen, [("lease_revoke", {"lease_id": "l1", "op": "lease_revoke"}, b"")])

    def test_changed_delivered(self) -> None:
        """A changed push reaches the callbacks with its paths and session id."""
        harness, client, pump = connected()
        seen: list[tuple[str, Mapping[str, object], bytes]] = []
        client.on_push(lambda op, payload, raw: seen.append((op, payload, raw)))
        sink = harness.service.handlers[0].sink
        sink.push("changed", {"paths": ["/agent-1/a", "/agent-1/b"], "session_id": None})
        pump.flush()
        payload = {"paths": ["/agent-1/a", "/agent-1/b"], "session_id": None, "op": "changed"}
        self.assertEqual(seen, [("changed", payload, b"")])


class GoingAwayTests(SynchronousTestCase):
    """
    GOAWAY, closing and loss, and what they say about unanswered calls.
    """

    def test_server_disconnect(self) -> None:
        """After a server GOAWAY: running calls are answered, crossing ones fail not-executed."""
        harness, client, pump = connected()
        running = client.call("hold")
        pump.flush()
        handler = harness.service.handlers[0]
        handler.sink.disconnect("credentials_expired")
        crossing = client.call("echo")
        pump.flush()
        self.assertEqual(client.going_away, GoAway("credentials_expired"))
        late = client.call("echo")
        self.failureResultOf(late, ConnectionGoingAway)
        handler.held[0].deferred.callback(OpReply({"ok": True}))
        pump.flush()
        self.assertEqual(self.successResultOf(running).payload, {"ok": True})
        error = self.failureResultOf(crossing, NotExecuted).value
        assert isinstance(error, ConnectionGoingAway)
        self.assertEqual(error.reason, "credentials_expired")
        self.assertEqual([op for op, _, _ in handler.handled], ["hold"])
        self.successResultOf(client.when_closed())
        self.assertEqual(handler.closed_reasons, ["credentials_expired"])

    def test_close(self) -> None:
        """close sends GOAWAY, waits for running calls, then closes; the server is told once."""
        harness, client, pump = connected()
        running = client.call("hold")
        pump.flush()
        closed = client.close()
        self.failureResultOf(client.call("echo"), NotExecuted)
        pump.flush()
        self.assertNoResult(closed)
        handler = harness.service.handlers[0]
        handler.held[0].deferred.callback(OpReply())
        pump.flush()
        self.successResultOf(running)
        self.successResultOf(closed)
        self.assertEqual(handler.closed_reasons, ["client going away: shutdown"])
        self.assertEqual(harness.clock.getDelayedCalls(), [])

    def test_close_timeout_aborts(self) -> None:
        """close gives up after its timeout: the connection is aborted, calls fail unknown."""
        harness, client, pump = connected()
        running = client.call("hold")
        pump.flush()
        closed = client.close(timeout=4)
        pump.flush()
        self.assertNoResult(closed)
        harness.clock.advance(4)
        pump.flush()
        self.failureResultOf(running, OutcomeUnknown)
        self.successResultOf(closed)
        self.assertEqual(len(harness.service.handlers[0].closed_reasons), 1)

    def test_close_fails_queued(self) -> None:
        """Calls still queued when close is called fail NotExecuted."""
        _harness, client, _pump = connected(ServerLimits(max_in_flight=1))
        client.call("hold")
        queued = client.call("echo")
        client.close()
        self.failureResultOf(queued, NotExecuted)

    def test_connection_lost(self) -> None:
        """Calls unanswered when the connection drops without GOAWAY fail OutcomeUnknown."""
        harness, client, pump = connected()
        running = client.call("hold")
        pump.flush()
        harness.service.handlers[0].sink.push("lease_revoke", {})
        pump.clientIO.abortConnection()
        pump.flush()
        self.failureResultOf(running, OutcomeUnknown)
        self.successResultOf(client.when_closed())
        self.assertEqual(len(harness.service.handlers[0].closed_reasons), 1)


def frames_sent(transport: StringTransport) -> list[Frame]:
    """What the client wrote."""
    return FrameDecoder(accept=FRAMES_TO_SERVER).feed(transport.value())


def wire(frame: Frame) -> bytes:
    """One encoded frame."""
    return b"".join(bytes(b) for b in encode_frame(frame))


class TCPTransport(StringTransport):
    """A L{StringTransport} that records C{setTcpNoDelay}."""

    no_delay: bool | None = None

    def setTcpNoDelay(self, enabled: bool) -> None:
        self.no_delay = enabled


class MisbehavingServerTests(SynchronousTestCase):
    """
    The client's own protocol checks, driven by hand-written frames.
    """

    def setUp(self) -> None:
        self.clock = Clock()
        self.transport = StringTransport()
        self.protocol = DataPlaneClientProtocol(self.clock, hello_timeout=30)
        self.protocol.makeConnection(self.transport)

    def test_no_delay_on_connection(self) -> None:
        """The client turns Nagle's algorithm off on a TCP transport (pipelined requests)."""
        transport = TCPTransport()
        DataPlaneClientProtocol(self.clock, hello_timeout=30).makeConnection(transport)
        self.assertIs(transport.no_delay, True)

    def test_sends_nothing_before_hello(self) -> None:
        """The client writes nothing until HELLO."""
        self.assertEqual(self.transport.value(), b"")
        self.assertNoResult(self.protocol.when_ready())

    def test_hello_timeout(self) -> None:
        """No HELLO within the timeout fails admission and aborts the connection."""
        ready = self.protocol.when_ready()
        self.clock.advance(30)
        self.failureResultOf(ready, AdmissionFailed)
        self.assertTrue(self.transport.disconnected)

    def test_frame_before_hello(self) -> None:
        """Any frame before HELLO is a protocol violation."""
        ready = self.protocol.when_ready()
        self.protocol.dataReceived(wire(Frame(FrameType.PUSH, 0, {"op": "lease_revoke"})))
        self.failureResultOf(ready, ProtocolViolation)
        self.assertTrue(self.transport.disconnecting)

    def test_version_unsupported(self) -> None:
        """A HELLO without version 1 gets GOAWAY version_unsupported and fails."""
        ready = self.protocol.when_ready()
        self.protocol.dataReceived(wire(hello_frame(Hello(versions=(2, 3)))))
        self.failureResultOf(ready, VersionUnsupported)
        [goaway] = frames_sent(self.transport)
        self.assertEqual(read_goaway(goaway).reason, "version_unsupported")
        self.assertTrue(self.transport.disconnecting)

    def test_answer_for_unknown_id(self) -> None:
        """A RESPONSE for an id not in flight drops the connection; running calls fail."""
        self.protocol.dataReceived(wire(hello_frame(Hello())))
        client = DataPlaneClient(self.protocol)
        running = client.call("ping")
        self.protocol.dataReceived(wire(Frame(FrameType.RESPONSE, 99, {})))
        self.assertTrue(self.transport.disconnecting)
        self.protocol.connectionLost(None)
        self.failureResultOf(running, OutcomeUnknown)

    def test_second_hello(self) -> None:
        """A second HELLO drops the connection."""
        self.protocol.dataReceived(wire(hello_frame(Hello())) * 2)
        self.assertEqual([f.type for f in frames_sent(self.transport)], [FrameType.GOAWAY])
        self.assertTrue(self.transport.disconnecting)

    def test_server_goaway_with_nothing_running(self) -> None:
        """A GOAWAY with nothing in flight closes the connection at once."""
        self.protocol.dataReceived(wire(hello_frame(Hello())) + wire(goaway_frame(GoAway("x"))))
        self.assertTrue(self.transport.disconnecting)


class PacedWritingTests(SynchronousTestCase):
    """
    A large raw segment leaves the client a slice per reactor turn, and
    closing waits for it.
    """

    def test_large_request_paced_and_close_waits(self) -> None:
        """
        A request carrying more than WRITE_SLICE bytes is not all written in
        the call's turn; a close right after sends its GOAWAY after it and
        only then closes the transport.
        """
        clock = Clock()
        transport = StringTransport()
        protocol = DataPlaneClientProtocol(clock, hello_timeout=30)
        protocol.makeConnection(transport)
        protocol.dataReceived(wire(hello_frame(Hello())))
        client = DataPlaneClient(protocol)
        body = bytes(range(256)) * (3 * WRITE_SLICE // 256)
        client.call("chunk_put", {"hash": "a" * 64}, body)
        self.assertLess(len(transport.value()), 2 * WRITE_SLICE)
        client.close()
        self.assertFalse(transport.disconnecting)
        clock.advance(0)
        sent = frames_sent(transport)
        self.assertEqual([f.type for f in sent], [FrameType.REQUEST, FrameType.GOAWAY])
        self.assertEqual(bytes(sent[0].raw), body)
        self.assertFalse(transport.disconnecting)  # the request is still in flight
        protocol.dataReceived(wire(Frame(FrameType.RESPONSE, sent[0].request_id, {})))
        self.assertTrue(transport.disconnecting)


class ConnectTests(SynchronousTestCase):
    """
    L{connect_dataplane} and L{listen_dataplane} through endpoints.
    """

    def test_connect_fires_after_hello(self) -> None:
        """connect_dataplane fires only once HELLO arrived, with the server's limits."""
        harness = TLSHarness(ServerLimits(max_in_flight=9))
        reactor = MemoryReactorClock()
        listening = listen_dataplane(
            reactor, "tcp:4433:interface=127.0.0.1", harness.factory, harness.tls
        )
        self.successResultOf(listening)
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", 4433)
        connecting = connect_dataplane(reactor, endpoint, harness.agent())
        self.assertNoResult(connecting)
        pump = ConnectionCompleter(reactor).succeedOnce(greet=False)
        assert pump is not None
        self.assertNoResult(connecting)
        pump.flush()
        client = self.successResultOf(connecting)
        self.assertEqual(client.hello.max_in_flight, 9)
        result = client.call("echo", {"x": 1})
        pump.flush()
        self.assertEqual(self.successResultOf(result).payload, {"x": 1})

    def test_connect_refused_agent(self) -> None:
        """connect_dataplane fails with AdmissionFailed for a refused certificate."""
        harness = TLSHarness()
        reactor = MemoryReactorClock()
        listen_dataplane(reactor, "tcp:4433", harness.factory, harness.tls)
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", 4433)
        creds = harness.pki.tenant_only_agent("tenant-a")
        connecting = connect_dataplane(reactor, endpoint, creds.client_options())
        pump = ConnectionCompleter(reactor).succeedOnce(greet=False)
        assert pump is not None
        pump.flush()
        error = self.failureResultOf(connecting, AdmissionFailed).value
        assert isinstance(error, AdmissionFailed)
        self.assertTrue(error.handshake_completed)
