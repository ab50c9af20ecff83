"""
The data-plane client: connect, wait for admission, call operations.

L{connect_dataplane} opens a mutual-TLS 1.3 connection and fires with a
L{DataPlaneClient} only once the server's HELLO arrived (in TLS 1.3 a finished
client handshake does not mean the server admitted the certificate; a refused
client sees the connection close without HELLO: L{AdmissionFailed}).

L{DataPlaneClient.call} pipelines requests (never more than the server's
C{max_in_flight} unanswered; extra calls wait in a local queue) and fires with
a L{Reply} or fails with one of the L{DataPlaneError}s below, which say
whether the request ran:

 - L{RemoteError}: the server answered ERROR (branch on C{errno}).
 - L{NotExecuted} (and its L{ConnectionGoingAway}): the request did not run;
   resending it on a new connection is safe.
 - L{OutcomeUnknown} (and L{CallTimedOut}): it may or may not have run.

Closing (L{DataPlaneClient.close}) sends GOAWAY C{shutdown}, waits for the
answers still expected, then closes TLS; the server then releases the
connection's leases. The C{close} op is not used by this client.

A connection can die without closing: the server's machine stops, the
network drops every packet, the server process hangs. TCP then reports
nothing for many minutes, and every call would wait out its own timeout on a
connection that will never answer. So while requests are in flight the
client watches for silence (C{silence_check}, 10 s by default): a check that
finds nothing received since the previous one sends a C{ping} (which the
server answers at once, whatever else it is running: C{dataplane-ops.md}
section 7); the next check, if it too finds nothing received, ends the
connection (with no ping sent -- none may follow a GOAWAY -- the third
silent check in a row does): its calls in flight fail L{OutcomeUnknown},
the queued ones L{NotExecuted}. One request slot of the server's
C{max_in_flight} is kept for that ping. A dead connection is so found 20 to
30 s after its last word; a live one that is merely slow (large answers
still streaming, a long request running) is never ended, since any byte
received counts.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, cast

import attrs
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.endpoints import HostnameEndpoint
from twisted.internet.interfaces import (
    IHandshakeListener,
    IOpenSSLClientConnectionCreator,
)
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.logger import Logger
from twisted.protocols.tls import TLSMemoryBIOFactory
from twisted.python.failure import Failure
from zope.interface import implementer  # type: ignore[import-untyped]

from svc.buffer_pool import BufferPool
from svc.dataplane_client.errors import (
    AdmissionFailed,
    CallTimedOut,
    ConnectionGoingAway,
    DataPlaneError,
    NotExecuted,
    OutcomeUnknown,
    ProtocolViolation,
    RemoteError,
    VersionUnsupported,
)
from svc.frame_tls import PacedFrameWriter, frame_tls_factory, no_delay
from svc.timers import Timer, TimerClock
from svc.wire.control import (
    GoAway,
    GoAwayReason,
    Hello,
    goaway_frame,
    read_error,
    read_goaway,
    read_hello,
)
from svc.wire.correlation import RequestTable
from svc.wire.decoder import FrameDecoder
from svc.wire.errors import CodecError
from svc.wire.frame import (
    FRAMES_TO_CLIENT,
    MAX_RAW_SIZE,
    MAX_REQUEST_ID,
    Buffer,
    Frame,
    FrameType,
    encode_frame,
    raw_bytes,
)
from svc.wire.ops import PUSH_OPS

_log = Logger()

RAW_BUFFERS_KEPT = 2
"""Idle reply-body buffers one connection keeps (a reply's body is copied out at once)."""

DEFAULT_HELLO_TIMEOUT = 30.0
"""Seconds to wait for HELLO after connecting (wire.md section 6)."""

DEFAULT_CALL_TIMEOUT = 120.0
"""Seconds a call may wait (queued plus in flight) unless told otherwise."""

DEFAULT_CLOSE_TIMEOUT = 10.0
"""Seconds L{DataPlaneClient.close} waits for outstanding answers."""

DEFAULT_SILENCE_CHECK = 10.0
"""Seconds between checks that a connection with requests in flight still speaks."""

SILENT_CHECKS_WITHOUT_PING = 3
"""Silent checks in a row that end a connection no ping could be sent on."""

PushCallback = Callable[[str, Mapping[str, object], bytes], object]
"""Receives a server PUSH: its op, its payload map and its raw segment."""


@attrs.frozen
class Reply:
    """A RESPONSE: the operation's result map and raw segment."""

    payload: Mapping[str, object]
    raw: bytes = b""


@attrs.define(eq=False)
class _Call:
    payload: Mapping[str, object]
    raw: Buffer
    deferred: Deferred[Reply]
    request_id: int | None = None
    timer: Timer | None = None


@implementer(IHandshakeListener)
class DataPlaneClientProtocol(Protocol):
    """
    The client end of one connection, inside Twisted's TLS layer. Use it
    through L{DataPlaneClient}.
    """

    def __init__(
        self,
        clock: TimerClock,
        *,
        hello_timeout: float = DEFAULT_HELLO_TIMEOUT,
        call_timeout: float | None = DEFAULT_CALL_TIMEOUT,
        silence_check: float | None = DEFAULT_SILENCE_CHECK,
    ) -> None:
        """
        @param silence_check: seconds between checks that a connection with
            requests in flight still speaks (module docstring); None: never
            checked.
        """
        self._clock = clock
        self._writer = PacedFrameWriter(lambda: self.transport, clock)
        self._hello_timeout = hello_timeout
        self.call_timeout = call_timeout
        # Large reply bodies (a chunk) are assembled in a lent buffer, which
        # the TLS layer decrypts straight into (L{receive_target}); each is
        # copied once into the reply's C{bytes} and given back.
        self._decoder = FrameDecoder(
            accept=FRAMES_TO_CLIENT, raw_buffers=BufferPool(MAX_RAW_SIZE, keep=RAW_BUFFERS_KEPT)
        )
        self.hello: Hello | None = None
        self._table: RequestTable[_Call] | None = None
        self._queue: deque[_Call] = deque()
        self._ready_waiters: list[Deferred[Hello]] = []
        self._not_ready: DataPlaneError | None = None
        self._handshake_done = False
        self._hello_timer: Timer | None = None
        self.goaway: GoAway | None = None
        self._closing = False
        self._lost: Failure | None = None
        self._lost_waiters: list[Deferred[None]] = []
        self._push_callbacks: list[PushCallback] = []
        self._failure_reason: DataPlaneError | None = None
        self._silence_check = silence_check
        self._silence_timer: Timer | None = None
        self._heard = False
        self._silent_checks = 0
        self._ping: _Call | None = None
        self._reserved = 0

    # -- life cycle ---------------------------------------------------------

    def when_ready(self) -> Deferred[Hello]:
        """Fires with the server's HELLO, or fails (L{AdmissionFailed}...)."""
        if self.hello is not None:
            return succeed(self.hello)
        if self._not_ready is not None:
            return fail(self._not_ready)
        waiter: Deferred[Hello] = Deferred()
        self._ready_waiters.append(waiter)
        return waiter

    def connectionMade(self) -> None:
        no_delay(self.transport)
        self._hello_timer = self._clock.callLater(self._hello_timeout, self._hello_timed_out)

    def handshakeCompleted(self) -> None:
        self._handshake_done = True

    def _hello_timed_out(self) -> None:
        self._hello_timer = None
        self._fail_ready(
            AdmissionFailed(f"no HELLO within {self._hello_timeout} seconds", self._handshake_done)
        )
        self._abort()

    def connectionLost(self, reason: Failure | None = None) -> None:
        self._lost = reason or connectionDone
        self._writer.discard()
        if self._hello_timer is not None and self._hello_timer.active():
            self._hello_timer.cancel()
        self._hello_timer = None
        if self._silence_timer is not None and self._silence_timer.active():
            self._silence_timer.cancel()
        self._silence_timer = None
        why = self._lost.getErrorMessage()
        if self._handshake_done:
            message = f"connection closed before HELLO (certificate refused?): {why}"
        else:
            message = f"TLS handshake failed: {why}"
        self._fail_ready(AdmissionFailed(message, self._handshake_done))
        queued = list(self._queue)
        self._queue.clear()
        sent = self._table.drain() if self._table is not None else []
        for call in queued:
            self._fail(call, self._not_executed("connection closed before the request was sent"))
        for call in sent:
            if self.goaway is not None:
                self._fail(call, ConnectionGoingAway(self.goaway))
            elif self._failure_reason is not None:
                self._fail(call, OutcomeUnknown(str(self._failure_reason)))
            else:
                self._fail(call, OutcomeUnknown(f"connection lost: {why}"))
        waiters, self._lost_waiters = self._lost_waiters, []
        for waiter in waiters:
            waiter.callback(None)

    def when_closed(self) -> Deferred[None]:
        """Fires once the connection is gone."""
        if self._lost is not None:
            return succeed(None)
        waiter: Deferred[None] = Deferred()
        self._lost_waiters.append(waiter)
        return waiter

    # -- frames in ----------------------------------------------------------

    def receive_target(self) -> memoryview | None:
        """
        Memory the TLS layer may decrypt the next bytes into (part of a
        large reply body; L{svc.wire.decoder.FrameDecoder.receive_target}),
        then calling L{received_into}; else C{None} (use L{dataReceived}).
        """
        if self._lost is not None or self._failure_reason is not None:
            return None
        return self._decoder.receive_target()

    def received_into(self, count: int) -> None:
        """C{count} bytes of the stream were written into L{receive_target}'s view."""
        self._heard = True
        self._decoder.received_into(count)

    def dataReceived(self, data: bytes) -> None:
        self._heard = True
        if self._lost is not None or self._failure_reason is not None:
            return
        try:
            for frame in self._decoder.feed(data):
                self._frame_received(frame)
                if self._failure_reason is not None:
                    return
        except CodecError as error:
            self._protocol_error(error.reason)

    def _frame_received(self, frame: Frame) -> None:
        try:
            self._dispatch(frame)
        finally:
            if frame.release_raw is not None:
                frame.release_raw()  # what was kept of it is a copy

    def _dispatch(self, frame: Frame) -> None:
        if self.hello is None:
            if frame.type is not FrameType.HELLO:
                raise CodecError(f"{frame.type.name} frame before HELLO")
            self._hello_received(read_hello(frame))
        elif frame.type is FrameType.HELLO:
            raise CodecError("second HELLO")
        elif frame.type is FrameType.RESPONSE:
            call = self._answered(frame.request_id)
            if call is not None:
                self._succeed(call, Reply(frame.payload, raw_bytes(frame.raw)))
        elif frame.type is FrameType.ERROR:
            call = self._answered(frame.request_id)
            if call is not None:
                self._fail(call, RemoteError(read_error(frame)))
        elif frame.type is FrameType.PUSH:
            self._push_received(frame)
        else:
            self._goaway_received(read_goaway(frame))

    def _hello_received(self, hello: Hello) -> None:
        if self._hello_timer is not None and self._hello_timer.active():
            self._hello_timer.cancel()
        self._hello_timer = None
        if hello.common_version() is None:
            self._failure_reason = VersionUnsupported(f"server speaks versions {hello.versions}")
            self._send(goaway_frame(GoAway(GoAwayReason.VERSION_UNSUPPORTED)))
            self._fail_ready(self._failure_reason)
            self._close_transport()
            return
        self.hello = hello
        self._table = RequestTable(min(hello.max_in_flight, MAX_REQUEST_ID - 1))
        # One slot is kept for the silence check's ping (when there are two).
        self._reserved = 1 if hello.max_in_flight > 1 and self._silence_check is not None else 0
        waiters, self._ready_waiters = self._ready_waiters, []
        for waiter in waiters:
            waiter.callback(hello)

    def _answered(self, request_id: int) -> _Call | None:
        assert self._table is not None
        call = self._table.finish(request_id)
        self._send_queued()
        return call

    def _push_received(self, frame: Frame) -> None:
        op = cast(str, frame.payload["op"])
        if op not in PUSH_OPS:
            _log.info("ignoring unknown data-plane push {op!r}", op=op)
            return
        for callback in list(self._push_callbacks):
            try:
                callback(op, frame.payload, raw_bytes(frame.raw))
            except Exception:
                _log.failure("data-plane push callback failed for {op}", op=op)

    def _goaway_received(self, goaway: GoAway) -> None:
        _log.info("data-plane server going away: {reason}", reason=goaway.reason)
        self.goaway = goaway
        queued = list(self._queue)
        self._queue.clear()
        for call in queued:
            self._fail(call, ConnectionGoingAway(goaway))
        if self._table is None or self._table.in_flight == 0:
            self._close_transport()

    def _protocol_error(self, reason: str) -> None:
        _log.info("data-plane server broke the protocol: {reason}", reason=reason)
        self._failure_reason = ProtocolViolation(f"server protocol error: {reason}")
        self._fail_ready(self._failure_reason)
        if self.hello is not None:
            self._send(goaway_frame(GoAway(GoAwayReason.PROTOCOL_ERROR)))
        self._close_transport()

    # -- calls --------------------------------------------------------------

    def call(
        self,
        op: str,
        payload: Mapping[str, object],
        raw: Buffer = b"",
        timeout: float | None = None,
    ) -> Deferred[Reply]:
        """See L{DataPlaneClient.call}; C{timeout} None means the default."""
        refusal = self._refusal()
        if refusal is not None:
            return fail(refusal)
        full = {"op": op, **payload}  # op first: the server reads it from the first bytes
        try:
            Frame(FrameType.REQUEST, 1, full, raw)
        except CodecError as error:
            return fail(error)
        call = _Call(full, raw, Deferred(lambda d: self._cancelled(call)))
        delay = self.call_timeout if timeout is None else timeout
        if delay is not None:
            call.timer = self._clock.callLater(delay, self._timed_out, call)
        self._queue.append(call)
        self._send_queued()
        return call.deferred

    def _refusal(self) -> DataPlaneError | None:
        if self.hello is None:
            return NotExecuted("not admitted yet")
        if self.goaway is not None:
            return ConnectionGoingAway(self.goaway)
        if self._closing or self._lost is not None or self._failure_reason is not None:
            return self._not_executed("connection closed")
        return None

    def _send_queued(self) -> None:
        table = self._table
        assert table is not None and self.hello is not None
        while self._queue and table.has_room(self._reserved) and self._refusal() is None:
            call = self._queue.popleft()
            request_id = table.start(call)
            try:
                buffers = encode_frame(
                    Frame(FrameType.REQUEST, request_id, call.payload, call.raw),
                    max_payload=self.hello.max_payload,
                    max_raw=self.hello.max_raw,
                )
            except CodecError as error:
                table.finish(request_id)
                self._fail(call, error)
                continue
            call.request_id = request_id
            self._writer.write(buffers)
            self._watch_silence()
        if (self._closing or self.goaway is not None) and table.in_flight == 0:
            self._close_transport()

    # -- silence ------------------------------------------------------------

    def _watch_silence(self) -> None:
        """A request went out: check in C{silence_check} seconds that the server speaks."""
        if self._silence_check is not None and self._silence_timer is None:
            self._heard = False
            self._silent_checks = 0
            self._silence_timer = self._clock.callLater(self._silence_check, self._check_silence)

    def _check_silence(self) -> None:
        self._silence_timer = None
        table = self._table
        if self._lost is not None or self._failure_reason is not None or table is None:
            return
        if table.in_flight == 0:
            return  # nothing expected; the next request starts watching again
        if self._heard:
            self._heard = False
            self._silent_checks = 0
        else:
            self._silent_checks += 1
            pinged = self._ping is not None
            if (pinged and self._silent_checks >= 2) or (
                self._silent_checks >= SILENT_CHECKS_WITHOUT_PING
            ):
                self._fall_silent()
                return
            if not pinged:
                self._send_ping()
        assert self._silence_check is not None
        self._silence_timer = self._clock.callLater(self._silence_check, self._check_silence)

    def _send_ping(self) -> None:
        table = self._table
        assert table is not None
        if not table.has_room() or self._refusal() is not None:
            return
        call = _Call({"op": "ping"}, b"", Deferred())
        call.request_id = table.start(call)
        self._ping = call

        def answered(result: object) -> None:
            if self._ping is call:
                self._ping = None

        call.deferred.addBoth(answered)
        self._writer.write(encode_frame(Frame(FrameType.REQUEST, call.request_id, call.payload)))

    def _fall_silent(self) -> None:
        """The server said nothing for too long: end the connection."""
        assert self._silence_check is not None
        seconds = self._silence_check * self._silent_checks
        why = "not even to a ping" if self._ping is not None else "and no ping could be sent"
        _log.warn(
            "data-plane server silent for {seconds:.0f}s with requests in flight ({why}):"
            " ending the connection",
            seconds=seconds,
            why=why,
        )
        self._failure_reason = OutcomeUnknown(
            f"the data-plane server said nothing for {seconds:.0f}s ({why})"
        )
        self._abort()

    def _timed_out(self, call: _Call) -> None:
        call.timer = None
        sent = self._forget(call)
        self._fail(call, CallTimedOut("no answer in time" if sent else "never sent", sent))

    def _cancelled(self, call: _Call) -> None:
        if call.timer is not None and call.timer.active():
            call.timer.cancel()
        call.timer = None
        self._forget(call)

    def _forget(self, call: _Call) -> bool:
        """Stop waiting for C{call}; whether it had been sent."""
        if call.request_id is None:
            if call in self._queue:
                self._queue.remove(call)
            return False
        if self._table is not None and not call.deferred.called:
            try:
                self._table.abandon(call.request_id)
            except KeyError:
                pass
        return True

    def _succeed(self, call: _Call, reply: Reply) -> None:
        if call.timer is not None and call.timer.active():
            call.timer.cancel()
        if not call.deferred.called:
            call.deferred.callback(reply)

    def _fail(self, call: _Call, error: Exception) -> None:
        if call.timer is not None and call.timer.active():
            call.timer.cancel()
        if not call.deferred.called:
            call.deferred.errback(error)

    def _not_executed(self, message: str) -> NotExecuted:
        if self.goaway is not None:
            return ConnectionGoingAway(self.goaway)
        return NotExecuted(message)

    # -- pushes and closing -------------------------------------------------

    def on_push(self, callback: PushCallback) -> None:
        """Call C{callback} for every known PUSH (see L{DataPlaneClient.on_push})."""
        self._push_callbacks.append(callback)

    def close(self, timeout: float = DEFAULT_CLOSE_TIMEOUT) -> Deferred[None]:
        """See L{DataPlaneClient.close}."""
        if self._lost is None and not self._closing:
            self._closing = True
            queued = list(self._queue)
            self._queue.clear()
            for call in queued:
                self._fail(call, NotExecuted("client closing"))
            if self.hello is not None and self.goaway is None:
                self._send(goaway_frame(GoAway(GoAwayReason.SHUTDOWN)))
            timer = self._clock.callLater(timeout, self._abort)
            self.when_closed().addCallback(lambda _: _cancel(timer))
            if self._table is None or self._table.in_flight == 0:
                self._close_transport()
        return self.when_closed()

    @property
    def _tls(self) -> Any:
        # Twisted's TLS transport; typed Any since its interfaces are zope's.
        return self.transport

    def _send(self, frame: Frame) -> None:
        if self.transport is not None and self._lost is None:
            self._writer.write(encode_frame(frame))

    def _close_transport(self) -> None:
        def close() -> None:
            if self.transport is not None and self._lost is None:
                self._tls.loseConnection()

        self._writer.after_sent(close)

    def _abort(self) -> None:
        self._writer.discard()
        if self.transport is not None and self._lost is None:
            self._tls.abortConnection()

    def _fail_ready(self, error: DataPlaneError) -> None:
        if self.hello is not None or self._not_ready is not None:
            return
        self._not_ready = error
        waiters, self._ready_waiters = self._ready_waiters, []
        for waiter in waiters:
            waiter.errback(error)


def _cancel(timer: Timer) -> None:
    if timer.active():
        timer.cancel()


class DataPlaneClient:
    """
    An admitted data-plane connection.

    @ivar hello: the server's HELLO (versions, limits, name).
    """

    def __init__(self, protocol: DataPlaneClientProtocol) -> None:
        """
        @param protocol: a protocol whose L{DataPlaneClientProtocol.when_ready}
            has fired.
        """
        assert protocol.hello is not None, "the server's HELLO has not arrived"
        self._protocol = protocol
        self.hello: Hello = protocol.hello

    def call(
        self,
        op: str,
        payload: Mapping[str, object] | None = None,
        raw: Buffer = b"",
        *,
        timeout: float | None = None,
    ) -> Deferred[Reply]:
        """
        Send operation C{op} with C{payload} (C{"op"} is added) and raw
        segment C{raw}.

        @param timeout: seconds before the call fails with L{CallTimedOut};
            None for the connection's default. Cancelling the Deferred
            also stops waiting (a sent request's id stays reserved until the
            server answers).
        @return: fires with the L{Reply}; fails with L{RemoteError},
            L{NotExecuted}, L{OutcomeUnknown} or L{CodecError} (payload does
            not fit the wire format or the server's limits).
        """
        return self._protocol.call(op, payload or {}, raw, timeout)

    def on_push(self, callback: PushCallback) -> None:
        """
        Call C{callback(op, payload, raw)} for every PUSH whose op this
        version knows (C{lease_revoke}, C{changed}); unknown pushes are
        ignored.
        """
        self._protocol.on_push(callback)

    @property
    def going_away(self) -> GoAway | None:
        """The server's GOAWAY, once received: no new call is accepted."""
        return self._protocol.goaway

    def close(self, timeout: float = DEFAULT_CLOSE_TIMEOUT) -> Deferred[None]:
        """
        Close in order: queued calls fail L{NotExecuted}, GOAWAY C{shutdown}
        is sent, answers still expected are awaited, then TLS closes; after
        C{timeout} seconds the connection is aborted instead.

        @return: L{when_closed}.
        """
        return self._protocol.close(timeout)

    def when_closed(self) -> Deferred[None]:
        """Fires once the connection is gone, whoever closed it."""
        return self._protocol.when_closed()


def client_tls_factory(
    protocol: DataPlaneClientProtocol, tls: IOpenSSLClientConnectionCreator, clock: Any
) -> TLSMemoryBIOFactory:
    """
    A TLS client factory whose one connection runs C{protocol}; C{clock} is
    the reactor (or a test clock).
    """
    wrapped: Any = Factory.forProtocol(lambda: protocol)
    return frame_tls_factory(tls, is_client=True, wrapped=wrapped, clock=clock)


def connect_dataplane(
    reactor: Any,
    endpoint: Any,
    tls: IOpenSSLClientConnectionCreator,
    *,
    hello_timeout: float = DEFAULT_HELLO_TIMEOUT,
    call_timeout: float | None = DEFAULT_CALL_TIMEOUT,
    silence_check: float | None = DEFAULT_SILENCE_CHECK,
) -> Deferred[DataPlaneClient]:
    """
    Connect to a data-plane server and wait for its HELLO.

    @param reactor: the reactor (clock; and TCP when C{endpoint} is a pair).
    @param endpoint: an C{IStreamClientEndpoint}, or C{(host, port)}.
    @param tls: the client TLS options (L{svc.pki.tls.client_tls_options}).
    @param call_timeout: default per-call timeout in seconds (None: none).
    @param silence_check: seconds between checks that the server still
        speaks while requests are in flight (module docstring; None: never).
    @return: fires with an admitted L{DataPlaneClient}; fails with
        L{AdmissionFailed} when the server drops us before HELLO, or with the
        endpoint's connection error.
    """
    dialler: Any = endpoint
    if isinstance(endpoint, tuple):
        host, port = endpoint
        dialler = HostnameEndpoint(reactor, host, port)
    protocol = DataPlaneClientProtocol(
        reactor,
        hello_timeout=hello_timeout,
        call_timeout=call_timeout,
        silence_check=silence_check,
    )
    connected: Deferred[Any] = dialler.connect(client_tls_factory(protocol, tls, reactor))
    connected.addCallback(lambda _: protocol.when_ready())
    connected.addCallback(lambda _: DataPlaneClient(protocol))
    return cast("Deferred[DataPlaneClient]", connected)
