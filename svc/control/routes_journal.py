"""
The owner's journal routes: C{GET /v1/journal} (paged, filtered),
C{POST /v1/journal/revert} and C{GET /v1/journal/stream} (server-sent
events). The journal lives on the tenant's data-plane server; these routes
reach it through a L{JournalAccess}. Parameters, bodies and the event
format: C{docs/specifications/owner-routes.md}.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import attrs
from twisted.web.server import Request

from svc.control.http import Call
from svc.control.journal_access import (
    JournalAccess,
    JournalFilter,
    TenantRef,
    render_entry,
)
from svc.control.journal_stream import (
    HEARTBEAT_SECONDS,
    MAX_STREAM_SECONDS,
    JournalStream,
    parse_last_event_id,
)
from svc.control.owner_auth import OwnerPrincipal
from svc.control.routes_entities import check_path_id, from_store
from svc.control.routing import AuthKind, Feature, HandlerResult, Reply, Route
from svc.control.store.interface import ControlStore
from svc.pki import names
from svc.store.errors import InvalidArgument
from svc.store.manifest_paths import check_path
from svc.web import errors as api
from svc.web.errors import JsonValue

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
TENANT_REQUIRED = "tenant_required"
_TRUE = frozenset({"1", "true"})
_FALSE = frozenset({"0", "false"})


@attrs.frozen
class JournalDeps:
    """
    What the journal routes work with.

    @ivar still_valid: whether a principal's credential still works (the
        stream asks between long-polls).
    """

    store: ControlStore
    access: JournalAccess
    clock: Any
    still_valid: Callable[[OwnerPrincipal], Any]
    heartbeat_seconds: float = HEARTBEAT_SECONDS
    max_stream_seconds: float = MAX_STREAM_SECONDS


def _flag(value: str | None, name: str) -> bool:
    if value is None:
        return False
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise api.InvalidRequest(f"bad_parameter:{name}")


def _time_ms(value: str | None, name: str) -> int | None:
    if value is None:
        return None
    try:
        if "T" not in value.upper():
            raise ValueError(value)
        moment = names.check_utc(datetime.fromisoformat(value), name)
    except ValueError:
        raise api.InvalidRequest(f"bad_parameter:{name}") from None
    return int(moment.timestamp() * 1000)


def _count(value: str | None, name: str, low: int, high: int) -> int | None:
    if value is None:
        return None
    if (
        not value.isdigit()
        or not value.isascii()
        or len(value) > 19
        or not low <= int(value) <= high
    ):
        raise api.InvalidRequest(f"bad_parameter:{name}")
    return int(value)


def _path(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise api.InvalidRequest(f"bad_parameter:{name}")
    try:
        return check_path(value)
    except InvalidArgument:
        raise api.InvalidRequest(f"bad_parameter:{name}") from None


def journal_filter(call: Call) -> JournalFilter:
    """The row filter of a journal or stream request's query parameters."""
    path = call.query_arg("path")
    agent = call.query_arg("agent")
    if agent is not None and not agent.startswith("owner:"):
        agent = check_path_id(agent, "agent")
    since_ms = _time_ms(call.query_arg("since"), "since")
    until_ms = _time_ms(call.query_arg("until"), "until")
    return JournalFilter(
        path=None if path is None else _path(path, "path"),
        below=_flag(call.query_arg("below"), "below"),
        agent=agent,
        since_ms=since_ms,
        until_ms=until_ms,
    )


class JournalRoutes:
    """The handlers; L{routes} declares them."""

    def __init__(self, deps: JournalDeps) -> None:
        self._deps = deps

    def routes(self) -> list[Route]:
        """Every route of this module."""
        database = {Feature.DATABASE}
        owner = AuthKind.ADMIN_SESSION
        return [
            Route("GET", "/v1/journal", owner, self.page, mounted_with=database, api_alias=True),
            Route(
                "POST",
                "/v1/journal/revert",
                owner,
                self.revert,
                mounted_with=database,
                api_alias=True,
            ),
            Route(
                "GET",
                "/v1/journal/stream",
                owner,
                self.stream,
                mounted_with=database,
                api_alias=True,
            ),
        ]

    async def _tenant(self, principal: OwnerPrincipal, asked: JsonValue) -> TenantRef:
        """
        The tenant asked for (which the user must own: else 404), or the
        user's only tenant.
        """
        allocations = await from_store(self._deps.store.list_allocations(principal.user_id))
        owned = sorted({a.tenant_id for a in allocations})
        if asked is None:
            if len(owned) != 1:
                raise api.InvalidRequest(TENANT_REQUIRED)
            return TenantRef(principal.user_id, owned[0])
        if not isinstance(asked, str):
            raise api.InvalidRequest("bad_parameter:tenant")
        if asked not in owned:
            raise api.NotFound("tenant")
        return TenantRef(principal.user_id, asked)

    async def page(self, call: Call) -> HandlerResult:
        """C{GET /v1/journal}: one page of the tenant's journal."""
        principal = call.principal_as(OwnerPrincipal)
        where = journal_filter(call)
        order = call.query_arg("order") or "desc"
        if order not in ("asc", "desc"):
            raise api.InvalidRequest("bad_parameter:order")
        cursor = _count(call.query_arg("cursor"), "cursor", 0, 2**63 - 1)
        limit = _count(call.query_arg("limit"), "limit", 1, MAX_LIMIT) or DEFAULT_LIMIT
        tenant = await self._tenant(principal, call.query_arg("tenant"))
        found = await self._deps.access.query(
            tenant, where, cursor=cursor, limit=limit, order=order
        )
        return {
            "tenant_id": tenant.tenant_id,
            "entries": [render_entry(e) for e in found.entries],
            "next_cursor": found.next_cursor,
            "last_seq": found.last_seq,
        }

    async def revert(self, call: Call) -> HandlerResult:
        """C{POST /v1/journal/revert}: restore C{path} to before row C{seq}."""
        principal = call.principal_as(OwnerPrincipal)
        body = call.json_body()
        if "path" not in body:
            raise api.InvalidRequest("missing_field:path")
        path = _path(body["path"], "path")
        seq = body.get("seq")
        if isinstance(seq, bool) or not isinstance(seq, int) or not 1 <= seq < 2**63:
            raise api.InvalidRequest("missing_field:seq" if seq is None else "invalid_seq")
        tenant = await self._tenant(principal, body.get("tenant"))
        answer = await self._deps.access.revert(tenant, path, seq, principal.user_id)
        return {"tenant_id": tenant.tenant_id, "path": path, **answer}

    async def stream(self, call: Call) -> HandlerResult:
        """C{GET /v1/journal/stream}: new rows as server-sent events."""
        principal = call.principal_as(OwnerPrincipal)
        where = journal_filter(call)
        try:
            after = parse_last_event_id(call.header("Last-Event-ID"))
        except ValueError:
            raise api.InvalidRequest("bad_parameter:Last-Event-ID") from None
        if after is None:
            after = _count(call.query_arg("after"), "after", 0, 2**63 - 1)
        tenant = await self._tenant(principal, call.query_arg("tenant"))
        request = call.request
        _start_event_stream(request)
        stream = JournalStream(
            self._deps.access,
            tenant,
            where,
            clock=self._deps.clock,
            write=request.write,
            still_allowed=lambda: self._deps.still_valid(principal),
            heartbeat_seconds=self._deps.heartbeat_seconds,
            max_seconds=self._deps.max_stream_seconds,
        )
        request.notifyFinish().addBoth(lambda _: stream.stop())
        await stream.run(after)
        return Reply.already_streamed()


def _start_event_stream(request: Request) -> None:
    request.setResponseCode(200)
    headers = request.responseHeaders
    headers.setRawHeaders(b"Content-Type", [b"text/event-stream; charset=utf-8"])
    headers.setRawHeaders(b"Cache-Control", [b"no-store"])
    headers.setRawHeaders(b"X-Accel-Buffering", [b"no"])


def journal_routes(deps: JournalDeps) -> list[Route]:
    """The journal routes for C{deps}."""
    return JournalRoutes(deps).routes()
