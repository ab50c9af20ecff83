"""
The control plane's own HTTPS listener (C{twist svc-control --tls-listen}):
the certificate it serves and its TLS context.

The serving certificate is one of:

  - B{issued} (the default): at every start a fresh ECDSA P-256 key and a
    server leaf for C{SVC_CONTROL_FQDN}, signed by the org root through the
    CA (so the signing is audited), kept in memory and replaced once two
    thirds of its life have passed. ECDSA, not the Ed25519 of the rest of
    svc's PKI, because browsers offer no Ed25519 signature in the TLS
    handshake (Chromium answers C{ERR_SSL_VERSION_OR_CIPHER_MISMATCH}).
    Clients that trust the org root (the mount client's C{SVC_CA_FILE}, the
    SDK) verify it like any other; a browser, which cannot verify an
    Ed25519 signature even with the org root installed, needs an exception
    for it or the operator's certificate;
  - the B{operator's} (C{SVC_CONTROL_TLS_CERT_FILE} and
    C{SVC_CONTROL_TLS_KEY_FILE}): a PEM certificate chain (leaf first, then
    the intermediates to send) and its unencrypted PEM private key, e.g. from
    a CA browsers trust. The files are read at start (a bad file stops the
    start, naming the variable) and again at every hourly check, and the
    listener serves the new chain when they changed.

Either way the listener I{asks} for, but does not require, a client
certificate verified against the org root alone (agents identify themselves
with their leaf there; see L{svc.control.agent_auth}).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import attrs
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes
from OpenSSL import SSL
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IOpenSSLContextFactory
from twisted.internet.ssl import CertificateOptions, TLSVersion
from twisted.logger import Logger
from zope.interface import implementer  # type: ignore[import-untyped]

from svc.config import ConfigError
from svc.control.ca import AgentCA
from svc.pki.tls import org_root_trust

CERT_FILE_VARIABLE = "SVC_CONTROL_TLS_CERT_FILE"
KEY_FILE_VARIABLE = "SVC_CONTROL_TLS_KEY_FILE"
MINIMUM_RSA_BITS = 2048

ServingKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey
"""The private key types a serving certificate may have."""

_log = Logger()


def _spki(key: Any) -> bytes:
    der: bytes = key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return der


@attrs.frozen
class ServingCertificate:
    """
    What the HTTPS listener presents: the certificate chain (leaf first) and
    the leaf's private key (kept out of C{repr}); built only when they match.
    """

    chain: tuple[x509.Certificate, ...]
    key: ServingKey = attrs.field(repr=False)

    def __attrs_post_init__(self) -> None:
        if not self.chain:
            raise ValueError("a serving certificate needs at least its leaf")
        if _spki(self.chain[0].public_key()) != _spki(self.key.public_key()):
            raise ValueError("the private key does not belong to the certificate")

    @property
    def leaf(self) -> x509.Certificate:
        """The certificate presented (the first of the chain)."""
        return self.chain[0]

    @property
    def renew_at(self) -> datetime:
        """When two thirds of the leaf's life have passed."""
        start = self.leaf.not_valid_before_utc
        return start + (self.leaf.not_valid_after_utc - start) * 2 / 3


def issue_serving_certificate(
    ca: AgentCA, fqdn: str, now: datetime
) -> Deferred[ServingCertificate]:
    """An issued serving certificate for C{fqdn}: ECDSA P-256, signed by the org root."""

    async def issuing() -> ServingCertificate:
        cert, key = await ca.issue_https_leaf(fqdn, now)
        return ServingCertificate((cert,), key)

    return Deferred.fromCoroutine(issuing())


def load_serving_certificate(
    cert_file: Path,
    key_file: Path,
    read_file: Callable[[Path], bytes] = Path.read_bytes,
) -> ServingCertificate:
    """
    The operator's serving certificate from C{SVC_CONTROL_TLS_CERT_FILE}
    (PEM certificates, leaf first) and C{SVC_CONTROL_TLS_KEY_FILE} (an
    unencrypted PEM private key: ECDSA, RSA of at least 2048 bits, or
    Ed25519, which browsers refuse, so a warning is logged).

    @raise ConfigError: naming the variable whose file is unreadable,
        malformed, or does not match the other.
    """
    chain = tuple(_certificates(_read(cert_file, CERT_FILE_VARIABLE, read_file)))
    key = _private_key(_read(key_file, KEY_FILE_VARIABLE, read_file))
    try:
        serving = ServingCertificate(chain, key)
    except ValueError as e:
        raise ConfigError(KEY_FILE_VARIABLE, f"{e} in {cert_file}") from None
    if isinstance(key, ed25519.Ed25519PrivateKey):
        _log.warn(
            "{variable} holds an Ed25519 key: browsers refuse it (use ECDSA P-256 or RSA)",
            variable=KEY_FILE_VARIABLE,
        )
    return serving


def _read(path: Path, variable: str, read_file: Callable[[Path], bytes]) -> bytes:
    try:
        return read_file(path)
    except OSError as e:
        raise ConfigError(variable, f"cannot read {path}: {e.strerror}") from None


def _certificates(data: bytes) -> list[x509.Certificate]:
    try:
        certificates = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise ConfigError(CERT_FILE_VARIABLE, "holds no PEM certificate") from None
    return certificates


def _private_key(data: bytes) -> ServingKey:
    try:
        key: PrivateKeyTypes = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise ConfigError(
            KEY_FILE_VARIABLE, "holds an encrypted key; give it unencrypted"
        ) from None
    except ValueError:
        raise ConfigError(KEY_FILE_VARIABLE, "holds no PEM private key") from None
    if isinstance(key, rsa.RSAPrivateKey) and key.key_size < MINIMUM_RSA_BITS:
        raise ConfigError(KEY_FILE_VARIABLE, f"RSA keys need {MINIMUM_RSA_BITS} bits or more")
    if not isinstance(
        key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey
    ):
        raise ConfigError(
            KEY_FILE_VARIABLE, f"a {type(key).__name__} cannot serve TLS; use ECDSA P-256 or RSA"
        )
    return key


@implementer(IOpenSSLContextFactory)
class OptionalClientCertificateOptions:
    """
    Server TLS context factory: present C{serving}, I{request} a client
    certificate and verify any that is sent against C{org_root} alone (a
    client without one still connects). The agent-identity authenticator
    re-verifies the chain and applies the admission rules itself.
    """

    def __init__(self, serving: ServingCertificate, org_root: x509.Certificate) -> None:
        self._org_root = org_root
        self.replace(serving)

    def replace(self, serving: ServingCertificate) -> None:
        """Present C{serving} on new connections (live ones keep theirs)."""
        settings: dict[str, Any] = {
            "privateKey": serving.key,
            "certificate": serving.leaf,
            "extraCertChain": list(serving.chain[1:]),
            "trustRoot": org_root_trust(self._org_root),
            "raiseMinimumTo": TLSVersion.TLSv1_2,
            "verifyDepth": 1,
        }
        context = CertificateOptions(**settings).getContext()
        context.set_verify(SSL.VERIFY_PEER)
        self._context = context
        self.serving = serving

    def getContext(self) -> SSL.Context:
        """The OpenSSL context, with the client certificate made optional."""
        return self._context
