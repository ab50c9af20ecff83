"""
The control plane's view of a tenant's write journal, which lives on the
tenant's data-plane server.

L{JournalAccess} is the seam the journal routes and the event stream use:
query a page (optionally long-polling for new rows) and revert one
C{(path, seq)} as the owner. L{DataPlaneJournal} implements it over
mutual TLS with the control-plane certificate
(C{docs/specifications/control-dataplane.md}); L{svc.testing.journal}
has the in-memory fake. Implementations raise the control plane's
L{svc.web.errors.ApiError}s, so routes translate nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any, Protocol

import attrs
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater
from twisted.logger import Logger

from svc.control.dataplane_client import (
    DataPlaneCallFailed,
    DataPlaneClient,
    DataPlaneRefused,
    DataPlaneTarget,
    target_for,
)
from svc.control.dataplane_journal import JournalRequest
from svc.control.store.interface import ControlStore
from svc.control.store.values import Server
from svc.web.errors import (
    AccessDenied,
    ApiError,
    Conflict,
    InvalidRequest,
    JsonValue,
    NotFound,
    ServiceUnavailable,
)

ORDERS = ("asc", "desc")
MAX_WAIT_SECONDS = 30.0
"""Longest long-poll one query may ask the data plane for."""

DATAPLANE_UNREACHABLE = "dataplane_unreachable"

_log = Logger()


@attrs.frozen
class TenantRef:
    """A tenant and its owner (the data plane keys tenants by both)."""

    owner_id: str
    tenant_id: str


@attrs.frozen
class JournalFilter:
    """
    Which rows: C{path} (and below it with C{below}), written by C{agent},
    with C{since_ms <= at_ms < until_ms}.
    """

    path: str | None = None
    below: bool = False
    agent: str | None = None
    since_ms: int | None = None
    until_ms: int | None = None


@attrs.frozen
class JournalSlice:
    """
    One page as the data plane answered it: C{entries} are data-plane entry
    maps (with C{at_ms}); C{last_seq} is the tenant's newest row, whatever
    the filter (0: empty journal).
    """

    entries: tuple[Mapping[str, JsonValue], ...]
    next_cursor: int | None
    last_seq: int


class JournalAccess(Protocol):
    """A tenant journal, wherever it lives."""

    def query(
        self,
        tenant: TenantRef,
        where: JournalFilter,
        *,
        cursor: int | None,
        limit: int,
        order: str,
        wait_seconds: float = 0.0,
    ) -> Deferred[JournalSlice]:
        """
        A page of rows after C{cursor} in C{order}. With C{wait_seconds}
        (only for C{asc}), an empty page is answered only after that long
        without a new row.

        @raise svc.web.errors.ServiceUnavailable: C{dataplane_unreachable}.
        """

    def revert(
        self, tenant: TenantRef, path: str, seq: int, user_id: str
    ) -> Deferred[Mapping[str, JsonValue]]:
        """
        Restore C{path} to its state before row C{seq}, written by
        C{owner:<user_id>}: C{reverted_seq}, C{journal_seq}, C{exists}.

        @raise svc.web.errors.NotFound: no such row for that path.
        @raise svc.web.errors.AccessDenied: C{disk_root}.
        @raise svc.web.errors.Conflict: C{chunks_collected}.
        """


def render_time_ms(at_ms: int) -> str:
    """
    A journal time in milliseconds as RFC 3339 UTC:
    C{2026-11-22T10:00:00.123Z} (C{.000} left out).
    """
    moment = datetime.fromtimestamp(at_ms / 1000, UTC)
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    millis = at_ms % 1000
    return f"{text}.{millis:03d}Z" if millis else f"{text}Z"


def render_entry(entry: Mapping[str, JsonValue]) -> dict[str, JsonValue]:
    """A data-plane entry map as the owner API shows it: C{at_ms} becomes C{at}."""
    rendered = {key: value for key, value in entry.items() if key != "at_ms"}
    at_ms = entry.get("at_ms")
    if isinstance(at_ms, int) and not isinstance(at_ms, bool):
        rendered["at"] = render_time_ms(at_ms)
    ordered: dict[str, JsonValue] = {"seq": rendered.pop("seq", None)}
    if "at" in rendered:
        ordered["at"] = rendered.pop("at")
    ordered.update(rendered)
    return ordered


class DataPlaneJournal:
    """
    L{JournalAccess} over the tenant's data-plane server: its placement
    names the server, L{DataPlaneClient} makes the mutual-TLS call. A
    tenant with no placement, or unknown to its server, has an empty
    journal (a long-poll on it waits on C{clock}, so a stream does not
    spin).
    """

    def __init__(
        self,
        store: ControlStore,
        client: DataPlaneClient,
        clock: Any,
        target_of: Callable[[Server], DataPlaneTarget] = target_for,
    ) -> None:
        self._store = store
        self._client = client
        self._clock = clock
        self._target_of = target_of

    async def _target(self, tenant: TenantRef) -> DataPlaneTarget | None:
        placement = await self._store.get_placement(tenant.tenant_id)
        return None if placement is None else self._target_of(placement.server)

    async def _empty(self, wait_seconds: float) -> JournalSlice:
        if wait_seconds > 0:
            await deferLater(self._clock, wait_seconds, lambda: None)
        return JournalSlice((), None, 0)

    def query(
        self,
        tenant: TenantRef,
        where: JournalFilter,
        *,
        cursor: int | None,
        limit: int,
        order: str,
        wait_seconds: float = 0.0,
    ) -> Deferred[JournalSlice]:
        """See L{JournalAccess.query}."""
        request = JournalRequest(
            path=where.path,
            below=where.below,
            agent=where.agent,
            since_ms=where.since_ms,
            until_ms=where.until_ms,
            cursor=cursor,
            limit=limit,
            order=order,
            wait_seconds=min(wait_seconds, MAX_WAIT_SECONDS) if order == "asc" else 0.0,
        )
        return Deferred.fromCoroutine(self._query(tenant, request))

    async def _query(self, tenant: TenantRef, request: JournalRequest) -> JournalSlice:
        target = await self._target(tenant)
        if target is None:
            return await self._empty(request.wait_seconds)
        try:
            answer = await self._client.journal(target, tenant.owner_id, tenant.tenant_id, request)
        except DataPlaneRefused as e:
            if e.status == HTTPStatus.NOT_FOUND:
                return await self._empty(request.wait_seconds)
            raise _refusal(e) from None
        except DataPlaneCallFailed as e:
            _log.warn("journal query to {fqdn} failed: {reason}", fqdn=target.fqdn, reason=e)
            raise ServiceUnavailable(DATAPLANE_UNREACHABLE) from None
        return JournalSlice(answer.entries, answer.next_cursor, answer.last_seq)

    def revert(
        self, tenant: TenantRef, path: str, seq: int, user_id: str
    ) -> Deferred[Mapping[str, JsonValue]]:
        """See L{JournalAccess.revert}."""
        return Deferred.fromCoroutine(self._revert(tenant, path, seq, user_id))

    async def _revert(
        self, tenant: TenantRef, path: str, seq: int, user_id: str
    ) -> Mapping[str, JsonValue]:
        target = await self._target(tenant)
        if target is None:
            raise NotFound("journal entry")
        try:
            answer = await self._client.journal_revert(
                target, tenant.owner_id, tenant.tenant_id, path, seq, user_id
            )
        except DataPlaneRefused as e:
            raise _refusal(e) from None
        except DataPlaneCallFailed as e:
            _log.warn("journal revert on {fqdn} failed: {reason}", fqdn=target.fqdn, reason=e)
            raise ServiceUnavailable(DATAPLANE_UNREACHABLE) from None
        return {
            "reverted_seq": answer.reverted_seq,
            "journal_seq": answer.journal_seq,
            "exists": answer.exists,
        }


def _refusal(refused: DataPlaneRefused) -> ApiError:
    """The owner-route error for a data plane's 4xx."""
    description = refused.description
    if refused.status == HTTPStatus.NOT_FOUND:
        return NotFound("journal entry")
    if refused.status == HTTPStatus.FORBIDDEN:
        return AccessDenied(description)
    if refused.status == HTTPStatus.CONFLICT:
        return Conflict(description or refused.error)
    return InvalidRequest(description)
