"""
The SDK's errors: one type for every failed call, and the pure translation
of a non-2xx control-plane answer into it.

Every failure of a L{svc.sdk.Client} method is an L{SvcError}. A non-2xx
answer is an L{SvcError} itself; the subclasses are for failures that are
not an error answer of the control plane: L{TransportError} (no answer:
refused, reset, TLS failure; L{RequestTimeout} when the time ran out),
L{VersionSkewError} (the server speaks another API major) and
L{InvalidResponse} (a 2xx answer that is not what the API documents).

Branch on L{SvcError.kind} (an L{ErrorKind}); C{error.kind is NOT_FOUND} is
the stable not-found test. Formats: C{docs/specifications/sdk.md}.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass

MAX_ERROR_BODY = 64 * 1024
"""The most bytes of an error answer's body kept (and read) by the SDK."""


class ErrorKind(enum.Enum):
    """
    What kind of failure an L{SvcError} is, for branching that survives new
    codes and descriptions.
    """

    INVALID_REQUEST = "invalid_request"
    """400: the request was malformed or a value was refused."""
    UNAUTHENTICATED = "unauthenticated"
    """401: the service token is missing, wrong or malformed."""
    FORBIDDEN = "forbidden"
    """403: C{access_denied}."""
    NOT_FOUND = "not_found"
    """404: unknown entity, owner, agent or route."""
    CONFLICT = "conflict"
    """409: a contradiction with what is stored."""
    GONE = "gone"
    """410: C{revoked} (the agent was revoked or purged) or C{lease_lost}."""
    RATE_LIMITED = "rate_limited"
    """429."""
    SERVER_ERROR = "server_error"
    """500, and any 5xx other than 502, 503, 504."""
    UNAVAILABLE = "unavailable"
    """502, 503, 504: transient."""
    OTHER_STATUS = "other_status"
    """Any other non-2xx status (405, 413, a 3xx ...)."""
    TRANSPORT = "transport"
    """No answer: connection refused or reset, DNS or TLS failure."""
    TIMEOUT = "timeout"
    """No answer within the client's timeout."""
    VERSION_SKEW = "version_skew"
    """The server's C{Svc-API-Version} names another major."""
    INVALID_RESPONSE = "invalid_response"
    """A 2xx answer whose body is not what the API documents."""


NOT_FOUND = ErrorKind.NOT_FOUND
"""The not-found sentinel: C{error.kind is NOT_FOUND}."""

_KIND_BY_STATUS = {
    400: ErrorKind.INVALID_REQUEST,
    401: ErrorKind.UNAUTHENTICATED,
    403: ErrorKind.FORBIDDEN,
    404: ErrorKind.NOT_FOUND,
    409: ErrorKind.CONFLICT,
    410: ErrorKind.GONE,
    429: ErrorKind.RATE_LIMITED,
    502: ErrorKind.UNAVAILABLE,
    503: ErrorKind.UNAVAILABLE,
    504: ErrorKind.UNAVAILABLE,
}


def kind_of_status(status: int) -> ErrorKind:
    """The L{ErrorKind} of a non-2xx HTTP status."""
    if status in _KIND_BY_STATUS:
        return _KIND_BY_STATUS[status]
    if 500 <= status <= 599:
        return ErrorKind.SERVER_ERROR
    return ErrorKind.OTHER_STATUS


@dataclass(frozen=True)
class Headers:
    """
    Response headers in the order received; names compare
    case-insensitively.

    @ivar pairs: C{(name, value)} as received.
    """

    pairs: tuple[tuple[str, str], ...] = ()

    def get(self, name: str) -> str | None:
        """The first value of header C{name}, or L{None}."""
        values = self.get_all(name)
        return values[0] if values else None

    def get_all(self, name: str) -> tuple[str, ...]:
        """Every value of header C{name}, in order."""
        wanted = name.lower()
        return tuple(value for key, value in self.pairs if key.lower() == wanted)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and bool(self.get_all(name))

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self.pairs)


class SvcError(Exception):
    """
    A client call failed.

    @ivar operation: the L{svc.sdk.Client} method, e.g. C{"resolve"}.
    @ivar method: the HTTP method sent.
    @ivar path: the request path sent (percent-encoded, without the base
        URL's own path prefix).
    @ivar status: the HTTP status, or L{None} when no answer came.
    @ivar code: the body's C{error} field, or L{None} when the body had none.
    @ivar message: the body's C{error_description} (empty when absent), or a
        description of the failure for errors without an answer.
    @ivar request_id: the answer's C{X-Request-ID}; the id the SDK sent when
        there is no answer or it carries none.
    @ivar headers: the answer's headers (empty without an answer).
    @ivar body: the answer's raw body, at most L{MAX_ERROR_BODY} bytes.
    @ivar body_truncated: whether the body was longer and cut.
    @ivar kind: the L{ErrorKind}.
    """

    kind: ErrorKind
    _no_answer_kind = ErrorKind.TRANSPORT

    def __init__(
        self,
        *,
        operation: str,
        method: str,
        path: str,
        status: int | None,
        code: str | None,
        message: str,
        request_id: str | None,
        headers: Headers = Headers(),
        body: bytes = b"",
        body_truncated: bool = False,
        kind: ErrorKind | None = None,
    ) -> None:
        self.operation = operation
        self.method = method
        self.path = path
        self.status = status
        self.code = code
        self.message = message
        self.request_id = request_id
        self.headers = headers
        self.body = body
        self.body_truncated = body_truncated
        if kind is None:
            kind = kind_of_status(status) if status is not None else self._no_answer_kind
        self.kind = kind
        super().__init__(self._summary())

    def _summary(self) -> str:
        answer = "no answer" if self.status is None else f"{self.status}"
        if self.code:
            answer += f" {self.code}"
        if self.message:
            answer += f": {self.message}"
        return (
            f"{self.operation}: {self.method} {self.path} -> {answer}"
            f" (request id {self.request_id})"
        )

    @property
    def is_not_found(self) -> bool:
        """Whether this is the not-found case (C{self.kind is NOT_FOUND})."""
        return self.kind is NOT_FOUND


class TransportError(SvcError):
    """No answer: the connection failed, was reset, or TLS was refused."""


class RequestTimeout(TransportError):
    """No (complete) answer within the client's timeout."""

    _no_answer_kind = ErrorKind.TIMEOUT


class VersionSkewError(SvcError):
    """
    The answer's C{Svc-API-Version} names a major other than the SDK's.

    The request may have taken effect on the server; the answer is not
    interpreted.

    @ivar server_version: the header's value as received.
    @ivar client_major: the SDK's API major.
    """

    def __init__(
        self,
        *,
        server_version: str,
        client_major: int,
        operation: str,
        method: str,
        path: str,
        status: int,
        request_id: str | None,
        headers: Headers,
        body: bytes,
        body_truncated: bool,
    ) -> None:
        self.server_version = server_version
        self.client_major = client_major
        super().__init__(
            operation=operation,
            method=method,
            path=path,
            status=status,
            code=None,
            message=(
                f"the server speaks API version {server_version!r};"
                f" this SDK speaks major {client_major}"
            ),
            request_id=request_id,
            headers=headers,
            body=body,
            body_truncated=body_truncated,
            kind=ErrorKind.VERSION_SKEW,
        )


class InvalidResponse(SvcError):
    """A 2xx answer whose body is not what the API documents."""


def read_bounded(read: Callable[[int], bytes], limit: int) -> tuple[bytes, bool]:
    """
    Read at most C{limit + 1} bytes with C{read(n)} (which may return fewer
    than asked, and C{b""} at the end), never more.

    @return: the first C{limit} bytes and whether there were more.
    """
    data = bytearray()
    while len(data) <= limit:
        piece = read(limit + 1 - len(data))
        if not piece:
            break
        data += piece
    return bytes(data[:limit]), len(data) > limit


def parse_error_body(body: bytes) -> tuple[str | None, str]:
    """
    The C{error} code and C{error_description} of an error body.

    A body that is not a JSON object, or whose fields are not strings, gives
    C{(None, "")} for what is missing.
    """
    try:
        document = json.loads(body)
    except ValueError:
        return None, ""
    if not isinstance(document, dict):
        return None, ""
    code = document.get("error")
    description = document.get("error_description")
    return (
        code if isinstance(code, str) else None,
        description if isinstance(description, str) else "",
    )


def error_from_response(
    *,
    operation: str,
    method: str,
    path: str,
    status: int,
    headers: Headers,
    body: bytes,
    body_truncated: bool,
    sent_request_id: str,
) -> SvcError:
    """
    The L{SvcError} for a non-2xx answer. A truncated body is not parsed
    (its code is L{None}): a control-plane error body is far smaller.
    """
    code, message = (None, "") if body_truncated else parse_error_body(body)
    return SvcError(
        operation=operation,
        method=method,
        path=path,
        status=status,
        code=code,
        message=message,
        request_id=headers.get("X-Request-ID") or sent_request_id,
        headers=headers,
        body=body,
        body_truncated=body_truncated,
    )


__all__ = [
    "MAX_ERROR_BODY",
    "NOT_FOUND",
    "ErrorKind",
    "Headers",
    "InvalidResponse",
    "RequestTimeout",
    "SvcError",
    "TransportError",
    "VersionSkewError",
    "error_from_response",
    "kind_of_status",
    "parse_error_body",
    "read_bounded",
]
