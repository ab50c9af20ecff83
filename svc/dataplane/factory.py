"""
The data-plane server factory, its TLS wrapping and listening.

L{DataPlaneFactory} builds one L{DataPlaneServerProtocol} per connection,
counts connections and stops them gracefully (L{DataPlaneFactory.stop_serving}).
L{tls_server_factory} wraps it in Twisted's TLS layer with a
L{SwappableServerTLS}, so the server leaf can be renewed while connections
live; L{listen_dataplane} listens on an endpoint string with both; and
L{DataPlaneListenerService} ties listening and graceful stop to a service's
start and stop.
"""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, cast

import attrs
from twisted.application.service import Service
from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import IAddress, IListeningPort
from twisted.internet.protocol import Factory
from twisted.logger import Logger, LogLevel
from twisted.protocols.tls import TLSMemoryBIOFactory

from svc.buffer_pool import BufferPool
from svc.dataplane.admission import Admission, SwappableServerTLS
from svc.dataplane.interfaces import IDataPlaneService
from svc.dataplane.protocol import DataPlaneServerProtocol
from svc.dataplane.rate_limited_log import RateLimitedLog
from svc.frame_tls import frame_tls_factory
from svc.metrics import CONNECTION_REFUSAL_REASONS, DataPlaneMetrics
from svc.pki.identity import AgentIdentity
from svc.timers import TimerClock
from svc.wire.commands import BY_NAME, Command
from svc.wire.control import DEFAULT_MAX_IN_FLIGHT, GoAwayReason, Hello
from svc.wire.frame import MAX_PAYLOAD_SIZE, MAX_RAW_SIZE, PROTOCOL_VERSION
from svc.worker import IWorker

_log = Logger()

MIB = 1024 * 1024

RAW_BUFFERS_KEPT = 8
"""
Idle request buffers a server keeps for reuse, shared by its connections
(each holds the pages of the largest raw segment it carried).
"""


DEFAULT_MAX_CONNECTIONS = 4096
"""Admitted connections a server holds at once (each holds a file descriptor)."""

DEFAULT_MAX_CONNECTIONS_PER_AGENT = 16
"""Admitted connections one agent may hold at once (a mount uses one, two while it moves)."""

DEFAULT_FRAMES_PER_TURN = 16
"""Frames a connection decodes and starts per reactor turn (L{ServerLimits.frames_per_turn})."""

DEFAULT_PAYLOAD_BYTES_PER_TURN = 64 * 1024
"""Payload bytes after which a connection's turn ends (L{ServerLimits.payload_bytes_per_turn})."""

REFUSAL_LOG_EVERY = 1000
"""Connections refused for a limit are logged the first time, then once per this many."""

DEFAULT_MAX_PENDING_CONNECTIONS = 512
"""
Connections not yet admitted (TLS handshake or admission under way) a
server holds at once. An honest peer's handshake takes milliseconds, so
this is far more than any legitimate burst needs (all of a host's mounts
reconnecting after a restart), while it bounds what peers that never finish
their handshake can hold: they no longer count against
L{DEFAULT_MAX_CONNECTIONS}.
"""

DEFAULT_MAX_PENDING_PER_ADDRESS = 32
"""
Connections not yet admitted from one source address at once: one peer
cannot take the whole pending budget (agents behind one NAT address still
connect 32 at a time, each handshake lasting milliseconds).
"""

DEFAULT_HANDSHAKE_TIMEOUT = 10.0
"""
Seconds a connection may take from accept to admission (TLS 1.3 handshake,
certificate checks): a hundred round trips of a slow link.
"""


def _positive(_instance: object, attribute: Any, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{attribute.name} must be positive, not {value!r}")


@attrs.frozen
class ServerLimits:
    """
    The per-connection limits of the data-plane server (all times in seconds).

    @ivar max_payload: largest REQUEST payload accepted (HELLO C{max_payload}).
    @ivar max_raw: largest REQUEST raw segment accepted (HELLO C{max_raw}).
    @ivar max_in_flight: unanswered requests allowed (HELLO C{max_in_flight}).
    @ivar pause_reading_above: unanswered request bytes (raw segments plus
        headers) above which the connection stops reading.
    @ivar resume_reading_below: ... and at or below which it reads again.
    @ivar handshake_timeout: TLS handshake plus admission must finish within
        (from accept); a connection still handshaking is then dropped.
    @ivar idle_timeout: nothing in flight and no request for this long
        ends the connection with GOAWAY C{idle_timeout}.
    @ivar request_timeout: a request unanswered for this long is answered
        ETIMEDOUT and its operation cancelled.
    @ivar drain_timeout: after GOAWAY, requests still running after this long
        are answered ETIMEDOUT and the connection closes.
    @ivar close_timeout: a connection whose orderly TLS close has not
        finished after this long is aborted.
    @ivar server_name: HELLO C{server}.
    @ivar max_connections: admitted connections at once; one more is
        dropped after its handshake like a refused certificate, before HELLO.
    @ivar max_connections_per_agent: admitted connections of one agent (one
        tenant's agent id) at once; one more is dropped likewise.
    @ivar max_pending_connections: connections not yet admitted (handshake
        or admission under way) at once; one more is closed as soon as it
        is accepted, before any TLS.
    @ivar max_pending_per_address: connections not yet admitted from one
        source address at once; one more is closed likewise.
    @ivar frames_per_turn: frames one connection decodes and starts per
        reactor turn; what is left of a read waits for a later turn, so one
        connection cannot hold the reactor (the others are served between).
    @ivar payload_bytes_per_turn: ... and fewer once their payloads (what
        decoding costs by) reach this many bytes: the frame that reaches it
        is the turn's last.
    """

    max_payload: int = attrs.field(default=MAX_PAYLOAD_SIZE)
    max_raw: int = attrs.field(default=MAX_RAW_SIZE)
    max_in_flight: int = attrs.field(default=DEFAULT_MAX_IN_FLIGHT, validator=_positive)
    pause_reading_above: int = attrs.field(default=64 * MIB, validator=_positive)
    resume_reading_below: int = attrs.field(default=32 * MIB)
    handshake_timeout: float = attrs.field(default=DEFAULT_HANDSHAKE_TIMEOUT, validator=_positive)
    idle_timeout: float = attrs.field(default=300.0, validator=_positive)
    request_timeout: float = attrs.field(default=120.0, validator=_positive)
    drain_timeout: float = attrs.field(default=30.0, validator=_positive)
    close_timeout: float = attrs.field(default=10.0, validator=_positive)
    server_name: str = "svc-dataplane"
    max_connections: int = attrs.field(default=DEFAULT_MAX_CONNECTIONS, validator=_positive)
    max_connections_per_agent: int = attrs.field(
        default=DEFAULT_MAX_CONNECTIONS_PER_AGENT, validator=_positive
    )
    max_pending_connections: int = attrs.field(
        default=DEFAULT_MAX_PENDING_CONNECTIONS, validator=_positive
    )
    max_pending_per_address: int = attrs.field(
        default=DEFAULT_MAX_PENDING_PER_ADDRESS, validator=_positive
    )
    frames_per_turn: int = attrs.field(default=DEFAULT_FRAMES_PER_TURN, validator=_positive)
    payload_bytes_per_turn: int = attrs.field(
        default=DEFAULT_PAYLOAD_BYTES_PER_TURN, validator=_positive
    )

    @max_payload.validator
    def _check_payload(self, _attribute: object, value: int) -> None:
        if not 1 <= value <= MAX_PAYLOAD_SIZE:
            raise ValueError(f"max_payload must be in 1..{MAX_PAYLOAD_SIZE}")

    @max_raw.validator
    def _check_raw(self, _attribute: object, value: int) -> None:
        if not 0 <= value <= MAX_RAW_SIZE:
            raise ValueError(f"max_raw must be in 0..{MAX_RAW_SIZE}")

    @resume_reading_below.validator
    def _check_resume(self, _attribute: object, value: int) -> None:
        if not 0 <= value <= self.pause_reading_above:
            raise ValueError("resume_reading_below must be in 0..pause_reading_above")

    def hello(self) -> Hello:
        """The HELLO these limits announce."""
        return Hello(
            versions=(PROTOCOL_VERSION,),
            max_payload=self.max_payload,
            max_raw=self.max_raw,
            max_in_flight=self.max_in_flight,
            server=self.server_name,
        )


LIMIT_REASONS = frozenset({"pending_limit", "address_limit", "connection_limit", "agent_limit"})
"""Refusal reasons that are a connection limit (logged as warnings)."""


def _agent_key(identity: AgentIdentity) -> tuple[str, str]:
    return (identity.tenant_id, identity.agent_id)


def random_connection_id() -> str:
    """
    A fresh connection id: 128 random bits in hex, so ids never repeat
    across connections or server restarts.
    """
    return secrets.token_hex(16)


class DataPlaneFactory(Factory):
    """
    Builds data-plane server connections and keeps track of them.

    This is the application-level factory; listen with it wrapped in TLS
    (L{tls_server_factory}, L{listen_dataplane}).

    Connections are counted in two budgets: I{pending} ones (accepted, TLS
    handshake or admission under way) against C{max_pending_connections}
    and, per source address, C{max_pending_per_address}; I{admitted} ones
    against C{max_connections} and, per agent, C{max_connections_per_agent}.
    So peers that never finish a handshake cannot keep agents out. Each
    refusal (and each handshake timeout and refused admission) is counted in
    C{svc_dataplane_connections_refused_total} and logged at a bounded rate
    (L{RateLimitedLog}).
    """

    def __init__(
        self,
        service: IDataPlaneService,
        admission: Admission,
        clock: TimerClock,
        limits: ServerLimits | None = None,
        *,
        new_connection_id: Callable[[], str] = random_connection_id,
        commands: Mapping[str, Command] = BY_NAME,
        decode_worker: IWorker | None = None,
        metrics: DataPlaneMetrics | None = None,
        seconds: Callable[[], float] | None = None,
    ) -> None:
        """
        @param service: the data-plane logic.
        @param admission: the post-handshake check (L{TLSAdmission}); it
            reads the current deny-list for each new connection.
        @param clock: timeouts run on it.
        @param limits: per-connection limits (default L{ServerLimits}()).
        @param new_connection_id: the connection id source.
        @param commands: the operations passed to the service, by name; any
            other is answered ENOSYS without calling it (tests pass their own).
        @param decode_worker: where large request payloads are decoded, off
            the reactor (L{DataPlaneServerProtocol}); L{None}: on the reactor.
        @param metrics: where refusals are counted (none if not given).
        @param seconds: the time, for the refusal log's rate (default: the
            clock's C{seconds}, which reactors and test clocks have).
        """
        self._service = service
        self._admission = admission
        self._clock = clock
        self.limits = limits or ServerLimits()
        self._new_connection_id = new_connection_id
        self._commands = commands
        self._decode_worker = decode_worker
        self._metrics = metrics
        self._stopping = False
        self._live: set[DataPlaneServerProtocol] = set()
        self._pending: dict[DataPlaneServerProtocol, str | None] = {}
        self._pending_per_address: Counter[str] = Counter()
        self._admitted: set[DataPlaneServerProtocol] = set()
        self._per_agent: Counter[tuple[str, str]] = Counter()
        self.refused_for_limits = 0
        self.refusals: Counter[str] = Counter()
        """Refusals so far by C{svc_dataplane_connections_refused_total} reason."""
        now = seconds if seconds is not None else cast(Any, clock).seconds
        self._refusal_log = RateLimitedLog(now, _log)
        # Shared by every connection: where large request raw segments
        # (chunk_put's bytes) are assembled, then lent again.
        self._raw_buffers = BufferPool(max(self.limits.max_raw, 1), keep=RAW_BUFFERS_KEPT)

    def trim_buffers(self) -> int:
        """
        Free the request buffers idle since the previous call
        (L{BufferPool.trim}); how many were freed.
        """
        return self._raw_buffers.trim()

    def buildProtocol(self, addr: IAddress | None) -> DataPlaneServerProtocol:
        protocol = DataPlaneServerProtocol(
            service=self._service,
            admission=self._admission,
            clock=self._clock,
            limits=self.limits,
            new_connection_id=self._new_connection_id,
            tracker=self,
            commands=self._commands,
            raw_buffers=self._raw_buffers,
            decode_worker=self._decode_worker,
        )
        host = getattr(addr, "host", None)
        protocol.peer_host = host if isinstance(host, str) else None
        return protocol

    @property
    def stopping(self) -> bool:
        """Whether L{stop_serving} was called."""
        return self._stopping

    @property
    def active_connections(self) -> int:
        """Admitted connections not yet closed."""
        return len(self._admitted)

    @property
    def pending_connections(self) -> int:
        """Connections accepted and not yet admitted nor closed."""
        return len(self._pending)

    def connection_started(self, connection: DataPlaneServerProtocol) -> bool:
        """
        Track a new transport (L{ConnectionTracker}); whether there is room
        for it among the pending connections, server-wide and for its
        source address (if not it is not tracked).
        """
        limits, host = self.limits, connection.peer_host
        if len(self._pending) >= limits.max_pending_connections:
            self._refused(
                "pending_limit",
                "{count} connections are handshaking (SVC_MAX_PENDING_CONNECTIONS)",
                count=len(self._pending),
            )
            return False
        if host is not None and self._pending_per_address[host] >= limits.max_pending_per_address:
            self._refused(
                "address_limit",
                "{peer} has {count} connections handshaking (SVC_MAX_PENDING_PER_ADDRESS)",
                count=self._pending_per_address[host],
                peer=host,
            )
            return False
        self._pending[connection] = host
        if host is not None:
            self._pending_per_address[host] += 1
        self._live.add(connection)
        return True

    def room_for(self, identity: AgentIdentity) -> bool:
        """
        Whether one more connection may be admitted for C{identity}'s agent
        (L{ConnectionTracker}): under C{max_connections} and the agent's
        C{max_connections_per_agent}.
        """
        if len(self._admitted) >= self.limits.max_connections:
            self._refused(
                "connection_limit",
                "{count} connections are admitted (SVC_MAX_CONNECTIONS)",
                count=len(self._admitted),
            )
            return False
        held = self._per_agent[_agent_key(identity)]
        if held < self.limits.max_connections_per_agent:
            return True
        self._refused(
            "agent_limit",
            "agent {agent_id} of tenant {tenant_id} has {count} connections"
            " (SVC_MAX_CONNECTIONS_PER_AGENT)",
            count=held,
            agent_id=identity.agent_id,
            tenant_id=identity.tenant_id,
        )
        return False

    def not_admitted(self, connection: DataPlaneServerProtocol, reason: str, detail: str) -> None:
        """
        A connection ends before admission (L{ConnectionTracker}): a
        C{handshake_timeout} or an C{admission} refusal is counted; each is
        logged at a bounded rate, C{lost} (the peer left) too.
        """
        peer = connection.peer_host
        if reason in CONNECTION_REFUSAL_REASONS:
            self._refused(reason, "{peer}: {detail}", peer=peer, detail=detail)
        else:
            self._refusal_log.emit(
                reason,
                LogLevel.info,
                "data-plane connection from {peer}: {detail}"
                " ({suppressed} similar lines not logged)",
                peer=peer,
                detail=detail,
            )

    def connection_admitted(self, connection: DataPlaneServerProtocol) -> None:
        """Count an admitted connection (L{ConnectionTracker})."""
        self._forget_pending(connection)
        if connection not in self._admitted and connection.identity is not None:
            self._per_agent[_agent_key(connection.identity)] += 1
        self._admitted.add(connection)

    def connection_lost(self, connection: DataPlaneServerProtocol) -> None:
        """Forget a closed connection (L{ConnectionTracker})."""
        self._live.discard(connection)
        self._forget_pending(connection)
        if connection in self._admitted and connection.identity is not None:
            key = _agent_key(connection.identity)
            self._per_agent[key] -= 1
            if self._per_agent[key] <= 0:
                del self._per_agent[key]
        self._admitted.discard(connection)

    def _forget_pending(self, connection: DataPlaneServerProtocol) -> None:
        if connection not in self._pending:
            return
        host = self._pending.pop(connection)
        if host is not None:
            self._pending_per_address[host] -= 1
            if self._pending_per_address[host] <= 0:
                del self._pending_per_address[host]

    def _refused(self, reason: str, what: str, **fields: object) -> None:
        if reason in LIMIT_REASONS:
            self.refused_for_limits += 1
        self.refusals[reason] += 1
        if self._metrics is not None:
            self._metrics.count_connection_refused(reason)
        self._refusal_log.emit(
            reason,
            LogLevel.warn if reason in LIMIT_REASONS else LogLevel.info,
            "data-plane connection refused ({reason}): " + what + "; {total} so far"
            " ({suppressed} similar lines not logged)",
            reason=reason,
            total=self.refusals[reason],
            **fields,
        )

    def stop_serving(self) -> Deferred[None]:
        """
        Stop gracefully: every connection gets GOAWAY C{shutdown}, finishes
        what it read (bounded by the drain and close timeouts) and closes;
        connections still handshaking are dropped; connections admitted
        later get GOAWAY at once.

        @return: fires when every connection is gone and its handler closed.
        """
        self._stopping = True
        _log.info("data-plane stopping: {count} connections", count=len(self._live))
        waits = [
            connection.go_away(GoAwayReason.SHUTDOWN, "server shutting down")
            for connection in list(self._live)
        ]
        done: Deferred[list[None]] = gatherResults(waits)
        return done.addCallback(lambda _: None)


def tls_server_factory(
    factory: DataPlaneFactory, tls: SwappableServerTLS, clock: Any
) -> TLSMemoryBIOFactory:
    """
    C{factory} behind TLS with the options current in C{tls} for each new
    connection; C{clock} is the reactor (or a test clock).
    """
    creator: Any = tls  # zope interfaces: mypy cannot see what these provide
    wrapped: Any = factory
    return frame_tls_factory(creator, is_client=False, wrapped=wrapped, clock=clock)


def listen_dataplane(
    reactor: Any, description: str, factory: DataPlaneFactory, tls: SwappableServerTLS
) -> Deferred[IListeningPort]:
    """
    Listen on the server endpoint C{description} (e.g.
    C{"tcp:7443:interface=127.0.0.1"}) with C{factory} behind TLS.

    @param reactor: the reactor (clock and listener).
    """
    endpoint: Any = serverFromString(reactor, description)  # type: ignore[no-untyped-call]
    listening: Deferred[IListeningPort] = endpoint.listen(tls_server_factory(factory, tls, reactor))
    return listening


class DataPlaneListenerService(Service):
    """
    Listens while running; on stop, stops listening, then stops the
    factory's connections gracefully.
    """

    def __init__(
        self, reactor: Any, description: str, factory: DataPlaneFactory, tls: SwappableServerTLS
    ) -> None:
        self._reactor = reactor
        self._description = description
        self.factory = factory
        self.tls = tls
        self._port: Deferred[IListeningPort] | None = None

    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]
        self._port = listen_dataplane(self._reactor, self._description, self.factory, self.tls)
        self._port.addErrback(
            lambda f: _log.failure("data-plane cannot listen on {d}", f, d=self._description)
        )

    def stopService(self) -> Deferred[None]:
        super().stopService()  # type: ignore[no-untyped-call]
        port, self._port = self._port, None

        def stop_listening(listening: Any) -> Deferred[None] | None:
            if listening is None:
                return None
            stopped: Deferred[None] | None = listening.stopListening()
            return stopped

        stopped: Deferred[Any] = port if port is not None else Deferred()
        if port is None:
            stopped.callback(None)
        stopped.addCallback(stop_listening)
        stopped.addCallback(lambda _: self.factory.stop_serving())
        return stopped
