"""
The certificate authority's exception tree.

Everything the PKI code refuses on purpose is a L{PKIError}; the data-plane
server and the control plane translate these once at their boundaries (a
dropped connection, an HTTP status). Admission refusals carry a
L{RefusalReason} for the operator log, never for the peer.
"""

from __future__ import annotations

import enum


class PKIError(Exception):
    """
    A certificate, key or CA operation was refused.
    """


class InvalidName(PKIError, ValueError):
    """
    An identifier (tenant, agent, user, organisation, trust domain, host name,
    serial) is not in the accepted form, or would not fit the certificate
    field it is destined for.
    """


class IssuanceError(PKIError):
    """
    A certificate cannot be issued as asked: the issuer is not the right kind
    of CA, would expire before the new certificate, or a CSR is unacceptable.
    """


class KeyEncryptionError(PKIError):
    """
    A private key could not be read with the key-encryption key given: the
    key is encrypted and no KEK was given, the KEK is wrong, or a KEK was
    given but the stored key is in plain text.
    """


class CANotInitialised(PKIError):
    """
    The filesystem CA has no org root yet (or its files are incomplete).
    """


class CAAlreadyInitialised(PKIError):
    """
    An org root already exists where a new one was asked for.
    """


class CAInconsistent(PKIError):
    """
    The stored CA material does not hang together: a key does not match its
    certificate, or a certificate has the wrong profile.
    """


class ChainVerificationError(PKIError):
    """
    A certificate chain does not verify to the org root at the given time.

    C{code} and C{depth} are OpenSSL's verification error number and the
    depth of the certificate it concerns (0 = leaf), when known.
    """

    def __init__(self, message: str, code: int | None = None, depth: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.depth = depth


class RefusalReason(enum.StrEnum):
    """
    Why a verified peer certificate was still not admitted.
    """

    NO_CLIENT_CERT = "no_client_cert"
    """The peer presented no certificate (or no verified chain exists)."""

    CHAIN_MISMATCH = "chain_mismatch"
    """The chain is not leaf -> tenant intermediate -> org root."""

    NOT_A_CLIENT_CERT = "not_a_client_cert"
    """The certificate is a CA, or lacks DigitalSignature or ClientAuth."""

    NO_TENANT_SAN = "no_tenant_san"
    """No C{spiffe://<td>/tenant/<id>} URI SAN."""

    WRONG_TRUST_DOMAIN = "wrong_trust_domain"
    """A SPIFFE URI SAN names another trust domain."""

    NO_AGENT_SAN = "no_agent_san"
    """No C{spiffe://<td>/agent/<id>} URI SAN (a tenant-only certificate)."""

    MULTIPLE_TENANT_OR_AGENT_SANS = "multiple_tenant_or_agent_sans"
    """More than one tenant SAN or more than one agent SAN."""

    UNEXPECTED_SAN = "unexpected_san"
    """A SAN that is neither the tenant nor the agent SPIFFE id."""

    MALFORMED_IDENTITY = "malformed_identity"
    """An identifier in a SAN or the subject is not in the accepted form."""

    TENANT_BINDING = "tenant_binding"
    """The intermediate's or the leaf's OU C{tenant=<id>} differs from the
    leaf's tenant SAN."""

    DENIED_SERIAL = "denied_serial"
    """The leaf's serial, or its retired intermediate's, is on the deny-list."""

    NO_CONTROL_SAN = "no_control_san"
    """A control-plane certificate without exactly C{spiffe://<td>/control}."""


class AdmissionRefused(PKIError):
    """
    A peer whose chain verified is nevertheless not admitted, for C{reason}.
    """

    def __init__(self, reason: RefusalReason, detail: str = "") -> None:
        super().__init__(f"{reason.value}: {detail}" if detail else reason.value)
        self.reason = reason
        self.detail = detail
