"""
Tests for L{svc.pki.issuance}: every field of the org root, tenant
intermediate and agent leaf profiles of the spec's "Certificates" table.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
)
from cryptography.x509.oid import (
    ExtendedKeyUsageOID,
    ExtensionOID,
    NameOID,
)
from twisted.trial.unittest import SynchronousTestCase

from svc.pki.errors import InvalidName, IssuanceError, PKIError
from svc.pki.issuance import (
    CertifiedKey,
    issue_agent_leaf,
    issue_org_root,
    issue_tenant_intermediate,
)
from svc.pki.test.profiles import (
    CA_USAGE,
    END_ENTITY_EXTENSIONS,
    NOW,
    TD,
    ProfileAssertions,
    ext,
    material,
)


class OrgRootTests(ProfileAssertions):
    """
    The org root profile.
    """

    def test_subject(self) -> None:
        """The subject and issuer are exactly CN '<ORG> Root CA'."""
        cert = material().root.cert
        expected = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Acme Root CA")])
        self.assertEqual(cert.subject, expected)
        self.assertEqual(cert.issuer, expected)

    def test_self_signed_ed25519(self) -> None:
        """The root is an ed25519 v3 certificate signed by its own key."""
        root = material().root
        self.assertEd25519(root)
        root.cert.verify_directly_issued_by(root.cert)

    def test_ca_path_length_one(self) -> None:
        """BasicConstraints is critical CA=true with path length 1."""
        self.assertBasics(material().root.cert, ca=True, path_length=1)

    def test_key_usage(self) -> None:
        """KeyUsage is critical keyCertSign + cRLSign and nothing else."""
        self.assertUsage(material().root.cert, CA_USAGE)

    def test_validity_ten_years(self) -> None:
        """NotAfter is now + 3650 days; NotBefore now - 5 minutes."""
        self.assertValidity(material().root.cert, timedelta(days=3650))

    def test_extensions(self) -> None:
        """The root carries exactly BasicConstraints, KeyUsage and its SKI."""
        cert = material().root.cert
        self.assertSki(cert)
        self.assertExtensions(
            cert,
            {
                ExtensionOID.BASIC_CONSTRAINTS,
                ExtensionOID.KEY_USAGE,
                ExtensionOID.SUBJECT_KEY_IDENTIFIER,
            },
        )

    def test_serials_random(self) -> None:
        """Two roots issued at the same time get different positive serials."""
        a = issue_org_root("Acme", NOW).cert.serial_number
        b = issue_org_root("Acme", NOW).cert.serial_number
        self.assertNotEqual(a, b)
        self.assertGreater(min(a, b), 0)

    def test_naive_time_refused(self) -> None:
        """A timezone-naive now is refused rather than guessed at."""
        self.assertRaises(InvalidName, issue_org_root, "Acme", datetime(2031, 1, 1))

    def test_bad_org_refused(self) -> None:
        """Organisation names with control characters or too long are refused."""
        self.assertRaises(InvalidName, issue_org_root, "Ac\nme", NOW)
        self.assertRaises(InvalidName, issue_org_root, "A" * 57, NOW)
        issue_org_root("A" * 56, NOW)

    def test_explicit_key_used(self) -> None:
        """A caller-supplied key becomes the root's key."""
        key = Ed25519PrivateKey.generate()
        self.assertIs(issue_org_root("Acme", NOW, key=key).key, key)

    def test_nonpositive_ttl_refused(self) -> None:
        """A zero validity is refused."""
        self.assertRaises(IssuanceError, issue_org_root, "Acme", NOW, ttl=timedelta(0))


class TenantIntermediateTests(ProfileAssertions):
    """
    The tenant intermediate profile.
    """

    def test_subject(self) -> None:
        """Subject is OU 'tenant=<id>' and CN '<ORG> Tenant <id> Intermediate'."""
        cert = material().intermediate.cert
        self.assertEqual(
            cert.subject,
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "tenant=t-1"),
                    x509.NameAttribute(NameOID.COMMON_NAME, "Acme Tenant t-1 Intermediate"),
                ]
            ),
        )

    def test_signed_by_root(self) -> None:
        """The intermediate is signed by the root, AKI = root SKI, ed25519."""
        m = material()
        self.assertLinked(m.intermediate.cert, m.root.cert)
        self.assertSki(m.intermediate.cert)
        self.assertEd25519(m.intermediate)

    def test_ca_path_length_zero(self) -> None:
        """BasicConstraints is critical CA=true with path length 0."""
        self.assertBasics(material().intermediate.cert, ca=True, path_length=0)

    def test_key_usage(self) -> None:
        """KeyUsage is critical keyCertSign + cRLSign."""
        self.assertUsage(material().intermediate.cert, CA_USAGE)

    def test_name_constraint(self) -> None:
        """A critical name constraint permits only URIs in the trust domain."""
        extension = ext(material().intermediate.cert, ExtensionOID.NAME_CONSTRAINTS)
        self.assertTrue(extension.critical)
        self.assertEqual(
            extension.value,
            x509.NameConstraints(
                permitted_subtrees=[x509.UniformResourceIdentifier(TD)], excluded_subtrees=None
            ),
        )

    def test_validity_one_year(self) -> None:
        """NotAfter is now + 365 days; NotBefore now - 5 minutes."""
        self.assertValidity(material().intermediate.cert, timedelta(days=365))

    def test_extensions(self) -> None:
        """Exactly BasicConstraints, KeyUsage, NameConstraints, SKI, AKI; no SAN."""
        self.assertExtensions(
            material().intermediate.cert,
            {
                ExtensionOID.BASIC_CONSTRAINTS,
                ExtensionOID.KEY_USAGE,
                ExtensionOID.NAME_CONSTRAINTS,
                ExtensionOID.SUBJECT_KEY_IDENTIFIER,
                ExtensionOID.AUTHORITY_KEY_IDENTIFIER,
            },
        )

    def test_issuer_must_be_root(self) -> None:
        """An intermediate cannot issue another intermediate."""
        self.assertRaises(
            IssuanceError,
            issue_tenant_intermediate,
            material().intermediate,
            "t-9",
            TD,
            NOW,
        )

    def test_root_must_outlive(self) -> None:
        """An intermediate that would outlive the root is refused."""
        late = NOW + timedelta(days=3650) - timedelta(days=30)
        self.assertRaises(
            IssuanceError, issue_tenant_intermediate, material().root, "t-9", TD, late
        )

    def test_common_name_budget(self) -> None:
        """An org name plus tenant id too long for a 64-character CN is refused."""
        root = issue_org_root("A" * 40, NOW)
        self.assertRaises(InvalidName, issue_tenant_intermediate, root, "t" * 10, TD, NOW)

    def test_bad_inputs(self) -> None:
        """Bad tenant ids and trust domains are refused."""
        root = material().root
        for tenant in ("a/b", "..", "a..b", "", "-a", "é"):
            self.assertRaises(InvalidName, issue_tenant_intermediate, root, tenant, TD, NOW)
        for domain in ("Example.org", "exa mple.org", "a/b", "", "spiffe://x"):
            self.assertRaises(InvalidName, issue_tenant_intermediate, root, "t", domain, NOW)


class AgentLeafTests(ProfileAssertions):
    """
    The agent leaf profile.
    """

    def test_subject(self) -> None:
        """Subject is OU 'tenant=<tenant>' and CN '<user_id>'."""
        self.assertEqual(
            material().leaf.cert.subject,
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "tenant=t-1"),
                    x509.NameAttribute(NameOID.COMMON_NAME, "alice"),
                ]
            ),
        )

    def test_sans(self) -> None:
        """URI SANs are exactly the tenant and agent SPIFFE ids, nothing else."""
        self.assertSans(
            material().leaf.cert,
            [
                x509.UniformResourceIdentifier(f"spiffe://{TD}/tenant/t-1"),
                x509.UniformResourceIdentifier(f"spiffe://{TD}/agent/agent.7"),
            ],
        )

    def test_usage(self) -> None:
        """KeyUsage critical digitalSignature only; EKU clientAuth; not a CA."""
        cert = material().leaf.cert
        self.assertUsage(cert, {"digital_signature"})
        self.assertPurpose(cert, ExtendedKeyUsageOID.CLIENT_AUTH)
        self.assertBasics(cert, ca=False, path_length=None)

    def test_validity_one_hour_backdated(self) -> None:
        """NotAfter is now + 1 hour and NotBefore is back-dated 5 minutes."""
        self.assertValidity(material().leaf.cert, timedelta(hours=1))

    def test_signed_by_intermediate(self) -> None:
        """The leaf is an ed25519 cert signed by its tenant intermediate."""
        m = material()
        self.assertLinked(m.leaf.cert, m.intermediate.cert)
        self.assertSki(m.leaf.cert)
        self.assertEd25519(m.leaf)
        self.assertExtensions(m.leaf.cert, END_ENTITY_EXTENSIONS)

    def test_other_tenant_intermediate_refused(self) -> None:
        """Issuing under another tenant's intermediate is refused."""
        self.assertRaises(
            IssuanceError,
            issue_agent_leaf,
            material().other_intermediate,
            tenant_id="t-1",
            agent_id="a",
            user_id="u",
            trust_domain=TD,
            now=NOW,
        )

    def test_other_trust_domain_refused(self) -> None:
        """Issuing for a trust domain the intermediate is not constrained to is refused."""
        self.assertRaises(
            IssuanceError,
            issue_agent_leaf,
            material().intermediate,
            tenant_id="t-1",
            agent_id="a",
            user_id="u",
            trust_domain="other.org",
            now=NOW,
        )

    def test_root_cannot_sign_agents(self) -> None:
        """The org root is not a tenant intermediate and cannot sign agent leaves."""
        self.assertRaises(
            IssuanceError,
            issue_agent_leaf,
            material().root,
            tenant_id="t-1",
            agent_id="a",
            user_id="u",
            trust_domain=TD,
            now=NOW,
        )

    def test_intermediate_must_outlive(self) -> None:
        """A leaf that would outlive its intermediate is refused."""
        late = NOW + timedelta(days=365) - timedelta(minutes=30)
        self.assertRaises(
            IssuanceError,
            issue_agent_leaf,
            material().intermediate,
            tenant_id="t-1",
            agent_id="a",
            user_id="u",
            trust_domain=TD,
            now=late,
        )

    def test_bad_ids_refused(self) -> None:
        """Agent and user ids with slashes, '..', or over 64 characters are refused."""
        for bad in ("a/b", "..", "x..", "%2e", "a" * 65, "a b"):
            self.assertRaises(
                InvalidName,
                issue_agent_leaf,
                material().intermediate,
                tenant_id="t-1",
                agent_id=bad,
                user_id="u",
                trust_domain=TD,
                now=NOW,
            )
            self.assertRaises(
                InvalidName,
                issue_agent_leaf,
                material().intermediate,
                tenant_id="t-1",
                agent_id="a",
                user_id=bad,
                trust_domain=TD,
                now=NOW,
            )


class CertifiedKeyTests(SynchronousTestCase):
    """
    The certificate + key pair value.
    """

    def test_mismatched_key_refused(self) -> None:
        """Pairing a certificate with a key that is not its own is refused."""
        self.assertRaises(
            PKIError, CertifiedKey, material().root.cert, Ed25519PrivateKey.generate()
        )

    def test_key_not_in_repr(self) -> None:
        """The private key never appears in the repr."""
        pair = material().leaf
        text = repr(pair)
        self.assertNotIn("key=", text)
        self.assertNotIn(pair.key_pem().decode().splitlines()[1][:20], text)
