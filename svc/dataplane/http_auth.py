"""
Who is calling the data plane's HTTPS surface: the listener's TLS options,
the verified peer chain of a request, and the caller it identifies.

The HTTPS listener is TLS 1.3 with the server leaf and an I{optional} client
certificate, verified during the handshake against the org root alone (no
system store): C{/healthz} and C{/metrics} need none, C{/audit} needs an
agent certificate and C{/control/*} the control-plane certificate. A client
certificate that does not verify to the org root fails the handshake, so it
never reaches a route.

Identity comes only from OpenSSL's I{verified} chain (never from what the
peer sent, a header or the body) and is re-judged on every request: the
deny-list in force and the certificates' expiry apply to requests on a
connection that was opened earlier (HTTP keep-alive).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import attrs
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from OpenSSL import SSL, crypto
from twisted.internet.ssl import CertificateOptions, TLSVersion

from svc.pki import names
from svc.pki.errors import AdmissionRefused, RefusalReason
from svc.pki.identity import AgentIdentity, ControlIdentity, DenyList, admit_agent, control_identity
from svc.web.errors import INVALID_CLIENT, AccessDenied, InvalidCredential

HTTP_VERIFY_DEPTH = 1
"""At most one intermediate between a client leaf and the org root (an
agent's tenant intermediate; the control-plane certificate has none)."""

AGENT_CERTIFICATE_REQUIRED = "agent_certificate_required"
CONTROL_CERTIFICATE_REQUIRED = "control_certificate_required"
CLIENT_CERTIFICATE_REQUIRED = "client_certificate_required"


def http_tls_options(
    server_leaf: x509.Certificate,
    server_key: Ed25519PrivateKey,
    org_root: x509.Certificate,
) -> CertificateOptions:
    """
    Options for the HTTPS listener: TLS 1.3 only, present C{server_leaf},
    ask for a client certificate without requiring one, and verify any
    certificate sent against C{org_root} alone (a chain of at most
    leaf, one intermediate, root).

    Unlike L{svc.pki.tls.server_tls_options} (whose C{trustRoot} makes a
    client certificate mandatory) this uses C{verify}/C{caCerts} with
    C{requireCertificate=False}: OpenSSL then sends a certificate request,
    accepts a handshake without a certificate, and fails the handshake when
    a certificate is sent that does not verify. Sessions and tickets stay
    off (Twisted's default), so every connection's chain is verified anew.
    Options cannot change once used: to rotate the leaf, build new ones.
    """
    settings: dict[str, Any] = {
        "privateKey": server_key,
        "certificate": server_leaf,
        "verify": True,
        "caCerts": [crypto.X509.from_cryptography(org_root)],
        "requireCertificate": False,
        "raiseMinimumTo": TLSVersion.TLSv1_3,
        "verifyDepth": HTTP_VERIFY_DEPTH,
    }
    return CertificateOptions(**settings)


def tls_verified_chain(request: object) -> list[x509.Certificate]:
    """
    The peer's chain as OpenSSL verified it in the handshake (leaf first,
    org root last), or an empty list when the request did not come over TLS
    or the peer sent no certificate.
    """
    channel = getattr(request, "channel", None)
    transport = getattr(channel, "transport", None)
    get_handle = getattr(transport, "getHandle", None)
    if get_handle is None:
        return []
    connection = get_handle()
    if not isinstance(connection, SSL.Connection):
        return []
    chain = connection.get_verified_chain(as_cryptography=True)
    return list(chain or [])


@attrs.frozen
class Anonymous:
    """A caller that presented no client certificate."""


@attrs.frozen
class Refused:
    """A caller whose certificate verified but is not admitted, and why."""

    reason: str


Caller = AgentIdentity | ControlIdentity | Anonymous | Refused
"""What a request's verified chain says about its sender."""


def identify_caller(
    chain: Sequence[x509.Certificate],
    org_root: x509.Certificate,
    trust_domain: str,
    deny_list: DenyList,
    now: datetime,
) -> Caller:
    """
    Classify a verified chain: none is L{Anonymous}; leaf, intermediate,
    root is an agent when L{admit_agent} admits it; leaf, root is the
    control plane when L{control_identity} accepts it and its serial is not
    deny-listed; anything else (another root, an expired certificate, a
    refused admission rule) is L{Refused}.
    """
    if not chain:
        return Anonymous()
    if chain[-1] != org_root:
        return Refused(RefusalReason.CHAIN_MISMATCH.value)
    now = names.check_utc(now, "now")
    if any(cert.not_valid_after_utc <= now for cert in chain):
        return Refused("expired")
    try:
        if len(chain) == 3:
            return admit_agent(chain[0], chain[1], trust_domain, deny_list)
        if len(chain) == 2:
            identity = control_identity(chain[0], org_root, trust_domain)
            if identity.serial in deny_list:
                return Refused(RefusalReason.DENIED_SERIAL.value)
            return identity
    except AdmissionRefused as e:
        return Refused(e.reason.value)
    return Refused(RefusalReason.CHAIN_MISMATCH.value)


class CertificateRequired(InvalidCredential):
    """401 C{invalid_client}: the route needs a client certificate and none
    was presented."""

    def __init__(self, description: str = CLIENT_CERTIFICATE_REQUIRED) -> None:
        super().__init__(INVALID_CLIENT, description)


class CertificateRefused(AccessDenied):
    """403 C{access_denied}: a certificate was presented but it is not the
    kind the route needs, or it is not admitted."""


AuthenticationFailure = CertificateRequired | CertificateRefused
"""The two HTTP-layer authentication failures (audited as C{http_auth})."""


def require_agent(caller: Caller) -> AgentIdentity:
    """
    The agent behind C{caller}.

    @raise CertificateRequired: no certificate.
    @raise CertificateRefused: any other caller.
    """
    if isinstance(caller, AgentIdentity):
        return caller
    if isinstance(caller, Anonymous):
        raise CertificateRequired()
    raise CertificateRefused(AGENT_CERTIFICATE_REQUIRED)


def require_control(caller: Caller) -> ControlIdentity:
    """
    The control plane behind C{caller}.

    @raise CertificateRequired: no certificate.
    @raise CertificateRefused: any other caller.
    """
    if isinstance(caller, ControlIdentity):
        return caller
    if isinstance(caller, Anonymous):
        raise CertificateRequired()
    raise CertificateRefused(CONTROL_CERTIFICATE_REQUIRED)
