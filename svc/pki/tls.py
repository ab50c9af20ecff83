"""
Mutual TLS 1.3 options for the data plane, and admission after the handshake.

Both sides trust only the org root (never the system store) and refuse
anything older than TLS 1.3. The server requires a client certificate and
lets a chain be at most leaf -> one intermediate -> root; the client accepts
only a server leaf issued directly by the root, with a DNS SAN matching the
host name it dialled.

The handshake only proves that the chain verifies. Admission (SPIFFE SANs,
tenant binding, deny-list) is L{admit_tls_connection}, which the server runs
when the handshake completes and before it reads any frame. The server must
then send the first frame, and the client must not treat the session as
admitted until it has read that frame: in TLS 1.3 the client's handshake
completes before the server has judged the client's certificate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from OpenSSL import SSL, crypto
from twisted.internet.interfaces import IOpenSSLClientConnectionCreator
from twisted.internet.ssl import (
    Certificate,
    CertificateOptions,
    TLSVersion,
    optionsForClientTLS,
    trustRootFromCertificates,
)

from svc.pki import names
from svc.pki.errors import AdmissionRefused, RefusalReason
from svc.pki.identity import AgentIdentity, DenyList, admit_agent

SERVER_VERIFY_DEPTH = 1
"""At most one untrusted CA (the tenant intermediate) between a client leaf
and the org root."""

CLIENT_VERIFY_DEPTH = 0
"""No CA between the server leaf and the org root: server leaves are signed
by the root directly, so a tenant intermediate cannot mint a server."""


def server_tls_options(
    server_leaf: x509.Certificate,
    server_key: Ed25519PrivateKey,
    org_root: x509.Certificate,
) -> CertificateOptions:
    """
    Server-side options: TLS 1.3 only, present C{server_leaf}, require a
    client certificate chaining to C{org_root} alone.

    The options cannot be changed once a connection used them; to rotate the
    server leaf or the root, build new options.
    """
    settings: dict[str, Any] = {
        "privateKey": server_key,
        "certificate": server_leaf,
        "trustRoot": org_root_trust(org_root),
        "raiseMinimumTo": TLSVersion.TLSv1_3,
        "verifyDepth": SERVER_VERIFY_DEPTH,
    }
    return CertificateOptions(**settings)


def client_tls_options(
    leaf: x509.Certificate,
    key: Ed25519PrivateKey,
    chain: Sequence[x509.Certificate],
    org_root: x509.Certificate,
    server_hostname: str,
) -> IOpenSSLClientConnectionCreator:
    """
    Client-side connection creator: TLS 1.3 only, present C{leaf} with
    C{chain} (the tenant intermediate) after it, trust only C{org_root}, and
    check that the server leaf names C{server_hostname}.
    """
    settings: dict[str, Any] = {
        "privateKey": key,
        "certificate": leaf,
        "extraCertChain": list(chain),
        "raiseMinimumTo": TLSVersion.TLSv1_3,
        "verifyDepth": CLIENT_VERIFY_DEPTH,
    }
    return optionsForClientTLS(
        names.check_fqdn(server_hostname),
        trustRoot=org_root_trust(org_root),
        extraCertificateOptions=settings,
    )


def admit_tls_connection(
    connection: SSL.Connection,
    org_root: x509.Certificate,
    trust_domain: str,
    deny_list: DenyList,
) -> AgentIdentity:
    """
    Run the admission rules on the peer of a server-side TLS C{connection}
    whose handshake has completed (for a Twisted TLS transport:
    C{transport.getHandle()}).

    Uses OpenSSL's verified chain (leaf, tenant intermediate, org root), not
    the chain the peer sent, and checks it ends at C{org_root}.

    @raise AdmissionRefused: the peer is not an admissible agent; the caller
        drops the connection without sending anything.
    """
    chain = connection.get_verified_chain(as_cryptography=True)
    if not chain:
        raise AdmissionRefused(RefusalReason.NO_CLIENT_CERT)
    if len(chain) != 3 or chain[-1] != org_root:
        raise AdmissionRefused(
            RefusalReason.CHAIN_MISMATCH, f"verified chain has {len(chain)} certificates"
        )
    leaf, intermediate, _root = chain
    return admit_agent(leaf, intermediate, trust_domain, deny_list)


def org_root_trust(root: x509.Certificate) -> Any:
    """
    A Twisted trust root (C{IOpenSSLTrustRoot}) holding only C{root}, for the
    C{trustRoot} argument of L{CertificateOptions} or L{optionsForClientTLS}.
    Typed L{Any}: Twisted neither exports that interface nor annotates its
    trust-root helpers.
    """
    anchor = Certificate(crypto.X509.from_cryptography(root))  # type: ignore[no-untyped-call]
    return trustRootFromCertificates([anchor])  # type: ignore[no-untyped-call]
