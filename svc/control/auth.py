"""
Authenticators for the bearer credentials this module can check without a
database: the service token and host JWTs.

Each turns a request into a principal or raises the spec's error: a missing
or malformed C{Authorization} header, or a wrong credential, is 401
C{invalid_token}; a host whose tenant is not allowed is 403
C{access_denied}/C{tenant_not_allowed}.
"""

from __future__ import annotations

import hashlib
import hmac

import attrs
from twisted.logger import Logger
from twisted.web.server import Request

from svc.control.hostjwt import HostIdentity, HostJwtVerifier, HostTokenRejected, TenantNotAllowed
from svc.web.errors import TENANT_NOT_ALLOWED, AccessDenied, InvalidCredential
from svc.web.rules import parse_bearer

_log = Logger()


def bearer_credential(request: Request) -> str | None:
    """
    The request's Bearer credential, or L{None} when the C{Authorization}
    header is absent, repeated, or not a well-formed Bearer credential.
    """
    values = request.requestHeaders.getRawHeaders(b"authorization")
    if values is None or len(values) != 1:
        return None
    return parse_bearer(values[0])


@attrs.frozen
class ServiceCaller:
    """The principal of a request that presented the service token."""


class ServiceTokenAuthenticator:
    """
    Accepts exactly C{SVC_CONTROL_PLANE_TOKEN}, compared in constant time.
    """

    def __init__(self, token: str) -> None:
        self._digest = hashlib.sha256(token.encode("ascii")).digest()

    async def authenticate(self, request: Request) -> ServiceCaller:
        """
        L{ServiceCaller} for the right token.

        @raise InvalidCredential: no token or a wrong one.
        """
        presented = bearer_credential(request)
        if presented is None:
            raise InvalidCredential()
        digest = hashlib.sha256(presented.encode("ascii")).digest()
        if not hmac.compare_digest(digest, self._digest):
            raise InvalidCredential()
        return ServiceCaller()


class HostJwtAuthenticator:
    """
    Verifies a host JWT with a L{HostJwtVerifier}; every failure is the same
    generic 401, whatever the reason (which is only logged).
    """

    def __init__(self, verifier: HostJwtVerifier) -> None:
        self._verifier = verifier

    async def authenticate(self, request: Request) -> HostIdentity:
        """
        The verified L{HostIdentity}.

        @raise InvalidCredential: missing, malformed or failing token.
        @raise AccessDenied: C{tenant_not_allowed}.
        """
        token = bearer_credential(request)
        if token is None:
            _log.warn(
                "host_identity_rejected reason={reason}",
                host_identity_rejected=True,
                reason="no_bearer_credential",
            )
            raise InvalidCredential()
        try:
            return self._verifier.verify(token)
        except HostTokenRejected:
            raise InvalidCredential() from None
        except TenantNotAllowed:
            raise AccessDenied(TENANT_NOT_ALLOWED) from None
