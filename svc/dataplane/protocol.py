"""
The data-plane server protocol: one mutual-TLS connection, from admission to
close.

It sits inside Twisted's TLS layer (see L{svc.dataplane.factory}) and does only
connection work; every operation is the service's (L{IConnectionHandler}):

 1. When the TLS handshake completes, admission runs before any frame is
    read or written. A refused peer is dropped without a byte of ours.
 2. An admitted peer gets HELLO, then REQUEST frames are decoded and handed to
    the handler, many at once (pipelined), each answered by its request id in
    the order the answers complete. Failures are translated to ERROR frames
    here, once (L{error_for_failure}).
 3. Limits: C{max_in_flight} (excess requests get EAGAIN, unexecuted), a
    per-request timeout (ETIMEDOUT), an idle timeout (GOAWAY idle_timeout),
    back-pressure: reading stops while too much is unanswered or the
    transport's write buffer is full, requests already read wait to start
    while it is, and frames go out through an L{AnswerWriter}, large ones
    in slices only as the transport takes them (a reply's C{sent} runs
    after its last slice).
 4. Going away (server stop, idle, deny-list, the client's C{close} op): send
    GOAWAY, execute nothing read afterwards, answer everything read before
    (or ETIMEDOUT it after the drain timeout), then close. So an unanswered
    request after a GOAWAY was never executed.
 5. Any protocol error drops this connection only, logged at info.

The wire contract is C{docs/specifications/wire.md}.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any
from typing import Protocol as TypingProtocol

import attrs
from twisted.internet.defer import Deferred, maybeDeferred, succeed
from twisted.internet.interfaces import IHandshakeListener, IPushProducer
from twisted.internet.protocol import Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer  # type: ignore[import-untyped]

from svc.buffer_pool import BufferPool
from svc.dataplane.admission import Admission
from svc.dataplane.answer_writer import AnswerWriter
from svc.dataplane.interfaces import IConnectionHandler, IDataPlaneService, OpReply
from svc.dataplane.request_intake import RequestIntake, release_raw
from svc.frame_tls import no_delay, write_frame
from svc.pki.errors import AdmissionRefused
from svc.pki.identity import AgentIdentity
from svc.timers import Timer, TimerClock
from svc.wire.commands import BY_NAME, Command
from svc.wire.contract import (
    DecodedRequest,
    RequestRefused,
)
from svc.wire.control import (
    GoAway,
    GoAwayReason,
    error_frame,
    goaway_frame,
    hello_frame,
)
from svc.wire.errno import WireErrno
from svc.wire.errors import CodecError
from svc.wire.frame import (
    HEADER_SIZE,
    Buffer,
    Frame,
    FrameType,
    PackedFrame,
    encode_frame,
)
from svc.wire.ops import Op
from svc.worker import IWorker

if TYPE_CHECKING:
    from svc.dataplane.factory import ServerLimits

_log = Logger()

GENERIC_FAILURE_MESSAGE = "internal server error"
"""The ERROR message sent for a failure that is a bug (never its text)."""

DROPPED_WHEN_BLOCKED = frozenset({Op.CHANGED})
"""Best-effort pushes not sent while the transport's write buffer is full."""


class ConnectionTracker(TypingProtocol):
    """
    What a connection tells the party that counts connections (the factory).
    """

    @property
    def stopping(self) -> bool:
        """Whether the server is shutting down (new connections go away at once)."""

    def connection_started(self, connection: DataPlaneServerProtocol) -> bool:
        """
        A transport was connected (handshake not yet done); whether there
        is room for it among the connections not yet admitted (if not it is
        closed at once).
        """

    def room_for(self, identity: AgentIdentity) -> bool:
        """Whether one more connection may be admitted for C{identity}'s agent."""

    def not_admitted(self, connection: DataPlaneServerProtocol, reason: str, detail: str) -> None:
        """
        C{connection} ends before admission: C{reason} C{handshake_timeout},
        C{admission} (refused credentials) or C{lost} (the peer left); the
        tracker counts and logs it (at a bounded rate: peers cause these).
        """

    def connection_admitted(self, connection: DataPlaneServerProtocol) -> None:
        """The peer was admitted and sent HELLO."""

    def connection_lost(self, connection: DataPlaneServerProtocol) -> None:
        """The connection is gone and the handler was told."""


def error_for_failure(request_id: int, failure: Failure, op: str) -> Frame:
    """
    The ERROR frame answering request C{request_id} whose operation failed.

    An exception with an C{errno} attribute that is a L{WireErrno} is an
    expected refusal: that errno, its C{message} attribute (or C{str}) and its
    optional C{details} mapping. Anything else is a bug: logged with its
    traceback and answered EIO with a generic message.
    """
    error = failure.value
    errno = getattr(error, "errno", None)
    if isinstance(errno, WireErrno):
        message = getattr(error, "message", None)
        details = getattr(error, "details", None)
        try:
            return error_frame(
                request_id,
                errno,
                message if isinstance(message, str) else str(error),
                details if isinstance(details, Mapping) else None,
            )
        except CodecError:
            _log.failure("unencodable error for data-plane op {op}", failure, op=op)
    else:
        _log.failure("data-plane op {op} failed", failure, op=op)
    return error_frame(request_id, WireErrno.EIO, GENERIC_FAILURE_MESSAGE)


def _log_close_failure(failure: Failure) -> None:
    _log.failure("data-plane connection handler failed to close", failure)


class ConnectionState(enum.Enum):
    """Where a server connection is in its life."""

    HANDSHAKING = "handshaking"
    """TLS handshake and admission pending; nothing is read or written."""

    OPEN = "open"
    """Admitted, HELLO sent, requests executed."""

    DRAINING = "draining"
    """GOAWAY sent or received: answering what was read, executing nothing new."""

    CLOSING = "closing"
    """The transport was asked to close; nothing more is sent."""

    CLOSED = "closed"
    """C{connectionLost} happened."""


@attrs.define(eq=False)
class _Request:
    request_id: int
    op: str
    size: int
    deferred: Deferred[OpReply] | None = None
    timer: Timer | None = None
    release_raw: Callable[[], None] | None = None


@implementer(IHandshakeListener, IPushProducer)
class DataPlaneServerProtocol(Protocol):
    """
    One data-plane connection at the server; also its L{IConnectionSink}.

    Its transport is Twisted's TLS transport. As the push producer registered
    on it, it learns when the transport's write buffer is full and then
    stops writing large answers, starting requests and reading, until it
    drains: a peer that does not read makes the server hold the answers of
    the requests already started (bulk ones within the answer budgets,
    L{svc.dataplane.answer_budget}) plus about one slice in the transport.

    @ivar identity: the admitted peer, once admitted.
    @ivar connection_id: this connection's id, once admitted.
    @ivar pushes_dropped: best-effort pushes not sent because the peer was
        not reading (L{DROPPED_WHEN_BLOCKED}).
    """

    def __init__(
        self,
        *,
        service: IDataPlaneService,
        admission: Admission,
        clock: TimerClock,
        limits: ServerLimits,
        new_connection_id: Callable[[], str],
        tracker: ConnectionTracker | None = None,
        commands: Mapping[str, Command] = BY_NAME,
        raw_buffers: BufferPool | None = None,
        decode_worker: IWorker | None = None,
    ) -> None:
        """
        @param raw_buffers: where the decoder assembles large raw segments
            (L{svc.wire.decoder.FrameDecoder}); each is given back once its
            request is answered or dropped.
        @param decode_worker: where large request payloads are decoded (a
            thread, so the reactor serves other connections meanwhile:
            L{svc.dataplane.request_intake}); L{None}: on the reactor.
        """
        self._service = service
        self._admission = admission
        self._clock = clock
        self._limits = limits
        self._new_connection_id = new_connection_id
        self._tracker = tracker
        self._intake = RequestIntake(
            self,
            clock=clock,
            limits=limits,
            commands=commands,
            raw_buffers=raw_buffers,
            decode_worker=decode_worker,
        )
        self.state = ConnectionState.HANDSHAKING
        self.identity: AgentIdentity | None = None
        self.connection_id: str | None = None
        self._handler: IConnectionHandler | None = None
        self._requests: dict[int, _Request] = {}
        self._unanswered_bytes = 0
        self._reading_paused = False
        self._writing_blocked = False
        self.pushes_dropped = 0
        self._goaway_sent = False
        self._close_reason = "connection lost"
        self._timers: dict[str, Timer] = {}
        self._lost_waiters: list[Deferred[None]] = []
        self._gone = False
        self.peer_host: str | None = None
        """The peer's address (set by the factory), for per-address limits."""
        self._writer = AnswerWriter(self._write_piece)
        # Requests read while the transport was paused: not started yet.

    # -- life cycle ---------------------------------------------------------

    def connectionMade(self) -> None:
        no_delay(self.transport)
        if self._tracker is not None and not self._tracker.connection_started(self):
            self._abort("connection limit")
            return
        self._start_timer("handshake", self._limits.handshake_timeout, self._handshake_timed_out)

    def handshakeCompleted(self) -> None:
        """
        The TLS handshake finished: run admission; send HELLO or drop.
        """
        self._cancel_timer("handshake")
        if self.state is not ConnectionState.HANDSHAKING:
            return
        try:
            identity = self._admission(self._tls)
        except AdmissionRefused as refusal:
            self._not_admitted("admission", f"refused: {refusal}")
            self._abort("admission refused")
            return
        except Exception:
            _log.failure("data-plane admission failed for {peer}", peer=self._peer())
            self._abort("admission failed")
            return
        if self._tracker is not None and not self._tracker.room_for(identity):
            self._abort("agent connection limit")
            return
        connection_id = self._new_connection_id()
        try:
            handler = self._service.connect(identity, connection_id, self)
        except Exception:
            _log.failure("data-plane service refused connection {id}", id=connection_id)
            self._abort("service connect failed")
            return
        self.identity = identity
        self.connection_id = connection_id
        self._handler = handler
        self.state = ConnectionState.OPEN
        self._tls.registerProducer(self, True)
        self._send(hello_frame(self._limits.hello()))
        _log.debug(
            "data-plane connection {connection_id} from {peer} admitted: "
            "tenant {tenant_id} agent {agent_id} serial {serial}",
            connection_id=connection_id,
            peer=self._peer(),
            tenant_id=identity.tenant_id,
            agent_id=identity.agent_id,
            serial=identity.serial,
        )
        if self._tracker is not None:
            self._tracker.connection_admitted(self)
            if self._tracker.stopping:
                self.go_away(GoAwayReason.SHUTDOWN, "server shutting down")
                return
        self._arm_idle_timer()

    def connectionLost(self, reason: Failure | None = None) -> None:
        if self.state is ConnectionState.CLOSED:
            return
        admitted = self._handler is not None
        if not admitted and self.state is ConnectionState.HANDSHAKING:
            why = reason.getErrorMessage() if reason is not None else "unknown"
            self._not_admitted("lost", f"lost before admission: {why}")
        self.state = ConnectionState.CLOSED
        self._intake.stop()
        for name in list(self._timers):
            self._cancel_timer(name)
        # Not cancelled: a request the handler is running finishes (cancelling
        # it would let the next one start while its work still runs in a
        # thread, breaking the connection's order); those it has not started
        # are not run once it is told the connection closed (dataplane-ops.md
        # section 7).
        self._abandon_requests(cancel=False)
        self._writer.discard()
        closed: Deferred[None] = succeed(None)
        if self._handler is not None:
            closed = maybeDeferred(self._handler.closed, self._close_reason)
            closed.addErrback(_log_close_failure)
        closed.addBoth(lambda _: self._finish_lost(admitted))

    def _finish_lost(self, admitted: bool) -> None:
        self._gone = True
        if admitted:
            _log.debug(
                "data-plane connection {connection_id} closed: {reason}",
                connection_id=self.connection_id,
                reason=self._close_reason,
            )
        if self._tracker is not None:
            self._tracker.connection_lost(self)
        waiters, self._lost_waiters = self._lost_waiters, []
        for waiter in waiters:
            waiter.callback(None)

    def when_lost(self) -> Deferred[None]:
        """
        A Deferred that fires once the connection is gone and the handler's
        C{closed} has finished.
        """
        if self._gone:
            return succeed(None)
        waiter: Deferred[None] = Deferred()
        self._lost_waiters.append(waiter)
        return waiter

    @property
    def in_flight(self) -> int:
        """Requests executing now."""
        return len(self._requests)

    # -- IConnectionSink ----------------------------------------------------

    def push(self, op: str, payload: Mapping[str, object]) -> None:
        """
        Send a PUSH frame with C{payload} plus C{"op": op}; ignored once the
        connection is closing.
        """
        if self.state not in (ConnectionState.OPEN, ConnectionState.DRAINING):
            return
        if self._writing_blocked and op in DROPPED_WHEN_BLOCKED:
            # The peer is not reading: a best-effort notice is not worth
            # buffering (a connection that never reads could otherwise be
            # made to hold every change of its agent until it idles out).
            self.pushes_dropped += 1
            return
        try:
            frame = Frame(FrameType.PUSH, 0, {**payload, "op": op})
            self._write(encode_frame(frame))
        except CodecError:
            _log.failure("unencodable data-plane push {op}", op=op)

    def disconnect(self, reason: str) -> None:
        """
        Send GOAWAY C{reason} and close once what was read is answered (see
        L{go_away}).
        """
        self.go_away(reason)

    def go_away(self, reason: str, message: str = "") -> Deferred[None]:
        """
        End this connection in order: GOAWAY C{reason}, no new request
        executed, every request already read answered (ETIMEDOUT after
        C{drain_timeout}), then close. A connection not yet admitted is
        aborted silently.

        @return: L{when_lost}.
        """
        if self.state is ConnectionState.HANDSHAKING:
            self._abort(reason)
        elif self.state in (ConnectionState.OPEN, ConnectionState.DRAINING):
            self._close_reason = reason
            if not self._goaway_sent:
                self._goaway_sent = True
                self._send(goaway_frame(GoAway(reason, message)))
            self._begin_draining()
        return self.when_lost()

    # -- frames in ----------------------------------------------------------

    def receive_target(self) -> memoryview | None:
        """
        Memory the TLS layer may decrypt the next bytes into (part of a
        large request body; L{svc.wire.decoder.FrameDecoder.receive_target}),
        then calling L{received_into}; else C{None} (use L{dataReceived}).
        """
        if not self.reading():
            return None
        return self._intake.receive_target()

    def received_into(self, count: int) -> None:
        """C{count} bytes of the stream were written into L{receive_target}'s view."""
        self._intake.received_into(count)

    def dataReceived(self, data: bytes) -> None:
        if self.reading():
            self._intake.feed(data)

    # -- IntakeOwner (the requests the intake hands over) --------------------

    def reading(self) -> bool:
        """Whether frames are read at all now (admitted, not closing)."""
        return self.state in (ConnectionState.OPEN, ConnectionState.DRAINING)

    def executing(self) -> bool:
        """Whether requests read now run (not after GOAWAY)."""
        return self.state is ConnectionState.OPEN

    def going_away(self, goaway: GoAway) -> None:
        """The client sent GOAWAY: answer what was read, run nothing new."""
        _log.debug(
            "data-plane client on {connection_id} going away: {reason}",
            connection_id=self.connection_id,
            reason=goaway.reason,
        )
        self._close_reason = f"client going away: {goaway.reason}"
        self._begin_draining()

    def admit(self, frame: PackedFrame) -> bool:
        """Whether a REQUEST may go on: its id free (else a protocol error), room in flight."""
        request_id = frame.request_id
        if request_id in self._requests:
            self.protocol_error(f"request id {request_id} reused while unanswered")
            return False
        self._cancel_timer("idle")
        if len(self._requests) >= self._limits.max_in_flight:
            message = f"more than {self._limits.max_in_flight} requests in flight"
            self.answer_error(frame, WireErrno.EAGAIN, message)
            return False
        return True

    def answer_error(self, frame: PackedFrame, errno: WireErrno, message: str) -> None:
        """Answer a request that will not run with an ERROR."""
        release_raw(frame)
        self._send(error_frame(frame.request_id, errno, message))

    def refused(self, error: RequestRefused) -> None:
        """A request refused by its shape: the handler counts and logs it."""
        assert self._handler is not None
        self._handler.refused(error)

    def turn_ended(self) -> None:
        """Look at reading and idleness again after the intake's turn."""
        self._update_reading()
        if not self._requests and self.state is ConnectionState.OPEN:
            self._arm_idle_timer()

    def start(self, command: Command, frame: PackedFrame, decoded: DecodedRequest) -> None:
        """Run the request C{frame} carries (the intake decoded it)."""
        assert self._handler is not None
        request_id = frame.request_id
        request = _Request(request_id, str(command.op), HEADER_SIZE + len(frame.raw))
        request.release_raw = frame.release_raw
        self._requests[request_id] = request
        self._unanswered_bytes += request.size
        request.timer = self._clock.callLater(
            self._limits.request_timeout, self._request_timed_out, request
        )
        # A view of its own: it stays usable (and keeps a lent buffer out of
        # reuse) even if the request is given up while the handler runs.
        raw = memoryview(frame.raw)
        deferred: Deferred[OpReply] = maybeDeferred(self._handler.handle, command, decoded, raw)
        request.deferred = deferred
        deferred.addCallbacks(
            self._answered,
            self._failed,
            callbackArgs=(request,),
            errbackArgs=(request,),
        )
        if command.op is Op.CLOSE:
            self.go_away(GoAwayReason.SHUTDOWN, "closed at the client's request")

    def backlogged(self) -> bool:
        """
        Whether received requests wait before they start: while the
        transport is paused (the peer is not taking what it was sent) or the
        answers queued hold more than C{max_payload} bytes of payload.
        """
        return self._writing_blocked or self._writer.queued_payload_bytes > self._limits.max_payload

    # -- answers out --------------------------------------------------------

    def _take(self, request: _Request) -> bool:
        """Forget C{request} if it is still unanswered; whether it was."""
        if self._requests.get(request.request_id) is not request:
            return False
        del self._requests[request.request_id]
        self._unanswered_bytes -= request.size
        if request.timer is not None and request.timer.active():
            request.timer.cancel()
        request.timer = None
        release, request.release_raw = request.release_raw, None
        if release is not None:
            release()
        return True

    def _answered(self, reply: OpReply, request: _Request) -> None:
        # Runs once the answer is handed on (its last slice written) or
        # dropped: the writer calls it, or this method if no frame is written.
        sent = reply.sent
        try:
            if not self._take(request):
                return
            try:
                buffers = encode_frame(
                    Frame(FrameType.RESPONSE, request.request_id, reply.payload, reply.raw)
                )
            except Exception:
                _log.failure("unencodable reply to data-plane op {op}", op=request.op)
                self._send(error_frame(request.request_id, WireErrno.EIO, GENERIC_FAILURE_MESSAGE))
            else:
                sent = None
                self._write(buffers, reply.sent)
                del buffers
        finally:
            if sent is not None:
                sent()
        self._after_answer()

    def _failed(self, failure: Failure, request: _Request) -> None:
        if not self._take(request):
            return
        self._send(error_for_failure(request.request_id, failure, request.op))
        self._after_answer()

    def _request_timed_out(self, request: _Request) -> None:
        request.timer = None
        if not self._take(request):
            return
        _log.warn(
            "data-plane op {op} (request {request_id}) on {connection_id} timed out",
            op=request.op,
            request_id=request.request_id,
            connection_id=self.connection_id,
        )
        self._send(
            error_frame(request.request_id, WireErrno.ETIMEDOUT, "operation did not finish in time")
        )
        if request.deferred is not None:
            request.deferred.cancel()
        self._after_answer()

    def _after_answer(self) -> None:
        self._intake.schedule()
        if self._requests:
            self._update_reading()
        elif self.state is ConnectionState.DRAINING:
            self._close_transport()
        elif self.state is ConnectionState.OPEN:
            self._update_reading()
            self._arm_idle_timer()

    # -- back-pressure (IPushProducer, called by the transport) -------------

    def pauseProducing(self) -> None:
        """
        The transport's write buffer is full: stop writing large answers,
        starting requests and reading.
        """
        self._writing_blocked = True
        self._writer.pause()
        self._update_reading()

    def resumeProducing(self) -> None:
        """
        The transport's write buffer drained: start the requests that
        waited (their reads overlap the writing), write on, read again.
        """
        self._writing_blocked = False
        self._writer.resume()
        self._intake.schedule()
        self._update_reading()

    def stopProducing(self) -> None:
        """The transport is going away; C{connectionLost} follows."""

    def _update_reading(self) -> None:
        if self.state not in (ConnectionState.OPEN, ConnectionState.DRAINING):
            return
        limits = self._limits
        if not self._reading_paused:
            if (
                len(self._requests) >= limits.max_in_flight
                or self._unanswered_bytes > limits.pause_reading_above
                or self._writing_blocked
                or self._intake.waiting
            ):
                self._reading_paused = True
                self._tls.pauseProducing()
        elif (
            len(self._requests) < limits.max_in_flight
            and self._unanswered_bytes <= limits.resume_reading_below
            and not self._writing_blocked
            and not self._intake.waiting
        ):
            self._reading_paused = False
            self._tls.resumeProducing()

    # -- closing ------------------------------------------------------------

    def _begin_draining(self) -> None:
        if self.state is not ConnectionState.OPEN:
            return
        self.state = ConnectionState.DRAINING
        self._cancel_timer("idle")
        if not self._requests:
            self._close_transport()
            return
        self._start_timer("drain", self._limits.drain_timeout, self._drain_timed_out)

    def _drain_timed_out(self) -> None:
        self._timers.pop("drain", None)
        for request in list(self._requests.values()):
            self._request_timed_out(request)

    def _idle_timed_out(self) -> None:
        self._timers.pop("idle", None)
        _log.debug("data-plane connection {connection_id} idle", connection_id=self.connection_id)
        self.go_away(GoAwayReason.IDLE_TIMEOUT, "no request for too long")

    def _handshake_timed_out(self) -> None:
        self._timers.pop("handshake", None)
        self._not_admitted("handshake_timeout", "handshake timed out")
        self._abort("handshake timeout")

    def _not_admitted(self, reason: str, detail: str) -> None:
        if self._tracker is not None:
            self._tracker.not_admitted(self, reason, detail)
        else:
            _log.info(
                "data-plane connection from {peer} not admitted ({reason}): {detail}",
                peer=self._peer(),
                reason=reason,
                detail=detail,
            )

    def protocol_error(self, reason: str) -> None:
        """The stream broke the protocol: drop this connection only, logged at info."""
        _log.info(
            "dropping data-plane connection {connection_id} from {peer}: protocol error: {reason}",
            connection_id=self.connection_id,
            peer=self._peer(),
            reason=reason,
        )
        self._close_reason = "protocol error"
        if not self._goaway_sent:
            self._goaway_sent = True
            self._send(goaway_frame(GoAway(GoAwayReason.PROTOCOL_ERROR)))
        self._close_transport()

    def _close_transport(self) -> None:
        if self.state in (ConnectionState.CLOSING, ConnectionState.CLOSED):
            return
        self.state = ConnectionState.CLOSING
        self._intake.stop()
        for name in list(self._timers):
            self._cancel_timer(name)
        self._abandon_requests()
        # What was answered goes out first (at the peer's pace, within the
        # close timeout), then the TLS close.
        self._start_timer("close", self._limits.close_timeout, self._close_timed_out)
        self._writer.when_idle(self._close_tls)

    def _close_tls(self) -> None:
        if self.state is not ConnectionState.CLOSING:
            return
        self._tls.unregisterProducer()
        if self._reading_paused:
            # The peer's TLS close_notify must be read for the close to finish.
            self._reading_paused = False
            self._tls.resumeProducing()
        self._tls.loseConnection()

    def _close_timed_out(self) -> None:
        self._timers.pop("close", None)
        self._tls.abortConnection()

    def _abort(self, reason: str) -> None:
        if self.state in (ConnectionState.CLOSING, ConnectionState.CLOSED):
            return
        self.state = ConnectionState.CLOSING
        self._close_reason = reason
        self._tls.abortConnection()

    def _abandon_requests(self, *, cancel: bool = True) -> None:
        """Forget every unanswered request (their answers go nowhere); C{cancel} them too."""
        requests = list(self._requests.values())
        for request in requests:
            self._take(request)
        if not cancel:
            return
        for request in requests:
            if request.deferred is not None:
                request.deferred.cancel()

    # -- helpers ------------------------------------------------------------

    def _send(self, frame: Frame) -> None:
        self._write(encode_frame(frame))

    def _write(self, buffers: list[Buffer], then: Callable[[], None] | None = None) -> None:
        """
        Write one encoded frame through the L{AnswerWriter}; C{then} runs
        once it is handed on or dropped (nothing new is written once the
        connection is closing).
        """
        if self.state in (ConnectionState.CLOSING, ConnectionState.CLOSED):
            if then is not None:
                then()
            return
        self._writer.write(buffers, then)

    def _write_piece(self, piece: memoryview) -> None:
        write_frame(self._tls, [piece])

    def _arm_idle_timer(self) -> None:
        self._start_timer("idle", self._limits.idle_timeout, self._idle_timed_out)

    def _start_timer(self, name: str, delay: float, action: Callable[[], None]) -> None:
        self._cancel_timer(name)
        self._timers[name] = self._clock.callLater(delay, action)

    def _cancel_timer(self, name: str) -> None:
        timer = self._timers.pop(name, None)
        if timer is not None and timer.active():
            timer.cancel()

    @property
    def _tls(self) -> Any:
        # Twisted's TLS transport; typed Any since its interfaces are zope's.
        return self.transport

    def _peer(self) -> str:
        if self.transport is None:
            return "?"
        return str(self._tls.getPeer())
