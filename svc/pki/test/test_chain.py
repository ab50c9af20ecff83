"""
Tests for L{svc.pki.chain}: OpenSSL chain verification outside a handshake,
including the intermediate's URI name constraint.
"""

from __future__ import annotations

from datetime import timedelta

from twisted.trial.unittest import SynchronousTestCase

from svc.pki.chain import verify_chain
from svc.pki.errors import ChainVerificationError
from svc.pki.issuance import issue_tenant_intermediate
from svc.testing.pki import shared_test_pki

X509_V_ERR_CERT_NOT_YET_VALID = 9
X509_V_ERR_CERT_HAS_EXPIRED = 10
X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY = 20
X509_V_ERR_PERMITTED_VIOLATION = 47


class VerifyChainTests(SynchronousTestCase):
    """
    L{verify_chain} against the org root alone.
    """

    def test_agent_chain(self) -> None:
        """An agent leaf verifies through its intermediate; the chain is leaf..root."""
        pki = shared_test_pki()
        agent = pki.agent("tenant-a", "agent-1")
        chain = verify_chain(agent.leaf.cert, agent.chain, pki.root.cert, pki.now)
        self.assertEqual(chain, [agent.leaf.cert, agent.chain[0], pki.root.cert])

    def test_server_and_control(self) -> None:
        """Server and control certificates verify directly against the root."""
        pki = shared_test_pki()
        for pair in (pki.server, pki.control):
            self.assertEqual(
                verify_chain(pair.cert, [], pki.root.cert, pki.now), [pair.cert, pki.root.cert]
            )

    def test_name_constraint_rejects_other_domain(self) -> None:
        """A leaf whose URI SANs are in another trust domain violates the name constraint."""
        pki = shared_test_pki()
        agent = pki.wrong_domain_agent("tenant-a", "agent-1", "other.test")
        error = self.assertRaises(
            ChainVerificationError,
            verify_chain,
            agent.leaf.cert,
            agent.chain,
            pki.root.cert,
            pki.now,
        )
        self.assertEqual(error.code, X509_V_ERR_PERMITTED_VIOLATION)
        self.assertEqual(error.depth, 0)

    def test_name_constraint_rejects_subdomain(self) -> None:
        """The constraint names the host exactly: a subdomain of the trust domain is refused."""
        pki = shared_test_pki()
        agent = pki.wrong_domain_agent("tenant-a", "agent-1", "x." + pki.trust_domain)
        error = self.assertRaises(
            ChainVerificationError,
            verify_chain,
            agent.leaf.cert,
            agent.chain,
            pki.root.cert,
            pki.now,
        )
        self.assertEqual(error.code, X509_V_ERR_PERMITTED_VIOLATION)

    def test_foreign_root(self) -> None:
        """A chain from another org's root does not verify."""
        pki = shared_test_pki()
        agent = pki.foreign_agent("tenant-a", "agent-1")
        error = self.assertRaises(
            ChainVerificationError,
            verify_chain,
            agent.leaf.cert,
            agent.chain,
            pki.root.cert,
            pki.now,
        )
        self.assertEqual(error.code, X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY)

    def test_missing_intermediate(self) -> None:
        """A leaf without its intermediate does not verify."""
        pki = shared_test_pki()
        agent = pki.agent("tenant-a", "agent-1")
        self.assertRaises(
            ChainVerificationError, verify_chain, agent.leaf.cert, [], pki.root.cert, pki.now
        )

    def test_expiry_no_leeway(self) -> None:
        """The leaf verifies one second before NotAfter and not one second after."""
        pki = shared_test_pki()
        agent = pki.agent("tenant-a", "agent-1")
        end = agent.leaf.cert.not_valid_after_utc
        verify_chain(agent.leaf.cert, agent.chain, pki.root.cert, end - timedelta(seconds=1))
        error = self.assertRaises(
            ChainVerificationError,
            verify_chain,
            agent.leaf.cert,
            agent.chain,
            pki.root.cert,
            end + timedelta(seconds=1),
        )
        self.assertEqual(error.code, X509_V_ERR_CERT_HAS_EXPIRED)

    def test_backdating(self) -> None:
        """A leaf verifies 4 minutes before its issue time but not 6 minutes before."""
        pki = shared_test_pki()
        agent = pki.agent("tenant-a", "agent-1")
        verify_chain(agent.leaf.cert, agent.chain, pki.root.cert, pki.now - timedelta(minutes=4))
        error = self.assertRaises(
            ChainVerificationError,
            verify_chain,
            agent.leaf.cert,
            agent.chain,
            pki.root.cert,
            pki.now - timedelta(minutes=6),
        )
        self.assertEqual(error.code, X509_V_ERR_CERT_NOT_YET_VALID)

    def test_rotated_intermediate(self) -> None:
        """A leaf does not verify with a rotated intermediate of the same tenant."""
        pki = shared_test_pki()
        agent = pki.agent("tenant-a", "agent-1")
        rotated = issue_tenant_intermediate(pki.root, "tenant-a", pki.trust_domain, pki.now)
        self.assertRaises(
            ChainVerificationError,
            verify_chain,
            agent.leaf.cert,
            [rotated.cert],
            pki.root.cert,
            pki.now,
        )

    def test_other_root_as_anchor(self) -> None:
        """A good chain does not verify when another org's root is the only anchor."""
        pki = shared_test_pki()
        agent = pki.agent("tenant-a", "agent-1")
        self.assertRaises(
            ChainVerificationError,
            verify_chain,
            agent.leaf.cert,
            agent.chain,
            pki.other_root.cert,
            pki.now,
        )
