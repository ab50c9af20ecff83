"""
Real TLS 1.3 handshakes in memory (L{twisted.test.iosim}) between the
data-plane options of L{svc.pki.tls}: a tiny server runs the post-handshake
admission and writes C{admitted} only on success; the client counts as
admitted only once it has read that line.
"""

from __future__ import annotations

from typing import Any, cast

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from twisted.internet.interfaces import IHandshakeListener, IOpenSSLClientConnectionCreator
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.ssl import CertificateOptions, TLSVersion, optionsForClientTLS
from twisted.internet.task import Clock
from twisted.protocols.tls import TLSMemoryBIOFactory
from twisted.python.failure import Failure
from twisted.test.iosim import connectedServerAndClient
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer  # type: ignore[import-untyped]

from svc.pki.errors import AdmissionRefused, RefusalReason
from svc.pki.identity import AgentIdentity, DenyList
from svc.pki.issuance import CertifiedKey
from svc.pki.names import format_serial
from svc.pki.tls import admit_tls_connection
from svc.testing.pki import SERVER_NAME, AgentCredentials, forge_leaf, shared_test_pki

GREETING = b"admitted\n"


@implementer(IHandshakeListener)
class AdmittingServer(Protocol):
    """
    Runs admission when the handshake completes; greets only admitted peers
    and drops the others without a byte.
    """

    def __init__(self, deny_list: DenyList) -> None:
        self.deny_list = deny_list
        self.identity: AgentIdentity | None = None
        self.refusal: AdmissionRefused | None = None
        self.lost = False

    def handshakeCompleted(self) -> None:
        pki = shared_test_pki()
        transport: Any = self.transport
        try:
            self.identity = admit_tls_connection(
                transport.getHandle(), pki.root.cert, pki.trust_domain, self.deny_list
            )
        except AdmissionRefused as refusal:
            self.refusal = refusal
            transport.abortConnection()
            return
        transport.write(GREETING)

    def connectionLost(self, reason: Failure | None = None) -> None:
        self.lost = True


@implementer(IHandshakeListener)
class WaitingClient(Protocol):
    """
    Treats the session as admitted only after reading the server's greeting.
    """

    def __init__(self) -> None:
        self.handshook = False
        self.received = b""
        self.lost = False

    def handshakeCompleted(self) -> None:
        self.handshook = True

    def dataReceived(self, data: bytes) -> None:
        self.received += data

    def connectionLost(self, reason: Failure | None = None) -> None:
        self.lost = True

    @property
    def admitted(self) -> bool:
        return self.received.startswith(GREETING)


def handshake(
    client_creator: IOpenSSLClientConnectionCreator,
    server_options: CertificateOptions | None = None,
    deny_list: DenyList | None = None,
    server_class: type[AdmittingServer] = AdmittingServer,
) -> tuple[AdmittingServer, WaitingClient]:
    """
    Connect a L{WaitingClient} to an admitting server through TLS over an
    in-memory pump, and pump until nothing moves.
    """
    clock = Clock()
    server = server_class(deny_list or DenyList())
    client = WaitingClient()
    # Without the mypy-zope plugin mypy cannot see that these provide the
    # interfaces TLSMemoryBIOFactory's annotations name.
    server_factory = TLSMemoryBIOFactory(
        cast(Any, server_options or shared_test_pki().server_options()),
        isClient=False,
        wrappedFactory=cast(Any, Factory.forProtocol(lambda: server)),
        clock=cast(Any, clock),
    )
    client_factory = TLSMemoryBIOFactory(
        client_creator,
        isClient=True,
        wrappedFactory=cast(Any, Factory.forProtocol(lambda: client)),
        clock=cast(Any, clock),
    )
    _c, _s, pump = connectedServerAndClient(
        lambda: server_factory.buildProtocol(None),
        lambda: client_factory.buildProtocol(None),
        greet=False,
        clock=clock,
    )
    pump.flush()
    assert not clock.getDelayedCalls(), clock.getDelayedCalls()
    return server, client


class HandshakeTests(SynchronousTestCase):
    """
    Mutual TLS 1.3 between the server and client options, with admission.
    """

    def assertDropped(
        self,
        server: AdmittingServer,
        client: WaitingClient,
        reason: RefusalReason | None = None,
    ) -> None:
        """
        The client got no byte and lost the connection; the server admitted
        nobody and (if C{reason}) refused for that reason after the handshake.
        """
        self.assertEqual(client.received, b"")
        self.assertFalse(client.admitted)
        self.assertTrue(client.lost)
        self.assertIsNone(server.identity)
        if reason is None:
            self.assertIsNone(server.refusal)
        else:
            assert server.refusal is not None
            self.assertEqual(server.refusal.reason, reason)

    def test_good_agent_admitted(self) -> None:
        """A good agent is admitted; identity comes from its cert; it reads the greeting."""
        creds = shared_test_pki().agent("tenant-a", "agent-1", "alice")
        server, client = handshake(creds.client_options())
        self.assertTrue(client.admitted)
        self.assertFalse(client.lost)
        assert server.identity is not None
        self.assertEqual(
            (server.identity.tenant_id, server.identity.agent_id, server.identity.user_id),
            ("tenant-a", "agent-1", "alice"),
        )
        self.assertEqual(server.identity.serial, format_serial(creds.leaf.cert.serial_number))

    def test_tls13_negotiated(self) -> None:
        """The negotiated protocol is TLS 1.3."""
        creds = shared_test_pki().agent("tenant-a", "agent-1")
        versions: list[str] = []

        class Recording(AdmittingServer):
            def handshakeCompleted(self) -> None:
                transport: Any = self.transport
                versions.append(transport.getHandle().get_protocol_version_name())
                super().handshakeCompleted()

        handshake(creds.client_options(), server_class=Recording)
        self.assertEqual(versions, ["TLSv1.3"])

    def test_foreign_root_agent(self) -> None:
        """A leaf from another org's root fails the handshake; nothing is sent."""
        creds = shared_test_pki().foreign_agent("tenant-a", "agent-1")
        server, client = handshake(creds.client_options())
        self.assertDropped(server, client)

    def test_tenant_only_cert(self) -> None:
        """A tenant-only cert completes TLS (even client-side) but is dropped at admission."""
        creds = shared_test_pki().tenant_only_agent("tenant-a")
        server, client = handshake(creds.client_options())
        self.assertTrue(client.handshook)
        self.assertDropped(server, client, RefusalReason.NO_AGENT_SAN)

    def test_other_tenant_intermediate(self) -> None:
        """A leaf for tenant A under tenant B's intermediate is dropped (tenant binding)."""
        creds = shared_test_pki().cross_tenant_agent("tenant-a", "agent-1", "tenant-b")
        server, client = handshake(creds.client_options())
        self.assertDropped(server, client, RefusalReason.TENANT_BINDING)

    def test_denied_serial(self) -> None:
        """A deny-listed serial is dropped after the handshake."""
        creds = shared_test_pki().agent("tenant-a", "agent-1")
        cert = creds.leaf.cert
        deny = DenyList.of([(format_serial(cert.serial_number), cert.not_valid_after_utc)])
        server, client = handshake(creds.client_options(), deny_list=deny)
        self.assertDropped(server, client, RefusalReason.DENIED_SERIAL)

    def test_expired_leaf(self) -> None:
        """An expired leaf fails the handshake."""
        creds = shared_test_pki().expired_agent("tenant-a", "agent-1")
        server, client = handshake(creds.client_options())
        self.assertDropped(server, client)

    def test_name_constraint_violation(self) -> None:
        """A leaf with SANs outside the intermediate's trust domain fails the handshake."""
        creds = shared_test_pki().wrong_domain_agent("tenant-a", "agent-1", "other.test")
        server, client = handshake(creds.client_options())
        self.assertDropped(server, client)

    def test_server_purpose_leaf(self) -> None:
        """A client leaf whose EKU is serverAuth only fails the handshake itself."""
        pki = shared_test_pki()
        td = pki.trust_domain
        creds = pki.forged_agent(
            "tenant-a",
            uris=[f"spiffe://{td}/tenant/tenant-a", f"spiffe://{td}/agent/agent-1"],
            ou="tenant=tenant-a",
            purpose=ExtendedKeyUsageOID.SERVER_AUTH,
        )
        server, client = handshake(creds.client_options())
        self.assertDropped(server, client)

    def test_no_client_cert(self) -> None:
        """A client presenting no certificate fails the handshake."""
        creator = optionsForClientTLS(
            SERVER_NAME,
            trustRoot=shared_test_pki().trust_root(),
            extraCertificateOptions={"raiseMinimumTo": TLSVersion.TLSv1_3},
        )
        server, client = handshake(creator)
        self.assertDropped(server, client)

    def test_tls12_client(self) -> None:
        """A good agent limited to TLS 1.2 fails the handshake."""
        creds = shared_test_pki().agent("tenant-a", "agent-1")
        creator = optionsForClientTLS(
            SERVER_NAME,
            trustRoot=shared_test_pki().trust_root(),
            extraCertificateOptions={
                "privateKey": creds.leaf.key,
                "certificate": creds.leaf.cert,
                "extraCertChain": list(creds.chain),
                "lowerMaximumSecurityTo": TLSVersion.TLSv1_2,
            },
        )
        server, client = handshake(creator)
        self.assertFalse(client.handshook)
        self.assertDropped(server, client)


class ServerAuthenticationTests(SynchronousTestCase):
    """
    The client's checks on the server.
    """

    def connect_to(self, server_pair: CertifiedKey) -> tuple[AdmittingServer, WaitingClient]:
        creds: AgentCredentials = shared_test_pki().agent("tenant-a", "agent-1")
        options = shared_test_pki().server_options(server_pair)
        return handshake(creds.client_options(), options)

    def assertRejected(self, server: AdmittingServer, client: WaitingClient) -> None:
        self.assertFalse(client.handshook)
        self.assertFalse(client.admitted)
        self.assertTrue(client.lost)
        self.assertIsNone(server.identity)

    def test_real_server_accepted(self) -> None:
        """The control case: the real server leaf is accepted."""
        server, client = self.connect_to(shared_test_pki().server)
        self.assertTrue(client.admitted)
        self.assertIsNotNone(server.identity)

    def test_foreign_root_server(self) -> None:
        """A server leaf from another org's root is rejected by the client."""
        server, client = self.connect_to(shared_test_pki().foreign_server())
        self.assertRejected(server, client)

    def test_wrong_hostname(self) -> None:
        """A server leaf from the right root for another host name is rejected."""
        server, client = self.connect_to(shared_test_pki().server_leaf("elsewhere.test"))
        self.assertRejected(server, client)

    def test_server_under_tenant_intermediate(self) -> None:
        """A server leaf minted by a tenant intermediate is rejected (root-only depth)."""
        pki = shared_test_pki()
        intermediate = pki.intermediates["tenant-a"]
        forged = forge_leaf(
            intermediate,
            pki.now,
            uris=[],
            common_name=SERVER_NAME,
            ou=None,
            purpose=ExtendedKeyUsageOID.SERVER_AUTH,
            extra_sans=[x509.DNSName(SERVER_NAME)],
        )
        settings: dict[str, Any] = {
            "privateKey": forged.key,
            "certificate": forged.cert,
            "extraCertChain": [intermediate.cert],
            "trustRoot": pki.trust_root(),
            "raiseMinimumTo": TLSVersion.TLSv1_3,
        }
        rogue_options = CertificateOptions(**settings)
        creds = pki.agent("tenant-a", "agent-1")
        server, client = handshake(creds.client_options(), rogue_options)
        self.assertRejected(server, client)
