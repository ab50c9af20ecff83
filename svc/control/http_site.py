"""
The HTTP/1.1 server the control plane's app is served by: request bodies
bounded before anything reads them, and the answers Twisted's own parser
gives carrying the general headers.

L{ControlSite} is a C{Site} whose connections are L{ControlChannel}s and
whose requests are L{BoundedRequest}s:

  - a request declaring a C{Content-Length} above C{max_body_bytes} is
    answered C{413} at once, when its headers end: no byte of the body is
    read, no route is looked up, no credential is checked; a chunked body is
    counted as it arrives and answered the same way once it passes the
    limit. The body is held in memory (never spooled to disk), so one
    request costs at most the limit;
  - a request Twisted's parser refuses (a malformed request line or header,
    too many or too large headers, a line over 16 KiB, a bad
    C{Content-Length} or chunk) is
    answered C{400 invalid_request} / C{malformed_request} instead of
    Twisted's bare C{400 Bad Request}.

Both answers have the body, C{X-Request-ID}, C{Svc-API-Version} and
C{Content-Type} every control-plane answer has, produce the same request
log line as L{svc.control.http.ControlResource}, and close the connection
(the rest of the request is never read). Rules:
C{docs/specifications/control-http.md} section 2.
"""

from __future__ import annotations

import io
from typing import Any, cast

from twisted.web.http import RESPONSES, HTTPChannel
from twisted.web.resource import Resource
from twisted.web.server import Request, Site

from svc.control.http import (
    API_VERSION_HEADER,
    JSON_CONTENT_TYPE,
    REQUEST_ID_HEADER,
    RequestTooLarge,
    log_request,
)
from svc.control.settings import DEFAULT_MAX_BODY_BYTES
from svc.web.errors import ApiError, InvalidRequest
from svc.web.rules import API_MAJOR_VERSION, choose_request_id, new_request_id

MALFORMED_REQUEST = "malformed_request"
"""The description of the 400 for a request Twisted's parser refused."""


class BoundedRequest(Request):
    """
    A request whose body is kept in memory up to the site's limit; a chunk
    past it makes the channel refuse the request (413).
    """

    _body_bytes = 0

    def gotLength(self, length: int | None) -> None:
        self.content = io.BytesIO()
        self._body_bytes = 0

    def handleContentChunk(self, data: bytes) -> None:
        channel = cast(ControlChannel, self.channel)
        if channel.refused:
            return
        self._body_bytes += len(data)
        if self._body_bytes > channel.site.max_body_bytes:
            channel.refuse(RequestTooLarge(channel.site.max_body_bytes))
            return
        cast(io.BytesIO, self.content).write(data)


class ControlChannel(HTTPChannel):
    """
    One HTTP/1.1 connection: refuses oversized bodies when their length is
    known and answers its own parse failures with the general headers.
    """

    site: ControlSite
    refused = False
    """Whether this connection answered a refusal and is closing."""

    def allHeadersReceived(self) -> None:
        length = self.length
        if length is not None and length > self.site.max_body_bytes:
            self.refuse(RequestTooLarge(self.site.max_body_bytes))
            return
        super().allHeadersReceived()  # type: ignore[no-untyped-call]

    def rawDataReceived(self, data: bytes) -> None:
        if self.refused:
            return
        super().rawDataReceived(data)

    def allContentReceived(self) -> None:
        if self.refused:
            return
        super().allContentReceived()  # type: ignore[no-untyped-call]

    def _respondToBadRequestAndDisconnect(self) -> None:
        # Twisted's parser calls this for every request it cannot parse.
        self.refuse(InvalidRequest(MALFORMED_REQUEST))

    def lineLengthExceeded(self, line: bytes) -> None:
        # A request or header line longer than LineReceiver.MAX_LENGTH.
        self.refuse(InvalidRequest(MALFORMED_REQUEST))

    def refuse(self, error: ApiError) -> None:
        """
        Answer C{error} (general headers, C{Connection: close}) and close
        the connection without reading the rest of the request.
        """
        if self.refused:
            return
        self.refused = True
        request = self.requests[-1] if self.requests else None
        incoming = (
            None if request is None else request.requestHeaders.getRawHeaders(REQUEST_ID_HEADER)
        )
        request_id = choose_request_id(incoming, new_request_id())
        body = error.body_bytes()
        headers = [
            (REQUEST_ID_HEADER, request_id.encode("ascii")),
            (API_VERSION_HEADER, str(API_MAJOR_VERSION).encode("ascii")),
            (b"Content-Type", JSON_CONTENT_TYPE),
            (b"Content-Length", str(len(body)).encode("ascii")),
            (b"Connection", b"close"),
            *(
                (name.encode("latin-1"), value.encode("latin-1"))
                for name, value in error.headers.items()
            ),
        ]
        reason = RESPONSES.get(error.status, b"Error")
        head = b"HTTP/1.1 %d %s\r\n" % (error.status, reason)
        head += b"".join(name + b": " + value + b"\r\n" for name, value in headers)
        transport: Any = self.transport
        transport.write(head + b"\r\n" + body)
        command = getattr(self, "_command", None)
        path = getattr(self, "_path", None)
        log_request(
            method=_text(command),
            path=_text(path.split(b"?", 1)[0] if isinstance(path, bytes) else None),
            status=error.status,
            duration=0.0,
            request_id=request_id,
            completed=True,
        )
        self.loseConnection()  # type: ignore[no-untyped-call]


def _text(value: object) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else "-"


class ControlSite(Site):
    """
    The site serving the control plane: L{ControlChannel} connections,
    L{BoundedRequest} requests, no access log of its own (the app logs every
    request), no parsing of form bodies into C{request.args}.

    @param max_body_bytes: the largest request body accepted
        (C{SVC_MAX_BODY_BYTES}).
    @param reactor: for the connections' idle timeouts (the global one if
        L{None}).
    """

    protocol = ControlChannel  # type: ignore[assignment]
    requestFactory = BoundedRequest

    def __init__(
        self,
        resource: Resource,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        *,
        reactor: Any = None,
    ) -> None:
        super().__init__(  # type: ignore[no-untyped-call]
            resource, parsePOSTFormSubmission=False, reactor=reactor
        )
        self.max_body_bytes = max_body_bytes

    def log(self, request: Any) -> None:
        """Log nothing (L{svc.control.http.ControlResource} logs every request)."""
