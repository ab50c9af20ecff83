"""
The data-plane server's operator listener (C{twist svc-dataplane
--metrics-listen STRPORT}): plain HTTP for Prometheus and probes, kept off
the port agents reach.

Routes (C{docs/specifications/dataplane-http.md} section 8):

  - C{GET /metrics}: the Prometheus text exposition (then no longer served
    on the HTTPS surface: L{DataPlaneHttp}'s C{serve_metrics} is off);
  - C{GET /healthz}: C{{"status": "ok"}} while the process runs;
  - C{GET /readyz}: the readiness checks (L{svc.web.readiness}).

The listener opens first thing at start, before the server has its
certificate, so C{/readyz} tells an operator what the server still waits
for. It has no authentication of its own: bind it to an interface only the
operator's scrapers reach. The two rendering helpers are shared with the
HTTPS surface, which serves the same three routes.
"""

from __future__ import annotations

from typing import Any, cast

import werkzeug.exceptions
from klein import Klein
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import serverFromString
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.resource import IResource
from twisted.web.server import Request, Site

from svc.web.errors import (
    ApiError,
    JsonValue,
    MethodNotAllowed,
    NotFound,
    ServerError,
    render_json,
)
from svc.web.readiness import ReadinessProbe

JSON_CONTENT_TYPE = b"application/json"


class QuietSite(Site):
    """A C{Site} without an access log (C{/metrics} is scraped often)."""

    def log(self, request: Any) -> None:
        """Log nothing."""


def metrics_exposition(request: Request, registry: CollectorRegistry) -> bytes:
    """The Prometheus text exposition of C{registry}, with its content type."""
    request.responseHeaders.setRawHeaders(b"Content-Type", [CONTENT_TYPE_LATEST.encode("ascii")])
    exposition: bytes = generate_latest(registry)
    return exposition


async def readiness_answer(request: Request, probe: ReadinessProbe) -> bytes:
    """
    200 and the readiness body when every check passes; else raises the
    503 L{ApiError} (the caller's error handler renders it).
    """
    readiness = await probe.probe()
    if not readiness.ready:
        raise readiness.refusal()
    return _json(request, readiness.body())


class OperatorHttp:
    """
    The Klein application of the operator listener.

    @param registry: the registry served at C{/metrics}.
    @param readiness: the server's readiness checks.
    """

    app = Klein()
    _log = Logger()

    def __init__(self, registry: CollectorRegistry, readiness: ReadinessProbe) -> None:
        self._registry = registry
        self._readiness = readiness

    def resource(self) -> IResource:
        """The Twisted resource to serve (wrap in a C{Site})."""
        return cast(IResource, self.app.resource())

    def listen(self, reactor: Any, description: str) -> Deferred[Any]:
        """Serve on the stream endpoint C{description}, without an access log."""
        site = QuietSite(self.resource())  # type: ignore[no-untyped-call]
        endpoint: Any = serverFromString(reactor, description)  # type: ignore[no-untyped-call]
        listening: Deferred[Any] = endpoint.listen(site)
        return listening

    @app.route("/healthz", methods=["GET"])
    def healthz(self, request: Request) -> bytes:
        """C{{"status": "ok"}}."""
        return _json(request, {"status": "ok"})

    @app.route("/metrics", methods=["GET"])
    def metrics(self, request: Request) -> bytes:
        """The Prometheus text exposition."""
        return metrics_exposition(request, self._registry)

    @app.route("/readyz", methods=["GET"])
    async def readyz(self, request: Request) -> bytes:
        """200 when ready, else 503 naming the failing checks."""
        return await readiness_answer(request, self._readiness)

    @app.handle_errors
    def render_failure(  # type: ignore[misc]
        self, request: Request, failure: Failure
    ) -> bytes:
        """An L{ApiError} as itself, Klein's routing errors as 404/405, else 500."""
        value: Any = failure.value
        error: ApiError
        if isinstance(value, ApiError):
            error = value
        elif isinstance(value, werkzeug.exceptions.MethodNotAllowed):
            error = MethodNotAllowed(list(value.valid_methods or []))
        elif isinstance(value, werkzeug.exceptions.NotFound):
            error = NotFound()
        else:
            error = ServerError()
            self._log.failure("unhandled error in GET {path}", failure, path=request.uri)
        request.setResponseCode(error.status)
        for name, header in error.headers.items():
            request.responseHeaders.setRawHeaders(
                name.encode("latin-1"), [header.encode("latin-1")]
            )
        request.responseHeaders.setRawHeaders(b"Content-Type", [JSON_CONTENT_TYPE])
        return error.body_bytes()


def _json(request: Request, body: JsonValue) -> bytes:
    request.responseHeaders.setRawHeaders(b"Content-Type", [JSON_CONTENT_TYPE])
    return render_json(body)
