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
deny-list current at that moment.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
from cryptography import x509
from OpenSSL import SSL
from twisted.internet.interfaces import IOpenSSLServerConnectionCreator, ITransport
from twisted.internet.ssl import CertificateOptions
from zope.interface import implementer  # type: ignore[import-untyped]

from svc.pki.identity import AgentIdentity, DenyList
from svc.pki.tls import admit_tls_connection

Admission = Callable[[ITransport], AgentIdentity]
"""
Decides who the peer of a transport whose TLS handshake completed is: returns
its identity or raises L{svc.pki.errors.AdmissionRefused}. L{TLSAdmission} is
the real one; protocol tests without TLS pass a function returning a fixed
identity.
"""


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

    def __call__(self, transport: ITransport) -> AgentIdentity:
        """
        Admit the peer of C{transport}, a Twisted TLS transport whose
        handshake has completed.

        @raise AdmissionRefused: if the peer is not an admissible agent.
        """
        tls: Any = transport
        connection: SSL.Connection = tls.getHandle()
        return admit_tls_connection(connection, self.org_root, self.trust_domain, self.deny_list())
