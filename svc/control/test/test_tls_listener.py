"""
Tests for L{svc.control.tls_listener}: the serving certificate (issued or the
operator's files), and the listener that asks for, but does not require, a
client certificate, over real loopback handshakes.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from twisted.internet import reactor as global_reactor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import SSL4ClientEndpoint, connectProtocol
from twisted.internet.protocol import Protocol, connectionDone
from twisted.internet.ssl import CertificateOptions, TLSVersion
from twisted.logger import capturedLogs
from twisted.protocols.tls import TLSMemoryBIOFactory
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.resource import Resource
from twisted.web.server import Request, Site

from svc.config import ConfigError
from svc.control.tls_listener import (
    CERT_FILE_VARIABLE,
    KEY_FILE_VARIABLE,
    OptionalClientCertificateOptions,
    ServingCertificate,
    load_serving_certificate,
)
from svc.pki.issuance import issue_https_server_leaf
from svc.testing.pki import TestPKI, shared_test_pki

_reactor: Any = global_reactor


def https_serving(pki: TestPKI, fqdn: str = "localhost") -> ServingCertificate:
    """An issued-style serving certificate under the test org root."""
    cert, key = issue_https_server_leaf(pki.root, fqdn, pki.now)
    return ServingCertificate((cert,), key)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def operator_chain(
    fqdn: str = "localhost", key: Any = None
) -> tuple[x509.Certificate, x509.Certificate, Any]:
    """
    What an operator might get from a public CA: an ECDSA P-256 CA and a
    leaf for C{fqdn} it signed with SHA-256; the CA, the leaf and its key.
    """
    now = datetime.now(UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("Operator Test CA"))
        .issuer_name(_name("Operator Test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(hours=1))
        .not_valid_after(now + timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = key or ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(_name(fqdn))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(hours=1))
        .not_valid_after(now + timedelta(days=10))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(fqdn)]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return ca, leaf, key


def pem(*certificates: x509.Certificate) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certificates)


def key_pem(key: Any, password: bytes | None = None) -> bytes:
    encryption: Any = (
        serialization.NoEncryption()
        if password is None
        else serialization.BestAvailableEncryption(password)
    )
    data: bytes = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
    )
    return data


class ServingCertificateTests(SynchronousTestCase):
    """The value and the operator's files."""

    def files(self, cert: bytes, key: bytes) -> tuple[Path, Path]:
        directory = Path(self.mktemp())
        directory.mkdir()
        (directory / "cert.pem").write_bytes(cert)
        (directory / "key.pem").write_bytes(key)
        return directory / "cert.pem", directory / "key.pem"

    def refused(self, cert: bytes, key: bytes) -> ConfigError:
        error: ConfigError = self.assertRaises(
            ConfigError, load_serving_certificate, *self.files(cert, key)
        )
        return error

    def test_key_must_match(self) -> None:
        """A key that is not the leaf's is refused."""
        serving = https_serving(shared_test_pki())
        other = ec.generate_private_key(ec.SECP256R1())
        self.assertRaises(ValueError, ServingCertificate, serving.chain, other)
        self.assertRaises(ValueError, ServingCertificate, (), serving.key)

    def test_renew_at_two_thirds(self) -> None:
        """An issued certificate is renewed once two thirds of its life have passed."""
        serving = https_serving(shared_test_pki())
        start, end = serving.leaf.not_valid_before_utc, serving.leaf.not_valid_after_utc
        self.assertEqual(serving.renew_at, start + (end - start) * 2 / 3)

    def test_operator_chain_loaded(self) -> None:
        """The chain (leaf first, intermediates after) and key of the operator's files."""
        ca, leaf, key = operator_chain()
        serving = load_serving_certificate(*self.files(pem(leaf, ca), key_pem(key)))
        self.assertEqual(serving.chain, (leaf, ca))
        self.assertEqual(serving.leaf, leaf)

    def test_unreadable_files(self) -> None:
        """A missing file names its variable."""
        _ca, leaf, key = operator_chain()
        cert_file, key_file = self.files(pem(leaf), key_pem(key))
        missing = cert_file.parent / "missing.pem"
        error = self.assertRaises(ConfigError, load_serving_certificate, missing, key_file)
        self.assertEqual(error.variable, CERT_FILE_VARIABLE)
        error = self.assertRaises(ConfigError, load_serving_certificate, cert_file, missing)
        self.assertEqual(error.variable, KEY_FILE_VARIABLE)

    def test_malformed_files(self) -> None:
        """No certificate, no key, an encrypted key or a short RSA key: refused, named."""
        _ca, leaf, key = operator_chain()
        self.assertEqual(self.refused(b"nothing", key_pem(key)).variable, CERT_FILE_VARIABLE)
        self.assertEqual(self.refused(pem(leaf), b"nothing").variable, KEY_FILE_VARIABLE)
        encrypted = self.refused(pem(leaf), key_pem(key, b"secret"))
        self.assertIn("encrypted", str(encrypted))
        small = rsa.generate_private_key(public_exponent=65537, key_size=1024)
        self.assertIn("2048", str(self.refused(pem(leaf), key_pem(small))))

    def test_mismatched_files(self) -> None:
        """A key file that does not belong to the certificate file is refused."""
        _ca, leaf, _ = operator_chain()
        error = self.refused(pem(leaf), key_pem(ec.generate_private_key(ec.SECP256R1())))
        self.assertEqual(error.variable, KEY_FILE_VARIABLE)
        self.assertIn("does not belong", str(error))

    def test_ed25519_warned(self) -> None:
        """An Ed25519 operator key is served, with a warning that browsers refuse it."""
        _ca, leaf, key = operator_chain(key=ed25519.Ed25519PrivateKey.generate())
        with capturedLogs() as events:
            load_serving_certificate(*self.files(pem(leaf), key_pem(key)))
        self.assertTrue(any("browsers refuse" in e.get("log_format", "") for e in events))


async def tls_get(port: int, client_options: Any) -> tuple[bytes, Any]:
    """
    C{GET /} over TLS to loopback C{port}: the raw answer, and the server
    certificate the client saw (L{None} if the handshake failed).
    """
    endpoint = SSL4ClientEndpoint(_reactor, "127.0.0.1", port, client_options)
    done: Deferred[bytes] = Deferred()
    received: list[bytes] = []
    seen: list[Any] = []

    class Client(Protocol):
        def connectionMade(self) -> None:
            transport: Any = self.transport
            transport.write(b"GET /healthz HTTP/1.0\r\nHost: x\r\n\r\n")

        def dataReceived(self, data: bytes) -> None:
            if not seen:
                handle: Any = self.transport.getHandle()  # type: ignore[union-attr]
                seen.append(handle.get_peer_certificate(as_cryptography=True))
            received.append(data)

        def connectionLost(self, reason: Failure = connectionDone) -> None:
            done.callback(b"".join(received))

    await connectProtocol(endpoint, Client())
    return await done, (seen[0] if seen else None)


class _PeerRecorder(Resource):
    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.peers: list[Any] = []

    def render(self, request: Request) -> bytes:
        handle = request.transport.getHandle()  # type: ignore[union-attr]
        self.peers.append(handle.get_peer_certificate(as_cryptography=True))
        return b"ok"


class OptionalClientCertificateTests(TestCase):
    """The TLS listener asks for, but does not require, a client certificate."""

    def setUp(self) -> None:
        self.pki: TestPKI = shared_test_pki()
        self.recorder = _PeerRecorder()
        self.serving = https_serving(self.pki)
        self.options = OptionalClientCertificateOptions(self.serving, self.pki.root.cert)
        site: Any = Site(self.recorder)
        factory = TLSMemoryBIOFactory(self.options, False, site)  # type: ignore[arg-type]
        port = _reactor.listenTCP(0, factory, interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        self.port = port.getHost().port

    async def get(self, client_options: Any) -> tuple[bytes, Any]:
        return await tls_get(self.port, client_options)

    async def test_with_agent_certificate(self) -> None:
        """An agent's leaf (with its intermediate) is seen by the application."""
        agent = self.pki.agent("tenant-a", "agent-1")
        settings: dict[str, Any] = {
            "privateKey": agent.leaf.key,
            "certificate": agent.leaf.cert,
            "extraCertChain": list(agent.chain),
            "trustRoot": self.pki.trust_root(),
            "raiseMinimumTo": TLSVersion.TLSv1_3,
        }
        answer, server = await self.get(CertificateOptions(**settings))
        self.assertTrue(answer.endswith(b"ok"))
        self.assertEqual(self.recorder.peers, [agent.leaf.cert])
        self.assertEqual(server, self.serving.leaf)

    async def test_without_certificate(self) -> None:
        """A client with no certificate is served too, and sees the ECDSA P-256 leaf."""
        answer, server = await self.get(CertificateOptions(trustRoot=self.pki.trust_root()))
        self.assertTrue(answer.endswith(b"ok"))
        self.assertEqual(self.recorder.peers, [None])
        self.assertIsInstance(server.public_key(), ec.EllipticCurvePublicKey)

    async def test_foreign_certificate_refused(self) -> None:
        """A client certificate from another org's root fails the handshake."""
        agent = self.pki.foreign_agent("tenant-a", "agent-1")
        settings: dict[str, Any] = {
            "privateKey": agent.leaf.key,
            "certificate": agent.leaf.cert,
            "extraCertChain": list(agent.chain),
            "trustRoot": self.pki.trust_root(),
        }
        answer, _ = await self.get(CertificateOptions(**settings))
        self.assertEqual(answer, b"")
        self.assertEqual(self.recorder.peers, [])

    async def test_operator_chain_served(self) -> None:
        """With the operator's chain the listener sends it (leaf and CA), still asking agents."""
        ca, leaf, key = operator_chain()
        self.options.replace(ServingCertificate((leaf, ca), key))
        answer, server = await self.get(CertificateOptions())
        self.assertTrue(answer.endswith(b"ok"))
        self.assertEqual(server, leaf)


class CertificateRotationTests(SynchronousTestCase):
    """The TLS listener's certificate can be replaced for new connections."""

    def test_replace(self) -> None:
        """replace() swaps the serving certificate and the context."""
        pki = shared_test_pki()
        options = OptionalClientCertificateOptions(https_serving(pki), pki.root.cert)
        first = options.getContext()
        self.assertIs(options.getContext(), first)
        other = https_serving(pki, "other.test")
        options.replace(other)
        self.assertIs(options.serving, other)
        self.assertIsNot(options.getContext(), first)
