"""
Test doubles for the data-plane connection layer: a scripted fake service
behind the L{svc.dataplane.interfaces} seam, a raw frame-level client, and a
harness that connects clients to a real L{DataPlaneFactory} through real
TLS 1.3 in memory (L{twisted.test.iosim}).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import attrs
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.interfaces import IOpenSSLClientConnectionCreator
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock
from twisted.protocols.tls import TLSMemoryBIOFactory
from twisted.python.failure import Failure
from twisted.test.iosim import IOPump, connectedServerAndClient

from svc.dataplane.admission import SwappableServerTLS, TLSAdmission
from svc.dataplane.factory import DataPlaneFactory, ServerLimits, tls_server_factory
from svc.dataplane.interfaces import IConnectionSink, OpReply
from svc.dataplane.protocol import DataPlaneServerProtocol
from svc.dataplane_client.client import DataPlaneClientProtocol, client_tls_factory
from svc.metrics import DataPlaneMetrics
from svc.pki.identity import AgentIdentity, DenyList
from svc.testing.pki import TestPKI, shared_test_pki
from svc.wire.answers import EmptyReply
from svc.wire.commands import BY_NAME, Command, declare
from svc.wire.contract import DecodedRequest, RequestRefused
from svc.wire.decoder import FrameDecoder
from svc.wire.errno import WireErrno
from svc.wire.frame import FRAMES_TO_CLIENT, Frame, encode_frame
from svc.wire.messages import EmptyRequest
from svc.wire.ops import Op


def _scripted(name: str) -> Command:
    # Not an operation of the protocol: an op name only the fake runs.
    return declare(cast(Op, name), EmptyRequest, EmptyReply)


FAKE_OPS: Mapping[str, Command] = {
    **BY_NAME,
    **{name: _scripted(name) for name in ("echo", "hold", "refuse", "crash")},
}
"""Operations the fake service runs, by name; pass as the factory's C{commands}."""


class FakeOpRefused(Exception):
    """An expected refusal carrying a wire errno, like the service's errors."""

    def __init__(
        self, errno: WireErrno, message: str, details: Mapping[str, object] | None = None
    ) -> None:
        super().__init__(message)
        self.errno = errno
        self.message = message
        self.details = dict(details or {})


@attrs.define
class HeldRequest:
    """A C{hold} request the test answers (or watches being cancelled)."""

    payload: Mapping[str, object]
    deferred: Deferred[OpReply]
    cancelled: bool = False


class ScriptedConnectionHandler:
    """
    One connection's handler in L{ScriptedDataPlaneService}:

     - C{echo}: answers its payload (without C{op}) and raw segment;
     - C{hold}: waits until the test fires L{held}[i].deferred;
     - C{refuse}: fails with L{FakeOpRefused} (C{errno} from the payload);
     - C{crash}: raises a bug (C{ZeroDivisionError});
     - C{ping} and C{close}: empty answers; anything else ENOSYS.
    """

    def __init__(self, identity: AgentIdentity, connection_id: str, sink: IConnectionSink):
        self.identity = identity
        self.connection_id = connection_id
        self.sink = sink
        self.handled: list[tuple[str, Mapping[str, object], bytes]] = []
        self.held: list[HeldRequest] = []
        self.closed_reasons: list[str] = []
        self.refusals: list[RequestRefused] = []

    def refused(self, error: RequestRefused) -> None:
        """Record a request the protocol refused."""
        self.refusals.append(error)

    def handle(
        self, command: Command, decoded: DecodedRequest, raw: memoryview
    ) -> Deferred[OpReply]:
        """Run one scripted operation (its whole map: the fake takes any keys)."""
        op = str(command.op)
        payload = decoded.payload
        self.handled.append((op, payload, bytes(raw)))
        if op == "echo":
            echoed = {k: v for k, v in payload.items() if k != "op"}
            return succeed(OpReply(echoed, bytes(raw)))
        if op == "hold":

            def cancelled(_: Deferred[OpReply]) -> None:
                held.cancelled = True

            held = HeldRequest(payload, Deferred(cancelled))
            self.held.append(held)
            return held.deferred
        if op == "refuse":
            errno = WireErrno(int(payload.get("errno", WireErrno.ENOENT)))  # type: ignore[call-overload]
            return fail(FakeOpRefused(errno, "refused by script", {"why": "scripted"}))
        if op == "crash":
            1 / 0  # noqa: B018
        if op in ("ping", "close"):
            return succeed(OpReply())
        return fail(FakeOpRefused(WireErrno.ENOSYS, "unknown operation"))

    def closed(self, reason: str) -> Deferred[None]:
        """Record the close."""
        self.closed_reasons.append(reason)
        return succeed(None)


class ScriptedDataPlaneService:
    """An L{IDataPlaneService} whose connections are L{ScriptedConnectionHandler}s."""

    def __init__(self) -> None:
        self.handlers: list[ScriptedConnectionHandler] = []

    def connect(
        self, identity: AgentIdentity, connection_id: str, sink: IConnectionSink
    ) -> ScriptedConnectionHandler:
        """Make and remember a handler."""
        handler = ScriptedConnectionHandler(identity, connection_id, sink)
        self.handlers.append(handler)
        return handler


class RawFrameClient(Protocol):
    """
    A frame-level client that sends whatever it is told and records every
    byte and frame it receives (for checks the real client would hide).
    """

    def __init__(self) -> None:
        self.received = b""
        self.frames: list[Frame] = []
        self.lost: Failure | None = None
        self._decoder = FrameDecoder(accept=FRAMES_TO_CLIENT)

    def dataReceived(self, data: bytes) -> None:
        self.received += data
        self.frames.extend(self._decoder.feed(data))

    def connectionLost(self, reason: Failure | None = None) -> None:
        self.lost = reason

    def send(self, *frames: Frame) -> None:
        """Write C{frames} back to back in one write."""
        transport: Any = self.transport
        transport.write(b"".join(b"".join(map(bytes, encode_frame(f))) for f in frames))

    def send_bytes(self, data: bytes) -> None:
        """Write C{data} as it is."""
        transport: Any = self.transport
        transport.write(data)


@attrs.define
class Connection:
    """One in-memory TLS connection made by L{TLSHarness}."""

    server: DataPlaneServerProtocol
    client: Any
    pump: IOPump


class TLSHarness:
    """
    A L{DataPlaneFactory} over the fake service, with real TLS 1.3 admission
    against a L{TestPKI}, all on one L{Clock}.
    """

    def __init__(
        self,
        limits: ServerLimits | None = None,
        pki: TestPKI | None = None,
        metrics: DataPlaneMetrics | None = None,
    ) -> None:
        self.pki = pki or shared_test_pki()
        self.clock = Clock()
        self.service = ScriptedDataPlaneService()
        self.deny_list = DenyList()
        self.tls = SwappableServerTLS(self.pki.server_options())
        admission = TLSAdmission(self.pki.root.cert, self.pki.trust_domain, lambda: self.deny_list)
        ids = iter(range(1, 1_000_000))
        self.factory = DataPlaneFactory(
            self.service,
            admission,
            self.clock,
            limits,
            new_connection_id=lambda: f"conn-{next(ids)}",
            commands=FAKE_OPS,
            metrics=metrics,
        )
        self.server_tls = tls_server_factory(self.factory, self.tls, self.clock)

    def _connect(
        self, client_tls: Any, address: Any = None
    ) -> tuple[DataPlaneServerProtocol, IOPump]:
        _client, server, pump = connectedServerAndClient(
            lambda: self.server_tls.buildProtocol(address),
            lambda: client_tls.buildProtocol(None),
            greet=False,
            clock=self.clock,
        )
        protocol = server.wrappedProtocol  # the TLS layer forgets it once closed
        pump.flush()
        return protocol, pump

    def connect_bare(self, host: str) -> tuple[DataPlaneServerProtocol, IOPump]:
        """
        A TCP peer from C{host} that never starts TLS: the server protocol
        (still handshaking, or already closed) and the pump.
        """
        return self._connect(Factory.forProtocol(Protocol), IPv4Address("TCP", host, 40000))

    def connect_raw(
        self, creator: IOpenSSLClientConnectionCreator
    ) -> tuple[RawFrameClient, DataPlaneServerProtocol, IOPump]:
        """Connect a L{RawFrameClient}; returns it, the server protocol and the pump."""
        raw = RawFrameClient()
        wrapped: Any = Factory.forProtocol(lambda: raw)
        clock: Any = self.clock
        client_tls = TLSMemoryBIOFactory(
            creator, isClient=True, wrappedFactory=wrapped, clock=clock
        )
        server, pump = self._connect(client_tls)
        return raw, server, pump

    def connect_client(
        self, creator: IOpenSSLClientConnectionCreator, **options: Any
    ) -> tuple[DataPlaneClientProtocol, IOPump]:
        """
        Connect a L{DataPlaneClientProtocol} (from the address C{host=} if
        given); returns it and the pump.
        """
        host = options.pop("host", None)
        protocol = DataPlaneClientProtocol(self.clock, **options)
        address = None if host is None else IPv4Address("TCP", host, 40001)
        _server, pump = self._connect(client_tls_factory(protocol, creator, self.clock), address)
        return protocol, pump

    def agent(self, tenant: str = "tenant-a", agent: str = "agent-1") -> Any:
        """Client TLS options for a good agent."""
        return self.pki.agent(tenant, agent).client_options()
