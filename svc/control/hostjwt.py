"""
Host JWT verification (spec "Host JWT verification").

A host proves its tenant with a JWT signed by its identity provider, checked
against exactly one static public key. The checks, in order:

  1. the algorithm is fixed by the key type (RSA: C{RS256}; ECDSA P-256:
     C{ES256}; Ed25519: C{EdDSA}), never taken from the token header; any
     other key type or curve refuses to start;
  2. the signature verifies;
  3. C{iss} equals the configured issuer exactly, if one is configured;
  4. C{aud} contains the audience (string or array form);
  5. C{exp} is present and C{now <= exp + 60};
  6. C{nbf}, if present, satisfies C{nbf <= now + 60};
  7. the tenant claim is a non-empty string on the allowlist.

Any failure of 1-7 raises L{HostTokenRejected} (a generic 401 at the HTTP
boundary; the reason is only logged, as C{host_identity_rejected}); a token
that passes 1-6 and carries a well-formed tenant that is not on the
allowlist raises L{TenantNotAllowed} (403 C{tenant_not_allowed}). C{sub}
becomes L{HostIdentity.subject}, for audit only.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import attrs
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from joserfc import jwt
from joserfc.errors import (
    BadSignatureError,
    JoseError,
    MissingAlgorithmError,
    SecurityWarning,
    UnsupportedAlgorithmError,
)
from joserfc.jwk import ECKey, OKPKey, RSAKey
from twisted.logger import Logger

from svc.config import ConfigError

CLOCK_SKEW_SECONDS = 60
"""Allowance on C{exp} and C{nbf} (spec "Limits")."""

MINIMUM_RSA_BITS = 2048

PUBLIC_KEY_VARIABLE = "SVC_IDENTITY_PUBLIC_KEY_FILE"
ALLOWLIST_VARIABLE = "SVC_IDENTITY_TENANT_ALLOWLIST"

_log = Logger()

VerificationKey = RSAKey | ECKey | OKPKey


@attrs.frozen
class HostIdentity:
    """
    A verified host: the tenant its token names and its C{sub} (empty when
    the token has none).
    """

    tenant_id: str
    subject: str


class HostTokenRejected(Exception):
    """
    The token failed a check. C{reason} is for the operator's log only and
    must never reach the client.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class TenantNotAllowed(Exception):
    """
    A validly signed, current token names a tenant not on the allowlist.
    """

    def __init__(self, tenant_id: str, subject: str) -> None:
        super().__init__(tenant_id)
        self.tenant_id = tenant_id
        self.subject = subject


def _string_set(value: Iterable[str]) -> frozenset[str]:
    return frozenset(value)


def _non_empty_allowlist(
    instance: object, attribute: attrs.Attribute[frozenset[str]], value: frozenset[str]
) -> None:
    if not value:
        raise ConfigError(ALLOWLIST_VARIABLE, "is empty; the host JWT verifier refuses to start")


@attrs.frozen
class HostJwtPolicy:
    """
    What a host token must say: checks 3-7.
    """

    audience: str
    issuer: str | None
    tenant_claim: str
    tenant_allowlist: frozenset[str] = attrs.field(
        converter=_string_set, validator=_non_empty_allowlist
    )


def algorithm_for_key(key: object) -> str:
    """
    The one JWS algorithm a public key verifies (check 1).

    @raise ConfigError: naming C{SVC_IDENTITY_PUBLIC_KEY_FILE}, for any other
        key type, curve, or an RSA key under 2048 bits.
    """
    if isinstance(key, rsa.RSAPublicKey):
        if key.key_size < MINIMUM_RSA_BITS:
            raise ConfigError(
                PUBLIC_KEY_VARIABLE, f"RSA key of {key.key_size} bits; at least 2048 required"
            )
        return "RS256"
    if isinstance(key, ec.EllipticCurvePublicKey):
        if not isinstance(key.curve, ec.SECP256R1):
            raise ConfigError(
                PUBLIC_KEY_VARIABLE, f"EC curve {key.curve.name} is not supported; use P-256"
            )
        return "ES256"
    if isinstance(key, ed25519.Ed25519PublicKey):
        return "EdDSA"
    raise ConfigError(
        PUBLIC_KEY_VARIABLE,
        f"{type(key).__name__} is not supported; use RSA, EC P-256 or Ed25519",
    )


def load_verification_key(pem: bytes) -> tuple[VerificationKey, str]:
    """
    Import a PKIX/SPKI PEM public key with its explicit key type, and the
    algorithm it fixes.

    @raise ConfigError: naming C{SVC_IDENTITY_PUBLIC_KEY_FILE}.
    """
    try:
        public_key = serialization.load_pem_public_key(pem)
    except (ValueError, TypeError):
        raise ConfigError(PUBLIC_KEY_VARIABLE, "is not a PEM public key (PKIX/SPKI)") from None
    algorithm = algorithm_for_key(public_key)
    key: VerificationKey
    if isinstance(public_key, rsa.RSAPublicKey):
        key = RSAKey.import_key(public_key)
    elif isinstance(public_key, ec.EllipticCurvePublicKey):
        key = ECKey.import_key(public_key)
    else:
        assert isinstance(public_key, ed25519.Ed25519PublicKey)
        key = OKPKey.import_key(public_key)
    return key, algorithm


def check_claims(claims: Mapping[str, object], policy: HostJwtPolicy, now: float) -> HostIdentity:
    """
    Checks 3-7 on an already signature-verified claim set, at time C{now}
    (seconds since the epoch).

    @raise HostTokenRejected: a check failed.
    @raise TenantNotAllowed: only the allowlist check failed.
    """
    if policy.issuer is not None and claims.get("iss") != policy.issuer:
        raise HostTokenRejected("issuer_mismatch")
    audience = claims.get("aud")
    if isinstance(audience, str):
        audience_ok = audience == policy.audience
    elif isinstance(audience, list):
        audience_ok = policy.audience in [a for a in audience if isinstance(a, str)]
    else:
        audience_ok = False
    if not audience_ok:
        raise HostTokenRejected("audience_mismatch")
    if "exp" not in claims:
        raise HostTokenRejected("exp_missing")
    expires = _numeric_date(claims["exp"], "exp")
    if now > expires + CLOCK_SKEW_SECONDS:
        raise HostTokenRejected("expired")
    if "nbf" in claims:
        not_before = _numeric_date(claims["nbf"], "nbf")
        if not_before > now + CLOCK_SKEW_SECONDS:
            raise HostTokenRejected("not_yet_valid")
    tenant = claims.get(policy.tenant_claim)
    if not isinstance(tenant, str) or not tenant:
        raise HostTokenRejected("tenant_claim_missing")
    subject = claims.get("sub")
    subject = subject if isinstance(subject, str) else ""
    if tenant not in policy.tenant_allowlist:
        raise TenantNotAllowed(tenant, subject)
    return HostIdentity(tenant_id=tenant, subject=subject)


def _numeric_date(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise HostTokenRejected(f"{name}_not_numeric")
    if not math.isfinite(value):
        raise HostTokenRejected(f"{name}_not_numeric")
    return float(value)


class HostJwtVerifier:
    """
    Verifies host JWTs against one static public key and a L{HostJwtPolicy}.

    @param key_pem: the PKIX/SPKI PEM public key.
    @param now: the clock, seconds since the epoch (e.g. C{reactor.seconds}).
    @raise ConfigError: the key is unusable (refuse to start).
    """

    def __init__(self, key_pem: bytes, policy: HostJwtPolicy, now: Callable[[], float]) -> None:
        self._key, self.algorithm = load_verification_key(key_pem)
        self.policy = policy
        self._now = now

    @classmethod
    def from_file(
        cls,
        path: Path,
        policy: HostJwtPolicy,
        now: Callable[[], float],
        read_file: Callable[[Path], bytes] = Path.read_bytes,
    ) -> HostJwtVerifier:
        """
        A verifier whose key is read from C{path} (at start, once).

        @raise ConfigError: the file cannot be read or holds no usable key.
        """
        try:
            pem = read_file(path)
        except OSError as e:
            raise ConfigError(PUBLIC_KEY_VARIABLE, f"cannot read {path}: {e.strerror}") from None
        return cls(pem, policy, now)

    def verify(self, token: str) -> HostIdentity:
        """
        The identity C{token} proves.

        @raise HostTokenRejected: any check failed (logged with its reason).
        @raise TenantNotAllowed: the tenant is not on the allowlist (logged).
        """
        try:
            identity = check_claims(self._verified_claims(token), self.policy, self._now())
        except HostTokenRejected as e:
            _log.warn(
                "host_identity_rejected reason={reason}",
                host_identity_rejected=True,
                reason=e.reason,
            )
            raise
        except TenantNotAllowed as e:
            _log.warn(
                "host_identity_rejected reason={reason} tenant={tenant_id} subject={subject}",
                host_identity_rejected=True,
                reason="tenant_not_allowed",
                tenant_id=e.tenant_id,
                subject=e.subject,
            )
            raise
        return identity

    def _verified_claims(self, token: str) -> Mapping[str, object]:
        try:
            with warnings.catch_warnings():
                # EdDSA is listed deliberately (the spec's name for Ed25519
                # JWS); joserfc warns that RFC 9864 deprecates the name.
                warnings.filterwarnings("ignore", ".*EdDSA.*", SecurityWarning)
                decoded = jwt.decode(token, self._key, algorithms=[self.algorithm])
        except (UnsupportedAlgorithmError, MissingAlgorithmError):
            raise HostTokenRejected("algorithm_not_allowed") from None
        except BadSignatureError:
            raise HostTokenRejected("bad_signature") from None
        except (JoseError, ValueError, TypeError, KeyError):
            raise HostTokenRejected("malformed") from None
        if decoded.header.get("alg") != self.algorithm:
            raise HostTokenRejected("algorithm_not_allowed")
        claims: Mapping[str, object] = decoded.claims
        return claims
