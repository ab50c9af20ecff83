"""
Bodies of C{POST /control/sign-server-cert} as a data-plane server sends
them (``docs/specifications/control-dataplane.md``): for tests of the
control plane that register a server without running one.
"""

from __future__ import annotations

from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.x509.oid import NameOID

from svc.pki import server_identity


def server_csr(key: Ed25519PrivateKey, fqdn: str) -> x509.CertificateSigningRequest:
    """A CSR for C{fqdn} (CN) signed by C{key}."""
    return (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, fqdn)]))
        .sign(key, None)
    )


def registration_body(
    fqdn: str,
    advertise_addr: str,
    http_addr: str,
    trust_domain: str,
    *,
    key: Ed25519PrivateKey | None = None,
    identity: Ed25519PrivateKey | None = None,
    csr: x509.CertificateSigningRequest | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """
    The body registering C{fqdn} under C{identity} (a new identity key by
    default) with a CSR for C{key} (a new key by default, or C{csr} as
    given), proved; C{extra} fields are added (C{capacity},
    C{replaces_identity_key}, or overrides).
    """
    identity = identity or Ed25519PrivateKey.generate()
    if csr is None:
        csr = server_csr(key or Ed25519PrivateKey.generate(), fqdn)
    body: dict[str, Any] = {
        "csr_pem": csr.public_bytes(serialization.Encoding.PEM).decode("ascii"),
        "fqdn": fqdn,
        "advertise_addr": advertise_addr,
        "http_addr": http_addr,
        "trust_domain": trust_domain,
        "identity_key": server_identity.key_text(identity),
        "identity_proof": server_identity.prove(identity, csr),
    }
    body.update(extra)
    return body
