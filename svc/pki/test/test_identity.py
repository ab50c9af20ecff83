"""
Tests for L{svc.pki.identity}: the data-plane admission rules, the
control-plane identity check, and the deny-list value.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from twisted.trial.unittest import SynchronousTestCase

from svc.pki.errors import AdmissionRefused, InvalidName, RefusalReason
from svc.pki.identity import (
    AgentIdentity,
    ControlIdentity,
    DenyList,
    admit_agent,
    control_identity,
)
from svc.pki.names import format_serial
from svc.testing.pki import AgentCredentials, forge_leaf, shared_test_pki

TD = shared_test_pki().trust_domain
TENANT_URI = f"spiffe://{TD}/tenant/tenant-a"
AGENT_URI = f"spiffe://{TD}/agent/agent-1"


class AdmitAgentTests(SynchronousTestCase):
    """
    L{admit_agent}, one test per rule.
    """

    def admit(self, creds: AgentCredentials, deny_list: DenyList | None = None) -> AgentIdentity:
        return admit_agent(creds.leaf.cert, creds.chain[0], TD, deny_list or DenyList())

    def assertRefused(
        self,
        creds: AgentCredentials,
        reason: RefusalReason,
        deny_list: DenyList | None = None,
    ) -> None:
        error = self.assertRaises(AdmissionRefused, self.admit, creds, deny_list)
        self.assertEqual(error.reason, reason)

    def forged(
        self,
        *uris: str,
        ou: str | None = "tenant=tenant-a",
        user_id: str = "user-1",
        purpose: x509.ObjectIdentifier = ExtendedKeyUsageOID.CLIENT_AUTH,
        ca: bool = False,
        extra_sans: Sequence[x509.GeneralName] = (),
    ) -> AgentCredentials:
        return shared_test_pki().forged_agent(
            "tenant-a",
            uris=uris,
            ou=ou,
            user_id=user_id,
            purpose=purpose,
            ca=ca,
            extra_sans=extra_sans,
        )

    def test_admitted(self) -> None:
        """A good leaf yields tenant, agent, user (CN), hex serial, subject and expiry."""
        creds = shared_test_pki().agent("tenant-a", "agent-1", "alice")
        identity = self.admit(creds)
        cert = creds.leaf.cert
        self.assertEqual(
            identity,
            AgentIdentity(
                tenant_id="tenant-a",
                agent_id="agent-1",
                user_id="alice",
                serial=format(cert.serial_number, "x"),
                subject="CN=alice,OU=tenant=tenant-a",
                not_after=cert.not_valid_after_utc,
            ),
        )

    def test_forged_baseline_admitted(self) -> None:
        """A forged leaf with exactly the right SANs and OU is admitted (the control case)."""
        self.assertEqual(self.admit(self.forged(TENANT_URI, AGENT_URI)).agent_id, "agent-1")

    def test_wrong_intermediate(self) -> None:
        """A leaf paired with an intermediate that did not issue it is a chain mismatch."""
        pki = shared_test_pki()
        creds = pki.agent("tenant-a", "agent-1")
        error = self.assertRaises(
            AdmissionRefused,
            admit_agent,
            creds.leaf.cert,
            pki.intermediates["tenant-b"].cert,
            TD,
            DenyList(),
        )
        self.assertEqual(error.reason, RefusalReason.CHAIN_MISMATCH)

    def test_server_purpose(self) -> None:
        """A leaf for serverAuth only is not a client certificate."""
        creds = self.forged(TENANT_URI, AGENT_URI, purpose=ExtendedKeyUsageOID.SERVER_AUTH)
        self.assertRefused(creds, RefusalReason.NOT_A_CLIENT_CERT)

    def test_ca_leaf(self) -> None:
        """A leaf marked CA=true is not a client certificate."""
        self.assertRefused(
            self.forged(TENANT_URI, AGENT_URI, ca=True), RefusalReason.NOT_A_CLIENT_CERT
        )

    def test_no_tenant_san(self) -> None:
        """A leaf with an agent SAN but no tenant SAN is refused."""
        self.assertRefused(self.forged(AGENT_URI), RefusalReason.NO_TENANT_SAN)

    def test_no_sans_at_all(self) -> None:
        """A leaf without a SAN extension has no tenant SAN."""
        self.assertRefused(self.forged(), RefusalReason.NO_TENANT_SAN)

    def test_wrong_trust_domain(self) -> None:
        """SPIFFE SANs in another trust domain are refused."""
        creds = shared_test_pki().wrong_domain_agent("tenant-a", "agent-1", "other.test")
        self.assertRefused(creds, RefusalReason.WRONG_TRUST_DOMAIN)

    def test_one_san_in_other_domain(self) -> None:
        """A single foreign-domain SAN beside good ones is refused."""
        creds = self.forged(TENANT_URI, AGENT_URI, "spiffe://other.test/agent/x")
        self.assertRefused(creds, RefusalReason.WRONG_TRUST_DOMAIN)

    def test_tenant_only(self) -> None:
        """A tenant-only certificate (no agent SAN) is refused."""
        self.assertRefused(
            shared_test_pki().tenant_only_agent("tenant-a"), RefusalReason.NO_AGENT_SAN
        )

    def test_two_agents(self) -> None:
        """Two agent SANs are refused."""
        creds = self.forged(TENANT_URI, AGENT_URI, f"spiffe://{TD}/agent/agent-2")
        self.assertRefused(creds, RefusalReason.MULTIPLE_TENANT_OR_AGENT_SANS)

    def test_two_tenants(self) -> None:
        """Two tenant SANs are refused."""
        creds = self.forged(TENANT_URI, f"spiffe://{TD}/tenant/tenant-b", AGENT_URI)
        self.assertRefused(creds, RefusalReason.MULTIPLE_TENANT_OR_AGENT_SANS)

    def test_extra_spiffe_path(self) -> None:
        """An extra SPIFFE id of another kind (control) is unexpected."""
        creds = self.forged(TENANT_URI, AGENT_URI, f"spiffe://{TD}/control")
        self.assertRefused(creds, RefusalReason.UNEXPECTED_SAN)

    def test_extra_non_spiffe_uri(self) -> None:
        """A non-SPIFFE URI SAN is unexpected."""
        creds = self.forged(TENANT_URI, AGENT_URI, "https://example.test/")
        self.assertRefused(creds, RefusalReason.UNEXPECTED_SAN)

    def test_extra_dns_san(self) -> None:
        """A DNS SAN on an agent leaf is unexpected."""
        creds = self.forged(TENANT_URI, AGENT_URI, extra_sans=[x509.DNSName("dataplane.test")])
        self.assertRefused(creds, RefusalReason.UNEXPECTED_SAN)

    def test_agent_id_with_traversal(self) -> None:
        """An agent SAN whose id would climb out of a directory is malformed."""
        for uri in (
            f"spiffe://{TD}/agent/../x",
            f"spiffe://{TD}/agent/a%2Fb",
            f"spiffe://{TD}/agent/",
        ):
            self.assertRefused(self.forged(TENANT_URI, uri), RefusalReason.MALFORMED_IDENTITY)

    def test_tenant_id_malformed(self) -> None:
        """A tenant SAN with a path inside is malformed."""
        creds = self.forged(f"spiffe://{TD}/tenant/a/b", AGENT_URI)
        self.assertRefused(creds, RefusalReason.MALFORMED_IDENTITY)

    def test_bad_common_name(self) -> None:
        """A CN that is not a valid user id is malformed."""
        creds = self.forged(TENANT_URI, AGENT_URI, user_id="bad user")
        self.assertRefused(creds, RefusalReason.MALFORMED_IDENTITY)

    def test_intermediate_of_other_tenant(self) -> None:
        """A leaf for tenant A signed by tenant B's intermediate breaks the tenant binding."""
        creds = shared_test_pki().cross_tenant_agent("tenant-a", "agent-1", "tenant-b")
        self.assertRefused(creds, RefusalReason.TENANT_BINDING)

    def test_leaf_ou_other_tenant(self) -> None:
        """A leaf whose OU names another tenant than its SAN breaks the tenant binding."""
        creds = self.forged(TENANT_URI, AGENT_URI, ou="tenant=tenant-b")
        self.assertRefused(creds, RefusalReason.TENANT_BINDING)

    def test_leaf_without_ou(self) -> None:
        """A leaf without the OU breaks the tenant binding."""
        self.assertRefused(
            self.forged(TENANT_URI, AGENT_URI, ou=None), RefusalReason.TENANT_BINDING
        )

    def test_denied_serial(self) -> None:
        """A leaf whose serial is on the deny-list is refused."""
        creds = shared_test_pki().agent("tenant-a", "agent-1")
        cert = creds.leaf.cert
        denied = DenyList.of([(format_serial(cert.serial_number), cert.not_valid_after_utc)])
        self.assertRefused(creds, RefusalReason.DENIED_SERIAL, denied)

    def test_retired_intermediate(self) -> None:
        """A leaf whose intermediate's serial is deny-listed (rotated out) is refused."""
        creds = shared_test_pki().agent("tenant-a", "agent-1")
        intermediate = creds.chain[0]
        denied = DenyList.of(
            [(format_serial(intermediate.serial_number), intermediate.not_valid_after_utc)]
        )
        self.assertRefused(creds, RefusalReason.DENIED_SERIAL, denied)

    def test_other_serial_not_denied(self) -> None:
        """A deny-list holding other serials does not affect a leaf."""
        creds = shared_test_pki().agent("tenant-a", "agent-1")
        other = shared_test_pki().agent("tenant-a", "agent-1")
        cert = other.leaf.cert
        denied = DenyList.of([(format_serial(cert.serial_number), cert.not_valid_after_utc)])
        self.assertEqual(self.admit(creds, denied).agent_id, "agent-1")


class ControlIdentityTests(SynchronousTestCase):
    """
    L{control_identity}.
    """

    def forge(self, *uris: str, common_name: str = "svc-control") -> x509.Certificate:
        pki = shared_test_pki()
        return forge_leaf(pki.root, pki.now, uris=uris, common_name=common_name, ou=None).cert

    def assertRefused(self, cert: x509.Certificate, reason: RefusalReason) -> None:
        error = self.assertRaises(
            AdmissionRefused, control_identity, cert, shared_test_pki().root.cert, TD
        )
        self.assertEqual(error.reason, reason)

    def test_control_cert(self) -> None:
        """The control-plane certificate is recognised with its serial and subject."""
        pki = shared_test_pki()
        cert = pki.control.cert
        self.assertEqual(
            control_identity(cert, pki.root.cert, TD),
            ControlIdentity(
                serial=format_serial(cert.serial_number),
                subject="CN=svc-control",
                not_after=cert.not_valid_after_utc,
            ),
        )

    def test_agent_leaf_refused(self) -> None:
        """An agent leaf is not issued by the root and is refused."""
        pki = shared_test_pki()
        self.assertRefused(pki.agent("tenant-a", "agent-1").leaf.cert, RefusalReason.CHAIN_MISMATCH)

    def test_other_root_refused(self) -> None:
        """A control certificate checked against another org's root is refused."""
        pki = shared_test_pki()
        error = self.assertRaises(
            AdmissionRefused, control_identity, pki.control.cert, pki.other_root.cert, TD
        )
        self.assertEqual(error.reason, RefusalReason.CHAIN_MISMATCH)

    def test_server_leaf_refused(self) -> None:
        """A server leaf is not a client certificate."""
        self.assertRefused(shared_test_pki().server.cert, RefusalReason.NOT_A_CLIENT_CERT)

    def test_wrong_san(self) -> None:
        """A root-signed client cert with an agent SAN is not the control plane."""
        self.assertRefused(self.forge(AGENT_URI), RefusalReason.NO_CONTROL_SAN)
        self.assertRefused(
            self.forge(f"spiffe://{TD}/control", AGENT_URI), RefusalReason.NO_CONTROL_SAN
        )

    def test_wrong_domain(self) -> None:
        """The control SPIFFE id of another trust domain is refused."""
        self.assertRefused(
            self.forge("spiffe://other.test/control"), RefusalReason.WRONG_TRUST_DOMAIN
        )

    def test_wrong_common_name(self) -> None:
        """The right SAN with another CN is refused."""
        self.assertRefused(
            self.forge(f"spiffe://{TD}/control", common_name="imposter"),
            RefusalReason.MALFORMED_IDENTITY,
        )


class DenyListTests(SynchronousTestCase):
    """
    The immutable deny-list value.
    """

    T0 = datetime(2031, 1, 1, tzinfo=UTC)

    def test_membership(self) -> None:
        """Listed serials are members; others are not."""
        deny = DenyList.of([("abc", self.T0)])
        self.assertIn("abc", deny)
        self.assertNotIn("abd", deny)
        self.assertEqual(len(deny), 1)

    def test_active_ages_out(self) -> None:
        """Entries whose certificate has expired by now are dropped; others kept."""
        deny = DenyList.of([("a", self.T0), ("b", self.T0 + timedelta(hours=1))])
        self.assertEqual(deny.active(self.T0 - timedelta(seconds=1)), deny)
        at_expiry = deny.active(self.T0)
        self.assertNotIn("a", at_expiry)
        self.assertIn("b", at_expiry)
        self.assertEqual(len(deny.active(self.T0 + timedelta(hours=2))), 0)

    def test_with_entry_is_new_value(self) -> None:
        """Adding an entry returns a new list and leaves the original unchanged."""
        deny = DenyList()
        more = deny.with_entry("f00", self.T0)
        self.assertNotIn("f00", deny)
        self.assertIn("f00", more)
        self.assertEqual(more, DenyList.of([("f00", self.T0)]))

    def test_merged_is_the_union(self) -> None:
        """A serial in either list stays listed; a serial in both keeps the later not-after."""
        later = self.T0 + timedelta(hours=1)
        first = DenyList.of([("a", self.T0), ("b", later)])
        second = DenyList.of([("b", self.T0), ("c", self.T0)])
        merged = first.merged(second)
        self.assertEqual(merged, DenyList.of([("a", self.T0), ("b", later), ("c", self.T0)]))
        self.assertEqual(second.merged(first), merged)
        self.assertEqual(merged.merged(DenyList()), merged)

    def test_non_canonical_serial_refused(self) -> None:
        """Serials not in canonical lowercase hex are refused on construction."""
        for bad in ("ABC", "0abc", "0xabc", ""):
            self.assertRaises(InvalidName, DenyList.of, [(bad, self.T0)])

    def test_naive_time_refused(self) -> None:
        """Entry expiries must be timezone-aware."""
        self.assertRaises(InvalidName, DenyList.of, [("abc", datetime(2031, 1, 1))])
        self.assertRaises(InvalidName, DenyList().active, datetime(2031, 1, 1))
