"""
The journal event stream (C{GET /v1/journal/stream}): server-sent events
of a tenant's new journal rows, resumable with C{Last-Event-ID}.

L{JournalStream} is the loop, written against a C{write} callable, a clock
and a L{JournalAccess}: it long-polls the data plane from a seq cursor,
sends each row once as an event whose C{id} is its seq, sends a heartbeat
comment when a long-poll comes back empty, and ends cleanly (after a whole
event) when its time is up, when C{still_allowed} says the credential is
gone, or when L{JournalStream.stop} is called (the client went away). Event
format: C{docs/specifications/owner-routes.md}.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from twisted.internet.defer import CancelledError, Deferred
from twisted.logger import Logger

from svc.control.journal_access import (
    JournalAccess,
    JournalFilter,
    JournalSlice,
    TenantRef,
    render_entry,
)
from svc.web.errors import ApiError, JsonValue

HEARTBEAT_SECONDS = 15.0
"""Longest silence before a heartbeat comment."""

MAX_STREAM_SECONDS = 300.0
"""A stream ends (the client reconnects) after this long."""

RETRY_MILLISECONDS = 2000
"""The reconnection delay the stream suggests to C{EventSource}."""

PAGE = 100
"""Rows asked per long-poll."""

_log = Logger()


def event_bytes(entry: dict[str, JsonValue]) -> bytes:
    """One C{journal} event: C{id} = seq, C{data} = the entry as one JSON line."""
    data = json.dumps(entry, separators=(",", ":"), ensure_ascii=False)
    return f"id: {entry['seq']}\nevent: journal\ndata: {data}\n\n".encode()


def comment_bytes(text: str) -> bytes:
    """A comment line (ignored by C{EventSource}; keeps proxies from timing out)."""
    return f": {text}\n\n".encode()


def error_bytes(code: str) -> bytes:
    """An C{error} event before a close the server did not choose."""
    data = json.dumps({"error": code}, separators=(",", ":"))
    return f"event: error\ndata: {data}\n\n".encode()


def parse_last_event_id(value: str | None) -> int | None:
    """
    The seq in a C{Last-Event-ID} header, or L{None} when absent or empty.

    @raise ValueError: not a non-negative decimal integer.
    """
    if value is None or not value.strip():
        return None
    text = value.strip()
    if not text.isdigit() or not text.isascii() or len(text) > 19:
        raise ValueError(value)
    return int(text)


class JournalStream:
    """
    One client's stream of one tenant's journal.

    @param still_allowed: asked between long-polls; C{False} ends the stream
        (the session expired or was revoked, the user was suspended).
    """

    def __init__(
        self,
        access: JournalAccess,
        tenant: TenantRef,
        where: JournalFilter,
        *,
        clock: Any,
        write: Callable[[bytes], object],
        still_allowed: Callable[[], Awaitable[bool]],
        heartbeat_seconds: float = HEARTBEAT_SECONDS,
        max_seconds: float = MAX_STREAM_SECONDS,
    ) -> None:
        self._access = access
        self._tenant = tenant
        self._where = where
        self._clock = clock
        self._write = write
        self._still_allowed = still_allowed
        self._heartbeat = heartbeat_seconds
        self._max_seconds = max_seconds
        self._stopped = False
        self._pending: Deferred[JournalSlice] | None = None
        self.sent: list[int] = []
        """The seqs sent, in order."""

    def stop(self) -> None:
        """The client went away: abandon the long-poll in flight and end."""
        self._stopped = True
        if self._pending is not None and not self._pending.called:
            self._pending.cancel()

    async def _ask(self, cursor: int | None, limit: int, order: str, wait: float) -> JournalSlice:
        self._pending = self._access.query(
            self._tenant, self._where, cursor=cursor, limit=limit, order=order, wait_seconds=wait
        )
        try:
            return await self._pending
        finally:
            self._pending = None

    async def start_cursor(self, after: int | None) -> int:
        """C{after}, or the journal's newest seq now (only new rows)."""
        if after is not None:
            return after
        first = await self._ask(None, 1, "desc", 0.0)
        return first.last_seq

    async def run(self, after: int | None) -> None:
        """
        Stream rows with seq greater than C{after} (L{None}: than the newest
        row now) until the stream ends. Never raises for an ended or failed
        stream: a failure is sent as an C{error} event first.
        """
        deadline = self._clock.seconds() + self._max_seconds
        try:
            cursor = await self.start_cursor(after)
            self._write(
                f"retry: {RETRY_MILLISECONDS}\n".encode()
                + comment_bytes(f"connected after={cursor}")
            )
            while not self._stopped:
                remaining = deadline - self._clock.seconds()
                if remaining <= 0:
                    break
                wait = min(self._heartbeat, remaining)
                found = await self._ask(cursor, PAGE, "asc", wait)
                if self._stopped:
                    break
                for entry in found.entries:
                    rendered = render_entry(entry)
                    seq = rendered["seq"]
                    if not isinstance(seq, int) or seq <= cursor:
                        continue  # never repeat a row
                    self._write(event_bytes(rendered))
                    self.sent.append(seq)
                    cursor = seq
                if not found.entries:
                    self._write(comment_bytes("heartbeat"))
                if not await self._still_allowed():
                    break
        except CancelledError:
            return
        except ApiError as e:
            if not self._stopped:
                self._write(error_bytes(e.description or e.code))
        except Exception:
            _log.failure("journal stream of tenant {tenant} failed", tenant=self._tenant.tenant_id)
            if not self._stopped:
                self._write(error_bytes("server_error"))
