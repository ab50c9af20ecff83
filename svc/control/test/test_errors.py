"""
Tests for L{svc.web.errors}.
"""

from __future__ import annotations

import json

from twisted.trial.unittest import SynchronousTestCase

from svc.web.errors import (
    AccessDenied,
    ApiError,
    Conflict,
    Gone,
    InvalidCredential,
    InvalidRequest,
    LeaseLive,
    MethodNotAllowed,
    NotFound,
    RateLimited,
    ServerError,
    ServiceUnavailable,
)


class ApiErrorTests(SynchronousTestCase):
    """
    Tests for L{ApiError} and its rendering.
    """

    def test_description_omitted_when_empty(self) -> None:
        """An empty description leaves C{error_description} out of the body."""
        self.assertEqual(json.loads(NotFound().body_bytes()), {"error": "not_found"})

    def test_description_present_when_given(self) -> None:
        """A description is rendered as C{error_description}."""
        body = json.loads(AccessDenied("tenant_not_allowed").body_bytes())
        self.assertEqual(
            body, {"error": "access_denied", "error_description": "tenant_not_allowed"}
        )

    def test_compact_rendering(self) -> None:
        """The body is compact JSON with no spaces."""
        self.assertEqual(ServerError().body_bytes(), b'{"error":"server_error"}')

    def test_extra_fields_cannot_override_error(self) -> None:
        """Extra fields may not replace C{error} or C{error_description}."""
        self.assertRaises(ValueError, ApiError, 409, "x", extra={"error": "y"})
        self.assertRaises(ValueError, ApiError, 409, "x", extra={"error_description": "y"})

    def test_status_must_be_an_error(self) -> None:
        """An ApiError with a success status is refused."""
        self.assertRaises(ValueError, ApiError, 200, "ok")

    def test_lease_live_carries_incumbent(self) -> None:
        """409 lease_live carries C{bound_at} and C{lease_expires_at}."""
        error = LeaseLive("2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z")
        self.assertEqual(error.status, 409)
        self.assertEqual(
            error.body(),
            {
                "error": "lease_live",
                "bound_at": "2026-01-01T00:00:00Z",
                "lease_expires_at": "2026-01-01T00:05:00Z",
            },
        )

    def test_statuses_and_codes(self) -> None:
        """Each constructor has the spec's status and code."""
        cases: list[tuple[ApiError, int, str]] = [
            (InvalidRequest(), 400, "invalid_request"),
            (InvalidCredential(), 401, "invalid_token"),
            (InvalidCredential("invalid_client"), 401, "invalid_client"),
            (AccessDenied(), 403, "access_denied"),
            (NotFound(), 404, "not_found"),
            (MethodNotAllowed(["GET"]), 405, "method_not_allowed"),
            (Conflict("wrong_agent"), 409, "wrong_agent"),
            (Gone("revoked"), 410, "revoked"),
            (Gone("lease_lost"), 410, "lease_lost"),
            (RateLimited(), 429, "rate_limited"),
            (ServerError(), 500, "server_error"),
            (ServiceUnavailable(), 503, "temporarily_unavailable"),
        ]
        for error, status, code in cases:
            self.assertEqual((error.status, error.code), (status, code), error)

    def test_bad_codes_refused(self) -> None:
        """401 and 410 accept only the spec's codes."""
        self.assertRaises(ValueError, InvalidCredential, "nope")
        self.assertRaises(ValueError, Gone, "nope")

    def test_retry_after(self) -> None:
        """429 and 503 carry C{Retry-After} only when given."""
        self.assertEqual(dict(RateLimited(7).headers), {"Retry-After": "7"})
        self.assertEqual(dict(ServiceUnavailable(retry_after=60).headers), {"Retry-After": "60"})
        self.assertEqual(dict(ServiceUnavailable().headers), {})

    def test_invalid_token_challenge(self) -> None:
        """401 invalid_token carries a Bearer challenge; invalid_client does not."""
        self.assertEqual(dict(InvalidCredential().headers), {"WWW-Authenticate": "Bearer"})
        self.assertEqual(dict(InvalidCredential("invalid_client").headers), {})

    def test_allow_header(self) -> None:
        """405 lists the allowed methods, sorted and unique."""
        error = MethodNotAllowed(["POST", "GET", "GET"])
        self.assertEqual(dict(error.headers), {"Allow": "GET, POST"})
