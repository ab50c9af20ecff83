"""
Issuing every certificate of the spec's "Certificates" table.

Pure functions: each takes the issuer's certificate and key, the names, and
the current time C{now} (timezone-aware; never read from a clock here), and
returns a new certificate with a fresh ed25519 key unless a key is passed.
Profiles (see C{docs/specifications/certificates.md}):

  - org root: self-signed, CA, path length 1, KeyCertSign+CRLSign, 10 years;
  - tenant intermediate: under the root, CA, path length 0, OU
    C{tenant=<id>}, URI name constraint permitting only the trust domain;
  - agent leaf: under the tenant's intermediate, tenant + agent SPIFFE URI
    SANs, ClientAuth, 1 hour;
  - server leaf: directly under the root, DNS SAN, ServerAuth, about 90 days
    (for the control plane's HTTPS listener, which browsers connect to, with
    an ECDSA P-256 key: L{issue_https_server_leaf});
  - control-plane certificate: under the root, C{spiffe://<td>/control},
    ClientAuth, 30 days.

Every certificate's C{NotBefore} is C{now - 5 minutes} (the spec's back-dating
for agent leaves, applied to all so that a verifier whose clock lags the CA's
a little never sees a CA certificate from the future); C{NotAfter} is
C{now + ttl}.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import attrs
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from svc.pki import names
from svc.pki.errors import IssuanceError, PKIError
from svc.pki.pem import cert_to_pem, key_to_pem

ROOT_TTL = timedelta(days=3650)
INTERMEDIATE_TTL = timedelta(days=365)
AGENT_LEAF_TTL = timedelta(hours=1)
SERVER_LEAF_TTL = timedelta(days=90)
CONTROL_TTL = timedelta(days=30)
BACKDATE = timedelta(minutes=5)
"""How far before C{now} every certificate's C{NotBefore} is set."""


@attrs.frozen
class CertifiedKey:
    """
    A certificate and its ed25519 private key. The key is kept out of
    C{repr}; construction checks that the two belong together.
    """

    cert: x509.Certificate
    key: Ed25519PrivateKey = attrs.field(repr=False)

    def __attrs_post_init__(self) -> None:
        public = self.cert.public_key()
        if not isinstance(public, Ed25519PublicKey) or _raw(public) != _raw(self.key.public_key()):
            raise PKIError("the private key does not belong to the certificate")

    def cert_pem(self) -> bytes:
        """
        The certificate as PEM.
        """
        return cert_to_pem(self.cert)

    def key_pem(self, kek: bytes | None = None) -> bytes:
        """
        The key as PKCS#8 PEM, encrypted with C{kek} if given.
        """
        return key_to_pem(self.key, kek)


def issue_org_root(
    org: str,
    now: datetime,
    *,
    ttl: timedelta = ROOT_TTL,
    key: Ed25519PrivateKey | None = None,
) -> CertifiedKey:
    """
    A self-signed org root: CN C{"<org> Root CA"}, CA with path length 1,
    KeyCertSign + CRLSign, valid C{ttl} (10 years) from C{now}.
    """
    now = names.check_utc(now, "now")
    key = key or Ed25519PrivateKey.generate()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names.root_common_name(org))])
    builder = (
        _validity(x509.CertificateBuilder(), now, ttl)
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=True, path_length=1), critical=True)
        .add_extension(_ca_key_usage(), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    return CertifiedKey(builder.sign(key, None), key)


def issue_tenant_intermediate(
    root: CertifiedKey,
    tenant_id: str,
    trust_domain: str,
    now: datetime,
    *,
    ttl: timedelta = INTERMEDIATE_TTL,
    key: Ed25519PrivateKey | None = None,
) -> CertifiedKey:
    """
    A tenant intermediate under C{root}: CN C{"<ORG> Tenant <id>
    Intermediate"}, OU C{"tenant=<id>"}, CA with path length 0, KeyCertSign +
    CRLSign, a critical name constraint permitting only URIs whose host is
    C{trust_domain}, valid C{ttl} (1 year).
    """
    now = names.check_utc(now, "now")
    names.check_trust_domain(trust_domain)
    try:
        org = org_of_root(root.cert)
    except PKIError:
        raise IssuanceError("the issuer is not an org root") from None
    key = key or Ed25519PrivateKey.generate()
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, names.tenant_ou(tenant_id)),
            x509.NameAttribute(NameOID.COMMON_NAME, names.intermediate_common_name(org, tenant_id)),
        ]
    )
    builder = (
        _issued_by(root, subject, key.public_key(), now, ttl, path_length=1)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_ca_key_usage(), critical=True)
        .add_extension(
            x509.NameConstraints(
                permitted_subtrees=[x509.UniformResourceIdentifier(trust_domain)],
                excluded_subtrees=None,
            ),
            critical=True,
        )
    )
    return CertifiedKey(builder.sign(root.key, None), key)


def issue_agent_leaf(
    intermediate: CertifiedKey,
    *,
    tenant_id: str,
    agent_id: str,
    user_id: str,
    trust_domain: str,
    now: datetime,
    ttl: timedelta = AGENT_LEAF_TTL,
    key: Ed25519PrivateKey | None = None,
) -> CertifiedKey:
    """
    An agent leaf under the tenant's C{intermediate}: CN C{user_id}, OU
    C{"tenant=<tenant_id>"}, URI SANs C{spiffe://<td>/tenant/<tenant_id>} and
    C{spiffe://<td>/agent/<agent_id>}, DigitalSignature, ClientAuth, not a
    CA, valid C{ttl} (1 hour) with C{NotBefore} back-dated 5 minutes.

    @raise IssuanceError: C{intermediate} is not C{tenant_id}'s intermediate
        for C{trust_domain}.
    """
    if tenant_of_intermediate(intermediate.cert) != tenant_id:
        raise IssuanceError(f"the intermediate does not belong to tenant {tenant_id!r}")
    if trust_domain_of_intermediate(intermediate.cert) != trust_domain:
        raise IssuanceError(f"the intermediate is not constrained to {trust_domain!r}")
    return _sign_agent_leaf(
        intermediate,
        tenant_id=tenant_id,
        agent_id=agent_id,
        user_id=user_id,
        trust_domain=trust_domain,
        now=now,
        ttl=ttl,
        key=key,
    )


def issue_server_leaf(
    root: CertifiedKey,
    fqdn: str,
    now: datetime,
    *,
    ttl: timedelta = SERVER_LEAF_TTL,
    key: Ed25519PrivateKey | None = None,
) -> CertifiedKey:
    """
    A data-plane server leaf directly under C{root}: CN and DNS SAN C{fqdn}
    (lower-cased), no URI SAN, DigitalSignature + KeyEncipherment,
    ServerAuth, not a CA, valid C{ttl} (90 days by default).
    """
    key = key or Ed25519PrivateKey.generate()
    return CertifiedKey(_server_leaf(root, key.public_key(), fqdn, now, ttl), key)


def issue_https_server_leaf(
    root: CertifiedKey,
    fqdn: str,
    now: datetime,
    *,
    ttl: timedelta = SERVER_LEAF_TTL,
    key: ec.EllipticCurvePrivateKey | None = None,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """
    A server leaf for an HTTPS listener browsers connect to (the control
    plane's own): the server-leaf profile under C{root} for C{fqdn}, but with
    an ECDSA P-256 key and DigitalSignature alone (browsers offer no Ed25519
    signature in the TLS handshake; an ECDSA key enciphers nothing). The
    certificate and its new key.
    """
    key = key or ec.generate_private_key(ec.SECP256R1())
    if not isinstance(key.curve, ec.SECP256R1):
        raise IssuanceError(f"HTTPS server keys must be P-256, got {key.curve.name}")
    cert = _server_leaf(root, key.public_key(), fqdn, now, ttl, key_encipherment=False)
    return cert, key


def sign_server_csr(
    root: CertifiedKey,
    csr: x509.CertificateSigningRequest,
    fqdn: str,
    now: datetime,
    ttl: timedelta = SERVER_LEAF_TTL,
) -> x509.Certificate:
    """
    Sign a server's CSR with the server-leaf profile for C{fqdn}.

    Only the CSR's (ed25519) public key is used, after checking the CSR's
    self-signature; its subject and every requested extension are ignored.

    @raise IssuanceError: the CSR signature is bad or the key is not ed25519.
    """
    public = csr.public_key()
    if not isinstance(public, Ed25519PublicKey):
        raise IssuanceError(f"server keys must be ed25519, got {type(public).__name__}")
    if not csr.is_signature_valid:
        raise IssuanceError("the CSR's signature does not verify")
    return _server_leaf(root, public, fqdn, now, ttl)


def issue_control_cert(
    root: CertifiedKey,
    trust_domain: str,
    now: datetime,
    *,
    ttl: timedelta = CONTROL_TTL,
    key: Ed25519PrivateKey | None = None,
) -> CertifiedKey:
    """
    The control plane's client certificate under C{root}: CN C{svc-control},
    URI SAN C{spiffe://<td>/control}, DigitalSignature, ClientAuth, not a CA,
    valid C{ttl} (30 days).
    """
    now = names.check_utc(now, "now")
    key = key or Ed25519PrivateKey.generate()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names.CONTROL_CN)])
    builder = _end_entity(
        _issued_by(root, subject, key.public_key(), now, ttl, path_length=1),
        x509.SubjectAlternativeName(
            [x509.UniformResourceIdentifier(names.control_spiffe_id(trust_domain))]
        ),
        _leaf_key_usage(key_encipherment=False),
        ExtendedKeyUsageOID.CLIENT_AUTH,
    )
    return CertifiedKey(builder.sign(root.key, None), key)


def org_of_root(cert: x509.Certificate) -> str:
    """
    The organisation name in an org root's CN.
    """
    return names.org_from_root_common_name(_single_attribute(cert.subject, NameOID.COMMON_NAME))


def tenant_of_intermediate(cert: x509.Certificate) -> str | None:
    """
    The tenant id in a certificate's single OU C{tenant=<id>}, or L{None}.
    """
    values = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
    if len(values) != 1 or not isinstance(values[0].value, str):
        return None
    return names.tenant_from_ou(values[0].value)


def trust_domain_of_intermediate(cert: x509.Certificate) -> str | None:
    """
    The single permitted URI domain of an intermediate's name constraint, or
    L{None} when there is not exactly one.
    """
    try:
        constraints = cert.extensions.get_extension_for_class(x509.NameConstraints).value
    except x509.ExtensionNotFound:
        return None
    permitted = constraints.permitted_subtrees or []
    if constraints.excluded_subtrees or len(permitted) != 1:
        return None
    (only,) = permitted
    if not isinstance(only, x509.UniformResourceIdentifier):
        return None
    return only.value


def _sign_agent_leaf(
    intermediate: CertifiedKey,
    *,
    tenant_id: str,
    agent_id: str,
    user_id: str,
    trust_domain: str,
    now: datetime,
    ttl: timedelta = AGENT_LEAF_TTL,
    key: Ed25519PrivateKey | None = None,
) -> CertifiedKey:
    """
    The agent-leaf profile without checking that C{intermediate} belongs to
    the tenant and trust domain; only tests forge mismatched leaves with it.
    """
    now = names.check_utc(now, "now")
    key = key or Ed25519PrivateKey.generate()
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, names.tenant_ou(tenant_id)),
            x509.NameAttribute(NameOID.COMMON_NAME, names.check_id(user_id, "user id")),
        ]
    )
    sans = x509.SubjectAlternativeName(
        [
            x509.UniformResourceIdentifier(names.tenant_spiffe_id(trust_domain, tenant_id)),
            x509.UniformResourceIdentifier(names.agent_spiffe_id(trust_domain, agent_id)),
        ]
    )
    builder = _end_entity(
        _issued_by(intermediate, subject, key.public_key(), now, ttl, path_length=0),
        sans,
        _leaf_key_usage(key_encipherment=False),
        ExtendedKeyUsageOID.CLIENT_AUTH,
    )
    return CertifiedKey(builder.sign(intermediate.key, None), key)


def _server_leaf(
    root: CertifiedKey,
    public: Ed25519PublicKey | ec.EllipticCurvePublicKey,
    fqdn: str,
    now: datetime,
    ttl: timedelta,
    *,
    key_encipherment: bool = True,
) -> x509.Certificate:
    now = names.check_utc(now, "now")
    host = names.check_fqdn(fqdn)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    builder = _end_entity(
        _issued_by(root, subject, public, now, ttl, path_length=1),
        x509.SubjectAlternativeName([x509.DNSName(host)]),
        _leaf_key_usage(key_encipherment=key_encipherment),
        ExtendedKeyUsageOID.SERVER_AUTH,
    )
    return builder.sign(root.key, None)


def _issued_by(
    issuer: CertifiedKey,
    subject: x509.Name,
    public: Ed25519PublicKey | ec.EllipticCurvePublicKey,
    now: datetime,
    ttl: timedelta,
    *,
    path_length: int,
) -> x509.CertificateBuilder:
    """
    A builder for a certificate signed by C{issuer}, after checking that
    C{issuer} is a CA with exactly C{path_length} (1: the org root, 0: a
    tenant intermediate) that outlives the new certificate.
    """
    try:
        constraints = issuer.cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        raise IssuanceError("the issuer has no BasicConstraints") from None
    if not constraints.ca:
        raise IssuanceError("the issuer is not a CA")
    if constraints.path_length != path_length:
        raise IssuanceError(
            f"the issuer's path length is {constraints.path_length}, expected {path_length}"
        )
    if now + ttl > issuer.cert.not_valid_after_utc:
        raise IssuanceError("the issuer expires before the certificate would; rotate it first")
    issuer_ski = issuer.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    return (
        _validity(x509.CertificateBuilder(), now, ttl)
        .subject_name(subject)
        .issuer_name(issuer.cert.subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(issuer_ski),
            critical=False,
        )
    )


def _end_entity(
    builder: x509.CertificateBuilder,
    sans: x509.SubjectAlternativeName,
    usage: x509.KeyUsage,
    purpose: x509.ObjectIdentifier,
) -> x509.CertificateBuilder:
    return (
        builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.ExtendedKeyUsage([purpose]), critical=False)
        .add_extension(sans, critical=False)
    )


def _validity(
    builder: x509.CertificateBuilder, now: datetime, ttl: timedelta
) -> x509.CertificateBuilder:
    if ttl <= timedelta(0):
        raise IssuanceError(f"validity must be positive, got {ttl}")
    return builder.not_valid_before(now - BACKDATE).not_valid_after(now + ttl)


def _ca_key_usage() -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=False,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=True,
        encipher_only=False,
        decipher_only=False,
    )


def _leaf_key_usage(*, key_encipherment: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=key_encipherment,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=False,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )


def _single_attribute(name: x509.Name, oid: x509.ObjectIdentifier) -> str:
    values = name.get_attributes_for_oid(oid)
    if len(values) != 1 or not isinstance(values[0].value, str):
        raise PKIError(f"expected exactly one {oid.dotted_string} in {name.rfc4514_string()}")
    return values[0].value


def _raw(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(Encoding.Raw, PublicFormat.Raw)
