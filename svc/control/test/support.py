"""
Helpers for the control-plane HTTP tests: test keys and host-JWT minting;
the synchronous StubTreq requests are L{svc.testing.web}'s (re-exported).
"""

from __future__ import annotations

import base64
import functools
import json
import warnings
from collections.abc import Mapping
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes
from joserfc import jwt
from joserfc.errors import SecurityWarning
from joserfc.jwk import ECKey, OKPKey, RSAKey

PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey


@functools.cache
def rsa_key() -> rsa.RSAPrivateKey:
    """An RSA 2048 key, generated once per test run (slow)."""
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@functools.cache
def ec_key() -> ec.EllipticCurvePrivateKey:
    """An EC P-256 key, generated once per test run."""
    return ec.generate_private_key(ec.SECP256R1())


@functools.cache
def ed25519_key() -> ed25519.Ed25519PrivateKey:
    """An Ed25519 key, generated once per test run."""
    return ed25519.Ed25519PrivateKey.generate()


def public_pem(key: PrivateKeyTypes) -> bytes:
    """The PKIX/SPKI PEM of C{key}'s public half."""
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def mint(key: PrivateKey, claims: Mapping[str, object], alg: str | None = None) -> str:
    """A JWT over C{claims} signed by C{key} with its natural algorithm."""
    if isinstance(key, rsa.RSAPrivateKey):
        signing_key: Any = RSAKey.import_key(key)
        alg = alg or "RS256"
    elif isinstance(key, ec.EllipticCurvePrivateKey):
        signing_key = ECKey.import_key(key)
        alg = alg or "ES256"
    else:
        signing_key = OKPKey.import_key(key)
        alg = alg or "EdDSA"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SecurityWarning)
        return jwt.encode({"alg": alg, "typ": "JWT"}, dict(claims), signing_key, algorithms=[alg])


def b64url(data: bytes) -> str:
    """Unpadded base64url, as JWS uses."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def unsigned(header: Mapping[str, object], claims: Mapping[str, object], signature: bytes) -> str:
    """A compact JWS with the given header and an arbitrary signature."""
    head = b64url(json.dumps(header).encode())
    body = b64url(json.dumps(claims).encode())
    return f"{head}.{body}.{b64url(signature)}"
