"""
The control plane's Klein application: the general HTTP rules applied to
every response, route registration from L{svc.control.routing} declarations,
authentication by credential kind, and the one place errors become
responses.

Every response, including Klein's own 404/405 and a 500, carries
C{X-Request-ID}, C{Svc-API-Version: 1} and C{Content-Type:
application/json} (no body and no content type on 204), and produces one
request log line with the same id. That is done by L{ControlResource}, which
wraps Klein's resource, so nothing Klein renders can escape it.

Use::

    app = ControlApp(routes, features, authenticators=..., now=reactor.seconds)
    site = Site(app.resource())           # or StubTreq(app.resource())
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol, TypeVar, cast

import werkzeug.exceptions
from klein import Klein
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request

from svc.control.routing import (
    AuthKind,
    Feature,
    HandlerResult,
    MountedRoute,
    Reply,
    Route,
    plan_mounts,
)
from svc.control.settings import DEFAULT_MAX_BODY_BYTES
from svc.control.store.errors import Unavailable
from svc.web.errors import (
    ApiError,
    InvalidRequest,
    JsonValue,
    MethodNotAllowed,
    NotFound,
    ServerError,
    ServiceUnavailable,
    render_json,
)
from svc.web.rules import (
    API_MAJOR_VERSION,
    BODY_REQUIRED,
    BODY_TOO_LARGE,
    check_json_content_type,
    choose_request_id,
    new_request_id,
    parse_json_object,
)

REQUEST_ID_HEADER = b"X-Request-ID"
API_VERSION_HEADER = b"Svc-API-Version"
JSON_CONTENT_TYPE = b"application/json"
REQUEST_TOO_LARGE = "request_too_large"
DATABASE_UNAVAILABLE = "database_unavailable"
DATABASE_RETRY_AFTER = 5
"""Seconds a client is asked to wait after 503 C{database_unavailable}."""

P = TypeVar("P")

_log = Logger()


class RequestTooLarge(ApiError):
    """
    413 C{request_too_large} / C{body_too_large}: the request body is over
    C{SVC_MAX_BODY_BYTES}; the body names the limit (C{max_body_bytes}).
    """

    def __init__(self, limit: int) -> None:
        super().__init__(413, REQUEST_TOO_LARGE, BODY_TOO_LARGE, extra={"max_body_bytes": limit})


class Authenticator(Protocol):
    """
    Turns a request's credential into a principal for one L{AuthKind}, or
    raises an L{ApiError} (401/403).
    """

    def authenticate(self, request: Request) -> Awaitable[object]:
        """
        The principal the request's credential proves.
        """


class Call:
    """
    One authenticated request, as a route handler sees it.

    @ivar request: the Twisted request (for anything not covered here).
    @ivar params: the route's path parameters.
    @ivar principal: what the route's authenticator returned (L{None} for
        public routes); see L{principal_as}.
    @ivar request_id: the request's C{X-Request-ID}.
    """

    def __init__(
        self,
        request: Request,
        params: Mapping[str, str],
        principal: object,
        request_id: str,
        max_body_bytes: int,
    ) -> None:
        self.request = request
        self.params = params
        self.principal = principal
        self.request_id = request_id
        self._max_body_bytes = max_body_bytes
        self._body: dict[str, JsonValue] | None = None

    def principal_as(self, kind: type[P]) -> P:
        """
        The principal, checked to be a C{kind}; a mismatch is a wiring bug
        (500).
        """
        if not isinstance(self.principal, kind):
            raise TypeError(f"principal is {type(self.principal).__name__}, not {kind.__name__}")
        return self.principal

    def json_body(self, *, optional: bool = False) -> dict[str, JsonValue]:
        """
        The request body, which must be a JSON object sent as
        C{application/json} (its size was bounded before routing).

        @param optional: an empty body is C{{}} instead of an error.
        @raise InvalidRequest: the body breaks a rule.
        """
        if self._body is not None:
            return self._body
        request = self.request
        content = request.content
        raw = b""
        if content is not None:
            content.seek(0)
            raw = content.read(self._max_body_bytes + 1)
        if not raw:
            if optional:
                return {}
            raise InvalidRequest(BODY_REQUIRED)
        check_json_content_type(request.getHeader(b"content-type"))
        self._body = parse_json_object(raw, self._max_body_bytes)
        return self._body

    def query_arg(self, name: str) -> str | None:
        """
        The single value of query parameter C{name}, or L{None} if absent.

        @raise InvalidRequest: it is repeated or not UTF-8.
        """
        args: Mapping[bytes, list[bytes]] = self.request.args or {}
        values = args.get(name.encode("ascii"))
        if not values:
            return None
        if len(values) != 1:
            raise InvalidRequest(f"repeated_parameter:{name}")
        value: bytes = values[0]
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidRequest(f"bad_parameter:{name}") from None

    def header(self, name: str) -> str | None:
        """
        The last value of request header C{name} decoded as Latin-1, or
        L{None}.
        """
        value = self.request.getHeader(name.encode("ascii"))
        return None if value is None else value.decode("latin-1")


async def _healthz(call: Call) -> HandlerResult:
    return {"status": "ok"}


HEALTHZ_ROUTE = Route("GET", "/healthz", AuthKind.PUBLIC, _healthz)
"""Mounting rule 1: always mounted, public, C{{"status": "ok"}}."""


class ControlApp:
    """
    The control plane's Klein app for one configuration.

    @param routes: route declarations; L{HEALTHZ_ROUTE} is always added.
    @param features: what this process has; decides which routes exist.
    @param authenticators: one per L{AuthKind} used by a mounted route.
    @param now: the clock (e.g. C{reactor.seconds}), for request durations.
    @param ready: whether a feature is usable right now (C{serves_with});
        defaults to membership of C{features}.
    @param make_request_id: source of fresh request ids.

    @raise ValueError: a mounted route needs an authenticator not given, or
        two routes collide.
    """

    def __init__(
        self,
        routes: Iterable[Route],
        features: frozenset[Feature],
        *,
        authenticators: Mapping[AuthKind, Authenticator],
        now: Callable[[], float],
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        ready: Callable[[Feature], bool] | None = None,
        make_request_id: Callable[[], str] = new_request_id,
    ) -> None:
        self.app = Klein()
        self.features = features
        self._authenticators = dict(authenticators)
        self._now = now
        self._max_body_bytes = max_body_bytes
        self._ready = ready if ready is not None else features.__contains__
        self._make_request_id = make_request_id
        # Adjacent slashes are a 404, not a redirect to the merged path.
        self.app.url_map.merge_slashes = False
        self.mounted: tuple[MountedRoute, ...] = plan_mounts([HEALTHZ_ROUTE, *routes], features)
        for mounted in self.mounted:
            auth = mounted.route.auth
            if auth is not AuthKind.PUBLIC and auth not in self._authenticators:
                raise ValueError(f"{mounted.endpoint} needs a {auth.value} authenticator")
            self.app.route(mounted.path, methods=[mounted.route.method], endpoint=mounted.endpoint)(
                self._executor(mounted.route)
            )
        self.app.handle_errors(Exception)(self._render_failure)

    def resource(self) -> Resource:
        """
        The resource to serve (by a C{Site} or C{StubTreq}).
        """
        return ControlResource(
            self.app.resource(), self._now, self._make_request_id, self._max_body_bytes
        )

    def _executor(self, route: Route) -> Callable[..., Awaitable[bytes]]:
        async def execute(request: Request, **params: str) -> bytes:
            principal = await self._authenticate(route.auth, request)
            for feature in sorted(route.serves_with, key=lambda f: f.value):
                if not self._ready(feature):
                    raise ServiceUnavailable(f"{feature.value}_not_configured")
            call = Call(request, params, principal, request_id_of(request), self._max_body_bytes)
            result = route.handler(call)
            if inspect.isawaitable(result):
                result = await result
            return _render_result(request, result)

        execute.__name__ = f"execute {route.method} {route.path}"
        return execute

    async def _authenticate(self, kind: AuthKind, request: Request) -> object:
        if kind is AuthKind.PUBLIC:
            return None
        return await self._authenticators[kind].authenticate(request)

    def _render_failure(self, request: Request, failure: Failure) -> bytes:
        error = _api_error_for(failure)
        if isinstance(failure.value, Unavailable):
            _log.warn(
                "database unavailable in {method} {path} request_id={request_id}: {reason}",
                method=_text(request.method),
                path=_text(request.path),
                request_id=request_id_of(request),
                reason=failure.getErrorMessage(),
            )
        elif isinstance(error, ServerError):
            _log.failure(
                "unhandled error in {method} {path} request_id={request_id}",
                failure,
                method=_text(request.method),
                path=_text(request.path),
                request_id=request_id_of(request),
            )
        return render_error(request, error)


def _api_error_for(failure: Failure) -> ApiError:
    value = failure.value
    if isinstance(value, ApiError):
        return value
    if isinstance(value, Unavailable):
        return ServiceUnavailable(DATABASE_UNAVAILABLE, retry_after=DATABASE_RETRY_AFTER)
    if isinstance(value, werkzeug.exceptions.MethodNotAllowed):
        return MethodNotAllowed(list(value.valid_methods or []))
    if isinstance(value, werkzeug.exceptions.NotFound):
        return NotFound()
    if isinstance(value, werkzeug.exceptions.HTTPException) and 400 <= (value.code or 0) < 500:
        return InvalidRequest()
    return ServerError()


def render_error(request: Request, error: ApiError) -> bytes:
    """
    Apply C{error} to C{request} (status, headers) and return its body.
    """
    request.setResponseCode(error.status)
    _set_headers(request, error.headers)
    _set_header(request, b"Content-Type", JSON_CONTENT_TYPE)
    return error.body_bytes()


def _render_result(request: Request, result: HandlerResult) -> bytes:
    if isinstance(result, Reply):
        reply = result
    elif isinstance(result, Mapping):
        reply = Reply(body=dict(result))
    else:
        raise TypeError(f"handler returned {type(result).__name__}, not a Reply or mapping")
    if reply.streamed:
        return b""
    request.setResponseCode(reply.status)
    _set_headers(request, reply.headers)
    if reply.raw is not None and reply.raw_type is not None:
        _set_header(request, b"Content-Type", reply.raw_type.encode("latin-1"))
        return reply.raw
    if reply.body is None:
        request.responseHeaders.removeHeader(b"Content-Type")
        return b""
    return render_json(reply.body)


def request_id_of(request: Request) -> str:
    """
    The id L{ControlResource} gave C{request}.
    """
    values = request.responseHeaders.getRawHeaders(REQUEST_ID_HEADER)
    return values[0].decode("ascii") if values else ""


def _set_header(request: Request, name: bytes, value: bytes) -> None:
    request.responseHeaders.setRawHeaders(name, [value])


def _set_headers(request: Request, headers: Mapping[str, str]) -> None:
    for name, value in headers.items():
        _set_header(request, name.encode("latin-1"), value.encode("latin-1"))


def _text(value: bytes | None) -> str:
    return "" if value is None else value.decode("latin-1")


def log_request(
    *, method: str, path: str, status: int, duration: float, request_id: str, completed: bool
) -> None:
    """
    The one log line of a finished request: the method, the path without
    its query string (a query may carry a token), the status, the duration
    and the request id. Per-request chatter: shown with C{SVC_LOG_LEVEL=debug}.
    """
    _log.debug(
        "{method} {path} {status} {duration:.3f}s request_id={request_id}",
        method=method,
        path=path,
        status=status,
        duration=duration,
        request_id=request_id,
        completed=completed,
    )


class ControlResource(Resource):
    """
    The root resource: stamps C{X-Request-ID} (a well-formed incoming one,
    else a fresh one), C{Svc-API-Version} and a JSON content type on every
    response, logs one line per request when it finishes (L{log_request}),
    refuses a body over C{max_body_bytes} (413, before any route or
    credential is looked at), then lets the wrapped Klein resource route it.

    Served by L{svc.control.http_site.ControlSite}, an oversized body is
    refused before it is read and never gets here; the check here holds the
    same rule under any other site.
    """

    isLeaf = True

    def __init__(
        self,
        inner: Resource,
        now: Callable[[], float],
        make_request_id: Callable[[], str],
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._inner = inner
        self._now = now
        self._make_request_id = make_request_id
        self._max_body_bytes = max_body_bytes

    def render(self, request: Request) -> bytes | int:
        request_id = choose_request_id(
            request.requestHeaders.getRawHeaders(REQUEST_ID_HEADER), self._make_request_id()
        )
        _set_header(request, REQUEST_ID_HEADER, request_id.encode("ascii"))
        _set_header(request, API_VERSION_HEADER, str(API_MAJOR_VERSION).encode("ascii"))
        _set_header(request, b"Content-Type", JSON_CONTENT_TYPE)
        started = self._now()
        finished = request.notifyFinish()
        finished.addBoth(self._log_request, request, request_id, started)
        try:
            b"/".join(request.postpath or []).decode("utf-8")
        except UnicodeDecodeError:
            return render_error(request, InvalidRequest("path_not_utf8"))
        if _body_size(request) > self._max_body_bytes:
            return render_error(request, RequestTooLarge(self._max_body_bytes))
        rendered: Any = self._inner.render(request)  # type: ignore[no-untyped-call]
        return cast("bytes | int", rendered if rendered is not None else NOT_DONE_YET)

    def _log_request(
        self, result: object, request: Request, request_id: str, started: float
    ) -> None:
        log_request(
            method=_text(request.method),
            path=_text(request.path),
            status=request.code,
            duration=self._now() - started,
            request_id=request_id,
            completed=not isinstance(result, Failure),
        )


def _body_size(request: Request) -> int:
    content = request.content
    if content is None:
        return 0
    size: int = content.seek(0, 2)
    content.seek(0)
    return size
