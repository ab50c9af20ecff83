"""
Tests for L{svc.dataplane.http_audit}: reading the audit log backwards,
query parsing and record selection.
"""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane.http_audit import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    AuditQuery,
    AuditScope,
    lines_from_end,
    parse_audit_query,
    select_records,
)
from svc.web.errors import InvalidRequest


def backwards(data: bytes, **limits: int) -> list[bytes]:
    return list(lines_from_end(io.BytesIO(data), **limits))


class LinesFromEndTests(SynchronousTestCase):
    """
    L{lines_from_end} yields complete lines newest first, within bounds.
    """

    def test_order_and_partial_tail(self) -> None:
        """Complete lines come newest first; an unterminated tail is left out."""
        self.assertEqual(backwards(b"a\nbb\nccc\npartial", block_size=2), [b"ccc", b"bb", b"a"])

    def test_empty_lines_skipped(self) -> None:
        """Empty lines are not yielded."""
        self.assertEqual(backwards(b"\na\n\n\nb\n", block_size=3), [b"b", b"a"])

    def test_only_partial(self) -> None:
        """A file holding only an unterminated line yields nothing."""
        self.assertEqual(backwards(b"no newline yet", block_size=4), [])

    def test_scan_window(self) -> None:
        """Only the last max_scan_bytes are read; a line cut by the window is dropped."""
        self.assertEqual(backwards(b"aaaa\nbbbb\ncc\n", max_scan_bytes=7), [b"cc"])
        self.assertEqual(backwards(b"aaaa\nbbbb\ncc\n", max_scan_bytes=8), [b"cc", b"bbbb"])

    def test_long_lines_skipped(self) -> None:
        """A line longer than max_line_bytes is skipped, its neighbours kept."""
        data = b"one\n" + b"x" * 50 + b"\ntwo\n"
        self.assertEqual(backwards(data, block_size=4, max_line_bytes=8), [b"two", b"one"])

    @settings(max_examples=200, deadline=None)
    @given(
        st.lists(st.binary(min_size=0, max_size=12).filter(lambda b: b"\n" not in b)),
        st.binary(max_size=5).filter(lambda b: b"\n" not in b),
        st.integers(1, 9),
    )
    def test_matches_forward_split(self, lines: list[bytes], tail: bytes, block: int) -> None:
        """For any content and block size, the result is the forward split reversed."""
        data = b"".join(line + b"\n" for line in lines) + tail
        expected = [line for line in reversed(lines) if line]
        self.assertEqual(backwards(data, block_size=block), expected)


class QueryTests(SynchronousTestCase):
    """
    L{parse_audit_query}.
    """

    def test_defaults(self) -> None:
        """No parameters: the default limit, any event, no lower time bound."""
        self.assertEqual(parse_audit_query({}), AuditQuery(DEFAULT_LIMIT, frozenset(), None))

    def test_all_parameters(self) -> None:
        """limit, repeated event and since are parsed; since becomes UTC."""
        query = parse_audit_query(
            {
                b"limit": [b"7"],
                b"event": [b"chunk_get", b"chunk_put"],
                b"since": [b"2026-11-22T20:00:00+01:00"],
            }
        )
        self.assertEqual(query.limit, 7)
        self.assertEqual(query.events, {"chunk_get", "chunk_put"})
        self.assertEqual(query.since, datetime(2026, 11, 22, 19, tzinfo=UTC))

    def test_limit_capped(self) -> None:
        """A limit over the cap, however long, is lowered to MAX_LIMIT."""
        self.assertEqual(parse_audit_query({b"limit": [b"1001"]}).limit, MAX_LIMIT)
        self.assertEqual(parse_audit_query({b"limit": [b"9" * 5000]}).limit, MAX_LIMIT)
        self.assertEqual(parse_audit_query({b"limit": [b"0005"]}).limit, 5)

    def test_refused(self) -> None:
        """Bad values are InvalidRequest with a description."""
        for args, description in [
            ({b"limit": [b"0000"]}, "bad_limit"),
            ({b"limit": [b"-1"]}, "bad_limit"),
            ({b"limit": ["\u0663".encode()]}, "bad_limit"),
            ({b"event": [b"Bad Name"]}, "bad_event"),
            ({b"since": [b"2026-11-22"]}, "bad_since"),
            ({b"since": [b"a", b"b"]}, "repeated_since"),
            ({b"\xff": [b"1"]}, "query_not_utf8"),
        ]:
            error = self.assertRaises(InvalidRequest, parse_audit_query, args)
            self.assertEqual(error.description, description)


def raw(ts: str, **fields: object) -> bytes:
    return json.dumps({"ts": ts, "event": "list_entries", **fields}).encode()


class SelectTests(SynchronousTestCase):
    """
    L{select_records} applies the scope, the event filter, since and limit.
    """

    SCOPE = AuditScope("t", "a")

    def test_scope_requires_both_ids(self) -> None:
        """A line needs both the tenant_id and the agent_id of the scope."""
        lines = [
            raw("2026-01-01T00:00:03.000Z", tenant_id="t", agent_id="a"),
            raw("2026-01-01T00:00:02.000Z", agent_id="a"),
            raw("2026-01-01T00:00:01.000Z", tenant_id="t"),
            raw("2026-01-01T00:00:00.000Z", tenant_id="u", agent_id="a"),
        ]
        found = select_records(lines, self.SCOPE, AuditQuery())
        self.assertEqual([r["ts"] for r in found], ["2026-01-01T00:00:03.000Z"])

    def test_malformed_skipped(self) -> None:
        """Lines that are not JSON objects or lack a ts are skipped, not fatal."""
        lines = [
            b"not json",
            b"[1]",
            json.dumps({"tenant_id": "t", "agent_id": "a"}).encode(),
            raw("2026-01-01T00:00:00.000Z", tenant_id="t", agent_id="a"),
        ]
        self.assertEqual(len(select_records(lines, self.SCOPE, AuditQuery())), 1)

    def test_since_stops_scan(self) -> None:
        """The scan stops at the first line older than since."""
        lines = [
            raw("2026-01-01T00:00:05.000Z", tenant_id="t", agent_id="a"),
            raw("2026-01-01T00:00:01.000Z", tenant_id="x", agent_id="y"),
            raw("2026-01-01T00:00:09.000Z", tenant_id="t", agent_id="a"),
        ]
        query = AuditQuery(since=datetime(2026, 1, 1, 0, 0, 2, tzinfo=UTC))
        self.assertEqual(len(select_records(lines, self.SCOPE, query)), 1)
