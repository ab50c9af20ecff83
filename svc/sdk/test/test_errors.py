"""
Tests for L{svc.sdk.errors}: the bounded body read and the translation of
an error answer.
"""

from __future__ import annotations

import io

from twisted.trial.unittest import SynchronousTestCase

from svc.sdk.errors import (
    MAX_ERROR_BODY,
    NOT_FOUND,
    ErrorKind,
    Headers,
    RequestTimeout,
    SvcError,
    TransportError,
    error_from_response,
    kind_of_status,
    parse_error_body,
    read_bounded,
)


class RecordingReader:
    """A stream that hands out at most C{chunk} bytes per read and counts what it gave."""

    def __init__(self, data: bytes, chunk: int) -> None:
        self._stream = io.BytesIO(data)
        self._chunk = chunk
        self.given = 0

    def read(self, n: int) -> bytes:
        piece = self._stream.read(min(n, self._chunk))
        self.given += len(piece)
        return piece


def answer(status: int, body: bytes, *, truncated: bool = False, **headers: str) -> SvcError:
    return error_from_response(
        operation="resolve",
        method="GET",
        path="/v1/entities/agent/a1",
        status=status,
        headers=Headers(tuple((k.replace("_", "-"), v) for k, v in headers.items())),
        body=body,
        body_truncated=truncated,
        sent_request_id="sent-id",
    )


class ReadBoundedTests(SynchronousTestCase):
    """L{read_bounded}."""

    def test_large_body_cut_after_limit_plus_one(self) -> None:
        """A 1 MiB body yields its first 64 KiB, truncated; at most 64 KiB + 1 is read."""
        reader = RecordingReader(b"x" * (1 << 20), chunk=8192)
        body, truncated = read_bounded(reader.read, MAX_ERROR_BODY)
        self.assertEqual((len(body), truncated), (MAX_ERROR_BODY, True))
        self.assertEqual(reader.given, MAX_ERROR_BODY + 1)

    def test_body_of_exactly_the_limit_is_whole(self) -> None:
        """A body of exactly the limit is kept whole and not marked truncated."""
        body, truncated = read_bounded(RecordingReader(b"y" * 100, 7).read, 100)
        self.assertEqual((body, truncated), (b"y" * 100, False))

    def test_short_reads_are_joined(self) -> None:
        """Reads returning fewer bytes than asked are joined until the end."""
        body, truncated = read_bounded(RecordingReader(b"abcdefghij", 3).read, 64)
        self.assertEqual((body, truncated), (b"abcdefghij", False))

    def test_empty_body(self) -> None:
        """An empty body is empty and whole."""
        self.assertEqual(read_bounded(io.BytesIO(b"").read, 10), (b"", False))


class ErrorBodyTests(SynchronousTestCase):
    """L{parse_error_body}."""

    def test_code_and_description(self) -> None:
        """Both fields are read."""
        body = b'{"error":"not_found","error_description":"no agent a1","x":1}'
        self.assertEqual(parse_error_body(body), ("not_found", "no agent a1"))

    def test_description_omitted(self) -> None:
        """A missing description is the empty message."""
        self.assertEqual(parse_error_body(b'{"error":"invalid_token"}'), ("invalid_token", ""))

    def test_not_json_or_not_object_or_wrong_types(self) -> None:
        """Bodies that are not the error object give no code."""
        for body in (b"<html>", b"[1]", b'{"error": 5, "error_description": []}', b""):
            self.assertEqual(parse_error_body(body), (None, ""), body)


class ErrorFromResponseTests(SynchronousTestCase):
    """L{error_from_response}."""

    def test_every_field(self) -> None:
        """The error holds operation, method, path, status, code, message, id, headers, body."""
        body = b'{"error":"not_found","error_description":"no agent a1"}'
        error = answer(404, body, X_Request_Id="rid-1", Svc_API_Version="1")
        self.assertEqual(
            (error.operation, error.method, error.path, error.status),
            ("resolve", "GET", "/v1/entities/agent/a1", 404),
        )
        self.assertEqual((error.code, error.message), ("not_found", "no agent a1"))
        self.assertEqual(error.request_id, "rid-1")
        self.assertEqual(error.headers.get("svc-api-version"), "1")
        self.assertEqual((error.body, error.body_truncated), (body, False))
        self.assertIs(error.kind, NOT_FOUND)
        self.assertTrue(error.is_not_found)
        self.assertIn("404 not_found: no agent a1", str(error))

    def test_request_id_falls_back_to_the_sent_one(self) -> None:
        """Without an X-Request-ID in the answer, the id sent is kept."""
        self.assertEqual(answer(500, b'{"error":"server_error"}').request_id, "sent-id")

    def test_truncated_body_not_parsed(self) -> None:
        """A truncated body gives no code, but keeps its bytes."""
        error = answer(502, b'{"error":"x"', truncated=True)
        self.assertEqual(
            (error.code, error.body, error.body_truncated), (None, b'{"error":"x"', True)
        )

    def test_kinds(self) -> None:
        """Statuses map to kinds."""
        expected = {
            400: ErrorKind.INVALID_REQUEST,
            401: ErrorKind.UNAUTHENTICATED,
            403: ErrorKind.FORBIDDEN,
            404: ErrorKind.NOT_FOUND,
            405: ErrorKind.OTHER_STATUS,
            409: ErrorKind.CONFLICT,
            410: ErrorKind.GONE,
            429: ErrorKind.RATE_LIMITED,
            500: ErrorKind.SERVER_ERROR,
            501: ErrorKind.SERVER_ERROR,
            502: ErrorKind.UNAVAILABLE,
            503: ErrorKind.UNAVAILABLE,
            504: ErrorKind.UNAVAILABLE,
            302: ErrorKind.OTHER_STATUS,
        }
        self.assertEqual({status: kind_of_status(status) for status in expected}, expected)

    def test_only_404_is_not_found(self) -> None:
        """A 410 revoked is not the not-found case."""
        self.assertFalse(answer(410, b'{"error":"revoked"}').is_not_found)

    def test_transport_errors_have_no_status(self) -> None:
        """Errors without an answer are kind transport, or timeout."""
        refused = TransportError(
            operation="usage",
            method="GET",
            path="/p",
            status=None,
            code=None,
            message="refused",
            request_id="r",
        )
        self.assertIs(refused.kind, ErrorKind.TRANSPORT)
        timeout = RequestTimeout(
            operation="usage",
            method="GET",
            path="/p",
            status=None,
            code=None,
            message="slow",
            request_id="r",
        )
        self.assertIsInstance(timeout, TransportError)
        self.assertIs(timeout.kind, ErrorKind.TIMEOUT)


class HeadersTests(SynchronousTestCase):
    """L{Headers}."""

    def test_case_insensitive_and_ordered(self) -> None:
        """Names match in any case; every value is kept in order."""
        headers = Headers((("Set-Thing", "a"), ("X-Request-Id", "r"), ("set-thing", "b")))
        self.assertEqual(headers.get("x-request-id"), "r")
        self.assertEqual(headers.get_all("SET-THING"), ("a", "b"))
        self.assertIn("X-REQUEST-ID", headers)
        self.assertIsNone(headers.get("missing"))
