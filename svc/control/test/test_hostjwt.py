"""
Tests for L{svc.control.hostjwt}: every check of the spec's host JWT
verification, for each supported key type.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import warnings
from collections.abc import Mapping
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa, x25519
from twisted.internet.task import Clock
from twisted.logger import capturedLogs
from twisted.trial.unittest import SynchronousTestCase

from svc.config import ConfigError
from svc.control.hostjwt import (
    HostIdentity,
    HostJwtPolicy,
    HostJwtVerifier,
    HostTokenRejected,
    TenantNotAllowed,
    algorithm_for_key,
    check_claims,
)
from svc.control.test.support import (
    PrivateKey,
    b64url,
    ec_key,
    ed25519_key,
    mint,
    public_pem,
    rsa_key,
    unsigned,
)

NOW = 1_800_000_000
AUDIENCE = "svc-control"
ISSUER = "https://idp.example"

POLICY = HostJwtPolicy(
    audience=AUDIENCE, issuer=ISSUER, tenant_claim="tenant", tenant_allowlist={"acme", "globex"}
)


def claims(**overrides: object) -> dict[str, object]:
    """A claim set that passes every check, with C{overrides} applied (None deletes)."""
    base: dict[str, object] = {
        "iss": ISSUER,
        "aud": AUDIENCE,
        "exp": NOW + 300,
        "nbf": NOW - 10,
        "sub": "host-7",
        "tenant": "acme",
    }
    for name, value in overrides.items():
        if value is None:
            base.pop(name, None)
        else:
            base[name] = value
    return base


def verifier(key: PrivateKey, policy: HostJwtPolicy = POLICY) -> HostJwtVerifier:
    """A verifier for C{key}'s public half at time L{NOW}."""
    clock = Clock()
    clock.advance(NOW)
    return HostJwtVerifier(public_pem(key), policy, clock.seconds)


class AlgorithmTests(SynchronousTestCase):
    """
    Check 1 (algorithm fixed by key type) and check 2 (signature).
    """

    def assertRejected(self, v: HostJwtVerifier, token: str, reason: str) -> None:
        error = self.assertRaises(HostTokenRejected, v.verify, token)
        self.assertEqual(error.reason, reason)

    def test_each_key_type(self) -> None:
        """RSA/RS256, P-256/ES256 and Ed25519/EdDSA tokens verify."""
        for key, algorithm in ((rsa_key(), "RS256"), (ec_key(), "ES256"), (ed25519_key(), "EdDSA")):
            v = verifier(key)
            self.assertEqual(v.algorithm, algorithm)
            self.assertEqual(v.verify(mint(key, claims())), HostIdentity("acme", "host-7"))

    def test_algorithm_for_key(self) -> None:
        """The algorithm comes from the key's type."""
        self.assertEqual(algorithm_for_key(rsa_key().public_key()), "RS256")
        self.assertEqual(algorithm_for_key(ec_key().public_key()), "ES256")
        self.assertEqual(algorithm_for_key(ed25519_key().public_key()), "EdDSA")

    def test_unsupported_keys_refuse_start(self) -> None:
        """P-384, Ed448, X25519 and short RSA keys are a ConfigError naming the key file."""
        keys: list[PrivateKey | ed448.Ed448PrivateKey | x25519.X25519PrivateKey] = [
            ec.generate_private_key(ec.SECP384R1()),
            ed448.Ed448PrivateKey.generate(),
            x25519.X25519PrivateKey.generate(),
            rsa.generate_private_key(public_exponent=65537, key_size=1024),
        ]
        for key in keys:
            error = self.assertRaises(
                ConfigError,
                HostJwtVerifier,
                public_pem(key),
                POLICY,
                lambda: NOW,
            )
            self.assertEqual(error.variable, "SVC_IDENTITY_PUBLIC_KEY_FILE")

    def test_not_a_public_key_refuses_start(self) -> None:
        """A file that is not a PEM public key is a ConfigError."""
        for pem in (
            b"",
            b"not pem",
            b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        ):
            error = self.assertRaises(ConfigError, HostJwtVerifier, pem, POLICY, lambda: NOW)
            self.assertEqual(error.variable, "SVC_IDENTITY_PUBLIC_KEY_FILE")

    def test_unreadable_file_refuses_start(self) -> None:
        """A key file that cannot be read is a ConfigError naming the variable."""
        error = self.assertRaises(
            ConfigError, HostJwtVerifier.from_file, Path(self.mktemp()), POLICY, lambda: NOW
        )
        self.assertEqual(error.variable, "SVC_IDENTITY_PUBLIC_KEY_FILE")

    def test_from_file(self) -> None:
        """A key read through the injected reader verifies tokens."""
        pem = public_pem(ed25519_key())
        v = HostJwtVerifier.from_file(Path("/k.pem"), POLICY, lambda: NOW, lambda path: pem)
        self.assertEqual(v.verify(mint(ed25519_key(), claims())).tenant_id, "acme")

    def test_hs256_with_public_pem_rejected(self) -> None:
        """HS256 keyed with the RSA public PEM as the HMAC secret is rejected."""
        pem = public_pem(rsa_key())
        header = b64url(b'{"alg":"HS256","typ":"JWT"}')
        body = b64url(json.dumps(claims()).encode())
        signature = hmac.new(pem, f"{header}.{body}".encode(), hashlib.sha256).digest()
        token = f"{header}.{body}.{b64url(signature)}"
        self.assertRejected(verifier(rsa_key()), token, "algorithm_not_allowed")

    def test_alg_none_rejected(self) -> None:
        """An unsigned token (alg none) is rejected for every key type."""
        token = unsigned({"alg": "none", "typ": "JWT"}, claims(), b"")
        for key in (rsa_key(), ec_key(), ed25519_key()):
            self.assertRejected(verifier(key), token, "algorithm_not_allowed")

    def test_cross_key_type_rejected(self) -> None:
        """An ES256 token against an RSA key and an RS256 token against Ed25519 are rejected."""
        self.assertRejected(verifier(rsa_key()), mint(ec_key(), claims()), "algorithm_not_allowed")
        self.assertRejected(
            verifier(ed25519_key()), mint(rsa_key(), claims()), "algorithm_not_allowed"
        )
        self.assertRejected(
            verifier(ec_key()), mint(ed25519_key(), claims()), "algorithm_not_allowed"
        )

    def test_same_key_other_algorithm_rejected(self) -> None:
        """A token signed by the right RSA key with RS512 is rejected: only RS256 is allowed."""
        token = mint(rsa_key(), claims(), alg="RS512")
        self.assertRejected(verifier(rsa_key()), token, "algorithm_not_allowed")

    def test_other_key_rejected(self) -> None:
        """A token signed by another key of the right type fails the signature check."""
        other = ed25519.Ed25519PrivateKey.generate()
        self.assertRejected(verifier(ed25519_key()), mint(other, claims()), "bad_signature")

    def test_tampered_payload_rejected(self) -> None:
        """Changing the payload of a signed token fails the signature check."""
        header, _, signature = mint(ec_key(), claims()).split(".")
        forged = b64url(json.dumps(claims(tenant="globex")).encode())
        self.assertRejected(verifier(ec_key()), f"{header}.{forged}.{signature}", "bad_signature")

    def test_malformed_rejected(self) -> None:
        """Strings that are not a compact JWS are rejected."""
        for token in ("", "garbage", "a.b.c", "a.b", "é.é.é"):
            self.assertRejected(verifier(ed25519_key()), token, "malformed")

    def test_eddsa_warning_suppressed(self) -> None:
        """Verifying an EdDSA token emits no warning (joserfc's is suppressed locally)."""
        token = mint(ed25519_key(), claims())
        v = verifier(ed25519_key())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            v.verify(token)
        self.assertEqual([str(w.message) for w in caught], [])

    def test_rejection_logged_with_reason(self) -> None:
        """A rejection is logged as host_identity_rejected with its reason."""
        with capturedLogs() as events:
            self.assertRaises(
                HostTokenRejected, verifier(ec_key()).verify, mint(ec_key(), claims(exp=NOW - 61))
            )
        logged = [e for e in events if e.get("host_identity_rejected")]
        self.assertEqual([e["reason"] for e in logged], ["expired"])


class ClaimTests(SynchronousTestCase):
    """
    Checks 3-7 on claim sets (L{check_claims}), at time L{NOW}.
    """

    def assertRejected(self, claim_set: Mapping[str, object], reason: str) -> None:
        error = self.assertRaises(HostTokenRejected, check_claims, claim_set, POLICY, NOW)
        self.assertEqual(error.reason, reason)

    def assertAccepted(
        self, claim_set: Mapping[str, object], policy: HostJwtPolicy = POLICY
    ) -> None:
        self.assertEqual(
            check_claims(claim_set, policy, NOW).tenant_id, claim_set.get("tenant", "acme")
        )

    def test_issuer(self) -> None:
        """A configured issuer must match exactly; missing or different is rejected."""
        self.assertAccepted(claims())
        self.assertRejected(claims(iss=ISSUER + "/"), "issuer_mismatch")
        self.assertRejected(claims(iss=None), "issuer_mismatch")

    def test_issuer_not_configured(self) -> None:
        """Without a configured issuer any or no iss is accepted."""
        policy = HostJwtPolicy(AUDIENCE, None, "tenant", {"acme"})
        self.assertAccepted(claims(iss="anyone"), policy)
        self.assertAccepted(claims(iss=None), policy)

    def test_audience_forms(self) -> None:
        """aud as the audience string or an array containing it is accepted."""
        self.assertAccepted(claims(aud=AUDIENCE))
        self.assertAccepted(claims(aud=["other", AUDIENCE]))

    def test_audience_rejected(self) -> None:
        """A different string, an array without it, missing or non-string aud is rejected."""
        for aud in ("other", ["other", "x"], [], None, 5, {"aud": AUDIENCE}, [[AUDIENCE]]):
            self.assertRejected(claims(aud=aud), "audience_mismatch")

    def test_exp_required(self) -> None:
        """A token without exp is rejected."""
        self.assertRejected(claims(exp=None), "exp_missing")

    def test_exp_skew_edge(self) -> None:
        """exp = now - 60 is accepted; exp = now - 60.5 and now - 61 are rejected."""
        self.assertAccepted(claims(exp=NOW - 60))
        self.assertRejected(claims(exp=NOW - 60.5), "expired")
        self.assertRejected(claims(exp=NOW - 61), "expired")

    def test_exp_not_numeric(self) -> None:
        """A string, boolean or non-finite exp is rejected."""
        for exp in (str(NOW + 300), True, float("inf"), float("nan")):
            self.assertRejected(claims(exp=exp), "exp_not_numeric")

    def test_nbf_skew_edge(self) -> None:
        """nbf = now + 60 is accepted; nbf = now + 61 is rejected; no nbf is fine."""
        self.assertAccepted(claims(nbf=NOW + 60))
        self.assertRejected(claims(nbf=NOW + 61), "not_yet_valid")
        self.assertAccepted(claims(nbf=None))

    def test_nbf_not_numeric(self) -> None:
        """A present but non-numeric nbf is rejected."""
        self.assertRejected(claims(nbf="soon"), "nbf_not_numeric")

    def test_tenant_malformed(self) -> None:
        """A missing, empty or non-string tenant claim is rejected (401, not 403)."""
        for tenant in ("", 123, ["acme"], {"id": "acme"}, True):
            self.assertRejected(claims(tenant=tenant), "tenant_claim_missing")
        self.assertRejected(claims(tenant=None), "tenant_claim_missing")

    def test_tenant_not_allowed(self) -> None:
        """A well-formed tenant off the allowlist raises TenantNotAllowed."""
        error = self.assertRaises(
            TenantNotAllowed, check_claims, claims(tenant="initech"), POLICY, NOW
        )
        self.assertEqual((error.tenant_id, error.subject), ("initech", "host-7"))

    def test_failures_before_allowlist(self) -> None:
        """An expired token naming a forbidden tenant is a rejection, not a 403."""
        self.assertRejected(claims(exp=NOW - 3600, tenant="initech"), "expired")

    def test_custom_tenant_claim(self) -> None:
        """The tenant comes from the configured claim name only."""
        policy = HostJwtPolicy(AUDIENCE, ISSUER, "org", {"acme"})
        identity = check_claims(claims(tenant=None, org="acme"), policy, NOW)
        self.assertEqual(identity.tenant_id, "acme")
        self.assertRaises(HostTokenRejected, check_claims, claims(), policy, NOW)

    def test_subject(self) -> None:
        """sub becomes the subject; a missing or non-string sub is empty."""
        self.assertEqual(check_claims(claims(), POLICY, NOW).subject, "host-7")
        self.assertEqual(check_claims(claims(sub=None), POLICY, NOW).subject, "")
        self.assertEqual(check_claims(claims(sub=5), POLICY, NOW).subject, "")

    def test_empty_allowlist_refuses_start(self) -> None:
        """An empty allowlist is a ConfigError naming SVC_IDENTITY_TENANT_ALLOWLIST."""
        error = self.assertRaises(ConfigError, HostJwtPolicy, AUDIENCE, None, "tenant", [])
        self.assertEqual(error.variable, "SVC_IDENTITY_TENANT_ALLOWLIST")

    def test_through_verifier(self) -> None:
        """The claim checks apply to signed tokens, with the verifier's clock."""
        v = verifier(ed25519_key())
        self.assertEqual(v.verify(mint(ed25519_key(), claims(exp=NOW - 60))).tenant_id, "acme")
        self.assertRaises(HostTokenRejected, v.verify, mint(ed25519_key(), claims(exp=NOW - 61)))
        self.assertRaises(TenantNotAllowed, v.verify, mint(ed25519_key(), claims(tenant="x")))
