"""
A data-plane server's identity key: the ed25519 key a server keeps for its
whole life (its TLS key changes with every leaf), under which the control
plane registers its FQDN (``docs/specifications/control-dataplane.md``,
"Server identity").

The registration names the key by its raw 32-byte public key in lowercase
hex (L{key_text}) and proves possession by signing the DER bytes of the
registration's CSR (L{prove}, checked by L{check_proof}), which binds the
proof to that request's TLS key and FQDN. Pure functions, no I/O.
"""

from __future__ import annotations

import re

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.x509 import CertificateSigningRequest

from svc.pki.errors import InvalidName, PKIError

_KEY_TEXT = re.compile(r"[0-9a-f]{64}")
_PROOF_TEXT = re.compile(r"[0-9a-f]{128}")


class BadIdentityProof(PKIError):
    """The proof was not made by the identity key over this CSR."""


def key_text(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    """The identity key's public half: 64 lowercase hex digits of its raw bytes."""
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return raw.hex()


def check_key_text(value: object, what: str = "identity key") -> str:
    """
    C{value} if it is an identity key's text (64 lowercase hex digits).

    @raise InvalidName: otherwise.
    """
    if not isinstance(value, str) or _KEY_TEXT.fullmatch(value) is None:
        raise InvalidName(f"{what} must be 64 lowercase hex digits")
    return value


def prove(key: Ed25519PrivateKey, csr: CertificateSigningRequest) -> str:
    """The proof that C{key} registers C{csr}: its signature of the CSR's DER, in hex."""
    return key.sign(csr.public_bytes(serialization.Encoding.DER)).hex()


def check_proof(key: str, proof: object, csr: CertificateSigningRequest) -> None:
    """
    Check that C{proof} is the signature of C{csr}'s DER by the identity key
    C{key} (L{key_text} form).

    @raise InvalidName: C{key} or C{proof} is malformed.
    @raise BadIdentityProof: the signature does not verify.
    """
    check_key_text(key)
    if not isinstance(proof, str) or _PROOF_TEXT.fullmatch(proof) is None:
        raise InvalidName("identity proof must be 128 lowercase hex digits")
    public = Ed25519PublicKey.from_public_bytes(bytes.fromhex(key))
    try:
        public.verify(bytes.fromhex(proof), csr.public_bytes(serialization.Encoding.DER))
    except InvalidSignature:
        raise BadIdentityProof("the identity proof does not verify for this CSR") from None
