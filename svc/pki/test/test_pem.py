"""
Tests for L{svc.pki.pem}: key encryption at rest and chain PEM handling.
"""

from __future__ import annotations

from datetime import UTC, datetime

from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)
from twisted.trial.unittest import SynchronousTestCase

from svc.pki.errors import KeyEncryptionError, PKIError
from svc.pki.issuance import issue_org_root, issue_tenant_intermediate
from svc.pki.pem import (
    cert_from_pem,
    certs_from_pem,
    certs_to_pem,
    key_from_pem,
    key_to_pem,
    split_ca_chain,
)

NOW = datetime(2031, 1, 1, tzinfo=UTC)
KEK = b"0123456789abcdef0123456789abcdef"


def raw(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


class KeyPemTests(SynchronousTestCase):
    """
    Private keys as PKCS#8 PEM, plain and encrypted.
    """

    def test_plain_round_trip(self) -> None:
        """A plain key reads back as the same key."""
        key = Ed25519PrivateKey.generate()
        data = key_to_pem(key)
        self.assertIn(b"-----BEGIN PRIVATE KEY-----", data)
        self.assertEqual(raw(key_from_pem(data)), raw(key))

    def test_encrypted_round_trip(self) -> None:
        """An encrypted key reads back with the KEK and hides the key bytes."""
        key = Ed25519PrivateKey.generate()
        data = key_to_pem(key, KEK)
        self.assertIn(b"-----BEGIN ENCRYPTED PRIVATE KEY-----", data)
        self.assertNotEqual(data, key_to_pem(key))
        self.assertEqual(raw(key_from_pem(data, KEK)), raw(key))

    def test_missing_kek(self) -> None:
        """Reading an encrypted key without a KEK is a KeyEncryptionError."""
        data = key_to_pem(Ed25519PrivateKey.generate(), KEK)
        error = self.assertRaises(KeyEncryptionError, key_from_pem, data)
        self.assertIn("no key-encryption key", str(error))

    def test_wrong_kek(self) -> None:
        """Reading an encrypted key with the wrong KEK is a KeyEncryptionError."""
        data = key_to_pem(Ed25519PrivateKey.generate(), KEK)
        error = self.assertRaises(KeyEncryptionError, key_from_pem, data, b"wrong")
        self.assertIn("does not decrypt", str(error))

    def test_plain_key_with_kek_refused(self) -> None:
        """A plain-text key is refused when a KEK is configured."""
        data = key_to_pem(Ed25519PrivateKey.generate())
        self.assertRaises(KeyEncryptionError, key_from_pem, data, KEK)

    def test_empty_kek_refused(self) -> None:
        """An empty KEK is refused when writing."""
        self.assertRaises(KeyEncryptionError, key_to_pem, Ed25519PrivateKey.generate(), b"")

    def test_not_ed25519(self) -> None:
        """A key of another type is refused."""
        other = ec.generate_private_key(ec.SECP256R1()).private_bytes(
            Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()
        )
        self.assertRaises(PKIError, key_from_pem, other)

    def test_garbage(self) -> None:
        """Malformed PEM is a PKIError, not a bare ValueError."""
        self.assertRaises(PKIError, key_from_pem, b"-----BEGIN PRIVATE KEY-----\nxx\n")


class CertPemTests(SynchronousTestCase):
    """
    Certificates and CA chains as PEM.
    """

    def test_chain_split(self) -> None:
        """A ca_chain_pem splits into its intermediate and its root, in order."""
        root = issue_org_root("Acme", NOW)
        intermediate = issue_tenant_intermediate(root, "t", "td.org", NOW)
        data = certs_to_pem([intermediate.cert, root.cert])
        intermediates, anchor = split_ca_chain(certs_from_pem(data))
        self.assertEqual(intermediates, [intermediate.cert])
        self.assertEqual(anchor, root.cert)

    def test_chain_without_root_refused(self) -> None:
        """A chain whose last certificate is not self-issued is refused."""
        root = issue_org_root("Acme", NOW)
        intermediate = issue_tenant_intermediate(root, "t", "td.org", NOW)
        self.assertRaises(PKIError, split_ca_chain, [intermediate.cert])
        self.assertRaises(PKIError, split_ca_chain, [])

    def test_single(self) -> None:
        """cert_from_pem wants exactly one certificate."""
        root = issue_org_root("Acme", NOW)
        self.assertEqual(cert_from_pem(certs_to_pem([root.cert])), root.cert)
        self.assertRaises(PKIError, cert_from_pem, certs_to_pem([root.cert, root.cert]))
        self.assertRaises(PKIError, cert_from_pem, b"nothing")
