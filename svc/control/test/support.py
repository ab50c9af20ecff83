"""
Helpers for the control-plane HTTP tests: synchronous StubTreq requests,
test keys and host-JWT minting.
"""

from __future__ import annotations

import base64
import functools
import json
import warnings
from collections.abc import Mapping
from typing import Any

import attrs
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes
from joserfc import jwt
from joserfc.errors import SecurityWarning
from joserfc.jwk import ECKey, OKPKey, RSAKey
from treq.testing import StubTreq
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.resource import Resource

PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey


@attrs.frozen
class Answer:
    """A response as the tests look at it."""

    status: int
    headers: Mapping[str, list[str]]
    body: bytes

    def header(self, name: str) -> str | None:
        """The last value of header C{name} (case-insensitive), or None."""
        values = self.headers.get(name.lower())
        return values[-1] if values else None

    def json(self) -> Any:
        """The body parsed as JSON."""
        return json.loads(self.body)


def request(
    case: SynchronousTestCase,
    resource: Resource,
    method: str,
    path: str,
    *,
    headers: Mapping[str, str | list[str]] | None = None,
    body: bytes | None = None,
) -> Answer:
    """
    Make one request against C{resource} through StubTreq and return the
    finished response; fails the test if it does not finish synchronously.
    """
    stub: Any = StubTreq(resource)
    raw_headers = {
        name: value if isinstance(value, list) else [value]
        for name, value in (headers or {}).items()
    }
    d = stub.request(
        method,
        "http://control.test" + path,
        headers=raw_headers,
        data=body,
        allow_redirects=False,
    )
    stub.flush()
    response = case.successResultOf(d)
    content = case.successResultOf(stub.content(response))
    stub.flush()
    found: dict[str, list[str]] = {}
    for name, values in response.headers.getAllRawHeaders():
        found[name.decode("latin-1").lower()] = [v.decode("latin-1") for v in values]
    return Answer(status=response.code, headers=found, body=content)


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
