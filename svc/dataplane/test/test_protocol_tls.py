"""
The data-plane server behind real TLS 1.3 (in memory, L{twisted.test.iosim}):
admission before the first frame, deny-list and server-certificate updates,
isolation between connections, graceful stop.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.interfaces import IOpenSSLClientConnectionCreator
from twisted.internet.ssl import TLSVersion, optionsForClientTLS
from twisted.internet.testing import MemoryReactorClock
from twisted.logger import capturedLogs
from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane.admission import AdmittedAgent
from svc.dataplane.factory import DataPlaneListenerService, ServerLimits
from svc.dataplane.interfaces import OpReply
from svc.dataplane.protocol import DataPlaneServerProtocol
from svc.dataplane.test.fakes import RawFrameClient, TLSHarness
from svc.dataplane_client.errors import AdmissionFailed
from svc.pki.names import format_serial
from svc.testing.pki import SERVER_NAME, shared_test_pki
from svc.wire.control import read_goaway
from svc.wire.frame import Frame, FrameType


def echo(request_id: int, **payload: object) -> Frame:
    """An C{echo} REQUEST."""
    return Frame(FrameType.REQUEST, request_id, {**payload, "op": "echo"})


def hold(request_id: int) -> Frame:
    """A C{hold} REQUEST."""
    return Frame(FrameType.REQUEST, request_id, {"op": "hold"})


def peer_serial(raw: RawFrameClient) -> int:
    """The serial of the server certificate a raw client's TLS session saw."""
    transport: Any = raw.transport
    return int(transport.getPeerCertificate().get_serial_number())


def tls12_only_agent() -> IOpenSSLClientConnectionCreator:
    """A good agent's credentials on a client limited to TLS 1.2."""
    pki = shared_test_pki()
    creds = pki.agent("tenant-a", "agent-1")
    return optionsForClientTLS(
        SERVER_NAME,
        trustRoot=pki.trust_root(),
        extraCertificateOptions={
            "privateKey": creds.leaf.key,
            "certificate": creds.leaf.cert,
            "extraCertChain": list(creds.chain),
            "lowerMaximumSecurityTo": TLSVersion.TLSv1_2,
        },
    )


def no_cert_client() -> IOpenSSLClientConnectionCreator:
    """A TLS 1.3 client that trusts the root but presents no certificate."""
    return optionsForClientTLS(
        SERVER_NAME,
        trustRoot=shared_test_pki().trust_root(),
        extraCertificateOptions={"raiseMinimumTo": TLSVersion.TLSv1_3},
    )


class AdmissionOverTLSTests(SynchronousTestCase):
    """
    Only admitted agents get a frame; HELLO is always the first.
    """

    def test_good_agent_gets_hello_first(self) -> None:
        """A good agent's first frame is HELLO; its identity comes from its certificate."""
        harness = TLSHarness()
        raw, server, pump = harness.connect_raw(harness.agent("tenant-a", "agent-7"))
        self.assertEqual([f.type for f in raw.frames], [FrameType.HELLO])
        [handler] = harness.service.handlers
        self.assertEqual(
            (handler.identity.tenant_id, handler.identity.agent_id), ("tenant-a", "agent-7")
        )
        self.assertEqual(server.connection_id, "conn-1")
        raw.send(echo(1, value="hi"))
        pump.flush()
        self.assertEqual(raw.frames[-1].payload, {"value": "hi"})
        self.assertEqual(harness.factory.active_connections, 1)

    def test_identity_names_the_intermediate(self) -> None:
        """The admitted identity names the verified chain's intermediate, for later checks."""
        harness = TLSHarness()
        creds = harness.pki.agent("tenant-a", "agent-7")
        harness.connect_raw(creds.client_options())
        [handler] = harness.service.handlers
        identity = handler.identity
        assert isinstance(identity, AdmittedAgent)
        [intermediate] = creds.chain
        self.assertEqual(
            (identity.serial, identity.intermediate_serial, identity.intermediate_not_after),
            (
                format_serial(creds.leaf.cert.serial_number),
                format_serial(intermediate.serial_number),
                intermediate.not_valid_after_utc,
            ),
        )

    def assertRefused(self, creator: IOpenSSLClientConnectionCreator, harness: TLSHarness) -> None:
        """The peer gets no byte at all, is dropped, and the real client reports it."""
        handlers = len(harness.service.handlers)
        active = harness.factory.active_connections
        raw, _server, _pump = harness.connect_raw(creator)
        self.assertEqual(raw.received, b"")
        self.assertIsNotNone(raw.lost)
        client, _pump = harness.connect_client(creator)
        self.failureResultOf(client.when_ready(), AdmissionFailed)
        self.assertEqual(len(harness.service.handlers), handlers)
        self.assertEqual(harness.factory.active_connections, active)

    def test_foreign_root(self) -> None:
        """An agent chain from another org's root is dropped before any frame."""
        harness = TLSHarness()
        self.assertRefused(
            harness.pki.foreign_agent("tenant-a", "agent-1").client_options(), harness
        )

    def test_tenant_only(self) -> None:
        """A tenant-only certificate is dropped before any frame."""
        harness = TLSHarness()
        self.assertRefused(harness.pki.tenant_only_agent("tenant-a").client_options(), harness)

    def test_cross_tenant(self) -> None:
        """A leaf under another tenant's intermediate is dropped before any frame."""
        harness = TLSHarness()
        creds = harness.pki.cross_tenant_agent("tenant-a", "agent-1", "tenant-b")
        self.assertRefused(creds.client_options(), harness)

    def test_wrong_trust_domain(self) -> None:
        """A leaf with SANs in another trust domain is dropped before any frame."""
        harness = TLSHarness()
        creds = harness.pki.wrong_domain_agent("tenant-a", "agent-1", "other.test")
        self.assertRefused(creds.client_options(), harness)

    def test_expired(self) -> None:
        """An expired leaf is dropped before any frame."""
        harness = TLSHarness()
        self.assertRefused(
            harness.pki.expired_agent("tenant-a", "agent-1").client_options(), harness
        )

    def test_no_client_certificate(self) -> None:
        """A client without a certificate is dropped before any frame."""
        self.assertRefused(no_cert_client(), TLSHarness())

    def test_tls12_client(self) -> None:
        """A client limited to TLS 1.2 is dropped before any frame."""
        self.assertRefused(tls12_only_agent(), TLSHarness())

    def test_deny_listed_serial(self) -> None:
        """A deny-listed serial is dropped; the current deny-list is read per connection."""
        harness = TLSHarness()
        creds = harness.pki.agent("tenant-a", "agent-1")
        old_raw, _server, old_pump = harness.connect_raw(creds.client_options())
        cert = creds.leaf.cert
        harness.deny_list = harness.deny_list.with_entry(
            format_serial(cert.serial_number), cert.not_valid_after_utc
        )
        self.assertRefused(creds.client_options(), harness)
        old_raw.send(echo(1))
        old_pump.flush()
        self.assertEqual(old_raw.frames[-1].type, FrameType.RESPONSE)


class ConnectionIsolationTests(SynchronousTestCase):
    """
    What one connection does never reaches another.
    """

    def test_garbage_drops_only_its_connection(self) -> None:
        """Garbage closes its own connection, logs no bug, and the other one carries on."""
        harness = TLSHarness()
        good, _s1, good_pump = harness.connect_raw(harness.agent())
        bad, _s2, bad_pump = harness.connect_raw(harness.agent())
        with capturedLogs() as events:
            bad.send_bytes(b"GET / HTTP/1.1\r\n\r\n")
            bad_pump.flush()
        self.assertEqual([e for e in events if "log_failure" in e], [])
        self.assertEqual(read_goaway(bad.frames[-1]).reason, "protocol_error")
        self.assertIsNotNone(bad.lost)
        good.send(echo(1))
        good_pump.flush()
        self.assertEqual(good.frames[-1].type, FrameType.RESPONSE)
        self.assertIsNone(good.lost)
        self.assertEqual([len(h.closed_reasons) for h in harness.service.handlers], [0, 1])
        self.assertEqual(harness.factory.active_connections, 1)


class CertificateSwapTests(SynchronousTestCase):
    """
    Renewing the server certificate without dropping connections.
    """

    def test_swap_affects_only_new_connections(self) -> None:
        """After swap, new connections see the new leaf; live ones keep theirs and work."""
        harness = TLSHarness()
        old_raw, _s, old_pump = harness.connect_raw(harness.agent())
        renewed = harness.pki.server_leaf(SERVER_NAME)
        harness.tls.swap(harness.pki.server_options(renewed))
        new_raw, _s2, _p2 = harness.connect_raw(harness.agent())
        self.assertEqual(peer_serial(new_raw), renewed.cert.serial_number)
        self.assertEqual(peer_serial(old_raw), harness.pki.server.cert.serial_number)
        old_raw.send(echo(1))
        old_pump.flush()
        self.assertEqual(old_raw.frames[-1].type, FrameType.RESPONSE)
        self.assertIsNone(old_raw.lost)


class GracefulStopTests(SynchronousTestCase):
    """
    L{DataPlaneFactory.stop_serving}.
    """

    def test_stop_waits_for_running_requests(self) -> None:
        """All get GOAWAY; stop fires once running requests are answered and all are closed."""
        harness = TLSHarness()
        busy, _s1, busy_pump = harness.connect_raw(harness.agent())
        idle, _s2, idle_pump = harness.connect_raw(harness.agent())
        busy.send(hold(1))
        busy_pump.flush()
        stopped = harness.factory.stop_serving()
        idle_pump.flush()
        busy_pump.flush()
        self.assertEqual(read_goaway(idle.frames[-1]).reason, "shutdown")
        self.assertIsNotNone(idle.lost)
        self.assertNoResult(stopped)
        self.assertEqual(harness.factory.active_connections, 1)
        harness.service.handlers[0].held[0].deferred.callback(OpReply({"done": True}))
        busy_pump.flush()
        self.assertEqual(
            [f.type for f in busy.frames], [FrameType.HELLO, FrameType.GOAWAY, FrameType.RESPONSE]
        )
        self.successResultOf(stopped)
        self.assertEqual(harness.factory.active_connections, 0)
        self.assertEqual([len(h.closed_reasons) for h in harness.service.handlers], [1, 1])
        self.assertEqual(harness.clock.getDelayedCalls(), [])

    def test_stop_is_bounded(self) -> None:
        """A request that never finishes gets ETIMEDOUT at the drain timeout; stop completes."""
        harness = TLSHarness(ServerLimits(drain_timeout=7))
        busy, _server, pump = harness.connect_raw(harness.agent())
        busy.send(hold(1))
        pump.flush()
        stopped = harness.factory.stop_serving()
        harness.clock.advance(7)
        pump.flush()
        self.successResultOf(stopped)
        self.assertEqual(busy.frames[-1].type, FrameType.ERROR)

    def test_admitted_while_stopping_goes_away(self) -> None:
        """A connection admitted after stop began gets HELLO then GOAWAY and closes."""
        harness = TLSHarness()
        harness.factory.stop_serving()
        raw, server, _pump = harness.connect_raw(harness.agent())
        self.assertEqual([f.type for f in raw.frames], [FrameType.HELLO, FrameType.GOAWAY])
        self.assertIsNotNone(raw.lost)
        self.assertIsInstance(server, DataPlaneServerProtocol)

    def test_listener_service(self) -> None:
        """The service listens behind TLS on start; stop stops listening, then connections."""
        harness = TLSHarness()
        reactor = MemoryReactorClock()
        service = DataPlaneListenerService(
            reactor, "tcp:4433:interface=127.0.0.1", harness.factory, harness.tls
        )
        service.startService()
        [(port, factory, _backlog, interface)] = reactor.tcpServers
        self.assertEqual((port, interface), (4433, "127.0.0.1"))
        self.assertIs(factory.wrappedFactory, harness.factory)
        self.assertFalse(harness.factory.stopping)
        self.successResultOf(service.stopService())
        self.assertTrue(harness.factory.stopping)
