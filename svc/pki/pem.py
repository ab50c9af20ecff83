"""
PEM encoding of certificates and ed25519 private keys.

Private keys are PKCS#8. With a key-encryption key (KEK) they are written as
C{ENCRYPTED PRIVATE KEY} using C{cryptography}'s C{BestAvailableEncryption};
the KEK should be a high-entropy random secret, not a human passphrase.
Reading is strict: an encrypted key needs the KEK, a wrong KEK is refused,
and a plain-text key is refused when a KEK is configured (CA keys must be
encrypted at rest once a KEK exists). Every failure is a
L{KeyEncryptionError} or L{PKIError}, never a bare C{TypeError}.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from svc.pki.errors import KeyEncryptionError, PKIError

_ENCRYPTED_MARKER = b"-----BEGIN ENCRYPTED PRIVATE KEY-----"


def cert_to_pem(cert: x509.Certificate) -> bytes:
    """
    One certificate as PEM.
    """
    return cert.public_bytes(serialization.Encoding.PEM)


def certs_to_pem(certs: Iterable[x509.Certificate]) -> bytes:
    """
    Several certificates as concatenated PEM, in the order given.
    """
    return b"".join(cert_to_pem(cert) for cert in certs)


def cert_from_pem(data: bytes) -> x509.Certificate:
    """
    Exactly one certificate from PEM; L{PKIError} otherwise.
    """
    certs = certs_from_pem(data)
    if len(certs) != 1:
        raise PKIError(f"expected one certificate, found {len(certs)}")
    return certs[0]


def certs_from_pem(data: bytes) -> list[x509.Certificate]:
    """
    Every certificate in concatenated PEM, in order; L{PKIError} when there
    is none or one is malformed.
    """
    try:
        return x509.load_pem_x509_certificates(data)
    except ValueError as e:
        raise PKIError(f"malformed certificate PEM: {e}") from None


def key_to_pem(key: Ed25519PrivateKey, kek: bytes | None = None) -> bytes:
    """
    A PKCS#8 PEM private key, encrypted with C{kek} when one is given.
    """
    encryption: serialization.KeySerializationEncryption
    if kek is None:
        encryption = serialization.NoEncryption()
    else:
        _check_kek(kek)
        encryption = serialization.BestAvailableEncryption(kek)
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
    )


def key_from_pem(data: bytes, kek: bytes | None = None) -> Ed25519PrivateKey:
    """
    An ed25519 private key from PKCS#8 PEM.

    @raise KeyEncryptionError: the key is encrypted and C{kek} is L{None},
        C{kek} is wrong, or C{kek} is given but the key is not encrypted.
    @raise PKIError: the PEM is malformed or the key is not ed25519.
    """
    encrypted = _ENCRYPTED_MARKER in data
    if encrypted and kek is None:
        raise KeyEncryptionError("the private key is encrypted and no key-encryption key is set")
    if not encrypted and kek is not None:
        raise KeyEncryptionError(
            "a key-encryption key is set but the stored private key is not encrypted"
        )
    if kek is not None:
        _check_kek(kek)
    try:
        key = serialization.load_pem_private_key(data, password=kek)
    except ValueError as e:
        if encrypted:
            raise KeyEncryptionError("the key-encryption key does not decrypt the key") from None
        raise PKIError(f"malformed private key PEM: {e}") from None
    except TypeError as e:
        raise KeyEncryptionError(str(e)) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise PKIError(f"expected an ed25519 private key, got {type(key).__name__}")
    return key


def split_ca_chain(
    certs: Sequence[x509.Certificate],
) -> tuple[list[x509.Certificate], x509.Certificate]:
    """
    Split an enrollment C{ca_chain_pem} (tenant intermediate followed by org
    root) into C{(intermediates, root)}: the root is the last certificate and
    must be self-issued.
    """
    if not certs:
        raise PKIError("the CA chain is empty")
    root = certs[-1]
    if root.issuer != root.subject:
        raise PKIError("the last certificate of the CA chain is not a self-issued root")
    return list(certs[:-1]), root


def _check_kek(kek: bytes) -> None:
    if not isinstance(kek, bytes) or not 1 <= len(kek) <= 1023:
        raise KeyEncryptionError("the key-encryption key must be 1 to 1023 bytes")
