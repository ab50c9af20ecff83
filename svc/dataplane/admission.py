"""
The TLS side of the data-plane server: server options that can be renewed
without dropping live connections, and the admission run after a handshake.

L{SwappableServerTLS} is the connection creator the server's
C{TLSMemoryBIOFactory} uses. A pyOpenSSL context cannot change once a
connection used it, so renewing the server leaf means building new
L{CertificateOptions} and L{SwappableServerTLS.swap}ping them in: every
connection accepted afterwards uses the new options, every live one keeps its
own TLS session untouched.

L{TLSAdmission} applies the spec's admission rules ("Data-plane
authentication" 2, 3) to a transport whose handshake completed, against the
deny-list current at that moment. The identity it returns, an
L{AdmittedAgent}, also names the tenant intermediate of the verified chain,
so that L{standing} can judge a live connection again later: when the
deny-list changes, and L{expiry} says when it lapses by itself (a denied or
expired leaf or intermediate ends the connection).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from datetime import datetime
from typing import Any

import attrs
from cryptography import x509
from OpenSSL import SSL
from twisted.internet.interfaces import IOpenSSLServerConnectionCreator, ITransport
from twisted.internet.ssl import CertificateOptions
from zope.interface import implementer  # type: ignore[import-untyped]

from svc.pki import names
from svc.pki.errors import AdmissionRefused, RefusalReason
from svc.pki.identity import AgentIdentity, DenyList
from svc.pki.tls import admit_tls_connection

Admission = Callable[[ITransport], AgentIdentity]
"""
Decides who the peer of a transport whose TLS handshake completed is: returns
its identity or raises L{svc.pki.errors.AdmissionRefused}. L{TLSAdmission} is
the real one; protocol tests without TLS pass a function returning a fixed
identity.
"""


def _utc(moment: datetime) -> datetime:
    return names.check_utc(moment, "intermediate_not_after")


@attrs.frozen
class AdmittedAgent(AgentIdentity):
    """
    An agent admitted over TLS: its identity (from the verified leaf) and
    the tenant intermediate its verified chain went through (serial in the
    canonical form, and C{NotAfter}).
    """

    intermediate_serial: str = attrs.field(validator=lambda _i, _a, v: names.check_serial(v))
    intermediate_not_after: datetime = attrs.field(converter=_utc)


class Standing(enum.Enum):
    """Why a live connection's credentials no longer hold (L{standing})."""

    DENIED = "denied"
    EXPIRED = "expired"


@attrs.frozen
class Lapse:
    """
    A live connection's credentials no longer hold: C{reason}, and the
    serial of the certificate (leaf or intermediate) that caused it.
    """

    reason: Standing
    serial: str


def standing(identity: AgentIdentity, deny_list: DenyList, now: datetime) -> Lapse | None:
    """
    Whether the credentials a connection was admitted with still hold at
    C{now}: L{None}, or the first lapse of, in order, the leaf serial on
    C{deny_list}, the intermediate serial on it, the leaf expired
    (C{not_after <= now}), the intermediate expired. The intermediate is
    known only for an L{AdmittedAgent}.
    """
    chain: list[tuple[str, datetime]] = [(identity.serial, identity.not_after)]
    if isinstance(identity, AdmittedAgent):
        chain.append((identity.intermediate_serial, identity.intermediate_not_after))
    for serial, _not_after in chain:
        if serial in deny_list:
            return Lapse(Standing.DENIED, serial)
    for serial, not_after in chain:
        if not_after <= now:
            return Lapse(Standing.EXPIRED, serial)
    return None


def expiry(identity: AgentIdentity) -> tuple[datetime, str]:
    """
    When the credentials a connection was admitted with stop holding by
    themselves, and the serial of the certificate that expires then: the
    earliest C{not_after} of the leaf and (for an L{AdmittedAgent}) the
    intermediate; the leaf when both expire together.
    """
    if isinstance(identity, AdmittedAgent) and identity.intermediate_not_after < identity.not_after:
        return identity.intermediate_not_after, identity.intermediate_serial
    return identity.not_after, identity.serial


@implementer(IOpenSSLServerConnectionCreator)
class SwappableServerTLS:
    """
    Server TLS options that can be replaced at runtime (server-leaf renewal).

    Each new connection asks for its C{SSL.Connection} when it is accepted and
    gets one from the options current at that moment; connections already
    made are not affected by a later L{swap}.
    """

    def __init__(self, options: CertificateOptions) -> None:
        """
        @param options: the initial options, e.g. from
            L{svc.pki.tls.server_tls_options}.
        """
        self._options = options

    @property
    def current(self) -> CertificateOptions:
        """The options new connections get."""
        return self._options

    def swap(self, options: CertificateOptions) -> None:
        """
        Use C{options} for every connection accepted from now on.
        """
        self._options = options

    def serverConnectionForTLS(self, tlsProtocol: Any) -> SSL.Connection:  # noqa: N803
        """
        The C{SSL.Connection} for one newly accepted connection
        (C{IOpenSSLServerConnectionCreator}).
        """
        return self._options.serverConnectionForTLS(tlsProtocol)


@attrs.frozen
class TLSAdmission:
    """
    The data-plane admission check (an L{Admission}).

    @ivar org_root: the only root client chains may end at.
    @ivar trust_domain: the SPIFFE trust domain of agent SANs.
    @ivar deny_list: returns the deny-list in force now; asked once per
        connection, so updates apply to every connection admitted later.
    """

    org_root: x509.Certificate
    trust_domain: str
    deny_list: Callable[[], DenyList]

    def __call__(self, transport: ITransport) -> AdmittedAgent:
        """
        Admit the peer of C{transport}, a Twisted TLS transport whose
        handshake has completed; the identity names the verified chain's
        intermediate.

        @raise AdmissionRefused: if the peer is not an admissible agent.
        """
        tls: Any = transport
        connection: SSL.Connection = tls.getHandle()
        admitted = admit_tls_connection(
            connection, self.org_root, self.trust_domain, self.deny_list()
        )
        chain = connection.get_verified_chain(as_cryptography=True)
        if chain is None or len(chain) != 3:
            raise AdmissionRefused(RefusalReason.CHAIN_MISMATCH, "no verified intermediate")
        intermediate = chain[1]
        return AdmittedAgent(
            tenant_id=admitted.tenant_id,
            agent_id=admitted.agent_id,
            user_id=admitted.user_id,
            serial=admitted.serial,
            subject=admitted.subject,
            not_after=admitted.not_after,
            intermediate_serial=names.format_serial(intermediate.serial_number),
            intermediate_not_after=intermediate.not_valid_after_utc,
        )
