"""
Who a dashboard or owner-route request comes from: a user, proved by the
admin session cookie or by an API token (C{docs/specifications/owner-routes.md}).

The pure parts are the cookie and CSRF rules (L{session_cookie},
L{cleared_cookie}, L{csrf_token_for}, L{check_cross_site}); the adapter is
L{OwnerAuthenticator}, registered for L{svc.control.routing.AuthKind.ADMIN_SESSION}.
Secrets never reach the store: it looks sessions and tokens up by SHA-256.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from urllib.parse import urlsplit

import attrs
from twisted.web.server import Request

from svc.control.store.interface import ControlStore
from svc.control.store.values import AdminSession, User
from svc.web.errors import AccessDenied, InvalidCredential
from svc.web.rules import parse_bearer

SESSION_COOKIE = "svc_admin_session"
"""The cookie that carries an admin session secret."""

API_TOKEN_PREFIX = "svc_"  # noqa: S105
"""Every API token starts with this."""

CSRF_HEADER = "X-CSRF-Token"
"""The header a cookie-authenticated state change must carry."""

CSRF_CHECK_FAILED = "csrf_check_failed"
SESSION_REQUIRED = "session_required"

UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
"""Methods that change state, hence are checked against cross-site requests."""

_CSRF_CONTEXT = b"svc-csrf-v1:"
_LINK_CONTEXT = "svc-admin-link-v1:"
_SAME_SITE_FETCHES = frozenset({"same-origin", "none"})


def hash_secret(secret: str) -> str:
    """The SHA-256 of a session (cookie) secret or token, as the store keeps it."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def hash_link_secret(secret: str) -> str:
    """
    The stored hash of a sign-in link's secret: C{SHA-256("svc-admin-link-v1:"
    + secret)}. Link and cookie secrets are hashed apart, so a link's secret
    presented as a cookie matches no session (it is only exchangeable, once,
    at C{GET /admin/session}), and a cookie's secret is no link.
    """
    return hashlib.sha256((_LINK_CONTEXT + secret).encode("utf-8")).hexdigest()


def csrf_token_for(secret: str) -> str:
    """
    The CSRF token of the session whose cookie secret is C{secret}:
    unpadded base64url of C{SHA-256("svc-csrf-v1:" + secret)}. Only a
    holder of the (HttpOnly) cookie's value, or a same-origin reader of
    C{GET /me}, can know it.
    """
    digest = hashlib.sha256(_CSRF_CONTEXT + secret.encode("utf-8")).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def _cookie_attributes(max_age: int, secure: bool) -> str:
    attributes = f"Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}"
    return attributes + "; Secure" if secure else attributes


def session_cookie(secret: str, max_age: int, secure: bool) -> str:
    """The C{Set-Cookie} value that installs a session for C{max_age} seconds."""
    return f"{SESSION_COOKIE}={secret}; {_cookie_attributes(max(0, max_age), secure)}"


def cleared_cookie(secure: bool) -> str:
    """The C{Set-Cookie} value that removes the session cookie."""
    return f"{SESSION_COOKIE}=; {_cookie_attributes(0, secure)}"


def _origin_host(origin: str) -> str | None:
    if origin == "null":
        return None
    try:
        parts = urlsplit(origin)
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/"):
        return None
    return parts.netloc.lower()


def check_cross_site(
    *,
    origin: str | None,
    host: str | None,
    sec_fetch_site: str | None,
    presented_token: str | None,
    expected_token: str,
) -> None:
    """
    Refuse a cookie-authenticated state change that may come from another
    site: an C{Origin} other than C{Host}, a cross-site C{Sec-Fetch-Site},
    or a missing or wrong CSRF token.

    @raise AccessDenied: C{csrf_check_failed}.
    """
    if origin is not None:
        origin_host = _origin_host(origin.strip())
        if origin_host is None or host is None or origin_host != host.strip().lower():
            raise AccessDenied(CSRF_CHECK_FAILED)
    if sec_fetch_site is not None and sec_fetch_site.strip().lower() not in _SAME_SITE_FETCHES:
        raise AccessDenied(CSRF_CHECK_FAILED)
    if presented_token is None or not _same(presented_token.strip(), expected_token):
        raise AccessDenied(CSRF_CHECK_FAILED)


def _same(left: str, right: str) -> bool:
    return hmac.compare_digest(left.encode("utf-8"), right.encode("utf-8"))


class OwnerCredential(enum.Enum):
    """How a user proved itself."""

    SESSION = "session"
    API_TOKEN = "api_token"  # noqa: S105


@attrs.frozen
class OwnerPrincipal:
    """
    A signed-in user.

    @ivar credential_hash: the SHA-256 of the cookie secret or API token.
    @ivar session: the admin session, for C{SESSION}.
    @ivar secret: the cookie secret, for C{SESSION} (CSRF token, logout).
    """

    user: User
    credential: OwnerCredential
    credential_hash: str = attrs.field(repr=False)
    session: AdminSession | None = None
    secret: str | None = attrs.field(default=None, repr=False)

    @property
    def user_id(self) -> str:
        """The user's id (also the owner id of its allocations)."""
        return self.user.user_id

    @property
    def csrf_token(self) -> str | None:
        """The session's CSRF token (L{None} for API tokens)."""
        return None if self.secret is None else csrf_token_for(self.secret)

    def require_session(self) -> OwnerPrincipal:
        """
        This principal, if it signed in with the cookie.

        @raise AccessDenied: C{session_required} (an API token).
        """
        if self.credential is not OwnerCredential.SESSION:
            raise AccessDenied(SESSION_REQUIRED)
        return self


def _header(request: Request, name: bytes) -> str | None:
    value = request.getHeader(name)
    return None if value is None else value.decode("latin-1")


class OwnerAuthenticator:
    """
    Authenticates owner routes: an C{Authorization: Bearer svc_…} API token
    if the header is present (and then only that), else the
    C{svc_admin_session} cookie, with the cross-site checks on state
    changes.
    """

    def __init__(self, store: ControlStore, clock_seconds: Callable[[], float]) -> None:
        self._store = store
        self._seconds = clock_seconds

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self._seconds(), UTC)

    async def authenticate(self, request: Request) -> OwnerPrincipal:
        """
        The signed-in user.

        @raise InvalidCredential: no, unknown, expired or revoked credential,
            or a suspended user.
        @raise AccessDenied: C{csrf_check_failed}.
        """
        authorization = request.requestHeaders.getRawHeaders(b"authorization")
        if authorization is not None:
            return await self._api_token(authorization)
        secret = session_secret(request)
        if secret is None:
            raise InvalidCredential()
        found = await self._store.authenticate_admin_session(hash_secret(secret), self._now())
        if found is None:
            raise InvalidCredential()
        session, user = found
        method = (request.method or b"").decode("latin-1").upper()
        if method in UNSAFE_METHODS:
            check_cross_site(
                origin=_header(request, b"origin"),
                host=_header(request, b"host"),
                sec_fetch_site=_header(request, b"sec-fetch-site"),
                presented_token=_header(request, CSRF_HEADER.encode("ascii")),
                expected_token=csrf_token_for(secret),
            )
        return OwnerPrincipal(user, OwnerCredential.SESSION, hash_secret(secret), session, secret)

    async def _api_token(self, values: Sequence[bytes]) -> OwnerPrincipal:
        token = parse_bearer(values[0]) if len(values) == 1 else None
        if token is None or not token.startswith(API_TOKEN_PREFIX):
            raise InvalidCredential()
        token_hash = hash_secret(token)
        found = await self._store.authenticate_api_token(token_hash, self._now())
        if found is None:
            raise InvalidCredential()
        user = await self._store.get_user(found.user_id)
        if user.suspended:
            raise InvalidCredential()
        return OwnerPrincipal(user, OwnerCredential.API_TOKEN, token_hash)

    async def still_valid(self, principal: OwnerPrincipal) -> bool:
        """
        Whether C{principal}'s credential still works now (not expired,
        revoked or suspended): asked by long-lived requests such as the
        journal stream.
        """
        now = self._now()
        if principal.credential is OwnerCredential.SESSION:
            found = await self._store.authenticate_admin_session(principal.credential_hash, now)
            return found is not None
        token = await self._store.authenticate_api_token(principal.credential_hash, now)
        if token is None:
            return False
        user = await self._store.get_user(token.user_id)
        return not user.suspended


def session_secret(request: Request) -> str | None:
    """The C{svc_admin_session} cookie's value, or L{None}."""
    raw: bytes | None = request.getCookie(SESSION_COOKIE.encode("ascii"))  # type: ignore[no-untyped-call]
    if not raw:
        return None
    try:
        return raw.decode("ascii")
    except UnicodeDecodeError:
        return None
