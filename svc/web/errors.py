"""
The control plane's error tree and its one JSON rendering.

Every expected failure of a control-plane request is an L{ApiError}: a status,
a machine-readable C{error} code, an optional C{error_description}, optional
extra body fields and optional response headers. Handlers and authenticators
raise these; L{svc.control.http} translates them to a response in exactly one
place. Anything else that escapes a handler is a bug and becomes a bare 500
C{server_error} (logged, never shown to the client).

The body is C{{"error": ..., "error_description": ...}} with
C{error_description} omitted when empty. The codes per status are listed in
C{docs/specifications/control-http.md}.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from types import MappingProxyType

JsonValue = None | bool | int | float | str | Sequence["JsonValue"] | Mapping[str, "JsonValue"]
"""A value that renders as JSON."""

# Codes (the ``error`` field). The spec fixes the 401/403/409/410/429/500
# ones; 400, 404, 405 and 503 codes are this service's choice.
INVALID_REQUEST = "invalid_request"
INVALID_TOKEN = "invalid_token"  # noqa: S105
INVALID_CLIENT = "invalid_client"
ACCESS_DENIED = "access_denied"
NOT_FOUND = "not_found"
METHOD_NOT_ALLOWED = "method_not_allowed"
WRONG_AGENT = "wrong_agent"
ALREADY_MOUNTED = "already_mounted"
LEASE_LIVE = "lease_live"
INSUFFICIENT_CAPACITY = "insufficient_capacity"
REVOKED = "revoked"
LEASE_LOST = "lease_lost"
RATE_LIMITED = "rate_limited"
SERVER_ERROR = "server_error"
TEMPORARILY_UNAVAILABLE = "temporarily_unavailable"

# Descriptions the spec names for 403 access_denied.
TENANT_NOT_ALLOWED = "tenant_not_allowed"
AGENT_SCOPE_REQUIRED = "agent_scope_required"
TENANT_SUSPENDED = "tenant_suspended"
USER_SUSPENDED = "user_suspended"

_RESERVED_FIELDS = frozenset({"error", "error_description"})


class ApiError(Exception):
    """
    A control-plane request failed in an expected way.

    @ivar status: the HTTP status.
    @ivar code: the C{error} field.
    @ivar description: the C{error_description} field; omitted when empty.
    @ivar extra: further body fields (never C{error}/C{error_description}).
    @ivar headers: response headers to add (for example C{Retry-After}).
    """

    def __init__(
        self,
        status: int,
        code: str,
        description: str = "",
        *,
        extra: Mapping[str, JsonValue] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        if not 400 <= status <= 599:
            raise ValueError(f"error status must be 4xx or 5xx, got {status}")
        if not code:
            raise ValueError("error code must not be empty")
        extra = dict(extra or {})
        clash = _RESERVED_FIELDS & extra.keys()
        if clash:
            raise ValueError(f"extra fields may not override {sorted(clash)}")
        super().__init__(status, code, description)
        self.status = status
        self.code = code
        self.description = description
        self.extra: Mapping[str, JsonValue] = MappingProxyType(extra)
        self.headers: Mapping[str, str] = MappingProxyType(dict(headers or {}))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.status} {self.code} {self.description!r}>"

    __str__ = __repr__

    def body(self) -> dict[str, JsonValue]:
        """
        The JSON body: C{error}, C{error_description} when non-empty, then
        the extra fields.
        """
        rendered: dict[str, JsonValue] = {"error": self.code}
        if self.description:
            rendered["error_description"] = self.description
        rendered.update(self.extra)
        return rendered

    def body_bytes(self) -> bytes:
        """
        The body as compact UTF-8 JSON.
        """
        return render_json(self.body())


def render_json(value: JsonValue) -> bytes:
    """
    Compact JSON bytes for a response body; NaN and infinities are refused.
    """
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode("utf-8")


class InvalidRequest(ApiError):
    """400 C{invalid_request}: the request is malformed."""

    def __init__(self, description: str = "") -> None:
        super().__init__(400, INVALID_REQUEST, description)


class InvalidCredential(ApiError):
    """
    401: a missing, invalid or expired credential. C{code} is
    C{invalid_token} (bearer credentials) or C{invalid_client} (agent
    identity). Carries C{WWW-Authenticate: Bearer} for bearer credentials.
    """

    def __init__(self, code: str = INVALID_TOKEN, description: str = "") -> None:
        if code not in (INVALID_TOKEN, INVALID_CLIENT):
            raise ValueError(f"401 code must be invalid_token or invalid_client, got {code!r}")
        headers = {"WWW-Authenticate": "Bearer"} if code == INVALID_TOKEN else {}
        super().__init__(401, code, description, headers=headers)


class AccessDenied(ApiError):
    """403 C{access_denied}; C{description} says why (e.g. C{tenant_not_allowed})."""

    def __init__(self, description: str = "") -> None:
        super().__init__(403, ACCESS_DENIED, description)


class NotFound(ApiError):
    """404 C{not_found}: no such route or resource."""

    def __init__(self, description: str = "") -> None:
        super().__init__(404, NOT_FOUND, description)


class MethodNotAllowed(ApiError):
    """405 C{method_not_allowed}, with an C{Allow} header listing C{allowed}."""

    def __init__(self, allowed: Sequence[str]) -> None:
        super().__init__(
            405, METHOD_NOT_ALLOWED, headers={"Allow": ", ".join(sorted(set(allowed)))}
        )


class Conflict(ApiError):
    """
    409: C{wrong_agent}, C{already_mounted}, C{insufficient_capacity}; use
    L{LeaseLive} for C{lease_live}.
    """

    def __init__(
        self, code: str, description: str = "", *, extra: Mapping[str, JsonValue] | None = None
    ) -> None:
        super().__init__(409, code, description, extra=extra)


class LeaseLive(Conflict):
    """
    409 C{lease_live}: another enrollment holds the mount lease. The body
    carries the incumbent's C{bound_at} and C{lease_expires_at}.
    """

    def __init__(self, bound_at: str, lease_expires_at: str, description: str = "") -> None:
        super().__init__(
            LEASE_LIVE,
            description,
            extra={"bound_at": bound_at, "lease_expires_at": lease_expires_at},
        )


class Gone(ApiError):
    """410: C{revoked} (revoked allocation) or C{lease_lost}."""

    def __init__(self, code: str, description: str = "") -> None:
        if code not in (REVOKED, LEASE_LOST):
            raise ValueError(f"410 code must be revoked or lease_lost, got {code!r}")
        super().__init__(410, code, description)


class RateLimited(ApiError):
    """429 C{rate_limited}, with C{Retry-After} seconds when given."""

    def __init__(self, retry_after: int | None = None, description: str = "") -> None:
        super().__init__(429, RATE_LIMITED, description, headers=_retry_after(retry_after))


class ServerError(ApiError):
    """500 C{server_error}; never carries details of the fault."""

    def __init__(self) -> None:
        super().__init__(500, SERVER_ERROR)


class ServiceUnavailable(ApiError):
    """
    503 C{temporarily_unavailable}: transient, retry; C{Retry-After} seconds
    when given.
    """

    def __init__(self, description: str = "", retry_after: int | None = None) -> None:
        super().__init__(
            503, TEMPORARILY_UNAVAILABLE, description, headers=_retry_after(retry_after)
        )


def _retry_after(seconds: int | None) -> dict[str, str]:
    if seconds is None:
        return {}
    if seconds < 0:
        raise ValueError(f"Retry-After must not be negative, got {seconds}")
    return {"Retry-After": str(seconds)}
