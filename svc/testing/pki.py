"""
A throwaway PKI for tests: an org root, tenant intermediates, agent leaves,
a server leaf, the control-plane certificate, and deliberately bad variants.

Everything is ed25519 and cheap; build one L{TestPKI} per test class (or use
L{shared_test_pki} for the process-wide one). Certificates are issued at
C{now} (default: the real current time, since a TLS handshake checks
validity against the real clock), so leaves stay valid for about an hour.

Typical use in a data-plane test::

    pki = shared_test_pki()
    server_options = pki.server_options()
    alice = pki.agent("tenant-a", "agent-1")
    client_creator = alice.client_options(SERVER_NAME)
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from twisted.internet.interfaces import IOpenSSLClientConnectionCreator
from twisted.internet.ssl import CertificateOptions

from svc.pki.issuance import (
    CertifiedKey,
    issue_agent_leaf,
    issue_control_cert,
    issue_org_root,
    issue_server_leaf,
    issue_tenant_intermediate,
)
from svc.pki.pem import certs_to_pem
from svc.pki.tls import client_tls_options, org_root_trust, server_tls_options

TRUST_DOMAIN = "svc.test"
ORG = "Svc Test"
OTHER_ORG = "Intruder"
SERVER_NAME = "dataplane.test"
TENANTS = ("tenant-a", "tenant-b")


@attrs.frozen
class AgentCredentials:
    """
    What an enrolled agent holds: its leaf and key, the intermediates it
    presents after the leaf, and the root it trusts for the server.
    """

    leaf: CertifiedKey
    chain: tuple[x509.Certificate, ...]
    root: x509.Certificate

    @property
    def ca_chain_pem(self) -> bytes:
        """
        The enrollment response's C{ca_chain_pem}: intermediates, then root.
        """
        return certs_to_pem([*self.chain, self.root])

    def client_options(self, server_hostname: str = SERVER_NAME) -> IOpenSSLClientConnectionCreator:
        """
        The data-plane client's TLS connection creator for these credentials.
        """
        return client_tls_options(
            self.leaf.cert, self.leaf.key, self.chain, self.root, server_hostname
        )


@attrs.frozen(eq=False)
class TestPKI:
    """
    One org's CA material plus an intruder org, issued at C{now}.
    """

    now: datetime
    trust_domain: str
    root: CertifiedKey
    intermediates: dict[str, CertifiedKey]
    server: CertifiedKey
    control: CertifiedKey
    other_root: CertifiedKey
    other_intermediates: dict[str, CertifiedKey]

    @classmethod
    def build(
        cls,
        now: datetime | None = None,
        trust_domain: str = TRUST_DOMAIN,
        tenants: Sequence[str] = TENANTS,
    ) -> TestPKI:
        """
        Issue roots, intermediates for C{tenants} under both roots, the
        server leaf for L{SERVER_NAME} and the control certificate.
        """
        now = now or datetime.now(UTC)
        root = issue_org_root(ORG, now)
        other_root = issue_org_root(OTHER_ORG, now)
        return cls(
            now=now,
            trust_domain=trust_domain,
            root=root,
            intermediates={
                t: issue_tenant_intermediate(root, t, trust_domain, now) for t in tenants
            },
            server=issue_server_leaf(root, SERVER_NAME, now),
            control=issue_control_cert(root, trust_domain, now),
            other_root=other_root,
            other_intermediates={
                t: issue_tenant_intermediate(other_root, t, trust_domain, now) for t in tenants
            },
        )

    def agent(
        self, tenant_id: str, agent_id: str, user_id: str = "user-1", *, at: datetime | None = None
    ) -> AgentCredentials:
        """
        A good agent leaf for C{(tenant_id, agent_id)}, issued at C{at}
        (default C{now}).
        """
        intermediate = self.intermediates[tenant_id]
        leaf = issue_agent_leaf(
            intermediate,
            tenant_id=tenant_id,
            agent_id=agent_id,
            user_id=user_id,
            trust_domain=self.trust_domain,
            now=at or self.now,
        )
        return AgentCredentials(leaf, (intermediate.cert,), self.root.cert)

    def expired_agent(self, tenant_id: str, agent_id: str) -> AgentCredentials:
        """
        A correctly formed leaf that expired an hour before C{now}.
        """
        return self.agent(tenant_id, agent_id, at=self.now - timedelta(hours=2))

    def foreign_agent(self, tenant_id: str, agent_id: str) -> AgentCredentials:
        """
        A well-formed agent chain from another org's root (same trust domain
        and tenant id); it trusts the real root for the server.
        """
        intermediate = self.other_intermediates[tenant_id]
        leaf = issue_agent_leaf(
            intermediate,
            tenant_id=tenant_id,
            agent_id=agent_id,
            user_id="intruder",
            trust_domain=self.trust_domain,
            now=self.now,
        )
        return AgentCredentials(leaf, (intermediate.cert,), self.root.cert)

    def forged_agent(
        self,
        signing_tenant: str,
        *,
        uris: Sequence[str],
        user_id: str = "user-1",
        ou: str | None = None,
        purpose: x509.ObjectIdentifier = ExtendedKeyUsageOID.CLIENT_AUTH,
        ca: bool = False,
        extra_sans: Sequence[x509.GeneralName] = (),
    ) -> AgentCredentials:
        """
        A leaf signed by C{signing_tenant}'s real intermediate with exactly
        the URI SANs, OU, purpose and CA flag given: for the admission-rule
        cases the issuance API refuses to produce.
        """
        intermediate = self.intermediates[signing_tenant]
        leaf = forge_leaf(
            intermediate,
            self.now,
            uris=uris,
            common_name=user_id,
            ou=ou,
            purpose=purpose,
            ca=ca,
            extra_sans=extra_sans,
        )
        return AgentCredentials(leaf, (intermediate.cert,), self.root.cert)

    def tenant_only_agent(self, tenant_id: str) -> AgentCredentials:
        """
        A leaf with a tenant SAN but no agent SAN.
        """
        return self.forged_agent(
            tenant_id,
            uris=[f"spiffe://{self.trust_domain}/tenant/{tenant_id}"],
            ou=f"tenant={tenant_id}",
        )

    def cross_tenant_agent(
        self, tenant_id: str, agent_id: str, signing_tenant: str
    ) -> AgentCredentials:
        """
        A leaf naming C{tenant_id} (SAN and OU) but signed by
        C{signing_tenant}'s intermediate.
        """
        return self.forged_agent(
            signing_tenant,
            uris=[
                f"spiffe://{self.trust_domain}/tenant/{tenant_id}",
                f"spiffe://{self.trust_domain}/agent/{agent_id}",
            ],
            ou=f"tenant={tenant_id}",
        )

    def wrong_domain_agent(self, tenant_id: str, agent_id: str, domain: str) -> AgentCredentials:
        """
        A leaf under the tenant's real intermediate whose SANs are in
        C{domain}: the intermediate's name constraint forbids it.
        """
        return self.forged_agent(
            tenant_id,
            uris=[f"spiffe://{domain}/tenant/{tenant_id}", f"spiffe://{domain}/agent/{agent_id}"],
            ou=f"tenant={tenant_id}",
        )

    def server_leaf(self, fqdn: str) -> CertifiedKey:
        """
        A server leaf for another host name under the real root.
        """
        return issue_server_leaf(self.root, fqdn, self.now)

    def foreign_server(self, fqdn: str = SERVER_NAME) -> CertifiedKey:
        """
        A server leaf for C{fqdn} from the other org's root.
        """
        return issue_server_leaf(self.other_root, fqdn, self.now)

    def trust_root(self) -> Any:
        """
        A Twisted trust root holding only the real org root, for hand-built
        (deliberately odd) TLS options in tests.
        """
        return org_root_trust(self.root.cert)

    def server_options(self, server: CertifiedKey | None = None) -> CertificateOptions:
        """
        The data-plane server's TLS options (default: the L{SERVER_NAME} leaf).
        """
        server = server or self.server
        return server_tls_options(server.cert, server.key, self.root.cert)


def forge_leaf(
    issuer: CertifiedKey,
    now: datetime,
    *,
    uris: Sequence[str],
    common_name: str,
    ou: str | None,
    purpose: x509.ObjectIdentifier = ExtendedKeyUsageOID.CLIENT_AUTH,
    ca: bool = False,
    extra_sans: Sequence[x509.GeneralName] = (),
    ttl: timedelta = timedelta(hours=1),
) -> CertifiedKey:
    """
    A leaf signed by C{issuer} built directly with C{cryptography}, without
    any of the issuance checks: arbitrary URI SANs, OU, purpose and CA flag.
    """
    key = Ed25519PrivateKey.generate()
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if ou is not None:
        attributes.insert(0, x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, ou))
    general_names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(u) for u in uris]
    general_names.extend(extra_sans)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(attributes))
        .issuer_name(issuer.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + ttl)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=ca,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([purpose]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer.key.public_key()),
            critical=False,
        )
    )
    if general_names:
        builder = builder.add_extension(x509.SubjectAlternativeName(general_names), critical=False)
    return CertifiedKey(builder.sign(issuer.key, None), key)


@functools.cache
def shared_test_pki() -> TestPKI:
    """
    One L{TestPKI} per process, built on first use.
    """
    return TestPKI.build()
