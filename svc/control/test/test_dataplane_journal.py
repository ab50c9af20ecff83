"""
Tests for the journal calls of L{svc.control.dataplane_client} and the
values of L{svc.control.dataplane_journal}: the client talks (in memory,
through StubTreq) to a real L{svc.dataplane.http.DataPlaneHttp} over a real
storage engine, presenting the control certificate.
"""

from __future__ import annotations

from typing import Any

from treq.testing import StubTreq
from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.resource import Resource
from twisted.web.server import Request

from svc.control.dataplane_client import (
    ControlCredentials,
    DataPlaneCallFailed,
    DataPlaneClient,
    DataPlaneRefused,
    DataPlaneTarget,
)
from svc.control.dataplane_journal import (
    JournalAnswer,
    JournalRequest,
    MalformedAnswer,
    RevertAnswer,
    format_seconds,
    parse_journal_answer,
    parse_revert_answer,
)
from svc.control.test.test_dataplane_client import credentials
from svc.dataplane.test.test_http_journal import Journal, journal_fixture
from svc.store.test.test_engine import blob
from svc.testing.pki import SERVER_NAME

TARGET = DataPlaneTarget(SERVER_NAME, "10.0.0.1:8443")
TIMEOUT = 5.0


class _Canned(Resource):
    """Answers every request with one status and body."""

    isLeaf = True

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__()
        self.status = status
        self.body = body

    def render(self, request: Request) -> bytes:
        request.setResponseCode(self.status)
        return self.body


def client_for(resource: Resource, clock: Any) -> tuple[DataPlaneClient, Any]:
    """
    A client whose every target is C{resource}, in memory, and the StubTreq
    to C{flush} when an answer comes later than the request.
    """
    stub: Any = StubTreq(resource)

    def http_client(target: DataPlaneTarget, given: ControlCredentials) -> Any:
        return stub

    return DataPlaneClient(credentials, http_client, clock, timeout=TIMEOUT), stub


class JournalCallTests(SynchronousTestCase):
    """C{journal} and C{journal_revert} against a real data-plane app."""

    def setUp(self) -> None:
        self.f = journal_fixture(self)
        self.journal = Journal(self.f)
        self.journal.mkdir("/a1")
        self.first = self.journal.put("/a1/f", "first", 300)
        self.second = self.journal.put("/a1/f", "second", 500, version=1)
        self.client, self.stub = client_for(self.f.resource, self.f.clock)

    def test_page(self) -> None:
        """Filters and paging reach the server; the answer keeps entries as received."""
        answer = self.successResultOf(
            self.client.journal(
                TARGET, "acme", "acme", JournalRequest(path="/a1/f", limit=1, order="desc")
            )
        )
        self.assertEqual((answer.next_cursor, answer.last_seq), (self.second, self.second))
        [entry] = answer.entries
        self.assertEqual(
            (entry["seq"], entry["op"], entry["path"], entry["new_size"]),
            (self.second, "put", "/a1/f", 500),
        )
        self.assertIsInstance(entry["at_ms"], int)

    def test_long_poll_outlasts_the_call_timeout(self) -> None:
        """A wait longer than the normal timeout is answered when the server's wait ends."""
        query = JournalRequest(cursor=self.second, wait_seconds=20)
        d = self.client.journal(TARGET, "acme", "acme", query)
        self.f.clock.advance(TIMEOUT + 1)
        self.assertNoResult(d)
        self.f.clock.advance(20 - TIMEOUT - 1)
        self.stub.flush()
        self.assertEqual(
            self.successResultOf(d),
            JournalAnswer(entries=(), next_cursor=None, last_seq=self.second),
        )

    def test_long_poll_woken_by_a_row(self) -> None:
        """A row written during the wait is the answer."""
        d = self.client.journal(
            TARGET, "acme", "acme", JournalRequest(cursor=self.second, wait_seconds=30)
        )
        self.assertNoResult(d)
        seq = self.journal.put("/a1/g", "g", 9)
        self.stub.flush()
        self.assertEqual([e["seq"] for e in self.successResultOf(d).entries], [seq])

    def test_revert(self) -> None:
        """The revert answer is parsed; the file holds the older bytes again."""
        answer = self.successResultOf(
            self.client.journal_revert(TARGET, "acme", "acme", "/a1/f", self.second, "alice")
        )
        self.assertEqual(
            answer,
            RevertAnswer(
                path="/a1/f",
                reverted_seq=self.second,
                journal_seq=self.second + 1,
                exists=True,
                kind="file",
                version=3,
                size=300,
            ),
        )
        manifest = self.f.store.ok(self.journal.storage.manifest_get("/a1/f"))
        self.assertEqual([c.hash for c in manifest.chunks], [blob("first", 300)[0]])

    def test_refusals_are_typed(self) -> None:
        """404, 403 and 409 are DataPlaneRefused with the server's code and description."""
        chunk_hash = blob("first", 300)[0]
        self.f.store.ok(self.journal.storage.chunks.delete([chunk_hash]))
        for path, seq, expected in [
            ("/a1/f", 99, (404, "not_found", "no_such_entry")),
            ("/a1", 1, (403, "access_denied", "disk_root")),
            ("/a1/f", self.second, (409, "conflict", "chunks_collected")),
        ]:
            failure = self.failureResultOf(
                self.client.journal_revert(TARGET, "acme", "acme", path, seq, "alice"),
                DataPlaneRefused,
            )
            refused = failure.value
            self.assertEqual((refused.status, refused.error, refused.description), expected)
            self.assertIsInstance(refused, DataPlaneCallFailed)
            self.assertEqual(refused.reason, f"HTTP {expected[0]}")

    def test_unknown_tenant_refused(self) -> None:
        """A tenant the server does not hold is a 404 refusal of the query."""
        failure = self.failureResultOf(
            self.client.journal(TARGET, "acme", "ghost", JournalRequest()), DataPlaneRefused
        )
        self.assertEqual((failure.value.status, failure.value.description), (404, "unknown_tenant"))


class JournalFailureTests(SynchronousTestCase):
    """What is a refusal and what is a plain failure."""

    def test_long_poll_timeout_is_wait_plus_normal(self) -> None:
        """The HTTP timeout of a long-poll is its wait plus the normal call timeout."""
        timeouts: list[float] = []

        class Hanging:
            def request(self, method: str, url: str, **kwargs: Any) -> Deferred[Any]:
                timeouts.append(kwargs["timeout"])
                return Deferred()

        client = DataPlaneClient(credentials, lambda t, c: Hanging(), None, TIMEOUT)
        client.journal(TARGET, "acme", "acme", JournalRequest(wait_seconds=12.5))
        client.journal(TARGET, "acme", "acme", JournalRequest())
        client.journal_revert(TARGET, "acme", "acme", "/a1/f", 2, "alice")
        self.assertEqual(timeouts, [12.5 + TIMEOUT, TIMEOUT, TIMEOUT])

    def test_error_without_body_is_plain_failure(self) -> None:
        """A 4xx without an error body, or a 5xx, is DataPlaneCallFailed only."""
        for status, body in [(400, b"Non-UTF-8 encoding in URL."), (503, b'{"error":"x"}')]:
            client, _stub = client_for(_Canned(status, body), None)
            failure = self.failureResultOf(
                client.journal(TARGET, "acme", "acme", JournalRequest()), DataPlaneCallFailed
            )
            self.assertNotIsInstance(failure.value, DataPlaneRefused)

    def test_malformed_answer_fails(self) -> None:
        """An answer of the wrong shape is DataPlaneCallFailed naming the problem."""
        client, _stub = client_for(_Canned(200, b'{"entries": {}, "last_seq": 0}'), None)
        failure = self.failureResultOf(
            client.journal(TARGET, "acme", "acme", JournalRequest()), DataPlaneCallFailed
        )
        self.assertEqual(failure.value.reason, "entries is not an array")


class JournalValueTests(SynchronousTestCase):
    """L{JournalRequest} and the answer parsers."""

    def test_parameters(self) -> None:
        """Only set options are sent; wait is plain decimal seconds."""
        self.assertEqual(
            JournalRequest().parameters("o", "t"),
            [("owner", "o"), ("tenant", "t"), ("order", "asc")],
        )
        request = JournalRequest(
            path="/a",
            below=True,
            agent="owner:u",
            since_ms=1,
            until_ms=2,
            cursor=3,
            limit=4,
            wait_seconds=2.5,
        )
        self.assertEqual(
            request.parameters("o", "t")[2:],
            [
                ("path", "/a"),
                ("below", "1"),
                ("agent", "owner:u"),
                ("since_ms", "1"),
                ("until_ms", "2"),
                ("cursor", "3"),
                ("limit", "4"),
                ("order", "asc"),
                ("wait", "2.5"),
            ],
        )
        self.assertEqual([format_seconds(s) for s in (30, 0.25, 1e-6)], ["30", "0.25", "0.000001"])

    def test_request_validation(self) -> None:
        """A wait needs order asc and at most 30 s; limit is 1..1000; order asc or desc."""
        cases: list[dict[str, Any]] = [
            {"wait_seconds": 1.0, "order": "desc"},
            {"wait_seconds": 31.0},
            {"wait_seconds": -1.0},
            {"limit": 0},
            {"limit": 1001},
            {"order": "newest"},
        ]
        for kwargs in cases:
            self.assertRaises(ValueError, JournalRequest, **kwargs)

    def test_answer_shapes(self) -> None:
        """Entries need an integer seq; counts are non-negative integers."""
        good = {"entries": [{"seq": 1}], "next_cursor": None, "last_seq": 1}
        self.assertEqual(parse_journal_answer(good).entries, ({"seq": 1},))
        for bad in [
            [],
            {**good, "entries": [{"seq": "1"}]},
            {**good, "entries": [1]},
            {**good, "last_seq": -1},
            {**good, "next_cursor": True},
        ]:
            self.assertRaises(MalformedAnswer, parse_journal_answer, bad)
        revert = {"path": "/a/f", "reverted_seq": 2, "journal_seq": None, "exists": False}
        self.assertEqual(parse_revert_answer(revert), RevertAnswer("/a/f", 2, None, False))
        for bad_revert in [{**revert, "exists": 0}, {**revert, "reverted_seq": None}]:
            self.assertRaises(MalformedAnswer, parse_revert_answer, bad_revert)
