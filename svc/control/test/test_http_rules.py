"""
Tests for L{svc.web.rules}.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from svc.web.errors import InvalidRequest
from svc.web.rules import (
    check_declared_length,
    check_json_content_type,
    choose_request_id,
    is_well_formed_request_id,
    new_request_id,
    parse_bearer,
    parse_json_object,
)


class BearerTests(SynchronousTestCase):
    """
    Tests for L{parse_bearer}.
    """

    def test_plain(self) -> None:
        """The canonical form yields the credential."""
        self.assertEqual(parse_bearer("Bearer abc.def-_~+/="), "abc.def-_~+/=")

    def test_keyword_case_insensitive(self) -> None:
        """The keyword matches in any case."""
        for keyword in ("bearer", "BEARER", "BeArEr"):
            self.assertEqual(parse_bearer(f"{keyword} tok"), "tok", keyword)

    def test_whitespace_tolerated(self) -> None:
        """Trailing, leading and repeated spaces or tabs are tolerated."""
        self.assertEqual(parse_bearer("bearer   TOKEN  "), "TOKEN")
        self.assertEqual(parse_bearer("Bearer\tTOKEN\t"), "TOKEN")
        self.assertEqual(parse_bearer("  Bearer TOKEN"), "TOKEN")

    def test_bytes(self) -> None:
        """A bytes header value is accepted."""
        self.assertEqual(parse_bearer(b"Bearer tok"), "tok")

    def test_rejected(self) -> None:
        """Other schemes, missing or split credentials and non-ASCII are None."""
        for value in (
            None,
            "",
            "Bearer",
            "Bearer   ",
            "Basic dXNlcjpwdw==",
            "Bearertok",
            "Bearer a b",
            "Bearer a,b",
            "Bearer tök",
            b"Bearer t\xffk",
            "Token tok",
            "Bearer =abc",
        ):
            self.assertIsNone(parse_bearer(value), value)


class RequestIdTests(SynchronousTestCase):
    """
    Tests for request id selection.
    """

    def test_well_formed(self) -> None:
        """1-128 characters of [A-Za-z0-9._-] are well formed; others are not."""
        self.assertTrue(is_well_formed_request_id("a"))
        self.assertTrue(is_well_formed_request_id("A-z_0.9" + "x" * 121))
        self.assertFalse(is_well_formed_request_id(""))
        self.assertFalse(is_well_formed_request_id("x" * 129))
        self.assertFalse(is_well_formed_request_id("a b"))
        self.assertFalse(is_well_formed_request_id("a/b"))
        self.assertFalse(is_well_formed_request_id("a\nb"))

    def test_incoming_kept(self) -> None:
        """One well-formed incoming id is kept."""
        self.assertEqual(choose_request_id([b"req-1"], "fresh"), "req-1")

    def test_replaced(self) -> None:
        """Missing, repeated, malformed or non-ASCII ids are replaced."""
        for incoming in (None, [], [b"a", b"b"], [b"bad id"], [b"\xff"], [b"x" * 129]):
            self.assertEqual(choose_request_id(incoming, "fresh"), "fresh", incoming)

    def test_fresh_ids(self) -> None:
        """Fresh ids are well formed and differ."""
        first, second = new_request_id(), new_request_id()
        self.assertTrue(is_well_formed_request_id(first))
        self.assertNotEqual(first, second)


class JsonBodyTests(SynchronousTestCase):
    """
    Tests for the JSON body rules.
    """

    def assertRefused(self, description: str, f: object, *args: object) -> None:
        error = self.assertRaises(InvalidRequest, f, *args)
        self.assertEqual(error.description, description)

    def test_content_type_accepted(self) -> None:
        """application/json with any case and a utf-8 charset is accepted."""
        for value in (
            "application/json",
            b"Application/JSON",
            "application/json; charset=utf-8",
            'application/json;charset="UTF-8"',
        ):
            check_json_content_type(value)

    def test_content_type_refused(self) -> None:
        """Missing, other media types and other charsets are refused."""
        for value in (None, "text/plain", "application/jsonx", "application/json; charset=latin-1"):
            self.assertRefused("content_type_not_json", check_json_content_type, value)

    def test_object_parsed(self) -> None:
        """A JSON object within the limit is returned."""
        self.assertEqual(parse_json_object(b'{"a": [1, true]}', 100), {"a": [1, True]})

    def test_size_limit(self) -> None:
        """A body of exactly the limit is accepted; one byte more is refused."""
        body = b'{"a":"' + b"x" * 10 + b'"}'
        self.assertEqual(parse_json_object(body, len(body)), {"a": "x" * 10})
        self.assertRefused("body_too_large", parse_json_object, body, len(body) - 1)

    def test_declared_length(self) -> None:
        """A declared length over the limit, or a malformed one, is refused."""
        check_declared_length(None, 10)
        check_declared_length(b"10", 10)
        self.assertRefused("body_too_large", check_declared_length, b"11", 10)
        self.assertRefused("bad_content_length", check_declared_length, b"-1", 10)

    def test_not_json(self) -> None:
        """Invalid JSON, non-UTF-8, NaN, huge floats and duplicate keys are refused."""
        for body in (b"{", b"\xff", b'{"a": NaN}', b'{"a": 1e999}', b'{"a": 1, "a": 2}'):
            self.assertRefused("body_not_json", parse_json_object, body, 100)

    def test_not_object(self) -> None:
        """A JSON value that is not an object is refused."""
        for body in (b"[]", b"1", b'"s"', b"null"):
            self.assertRefused("body_not_object", parse_json_object, body, 100)
