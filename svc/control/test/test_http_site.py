"""
Tests for L{svc.control.http_site}: bodies bounded before they are read or
authenticated, and Twisted's own parse refusals with the general headers,
driven byte by byte over a L{StringTransport}.
"""

from __future__ import annotations

import json

from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import capturedLogs
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.server import Request

from svc.control.http import Call, ControlApp
from svc.control.http_site import ControlChannel, ControlSite
from svc.control.routing import AuthKind, HandlerResult, Route
from svc.web.errors import InvalidCredential

LIMIT = 1024


class _Recording:
    """An authenticator that records every request it is asked about."""

    def __init__(self) -> None:
        self.asked = 0

    async def authenticate(self, request: Request) -> object:
        self.asked += 1
        if request.getHeader(b"x-who") is None:
            raise InvalidCredential()
        return "someone"


def _size(call: Call) -> HandlerResult:
    content = call.request.content
    return {"size": 0 if content is None else len(content.read())}


class _Connection:
    """One connection to a L{ControlSite} over a L{StringTransport}."""

    def __init__(self, authenticator: _Recording) -> None:
        app = ControlApp(
            [Route("POST", "/size", AuthKind.SERVICE_TOKEN, _size)],
            frozenset(),
            authenticators={AuthKind.SERVICE_TOKEN: authenticator},
            now=Clock().seconds,
            max_body_bytes=LIMIT,
        )
        site = ControlSite(app.resource(), LIMIT, reactor=Clock())
        channel = site.buildProtocol(None)
        assert isinstance(channel, ControlChannel)
        self.channel = channel
        self.transport = StringTransport()
        channel.makeConnection(self.transport)

    def send(self, data: bytes) -> None:
        self.channel.dataReceived(data)

    def answer(self) -> tuple[bytes, dict[bytes, bytes], bytes]:
        """The status line, headers (lower-case names) and body written."""
        head, _, body = self.transport.value().partition(b"\r\n\r\n")
        status, *lines = head.split(b"\r\n")
        headers = {}
        for line in lines:
            name, _, value = line.partition(b": ")
            headers[name.lower()] = value
        return status, headers, body


class BodyLimitTests(SynchronousTestCase):
    """Bodies over C{max_body_bytes} are refused before they are read."""

    def setUp(self) -> None:
        self.authenticator = _Recording()
        self.connection = _Connection(self.authenticator)

    def assertRefused413(self) -> dict[bytes, bytes]:
        status, headers, body = self.connection.answer()
        self.assertEqual(status, b"HTTP/1.1 413 Request Entity Too Large")
        self.assertEqual(
            json.loads(body),
            {
                "error": "request_too_large",
                "error_description": "body_too_large",
                "max_body_bytes": LIMIT,
            },
        )
        self.assertEqual(headers[b"svc-api-version"], b"1")
        self.assertEqual(headers[b"content-type"], b"application/json")
        self.assertEqual(headers[b"connection"], b"close")
        self.assertEqual(int(headers[b"content-length"]), len(body))
        self.assertTrue(self.connection.transport.disconnecting)
        self.assertEqual(self.authenticator.asked, 0)
        return headers

    def test_declared_length_refused_at_headers(self) -> None:
        """A Content-Length over the limit is 413 when the headers end, unauthenticated."""
        with capturedLogs() as events:
            self.connection.send(
                b"POST /size HTTP/1.1\r\nHost: c\r\nX-Request-ID: mine-1\r\n"
                b"Content-Length: 67108864\r\n\r\n"
            )
        headers = self.assertRefused413()
        self.assertEqual(headers[b"x-request-id"], b"mine-1")
        lines = [e for e in events if e.get("request_id") == "mine-1"]
        self.assertEqual(
            [(e["method"], e["path"], e["status"]) for e in lines], [("POST", "/size", 413)]
        )

    def test_body_after_refusal_not_read(self) -> None:
        """Bytes of the refused body that arrive later are dropped, never routed."""
        self.connection.send(
            b"POST /size HTTP/1.1\r\nHost: c\r\nContent-Length: 2000\r\n\r\n" + b"x" * 2000
        )
        self.assertRefused413()
        self.connection.send(b"GET /healthz HTTP/1.1\r\nHost: c\r\n\r\n")
        self.assertEqual(self.connection.transport.value().count(b"HTTP/1.1"), 1)

    def test_no_continue_for_refused_body(self) -> None:
        """Expect: 100-continue with an oversized length gets the 413, not 100 Continue."""
        self.connection.send(
            b"POST /size HTTP/1.1\r\nHost: c\r\nExpect: 100-continue\r\n"
            b"Content-Length: 5000\r\n\r\n"
        )
        self.assertNotIn(b"100 Continue", self.connection.transport.value())
        self.assertRefused413()

    def test_chunked_body_refused_past_limit(self) -> None:
        """A chunked body is counted as it arrives and refused once it passes the limit."""
        self.connection.send(
            b"POST /size HTTP/1.1\r\nHost: c\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        chunk = b"%x\r\n%s\r\n" % (600, b"y" * 600)
        self.connection.send(chunk)
        self.assertEqual(self.connection.transport.value(), b"")
        self.connection.send(chunk + b"0\r\n\r\n")
        self.assertRefused413()
        request = self.connection.channel.requests[-1]
        self.assertLessEqual(len(request.content.getvalue()), LIMIT)

    def test_body_at_limit_served(self) -> None:
        """A body of exactly the limit reaches authentication and the route."""
        self.connection.send(
            b"POST /size HTTP/1.1\r\nHost: c\r\nX-Who: me\r\nContent-Length: %d\r\n\r\n" % LIMIT
            + b"z" * LIMIT
        )
        status, _, body = self.connection.answer()
        self.assertEqual(status, b"HTTP/1.1 200 OK")
        self.assertIn(b'{"size":1024}', body)
        self.assertEqual(self.authenticator.asked, 1)

    def test_body_held_in_memory(self) -> None:
        """A body is held in memory (never spooled to a file), whatever its declared length."""
        self.connection.send(
            b"POST /size HTTP/1.1\r\nHost: c\r\nContent-Length: %d\r\n\r\n" % LIMIT
        )
        request = self.connection.channel.requests[-1]
        self.assertEqual(type(request.content).__name__, "BytesIO")


class ParseRefusalTests(SynchronousTestCase):
    """What Twisted's parser refuses is a 400 with the general headers."""

    def assertMalformed(self, data: bytes) -> None:
        connection = _Connection(_Recording())
        with capturedLogs() as events:
            connection.send(data)
        status, headers, body = connection.answer()
        self.assertEqual(status, b"HTTP/1.1 400 Bad Request")
        self.assertEqual(
            json.loads(body),
            {"error": "invalid_request", "error_description": "malformed_request"},
        )
        self.assertRegex(headers[b"x-request-id"].decode(), "^[0-9a-f]{32}$")
        self.assertEqual(headers[b"svc-api-version"], b"1")
        self.assertEqual(headers[b"content-type"], b"application/json")
        self.assertTrue(connection.transport.disconnecting)
        logged = [e["request_id"] for e in events if e.get("status") == 400]
        self.assertEqual(logged, [headers[b"x-request-id"].decode()])

    def test_bad_request_line(self) -> None:
        """A request line that does not parse."""
        self.assertMalformed(b"NONSENSE\r\n\r\n")

    def test_bad_header(self) -> None:
        """A header line without a colon."""
        self.assertMalformed(b"GET /healthz HTTP/1.1\r\nno colon here\r\n\r\n")

    def test_bad_content_length(self) -> None:
        """A Content-Length that is not a number."""
        self.assertMalformed(b"POST /size HTTP/1.1\r\nContent-Length: -5\r\n\r\n")

    def test_line_too_long(self) -> None:
        """A header line longer than Twisted's line limit."""
        self.assertMalformed(b"GET /healthz HTTP/1.1\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n")

    def test_headers_too_large(self) -> None:
        """More header bytes in all than Twisted accepts."""
        headers = b"".join(b"X-H%d: %s\r\n" % (n, b"a" * 1000) for n in range(20))
        self.assertMalformed(b"GET /healthz HTTP/1.1\r\n" + headers + b"\r\n")

    def test_bad_chunk(self) -> None:
        """A chunked body whose chunk size is not hex."""
        self.assertMalformed(b"POST /size HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
