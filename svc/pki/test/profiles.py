"""
Shared material and field assertions for the certificate-profile tests.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta

import attrs
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.x509.oid import (
    ExtensionOID,
    SignatureAlgorithmOID,
)
from twisted.trial.unittest import SynchronousTestCase

from svc.pki.issuance import (
    CertifiedKey,
    issue_agent_leaf,
    issue_control_cert,
    issue_org_root,
    issue_server_leaf,
    issue_tenant_intermediate,
)

NOW = datetime(2031, 3, 4, 5, 6, 7, tzinfo=UTC)
TD = "example.org"
FIVE_MINUTES = timedelta(minutes=5)

CA_USAGE = {"key_cert_sign", "crl_sign"}
ALL_USAGE = (
    "digital_signature",
    "content_commitment",
    "key_encipherment",
    "data_encipherment",
    "key_agreement",
    "key_cert_sign",
    "crl_sign",
)


@attrs.frozen
class Material:
    root: CertifiedKey
    intermediate: CertifiedKey
    other_intermediate: CertifiedKey
    leaf: CertifiedKey
    server: CertifiedKey
    control: CertifiedKey


@functools.cache
def material() -> Material:
    root = issue_org_root("Acme", NOW)
    intermediate = issue_tenant_intermediate(root, "t-1", TD, NOW)
    return Material(
        root=root,
        intermediate=intermediate,
        other_intermediate=issue_tenant_intermediate(root, "t-2", TD, NOW),
        leaf=issue_agent_leaf(
            intermediate,
            tenant_id="t-1",
            agent_id="agent.7",
            user_id="alice",
            trust_domain=TD,
            now=NOW,
        ),
        server=issue_server_leaf(root, "DataPlane.Example.org", NOW),
        control=issue_control_cert(root, TD, NOW),
    )


def ext(cert: x509.Certificate, oid: x509.ObjectIdentifier) -> x509.Extension[x509.ExtensionType]:
    return cert.extensions.get_extension_for_oid(oid)


class ProfileAssertions(SynchronousTestCase):
    """
    Shared checks for one certificate's fields (a base class without tests).
    """

    def assertUsage(self, cert: x509.Certificate, expected: set[str]) -> None:
        extension = ext(cert, ExtensionOID.KEY_USAGE)
        self.assertTrue(extension.critical)
        usage = extension.value
        assert isinstance(usage, x509.KeyUsage)
        got = {name for name in ALL_USAGE if getattr(usage, name)}
        self.assertEqual(got, expected)

    def assertBasics(self, cert: x509.Certificate, *, ca: bool, path_length: int | None) -> None:
        extension = ext(cert, ExtensionOID.BASIC_CONSTRAINTS)
        self.assertTrue(extension.critical)
        self.assertEqual(extension.value, x509.BasicConstraints(ca=ca, path_length=path_length))

    def assertValidity(self, cert: x509.Certificate, ttl: timedelta) -> None:
        self.assertEqual(cert.not_valid_before_utc, NOW - FIVE_MINUTES)
        self.assertEqual(cert.not_valid_after_utc, NOW + ttl)

    def assertEd25519(self, pair: CertifiedKey) -> None:
        self.assertIsInstance(pair.cert.public_key(), Ed25519PublicKey)
        self.assertIsInstance(pair.key, Ed25519PrivateKey)
        self.assertEqual(pair.cert.signature_algorithm_oid, SignatureAlgorithmOID.ED25519)
        self.assertEqual(pair.cert.version, x509.Version.v3)

    def assertLinked(self, cert: x509.Certificate, issuer: x509.Certificate) -> None:
        cert.verify_directly_issued_by(issuer)
        self.assertEqual(cert.issuer, issuer.subject)
        aki = ext(cert, ExtensionOID.AUTHORITY_KEY_IDENTIFIER)
        self.assertFalse(aki.critical)
        issuer_ski = ext(issuer, ExtensionOID.SUBJECT_KEY_IDENTIFIER).value
        assert isinstance(issuer_ski, x509.SubjectKeyIdentifier)
        assert isinstance(aki.value, x509.AuthorityKeyIdentifier)
        self.assertEqual(aki.value.key_identifier, issuer_ski.digest)

    def assertSki(self, cert: x509.Certificate) -> None:
        ski = ext(cert, ExtensionOID.SUBJECT_KEY_IDENTIFIER)
        self.assertFalse(ski.critical)
        public = cert.public_key()
        assert isinstance(public, Ed25519PublicKey)
        self.assertEqual(ski.value, x509.SubjectKeyIdentifier.from_public_key(public))

    def assertExtensions(self, cert: x509.Certificate, oids: set[x509.ObjectIdentifier]) -> None:
        self.assertEqual({e.oid for e in cert.extensions}, oids)

    def assertPurpose(self, cert: x509.Certificate, purpose: x509.ObjectIdentifier) -> None:
        extension = ext(cert, ExtensionOID.EXTENDED_KEY_USAGE)
        self.assertFalse(extension.critical)
        assert isinstance(extension.value, x509.ExtendedKeyUsage)
        self.assertEqual(list(extension.value), [purpose])

    def assertSans(self, cert: x509.Certificate, names: list[x509.GeneralName]) -> None:
        extension = ext(cert, ExtensionOID.SUBJECT_ALTERNATIVE_NAME)
        self.assertFalse(extension.critical)
        assert isinstance(extension.value, x509.SubjectAlternativeName)
        self.assertEqual(list(extension.value), names)


END_ENTITY_EXTENSIONS = {
    ExtensionOID.BASIC_CONSTRAINTS,
    ExtensionOID.KEY_USAGE,
    ExtensionOID.EXTENDED_KEY_USAGE,
    ExtensionOID.SUBJECT_ALTERNATIVE_NAME,
    ExtensionOID.SUBJECT_KEY_IDENTIFIER,
    ExtensionOID.AUTHORITY_KEY_IDENTIFIER,
}
