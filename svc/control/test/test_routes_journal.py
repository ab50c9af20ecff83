"""
Tests for L{svc.control.routes_journal}: tenant choice, parameters, paging,
revert and the event stream through the real app, with the in-memory
journal standing in for the data plane.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from treq.testing import StubTreq
from twisted.internet.defer import Deferred, succeed

from svc.control.journal_access import TenantRef
from svc.control.owner_auth import OwnerPrincipal
from svc.control.routes_journal import JournalDeps, journal_routes
from svc.control.routing import Route
from svc.control.test.backends import SQLiteBackend
from svc.control.test.test_journal_stream import parse_events
from svc.control.test.test_routes_owner import BOB_LINK, OwnerRouteCase
from svc.testing.journal import MemoryJournal
from svc.testing.web import Answer

ALICE = TenantRef("alice", "alice")


class JournalRouteCase(OwnerRouteCase, SQLiteBackend):
    """The owner routes plus the journal routes over a L{MemoryJournal}."""

    def extra_routes(self) -> list[Route]:
        self.journal = MemoryJournal(self.clock)
        self.valid = True
        deps = JournalDeps(
            self.store,
            self.journal,
            self.clock,
            still_valid=self.still_valid,
            max_stream_seconds=30.0,
        )
        return journal_routes(deps)

    async def set_up(self) -> None:
        await super().set_up()
        self.cookie = await self.sign_in()

    def still_valid(self, principal: OwnerPrincipal) -> Deferred[bool]:
        return succeed(self.valid)

    async def get(self, path: str, **kwargs: Any) -> Answer:
        return await self.call("GET", path, cookie=self.cookie, **kwargs)

    def stream(
        self, path: str, during: Callable[[], object], headers: dict[str, str] | None = None
    ) -> Answer:
        """
        A streamed GET: sent, then C{during()} runs (appending rows,
        advancing the clock until the stream ends), then the whole answer.
        """
        stub: Any = StubTreq(self.resource)
        sent = {"Cookie": [f"svc_admin_session={self.cookie}"]}
        sent.update({name: [value] for name, value in (headers or {}).items()})
        response_d = stub.request("GET", "http://control.test" + path, headers=sent)
        stub.flush()
        during()
        stub.flush()
        response = self.successResultOf(response_d)
        content = self.successResultOf(stub.content(response))
        found = {
            name.decode().lower(): [v.decode() for v in values]
            for name, values in response.headers.getAllRawHeaders()
        }
        return Answer(status=response.code, headers=found, body=content)


class JournalPageTests(JournalRouteCase):
    async def test_page_renders_entries_with_times_and_the_last_seq(self) -> None:
        self.journal.append(ALICE, path="/a1/x")
        self.journal.append(ALICE, path="/a1/y", agent_id="a1")
        answer = await self.get("/v1/journal")
        body = answer.json()
        self.assertEqual(body["tenant_id"], "alice")
        self.assertEqual([e["seq"] for e in body["entries"]], [2, 1])
        self.assertEqual(body["entries"][0]["at"], "2026-11-22T19:00:00Z")
        self.assertEqual(body["last_seq"], 2)
        self.assertIsNone(body["next_cursor"])

    async def test_paging_with_cursor_and_limit(self) -> None:
        for _ in range(5):
            self.journal.append(ALICE)
        first = (await self.get("/v1/journal?order=asc&limit=2")).json()
        self.assertEqual(([e["seq"] for e in first["entries"]], first["next_cursor"]), ([1, 2], 2))
        second = (await self.get("/v1/journal?order=asc&limit=2&cursor=2")).json()
        self.assertEqual([e["seq"] for e in second["entries"]], [3, 4])

    async def test_filters_reach_the_data_plane(self) -> None:
        self.journal.append(ALICE, path="/a1/x", agent_id="a1")
        self.journal.append(ALICE, path="/a1/d/y", agent_id="a2")
        below = await self.get("/v1/journal?path=/a1/d&below=1")
        self.assertEqual([e["seq"] for e in below.json()["entries"]], [2])
        agent = await self.get("/v1/journal?agent=a1")
        self.assertEqual([e["seq"] for e in agent.json()["entries"]], [1])
        late = await self.get("/v1/journal?since=2026-11-22T19:00:01Z")
        self.assertEqual(late.json()["entries"], [])

    async def test_bad_parameters_are_400(self) -> None:
        for query in (
            "order=sideways",
            "limit=0",
            "limit=1001",
            "cursor=-1",
            "path=relative",
            "path=/a/../b",
            "below=maybe",
            "since=yesterday",
            "agent=bad%20id",
        ):
            answer = await self.get(f"/v1/journal?{query}")
            self.assertError(answer, 400, "invalid_request")

    async def test_another_users_tenant_is_not_found(self) -> None:
        self.assertError(await self.get("/v1/journal?tenant=bob"), 404, "not_found")

    async def test_tenant_is_required_when_the_user_has_several(self) -> None:
        await self.send(
            self.resource,
            "POST",
            "/v1/entities",
            headers={
                "Authorization": "Bearer " + self.environ["SVC_CONTROL_PLANE_TOKEN"],
                "Content-Type": "application/json",
            },
            body=b'{"type":"agent","id":"a9","owner":"alice","tenant":"alice-2","grant_bytes":5}',
        )
        self.assertError(await self.get("/v1/journal"), 400, "invalid_request", "tenant_required")
        ok = await self.get("/v1/journal?tenant=alice-2")
        self.assertEqual(ok.json()["tenant_id"], "alice-2")

    async def test_unreachable_data_plane_is_503(self) -> None:
        self.journal.unreachable = True
        answer = await self.get("/v1/journal")
        self.assertError(answer, 503, "temporarily_unavailable", "dataplane_unreachable")

    async def test_api_token_may_read_the_journal(self) -> None:
        created = await self.call("POST", "/v1/tokens", cookie=self.cookie, body={"name": "r"})
        answer = await self.call("GET", "/v1/journal", token=created.json()["token"])
        self.assertEqual(answer.status, 200, answer.body)


class JournalRevertTests(JournalRouteCase):
    async def test_revert_is_written_by_the_owner(self) -> None:
        self.journal.append(ALICE, path="/a1/x")
        answer = await self.call(
            "POST",
            "/v1/journal/revert",
            cookie=self.cookie,
            body={"path": "/a1/x", "seq": 1},
        )
        self.assertEqual(
            answer.json(),
            {
                "tenant_id": "alice",
                "path": "/a1/x",
                "reverted_seq": 1,
                "journal_seq": 2,
                "exists": True,
            },
        )
        rows = (await self.get("/v1/journal?agent=owner:alice")).json()["entries"]
        self.assertEqual([(r["op"], r["reverts_seq"]) for r in rows], [("revert", 1)])

    async def test_revert_needs_the_csrf_token(self) -> None:
        self.journal.append(ALICE, path="/a1/x")
        answer = await self.call(
            "POST",
            "/v1/journal/revert",
            cookie=self.cookie,
            csrf=False,
            body={"path": "/a1/x", "seq": 1},
        )
        self.assertError(answer, 403, "access_denied", "csrf_check_failed")

    async def test_revert_errors(self) -> None:
        self.journal.append(ALICE, path="/a1/x")
        cases = [
            ({"path": "/a1/x"}, 400, "invalid_request"),
            ({"path": "/a1/x", "seq": "1"}, 400, "invalid_request"),
            ({"path": "/a1/x", "seq": 0}, 400, "invalid_request"),
            ({"path": "a1/x", "seq": 1}, 400, "invalid_request"),
            ({"path": "/a1/other", "seq": 1}, 404, "not_found"),
            ({"path": "/a1/x", "seq": 9}, 404, "not_found"),
            ({"path": "/a1/x", "seq": 1, "tenant": "bob"}, 404, "not_found"),
        ]
        for body, status, code in cases:
            answer = await self.call("POST", "/v1/journal/revert", cookie=self.cookie, body=body)
            self.assertError(answer, status, code)

    async def test_bob_cannot_revert_alices_rows(self) -> None:
        self.journal.append(ALICE, path="/a1/x")
        bob = await self.sign_in(BOB_LINK)
        answer = await self.call(
            "POST",
            "/v1/journal/revert",
            cookie=bob,
            body={"tenant": "alice", "path": "/a1/x", "seq": 1},
        )
        self.assertError(answer, 404, "not_found")


class JournalStreamRouteTests(JournalRouteCase):
    async def test_stream_sends_events_and_ends_cleanly(self) -> None:
        self.journal.append(ALICE)

        def during() -> None:
            self.journal.append(ALICE, path="/a1/new")
            self.clock.advance(31)

        answer = self.stream("/v1/journal/stream", during)
        self.assertEqual(answer.status, 200)
        self.assertEqual(answer.header("content-type"), "text/event-stream; charset=utf-8")
        self.assertEqual(answer.header("cache-control"), "no-store")
        events = [e for e in parse_events(answer.body) if e.get("event") == "journal"]
        self.assertEqual([e["id"] for e in events], ["2"])

    async def test_last_event_id_header_wins_over_after(self) -> None:
        for _ in range(3):
            self.journal.append(ALICE)
        answer = self.stream(
            "/v1/journal/stream?after=0",
            lambda: self.clock.advance(31),
            headers={"Last-Event-ID": "2"},
        )
        ids = [e["id"] for e in parse_events(answer.body) if e.get("event") == "journal"]
        self.assertEqual(ids, ["3"])

    async def test_bad_last_event_id_is_400(self) -> None:
        answer = await self.get("/v1/journal/stream", headers={"Last-Event-ID": "abc"})
        self.assertError(answer, 400, "invalid_request")

    async def test_stream_of_another_users_tenant_is_404_before_streaming(self) -> None:
        answer = await self.get("/v1/journal/stream?tenant=bob")
        self.assertError(answer, 404, "not_found")

    async def test_stream_ends_when_the_session_ends(self) -> None:
        def during() -> None:
            self.valid = False
            self.clock.advance(15)

        answer = self.stream("/v1/journal/stream?after=0", during)
        self.assertEqual(parse_events(answer.body)[-1], {"comment": "heartbeat"})
