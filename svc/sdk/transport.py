"""
One HTTP exchange with the control plane, with the standard library's
C{http.client}: the headers every request carries, bounded reads, the
version check, and the translation of every failure to an L{SvcError}.

No redirects are followed and no proxy is used: the service token goes only
to the configured origin.
"""

from __future__ import annotations

import http.client
import json
import re
import secrets
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from svc.sdk.errors import (
    MAX_ERROR_BODY,
    Headers,
    InvalidResponse,
    RequestTimeout,
    TransportError,
    VersionSkewError,
    error_from_response,
    read_bounded,
)

API_MAJOR = 1
"""The control-plane API major this SDK speaks (C{Svc-API-Version})."""

MAX_RESPONSE_BODY = 8 * 1024 * 1024
"""The largest 2xx body accepted; a longer one is L{InvalidResponse}."""

API_VERSION_HEADER = "Svc-API-Version"
REQUEST_ID_HEADER = "X-Request-ID"

_MAJOR = re.compile(r"\s*([0-9]+)(?:\.[0-9]+)*\s*")


def server_major(value: str) -> int | None:
    """
    The major named by a C{Svc-API-Version} value (C{"1"}, or C{"1.4"}), or
    L{None} when it names none.
    """
    match = _MAJOR.fullmatch(value)
    return int(match.group(1)) if match else None


def is_compatible(value: str | None) -> bool:
    """
    Whether an answer's C{Svc-API-Version} (L{None}: absent) is compatible
    with L{API_MAJOR}: absent, or naming the same major.
    """
    return value is None or server_major(value) == API_MAJOR


def encode_segment(segment: str) -> str:
    """
    One path parameter, percent-encoded so that it stays one segment:
    every byte but C{A-Z a-z 0-9 - . _ ~} is escaped, and C{.} and C{..}
    (which would mean "this" and "the parent" segment) are escaped too.
    """
    if not isinstance(segment, str) or not segment:
        raise ValueError(f"a path parameter must be a non-empty string, got {segment!r}")
    encoded = quote(segment, safe="")
    if segment in (".", ".."):
        encoded = encoded.replace(".", "%2E")
    return encoded


@dataclass(frozen=True)
class Endpoint:
    """
    Where the control plane is.

    @ivar base_path: a path prefix (e.g. C{/api}), without a trailing slash;
        empty for none.
    """

    scheme: str
    host: str
    port: int | None
    base_path: str

    @classmethod
    def from_url(cls, url: str) -> Endpoint:
        """Parse C{http[s]://host[:port][/prefix]}; anything else is L{ValueError}."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"base_url must be http:// or https://, got {url!r}")
        if not parts.hostname:
            raise ValueError(f"base_url has no host: {url!r}")
        if parts.username is not None or parts.password is not None:
            raise ValueError("base_url must not carry credentials")
        if parts.query or parts.fragment:
            raise ValueError(f"base_url must not have a query or fragment: {url!r}")
        return cls(parts.scheme, parts.hostname, parts.port, parts.path.rstrip("/"))


@dataclass(frozen=True)
class Answer:
    """
    A 2xx answer, with what was asked.

    @ivar body: at most L{MAX_RESPONSE_BODY} bytes.
    """

    operation: str
    method: str
    path: str
    status: int
    headers: Headers
    body: bytes
    request_id: str

    def invalid(self, reason: str) -> InvalidResponse:
        """The L{InvalidResponse} for this answer."""
        return InvalidResponse(
            operation=self.operation,
            method=self.method,
            path=self.path,
            status=self.status,
            code=None,
            message=reason,
            request_id=self.request_id,
            headers=self.headers,
            body=self.body[:MAX_ERROR_BODY],
            body_truncated=len(self.body) > MAX_ERROR_BODY,
        )

    def json_object(self) -> dict[str, Any]:
        """The body as a JSON object, else L{InvalidResponse}."""
        try:
            document = json.loads(self.body)
        except ValueError:
            raise self.invalid("the body is not JSON") from None
        if not isinstance(document, dict):
            raise self.invalid("the body is not a JSON object")
        return document


def new_request_id() -> str:
    """A fresh C{X-Request-ID}: 32 lowercase hex digits."""
    return secrets.token_hex(16)


class Transport:
    """
    Sends requests to one control plane with the service token.
    """

    def __init__(
        self,
        endpoint: Endpoint,
        service_token: str,
        *,
        timeout: float,
        ssl_context: ssl.SSLContext | None,
        user_agent: str,
        request_ids: Callable[[], str] = new_request_id,
    ) -> None:
        self._endpoint = endpoint
        self._token = service_token
        self._timeout = timeout
        self._ssl_context = ssl_context
        self._user_agent = user_agent
        self._request_ids = request_ids

    def _connection(self) -> http.client.HTTPConnection:
        endpoint = self._endpoint
        if endpoint.scheme == "https":
            return http.client.HTTPSConnection(
                endpoint.host, endpoint.port, timeout=self._timeout, context=self._ssl_context
            )
        return http.client.HTTPConnection(endpoint.host, endpoint.port, timeout=self._timeout)

    def request(
        self, operation: str, method: str, path: str, body: Mapping[str, Any] | None = None
    ) -> Answer:
        """
        Send one request and read its answer.

        @param path: the percent-encoded path, after the base URL's prefix.
        @param body: sent as JSON when given.
        @return: the 2xx answer.
        @raise SvcError: for a non-2xx answer; L{TransportError} (or
            L{RequestTimeout}) without one; L{VersionSkewError} for an
            answer of another API major; L{InvalidResponse} for a 2xx
            body over L{MAX_RESPONSE_BODY}.
        """
        request_id = self._request_ids()
        headers = {
            "Authorization": f"Bearer {self._token}",
            API_VERSION_HEADER: str(API_MAJOR),
            REQUEST_ID_HEADER: request_id,
            "Accept": "application/json",
            "User-Agent": self._user_agent,
        }
        data = None
        if body is not None:
            data = json.dumps(body, separators=(",", ":"), allow_nan=False).encode("utf-8")
            headers["Content-Type"] = "application/json"
        connection = self._connection()
        try:
            connection.request(method, self._endpoint.base_path + path, body=data, headers=headers)
            response = connection.getresponse()
            status = response.status
            received = Headers(tuple(response.getheaders()))
            limit = MAX_RESPONSE_BODY if 200 <= status <= 299 else MAX_ERROR_BODY
            raw, truncated = read_bounded(response.read, limit)
        except TimeoutError as e:
            raise RequestTimeout(
                operation=operation,
                method=method,
                path=path,
                status=None,
                code=None,
                message=f"no answer within {self._timeout} s",
                request_id=request_id,
            ) from e
        except (OSError, http.client.HTTPException) as e:
            raise TransportError(
                operation=operation,
                method=method,
                path=path,
                status=None,
                code=None,
                message=f"{type(e).__name__}: {e}",
                request_id=request_id,
            ) from e
        finally:
            connection.close()
        version = received.get(API_VERSION_HEADER)
        if not is_compatible(version):
            assert version is not None
            raise VersionSkewError(
                operation=operation,
                method=method,
                path=path,
                server_version=version,
                client_major=API_MAJOR,
                status=status,
                request_id=received.get(REQUEST_ID_HEADER) or request_id,
                headers=received,
                body=raw[:MAX_ERROR_BODY],
                body_truncated=truncated or len(raw) > MAX_ERROR_BODY,
            )
        if not 200 <= status <= 299:
            raise error_from_response(
                operation=operation,
                method=method,
                path=path,
                status=status,
                headers=received,
                body=raw,
                body_truncated=truncated,
                sent_request_id=request_id,
            )
        answer = Answer(
            operation=operation,
            method=method,
            path=path,
            status=status,
            headers=received,
            body=raw,
            request_id=received.get(REQUEST_ID_HEADER) or request_id,
        )
        if truncated:
            raise answer.invalid(f"the body is over {MAX_RESPONSE_BODY} bytes")
        return answer


__all__ = [
    "API_MAJOR",
    "MAX_RESPONSE_BODY",
    "Answer",
    "Endpoint",
    "Transport",
    "encode_segment",
    "is_compatible",
    "new_request_id",
    "server_major",
]
