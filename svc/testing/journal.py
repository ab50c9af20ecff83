"""
An in-memory L{svc.control.journal_access.JournalAccess} for tests of the
journal routes and the event stream: the query semantics of the data
plane's C{GET /control/journal} (filters, cursor, order, long-poll on a
clock) over rows the test appends.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twisted.internet.defer import Deferred

from svc.control.journal_access import JournalFilter, JournalSlice, TenantRef
from svc.web import errors as api
from svc.web.errors import JsonValue


def _matches(entry: Mapping[str, JsonValue], where: JournalFilter) -> bool:
    if where.path is not None:
        names = [entry.get("path"), entry.get("to_path")]
        prefix = where.path.rstrip("/") + "/"
        if not any(
            name == where.path
            or (where.below and isinstance(name, str) and name.startswith(prefix))
            for name in names
        ):
            return False
    if where.agent is not None and entry.get("agent_id") != where.agent:
        return False
    at_ms = entry.get("at_ms")
    assert isinstance(at_ms, int)
    if where.since_ms is not None and at_ms < where.since_ms:
        return False
    return where.until_ms is None or at_ms < where.until_ms


class MemoryJournal:
    """
    Tenant journals held in lists. C{append} adds a row (and wakes
    long-polls); C{unreachable} makes every call fail as an unreachable data
    plane would.

    @ivar queries: every query asked, as C{(tenant, cursor, order, wait)}.
    """

    def __init__(self, clock: Any) -> None:
        self._clock = clock
        self._rows: dict[TenantRef, list[dict[str, JsonValue]]] = {}
        self._waiters: list[Deferred[None]] = []
        self.unreachable = False
        self.queries: list[tuple[TenantRef, int | None, str, float]] = []

    def append(self, tenant: TenantRef, **fields: JsonValue) -> dict[str, JsonValue]:
        """Add a row (C{seq} and C{at_ms} filled in when absent) and wake waiters."""
        rows = self._rows.setdefault(tenant, [])
        row: dict[str, JsonValue] = {
            "seq": len(rows) + 1,
            "at_ms": int(self._clock.seconds() * 1000),
            "agent_id": "agent-1",
            "op": "put",
            "path": "/agent-1/file",
            "old_version": 0,
            "new_version": 1,
        }
        row.update(fields)
        rows.append(row)
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.callback(None)
        return row

    def _slice(
        self, tenant: TenantRef, where: JournalFilter, cursor: int | None, limit: int, order: str
    ) -> JournalSlice:
        rows = self._rows.get(tenant, [])
        last_seq = len(rows)
        picked = [r for r in rows if _matches(r, where)]
        if order == "desc":
            picked.reverse()
            if cursor is not None:
                picked = [r for r in picked if _seq(r) < cursor]
        elif cursor is not None:
            picked = [r for r in picked if _seq(r) > cursor]
        page = picked[:limit]
        more = len(picked) > limit
        return JournalSlice(tuple(page), _seq(page[-1]) if more else None, last_seq)

    async def _query(
        self,
        tenant: TenantRef,
        where: JournalFilter,
        cursor: int | None,
        limit: int,
        order: str,
        wait_seconds: float,
    ) -> JournalSlice:
        self.queries.append((tenant, cursor, order, wait_seconds))
        if self.unreachable:
            raise api.ServiceUnavailable("dataplane_unreachable")
        found = self._slice(tenant, where, cursor, limit, order)
        if found.entries or wait_seconds <= 0 or order != "asc":
            return found
        waiter: Deferred[None] = Deferred(self._forget)
        self._waiters.append(waiter)
        timer = self._clock.callLater(wait_seconds, self._time_out, waiter)
        try:
            await waiter
        finally:
            if timer.active():
                timer.cancel()
        if self.unreachable:
            raise api.ServiceUnavailable("dataplane_unreachable")
        return self._slice(tenant, where, cursor, limit, order)

    def _forget(self, waiter: Deferred[None]) -> None:
        if waiter in self._waiters:
            self._waiters.remove(waiter)

    def _time_out(self, waiter: Deferred[None]) -> None:
        self._forget(waiter)
        if not waiter.called:
            waiter.callback(None)

    @property
    def waiting(self) -> int:
        """How many long-polls are parked."""
        return len(self._waiters)

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
        """See L{svc.control.journal_access.JournalAccess.query}."""
        return Deferred.fromCoroutine(
            self._query(tenant, where, cursor, limit, order, wait_seconds)
        )

    def revert(
        self, tenant: TenantRef, path: str, seq: int, user_id: str
    ) -> Deferred[Mapping[str, JsonValue]]:
        """Append a C{revert} row for C{(path, seq)} by C{owner:<user_id>}."""
        return Deferred.fromCoroutine(self._revert(tenant, path, seq, user_id))

    async def _revert(
        self, tenant: TenantRef, path: str, seq: int, user_id: str
    ) -> Mapping[str, JsonValue]:
        if self.unreachable:
            raise api.ServiceUnavailable("dataplane_unreachable")
        rows = self._rows.get(tenant, [])
        if not 1 <= seq <= len(rows) or path not in (
            rows[seq - 1]["path"],
            rows[seq - 1].get("to_path"),
        ):
            raise api.NotFound("journal entry")
        if path.count("/") == 1:
            raise api.AccessDenied("disk_root")
        row = self.append(
            tenant, agent_id=f"owner:{user_id}", op="revert", path=path, reverts_seq=seq
        )
        return {"reverted_seq": seq, "journal_seq": row["seq"], "exists": True}


def _seq(row: Mapping[str, JsonValue]) -> int:
    seq = row["seq"]
    assert isinstance(seq, int)
    return seq
