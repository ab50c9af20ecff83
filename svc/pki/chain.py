"""
Verifying a certificate chain outside a TLS handshake.

C{cryptography}'s own C{x509.verification} refuses ed25519 chains, so this
uses OpenSSL through pyOpenSSL's C{X509StoreContext}: the org root is the only
trust anchor, the intermediates are untrusted helpers, and the verification
time is explicit. OpenSSL enforces signatures, validity periods, CA basic
constraints, path lengths and URI name constraints here; the admission rules
of L{svc.pki.identity} come on top.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from cryptography import x509
from OpenSSL import crypto

from svc.pki import names
from svc.pki.errors import ChainVerificationError


def verify_chain(
    leaf: x509.Certificate,
    intermediates: Sequence[x509.Certificate],
    root: x509.Certificate,
    at: datetime,
) -> list[x509.Certificate]:
    """
    Verify that C{leaf} chains to C{root} (through C{intermediates}) and that
    every certificate is valid at C{at}.

    @return: the verified chain, leaf first and C{root} last.
    @raise ChainVerificationError: with OpenSSL's reason otherwise.
    """
    at = names.check_utc(at, "at")
    store = crypto.X509Store()
    store.add_cert(crypto.X509.from_cryptography(root))
    store.set_time(at)
    context = crypto.X509StoreContext(
        store,
        crypto.X509.from_cryptography(leaf),
        [crypto.X509.from_cryptography(c) for c in intermediates],
    )
    try:
        chain = context.get_verified_chain()
    except crypto.X509StoreContextError as e:
        code, depth, message = _error_fields(e)
        raise ChainVerificationError(message, code=code, depth=depth) from None
    return [c.to_cryptography() for c in chain]


def _error_fields(error: crypto.X509StoreContextError) -> tuple[int | None, int | None, str]:
    fields = list(error.errors) if isinstance(error.errors, list) else []
    if len(fields) == 3 and isinstance(fields[0], int) and isinstance(fields[1], int):
        return fields[0], fields[1], str(fields[2])
    return None, None, str(error)
