"""
Tests for L{svc.pki.issuance}: every field of the certificates the org root
signs directly (server leaf, server CSR, control-plane certificate).
"""

from __future__ import annotations

from datetime import timedelta

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
)
from cryptography.x509.oid import (
    ExtendedKeyUsageOID,
    NameOID,
)

from svc.pki.errors import InvalidName, IssuanceError
from svc.pki.issuance import (
    CertifiedKey,
    issue_server_leaf,
    sign_server_csr,
)
from svc.pki.test.profiles import (
    END_ENTITY_EXTENSIONS,
    NOW,
    TD,
    ProfileAssertions,
    material,
)


class ServerLeafTests(ProfileAssertions):
    """
    The data-plane server leaf profile.
    """

    def test_names(self) -> None:
        """CN and the only SAN are the lower-cased FQDN; no URI SAN."""
        cert = material().server.cert
        self.assertEqual(
            cert.subject,
            x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dataplane.example.org")]),
        )
        self.assertSans(cert, [x509.DNSName("dataplane.example.org")])

    def test_usage(self) -> None:
        """KeyUsage digitalSignature + keyEncipherment; EKU serverAuth; not a CA."""
        cert = material().server.cert
        self.assertUsage(cert, {"digital_signature", "key_encipherment"})
        self.assertPurpose(cert, ExtendedKeyUsageOID.SERVER_AUTH)
        self.assertBasics(cert, ca=False, path_length=None)

    def test_signed_by_root_directly(self) -> None:
        """The server leaf is signed by the org root itself."""
        m = material()
        self.assertLinked(m.server.cert, m.root.cert)
        self.assertEd25519(m.server)
        self.assertExtensions(m.server.cert, END_ENTITY_EXTENSIONS)

    def test_validity(self) -> None:
        """Default validity is 90 days; a given ttl is honoured."""
        self.assertValidity(material().server.cert, timedelta(days=90))
        short = issue_server_leaf(material().root, "h.example", NOW, ttl=timedelta(days=7))
        self.assertValidity(short.cert, timedelta(days=7))

    def test_intermediate_cannot_sign_servers(self) -> None:
        """A tenant intermediate cannot issue a server leaf."""
        self.assertRaises(
            IssuanceError, issue_server_leaf, material().intermediate, "h.example", NOW
        )

    def test_bad_fqdn(self) -> None:
        """Names that are not DNS host names (or too long for a CN) are refused."""
        for bad in ("", "a..b", "-a.b", "a_b.c", "x" * 65, "h/x", "1.2.3.4/8"):
            self.assertRaises(InvalidName, issue_server_leaf, material().root, bad, NOW)


class ServerCsrTests(ProfileAssertions):
    """
    Signing a data-plane server's CSR.
    """

    def csr(
        self, key: Ed25519PrivateKey | ec.EllipticCurvePrivateKey
    ) -> x509.CertificateSigningRequest:
        builder = (
            x509.CertificateSigningRequestBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "evil")]))
            .add_extension(
                x509.SubjectAlternativeName(
                    [
                        x509.DNSName("evil.example"),
                        x509.UniformResourceIdentifier(f"spiffe://{TD}/control"),
                    ]
                ),
                critical=False,
            )
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        )
        algorithm = None if isinstance(key, Ed25519PrivateKey) else hashes.SHA256()
        return builder.sign(key, algorithm)

    def test_profile_forced(self) -> None:
        """The signed cert has the server profile and the CSR's key, and no CSR extension."""
        key = Ed25519PrivateKey.generate()
        cert = sign_server_csr(material().root, self.csr(key), "dp.example.org", NOW)
        pair = CertifiedKey(cert, key)
        self.assertEd25519(pair)
        self.assertEqual(
            cert.subject, x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dp.example.org")])
        )
        self.assertSans(cert, [x509.DNSName("dp.example.org")])
        self.assertBasics(cert, ca=False, path_length=None)
        self.assertPurpose(cert, ExtendedKeyUsageOID.SERVER_AUTH)
        self.assertUsage(cert, {"digital_signature", "key_encipherment"})
        self.assertLinked(cert, material().root.cert)
        self.assertValidity(cert, timedelta(days=90))
        self.assertExtensions(cert, END_ENTITY_EXTENSIONS)

    def test_bad_signature(self) -> None:
        """A CSR whose self-signature does not verify is refused."""
        der = bytearray(
            self.csr(Ed25519PrivateKey.generate()).public_bytes(serialization.Encoding.DER)
        )
        der[-1] ^= 0x01
        tampered = x509.load_der_x509_csr(bytes(der))
        self.assertRaises(
            IssuanceError, sign_server_csr, material().root, tampered, "dp.example.org", NOW
        )

    def test_not_ed25519(self) -> None:
        """A CSR for a non-ed25519 key is refused."""
        csr = self.csr(ec.generate_private_key(ec.SECP256R1()))
        self.assertRaises(
            IssuanceError, sign_server_csr, material().root, csr, "dp.example.org", NOW
        )


class ControlCertTests(ProfileAssertions):
    """
    The control-plane certificate profile.
    """

    def test_names(self) -> None:
        """CN is svc-control and the only SAN is spiffe://<td>/control."""
        cert = material().control.cert
        self.assertEqual(
            cert.subject, x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "svc-control")])
        )
        self.assertSans(cert, [x509.UniformResourceIdentifier(f"spiffe://{TD}/control")])

    def test_usage(self) -> None:
        """KeyUsage digitalSignature; EKU clientAuth; not a CA."""
        cert = material().control.cert
        self.assertUsage(cert, {"digital_signature"})
        self.assertPurpose(cert, ExtendedKeyUsageOID.CLIENT_AUTH)
        self.assertBasics(cert, ca=False, path_length=None)

    def test_signed_by_root_30_days(self) -> None:
        """Signed by the org root, ed25519, valid 30 days."""
        m = material()
        self.assertLinked(m.control.cert, m.root.cert)
        self.assertEd25519(m.control)
        self.assertValidity(m.control.cert, timedelta(days=30))
        self.assertExtensions(m.control.cert, END_ENTITY_EXTENSIONS)
