"""
Tests for C{GET /control/journal} and C{POST /control/journal/revert}
(L{svc.dataplane.http}, L{svc.dataplane.http_journal}) over a real storage
engine, and for the journal-change notification they rely on
(L{svc.store.tenant.TenantStorage.journal_changed}).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

from treq.testing import StubTreq
from twisted.internet.defer import CancelledError, Deferred
from twisted.trial.unittest import SynchronousTestCase
from twisted.web._newclient import ResponseNeverReceived

from svc.audit.names import EventName
from svc.dataplane.http import DataPlaneHttp
from svc.dataplane.http_journal import parse_journal_listing
from svc.dataplane.test.test_http_support import HttpFixture
from svc.store.layout import TenantLocation
from svc.store.manifest_values import Writer
from svc.store.tenant import TenantStorage
from svc.store.test.test_engine import blob
from svc.testing.web import Answer
from svc.testing.worker import ImmediateWorker
from svc.web.errors import InvalidRequest

ACME = TenantLocation.for_owner("acme")
LABS = TenantLocation("acme", "labs")
AGENT = Writer("a1")
OTHER = Writer("a2")


def journal_fixture(case: SynchronousTestCase) -> HttpFixture:
    """
    An L{HttpFixture} whose app also has the engine's clock (long-poll
    timeouts) and the metrics; the control certificate is presented.
    """
    f = HttpFixture(case)
    f.http = DataPlaneHttp(
        engine=f.store.engine,
        registry=f.registry,
        audit_log=f.audit_log,
        emit=f.emitted.append,
        current_deny_list=lambda: f.deny_list,
        merge_deny_list=f.replaced.append,
        org_root=f.pki.root.cert,
        trust_domain=f.pki.trust_domain,
        now=f.clock.seconds,
        io=ImmediateWorker(),
        verified_chain=lambda _request: f.chain,
        clock=f.clock,
        metrics=f.metrics,
    )
    f.resource = f.http.resource()
    f.as_control()
    return f


def journal_path(**query: object) -> str:
    """C{/control/journal?owner=acme&tenant=acme&...}."""
    params = {"owner": "acme", "tenant": "acme", **query}
    return "/control/journal?" + urlencode({k: str(v) for k, v in params.items()})


def revert_body(path: str, seq: object, **changes: object) -> dict[str, object]:
    """A revert body for tenant acme by user alice."""
    body: dict[str, object] = {
        "owner": "acme",
        "tenant": "acme",
        "path": path,
        "seq": seq,
        "user_id": "alice",
    }
    body.update(changes)
    return body


class Journal:
    """Writes to one tenant through the engine, as agents do."""

    def __init__(self, f: HttpFixture, location: TenantLocation = ACME) -> None:
        self.f = f
        self.storage: TenantStorage = f.store.tenant(location)

    def mkdir(self, path: str, writer: Writer = AGENT) -> int:
        result = self.f.store.ok(
            self.storage.dir_create(path, mode=0o755, uid=0, gid=0, writer=writer)
        )
        return int(result.journal_seq)

    def put(self, path: str, label: str, size: int, version: int = 0) -> int:
        result = self.f.store.ok(
            self.f.store.put_file(
                self.storage, path, [blob(label, size)], expected_version=version, writer=AGENT
            )
        )
        return int(result.journal_seq)


def seqs(answer: Answer) -> list[int]:
    """The seqs of a journal answer's entries."""
    return [entry["seq"] for entry in answer.json()["entries"]]


class JournalQueryTests(SynchronousTestCase):
    """C{GET /control/journal}: pages, filters, C{last_seq}, parameter errors."""

    def setUp(self) -> None:
        self.f = journal_fixture(self)
        self.journal = Journal(self.f)
        self.journal.mkdir("/a1")
        self.journal.mkdir("/a2", OTHER)
        self.journal.put("/a1/f", "one", 10)
        self.journal.put("/a1/f", "two", 20, version=1)
        self.journal.mkdir("/a1/d")
        self.journal.put("/a1/d/g", "three", 5)

    def test_entries_rendered_like_journal_query(self) -> None:
        """Entries carry the journal_query keys, at_ms included; no cache."""
        answer = self.f.call("GET", journal_path(limit=1, cursor=2))
        self.assertEqual(answer.status, 200)
        self.assertEqual(answer.header("cache-control"), "no-store")
        [entry] = answer.json()["entries"]
        self.assertEqual(
            entry,
            {
                "seq": 3,
                "at_ms": entry["at_ms"],
                "agent_id": "a1",
                "op": "put",
                "path": "/a1/f",
                "old_version": 0,
                "new_version": 1,
                "new_kind": "file",
                "new_size": 10,
            },
        )
        self.assertIsInstance(entry["at_ms"], int)

    def test_pages_oldest_first(self) -> None:
        """Pages follow next_cursor to the end, where it is null."""
        first = self.f.call("GET", journal_path(limit=4)).json()
        self.assertEqual(
            ([e["seq"] for e in first["entries"]], first["next_cursor"]), ([1, 2, 3, 4], 4)
        )
        second = self.f.call("GET", journal_path(limit=4, cursor=4)).json()
        self.assertEqual(
            ([e["seq"] for e in second["entries"]], second["next_cursor"]), ([5, 6], None)
        )

    def test_newest_first(self) -> None:
        """order=desc pages from the newest row down."""
        answer = self.f.call("GET", journal_path(order="desc", limit=2)).json()
        self.assertEqual(
            ([e["seq"] for e in answer["entries"]], answer["next_cursor"]), ([6, 5], 5)
        )
        rest = self.f.call("GET", journal_path(order="desc", cursor=5))
        self.assertEqual(seqs(rest), [4, 3, 2, 1])

    def test_path_filters(self) -> None:
        """path alone matches that name; with below=1 also names below it."""
        self.assertEqual(seqs(self.f.call("GET", journal_path(path="/a1/f"))), [3, 4])
        self.assertEqual(seqs(self.f.call("GET", journal_path(path="/a1"))), [1])
        self.assertEqual(
            seqs(self.f.call("GET", journal_path(path="/a1", below="true"))), [1, 3, 4, 5, 6]
        )

    def test_agent_and_time_filters(self) -> None:
        """agent matches the author; since_ms is inclusive, until_ms exclusive."""
        self.assertEqual(seqs(self.f.call("GET", journal_path(agent="a2"))), [2])
        now_ms = round(self.f.clock.seconds() * 1000)
        self.f.clock.advance(10)
        self.journal.put("/a1/late", "late", 1)
        self.assertEqual(seqs(self.f.call("GET", journal_path(since_ms=now_ms + 1))), [7])
        self.assertEqual(
            seqs(self.f.call("GET", journal_path(until_ms=now_ms + 1))), [1, 2, 3, 4, 5, 6]
        )

    def test_last_seq_ignores_filters(self) -> None:
        """last_seq is the newest row of the journal whatever matched."""
        answer = self.f.call("GET", journal_path(agent="nobody")).json()
        self.assertEqual(answer, {"entries": [], "next_cursor": None, "last_seq": 6})

    def test_empty_journal(self) -> None:
        """A tenant with no rows answers no entries and last_seq 0."""
        self.f.store.tenant(LABS)
        answer = self.f.call("GET", journal_path(tenant="labs"))
        self.assertEqual(answer.json(), {"entries": [], "next_cursor": None, "last_seq": 0})

    def test_unknown_tenant_not_created(self) -> None:
        """A tenant without storage here is 404 unknown_tenant, and stays absent."""
        answer = self.f.call("GET", journal_path(tenant="ghost"))
        self.assertEqual(
            (answer.status, answer.json()),
            (404, {"error": "not_found", "error_description": "unknown_tenant"}),
        )
        self.assertFalse((self.f.store.root / "acme" / "ghost").exists())
        self.assertEqual(self.f.store.engine.opened(), [self.journal.storage])

    def test_parameter_errors(self) -> None:
        """Malformed or repeated parameters are 400 naming the parameter."""
        for query, description in [
            ("owner=acme", "missing_tenant"),
            ("tenant=acme", "missing_owner"),
            ("owner=acme&tenant=acme&tenant=labs", "repeated_tenant"),
            ("owner=..&tenant=acme", "bad_owner"),
            ("owner=acme&tenant=store", "bad_tenant"),
            ("owner=acme&tenant=acme&path=a1", "bad_path"),
            ("owner=acme&tenant=acme&path=/a1/", "bad_path"),
            ("owner=acme&tenant=acme&below=yes", "bad_below"),
            ("owner=acme&tenant=acme&limit=0", "bad_limit"),
            ("owner=acme&tenant=acme&limit=1001", "bad_limit"),
            ("owner=acme&tenant=acme&cursor=-1", "bad_cursor"),
            ("owner=acme&tenant=acme&since_ms=1e3", "bad_since_ms"),
            ("owner=acme&tenant=acme&order=up", "bad_order"),
            ("owner=acme&tenant=acme&wait=31", "bad_wait"),
            ("owner=acme&tenant=acme&wait=nan", "bad_wait"),
            ("owner=acme&tenant=acme&wait=1&order=desc", "wait_requires_asc"),
            ("owner=acme&tenant=acme&agent=", "bad_agent"),
        ]:
            answer = self.f.call("GET", "/control/journal?" + query)
            self.assertEqual(
                (answer.status, answer.json()),
                (400, {"error": "invalid_request", "error_description": description}),
                query,
            )

    def test_parsing_defaults(self) -> None:
        """Without options: every row, oldest first, 100 per page, no wait."""
        listing = parse_journal_listing({b"owner": [b"acme"], b"tenant": [b"labs"]})
        self.assertEqual(listing.location, LABS)
        query = listing.query
        self.assertEqual(
            (query.path, query.below, query.agent_id, query.limit, query.newest_first),
            (None, False, None, 100, False),
        )
        self.assertEqual(listing.wait_seconds, 0.0)
        self.assertRaises(
            InvalidRequest, parse_journal_listing, {b"owner": [b"acme"], b"tenant": [b"\xff"]}
        )

    def test_agent_certificate_refused(self) -> None:
        """An agent certificate gets 403 and an http_auth line; no certificate 401."""
        self.f.as_agent()
        answer = self.f.call("GET", journal_path())
        self.assertEqual(
            (answer.status, answer.json()["error_description"]),
            (403, "control_certificate_required"),
        )
        self.f.anonymous()
        self.assertEqual(self.f.call("GET", journal_path()).status, 401)
        self.assertEqual(len(self.f.events("http_auth")), 2)

    def test_query_duration_observed(self) -> None:
        """Each query is observed in svc_journal_query_duration_seconds."""
        self.f.call("GET", journal_path())
        count = self.f.registry.get_sample_value("svc_journal_query_duration_seconds_count")
        self.assertEqual(count, 1.0)


class LongPollTests(SynchronousTestCase):
    """C{GET /control/journal?wait=}: waits for a row, times out, stops on disconnect."""

    def setUp(self) -> None:
        self.f = journal_fixture(self)
        self.journal = Journal(self.f)
        self.journal.mkdir("/a1")
        self.stub: Any = StubTreq(self.f.resource)

    def start(self, **query: object) -> Deferred[Any]:
        d: Deferred[Any] = self.stub.request("GET", "http://dp.test" + journal_path(**query))
        self.stub.flush()
        return d

    def finish(self, d: Deferred[Any]) -> tuple[int, Any]:
        self.stub.flush()
        response = self.successResultOf(d)
        content = self.successResultOf(self.stub.content(response))
        return response.code, json.loads(content)

    def test_answers_at_once_when_rows_match(self) -> None:
        """A page with entries is answered without waiting."""
        code, body = self.finish(self.start(wait=30))
        self.assertEqual((code, [e["seq"] for e in body["entries"]]), (200, [1]))
        self.assertEqual(self.f.clock.getDelayedCalls(), [])

    def test_wakes_on_new_row(self) -> None:
        """An empty page waits; the next committed row answers it."""
        d = self.start(wait=30, cursor=1)
        self.assertNoResult(d)
        self.f.clock.advance(10)
        self.assertNoResult(d)
        seq = self.journal.put("/a1/new", "new", 7)
        code, body = self.finish(d)
        self.assertEqual(
            (code, [e["seq"] for e in body["entries"]], body["last_seq"]), (200, [seq], seq)
        )
        self.assertEqual(self.f.clock.getDelayedCalls(), [])

    def test_keeps_waiting_past_unmatched_rows(self) -> None:
        """A row outside the filters does not end the wait; a matching one does."""
        d = self.start(wait=30, cursor=1, path="/a1/wanted")
        self.journal.put("/a1/other", "other", 3)
        self.assertNoResult(d)
        seq = self.journal.put("/a1/wanted", "wanted", 3)
        _code, body = self.finish(d)
        self.assertEqual([e["seq"] for e in body["entries"]], [seq])

    def test_times_out_with_empty_page(self) -> None:
        """Without a new row the wait ends on the clock with an empty page."""
        d = self.start(wait=2.5, cursor=1)
        self.f.clock.advance(2.4)
        self.assertNoResult(d)
        self.f.clock.advance(0.1)
        code, body = self.finish(d)
        self.assertEqual((code, body), (200, {"entries": [], "next_cursor": None, "last_seq": 1}))
        self.assertEqual(self.f.clock.getDelayedCalls(), [])

    def test_disconnect_cancels_wait(self) -> None:
        """A client that goes away ends the wait: no timer left, later writes unaffected."""
        d = self.start(wait=30, cursor=1)
        self.assertEqual(len(self.f.clock.getDelayedCalls()), 1)
        d.cancel()
        self.stub.flush()
        self.failureResultOf(d, ResponseNeverReceived)
        self.assertEqual(self.f.clock.getDelayedCalls(), [])
        self.assertEqual(self.journal.storage.journal_waiting(), 0)
        self.journal.put("/a1/after", "after", 1)
        self.assertEqual(self.f.emitted, [])


class JournalChangedTests(SynchronousTestCase):
    """L{TenantStorage.journal_changed} fires after journaled commits only."""

    def setUp(self) -> None:
        self.f = journal_fixture(self)
        self.journal = Journal(self.f)

    def test_fires_after_journaled_change(self) -> None:
        """A change that appends a row fires every waiter once."""
        first, second = (
            self.journal.storage.journal_changed(),
            self.journal.storage.journal_changed(),
        )
        self.journal.mkdir("/a1")
        self.assertEqual((self.successResultOf(first), self.successResultOf(second)), (None, None))

    def test_not_fired_without_a_row(self) -> None:
        """A failed change, or one that journals nothing, wakes no waiter."""
        self.journal.mkdir("/a1")
        waiter = self.journal.storage.journal_changed()
        storage = self.journal.storage
        self.failureResultOf(storage.dir_create("/a1", mode=0o755, uid=0, gid=0, writer=AGENT))
        self.f.store.ok(storage.setattr("/a1", writer=AGENT))
        self.assertNoResult(waiter)

    def test_cancelled_waiter_forgotten(self) -> None:
        """A cancelled waiter is dropped at once; the others still fire."""
        storage = self.journal.storage
        cancelled, kept = storage.journal_changed(), storage.journal_changed()
        cancelled.cancel()
        self.failureResultOf(cancelled, CancelledError)
        self.assertEqual(storage.journal_waiting(), 1)
        self.journal.mkdir("/a1")
        self.assertIsNone(self.successResultOf(kept))
        self.assertEqual(storage.journal_waiting(), 0)


class RevertTests(SynchronousTestCase):
    """C{POST /control/journal/revert} as the owner."""

    def setUp(self) -> None:
        self.f = journal_fixture(self)
        self.journal = Journal(self.f)
        self.journal.mkdir("/a1")
        self.first = self.journal.put("/a1/f", "first", 300)
        self.second = self.journal.put("/a1/f", "second", 500, version=1)
        self.storage = self.journal.storage

    def test_restores_exact_bytes(self) -> None:
        """The file gets back its chunk list and bytes, as a row by owner:<user_id>."""
        answer = self.f.call(
            "POST", "/control/journal/revert", body=revert_body("/a1/f", self.second)
        )
        self.assertEqual(
            (answer.status, answer.json()),
            (
                200,
                {
                    "path": "/a1/f",
                    "reverted_seq": self.second,
                    "journal_seq": self.second + 1,
                    "exists": True,
                    "kind": "file",
                    "version": 3,
                    "size": 300,
                },
            ),
        )
        manifest = self.f.store.ok(self.storage.manifest_get("/a1/f"))
        chunk_hash, data = blob("first", 300)
        self.assertEqual([(c.hash, c.size) for c in manifest.chunks], [(chunk_hash, 300)])
        self.assertEqual(bytes(self.f.store.ok(self.storage.chunk_get(chunk_hash)).data), data)
        rows = self.f.call("GET", journal_path(cursor=self.second)).json()["entries"]
        self.assertEqual(
            [(r["op"], r["agent_id"], r["reverts_seq"]) for r in rows],
            [("revert", "owner:alice", self.second)],
        )

    def test_audit_and_metrics(self) -> None:
        """Each revert writes journal_revert_path with the control cert and is counted."""
        serial = self.f.as_control()
        self.f.call("POST", "/control/journal/revert", body=revert_body("/a1/f", self.first))
        self.f.call("POST", "/control/journal/revert", body=revert_body("/a1/f", self.first))
        [done, noop] = self.f.events(EventName.JOURNAL_REVERT_PATH)
        self.assertEqual(
            (done.path, done.allowed, done.tenant_id, done.cert_serial, done.agent_id),
            ("", True, "acme", serial, None),
        )
        self.assertTrue(noop.allowed)
        sample = self.f.registry.get_sample_value
        labels = {"allocation_id": "acme/a1"}
        self.assertEqual(sample("svc_journal_revert_total", {**labels, "result": "reverted"}), 1.0)
        self.assertEqual(sample("svc_journal_revert_total", {**labels, "result": "noop"}), 1.0)
        self.assertEqual(sample("svc_journal_writes_total", {**labels, "op": "revert"}), 1.0)

    def test_removes_created_file(self) -> None:
        """Reverting a file's creating row removes it; exists false."""
        answer = self.f.call(
            "POST", "/control/journal/revert", body=revert_body("/a1/f", self.first)
        )
        self.assertEqual(answer.json()["exists"], False)
        self.failureResultOf(self.storage.manifest_get("/a1/f"))

    def test_disk_root_refused(self) -> None:
        """A top-level directory is 403 disk_root, audited as refused, nothing changed."""
        mkdir_seq = 1
        answer = self.f.call("POST", "/control/journal/revert", body=revert_body("/a1", mkdir_seq))
        self.assertEqual(
            (answer.status, answer.json()),
            (403, {"error": "access_denied", "error_description": "disk_root"}),
        )
        self.f.store.ok(self.storage.list_dir("/a1"))
        [line] = self.f.events(EventName.JOURNAL_REVERT_PATH)
        self.assertFalse(line.allowed)
        self.assertEqual(self.f.events("http_auth"), [])

    def test_unknown_seq(self) -> None:
        """No such row, or a row about another path, is 404 not_found."""
        for body in [revert_body("/a1/f", 99), revert_body("/a1/g", self.second)]:
            answer = self.f.call("POST", "/control/journal/revert", body=body)
            self.assertEqual(
                (answer.status, answer.json()),
                (404, {"error": "not_found", "error_description": "no_such_entry"}),
            )
        self.assertEqual(
            self.f.registry.get_sample_value(
                "svc_journal_revert_total", {"allocation_id": "acme/a1", "result": "error"}
            ),
            2.0,
        )

    def test_chunks_collected(self) -> None:
        """Bytes already collected are 409 conflict/chunks_collected; the file is unchanged."""
        chunk_hash, _ = blob("first", 300)
        self.f.store.ok(self.storage.chunks.delete([chunk_hash]))
        answer = self.f.call(
            "POST", "/control/journal/revert", body=revert_body("/a1/f", self.second)
        )
        self.assertEqual(
            (answer.status, answer.json()),
            (409, {"error": "conflict", "error_description": "chunks_collected"}),
        )
        self.assertEqual(self.f.store.ok(self.storage.manifest_get("/a1/f")).size, 500)

    def test_unknown_tenant(self) -> None:
        """A tenant without storage here is 404 and is not created."""
        answer = self.f.call(
            "POST", "/control/journal/revert", body=revert_body("/a1/f", 2, tenant="ghost")
        )
        self.assertEqual(
            (answer.status, answer.json()["error_description"]), (404, "unknown_tenant")
        )
        self.assertFalse((self.f.store.root / "acme" / "ghost").exists())

    def test_body_errors(self) -> None:
        """Missing or malformed fields are 400 naming the field; nothing is audited."""
        for body, description in [
            ({"owner": "acme", "tenant": "acme", "path": "/a1/f", "seq": 2}, "missing_user_id"),
            (revert_body("/", 2), "bad_path"),
            (revert_body("a1/f", 2), "bad_path"),
            (revert_body("/a1/../f", 2), "bad_path"),
            (revert_body("/a1/f", 0), "bad_seq"),
            (revert_body("/a1/f", True), "bad_seq"),
            (revert_body("/a1/f", "2"), "bad_seq"),
            (revert_body("/a1/f", 2, user_id="a/b"), "bad_user_id"),
            (revert_body("/a1/f", 2, owner=7), "bad_owner"),
        ]:
            answer = self.f.call("POST", "/control/journal/revert", body=body)
            self.assertEqual(
                (answer.status, answer.json()),
                (400, {"error": "invalid_request", "error_description": description}),
            )
        self.assertEqual(self.f.events(EventName.JOURNAL_REVERT_PATH), [])

    def test_agent_certificate_refused(self) -> None:
        """An agent certificate gets 403 before the body is read; nothing reverted."""
        self.f.as_agent()
        answer = self.f.call(
            "POST", "/control/journal/revert", body=revert_body("/a1/f", self.second)
        )
        self.assertEqual(
            (answer.status, answer.json()["error_description"]),
            (403, "control_certificate_required"),
        )
        self.assertEqual(self.f.store.ok(self.storage.manifest_get("/a1/f")).size, 500)
        self.assertEqual(len(self.f.events("http_auth")), 1)
