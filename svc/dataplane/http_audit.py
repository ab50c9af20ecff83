"""
C{GET /audit}: its query parameters, the scope of an agent certificate, and
reading the newest matching records of the server's audit log.

The log is read backwards from its end in fixed-size blocks, so a request
costs at most C{max_scan_bytes} of reading and about C{block_size} plus the
longest line in memory, however large the file has grown. Lines are assumed
to be in time order (the server appends them as it writes them), which lets
C{since} stop the scan at the first older line. Only the current file is
read, never rotated ones. The reading is blocking: run it through an
L{svc.worker.IWorker}.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import BinaryIO

import attrs

from svc.audit.reader import parse_line
from svc.pki import names
from svc.pki.identity import AgentIdentity
from svc.web.errors import InvalidRequest

DEFAULT_LIMIT = 100
"""Records returned when C{limit} is not given."""

MAX_LIMIT = 1000
"""The cap on C{limit}: a larger value is lowered to it."""

BLOCK_SIZE = 64 * 1024
"""Bytes read from the file per step backwards."""

MAX_SCAN_BYTES = 64 * 1024 * 1024
"""How far back from the end of the file one request reads at most."""

MAX_LINE_BYTES = 1024 * 1024
"""A longer line is skipped (no audit line comes close)."""

QUERY_PARAMETERS = frozenset({"limit", "event", "since"})

_EVENT_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")


def _events(value: Iterable[str]) -> frozenset[str]:
    return frozenset(value)


@attrs.frozen
class AuditQuery:
    """
    The parsed query of C{GET /audit}: at most C{limit} records, only
    C{events} when non-empty, only lines written at or after C{since}.
    """

    limit: int = DEFAULT_LIMIT
    events: frozenset[str] = attrs.field(factory=frozenset, converter=_events)
    since: datetime | None = None


def parse_timestamp(text: str, what: str) -> datetime:
    """
    An RFC 3339 timestamp with an explicit offset (C{Z} or C{+hh:mm}),
    converted to UTC.

    @raise InvalidRequest: C{bad_<what>} otherwise.
    """
    try:
        if "T" not in text.upper():
            raise ValueError(text)
        moment = datetime.fromisoformat(text)
        return names.check_utc(moment, what)
    except ValueError:
        raise InvalidRequest(f"bad_{what}") from None


def parse_audit_query(args: Mapping[bytes, Sequence[bytes]]) -> AuditQuery:
    """
    Parse C{request.args}: C{limit} (once, an integer of at least 1, lowered
    to L{MAX_LIMIT}; default L{DEFAULT_LIMIT}), C{event} (repeatable event
    names) and C{since} (once, RFC 3339). Any other parameter is refused.

    @raise InvalidRequest: with a description naming the problem.
    """
    decoded: dict[str, list[str]] = {}
    for raw_name, raw_values in args.items():
        try:
            name = raw_name.decode("utf-8")
            values = [v.decode("utf-8") for v in raw_values]
        except UnicodeDecodeError:
            raise InvalidRequest("query_not_utf8") from None
        if name not in QUERY_PARAMETERS:
            raise InvalidRequest("unknown_parameter")
        decoded[name] = values
    limit = DEFAULT_LIMIT
    if "limit" in decoded:
        (text,) = _once(decoded["limit"], "limit")
        digits = text.lstrip("0")
        if not text.isascii() or not text.isdigit() or not digits:
            raise InvalidRequest("bad_limit")
        limit = MAX_LIMIT if len(digits) > 6 else min(int(digits), MAX_LIMIT)
    events = decoded.get("event", [])
    if any(_EVENT_NAME.fullmatch(e) is None for e in events):
        raise InvalidRequest("bad_event")
    since = None
    if "since" in decoded:
        (text,) = _once(decoded["since"], "since")
        since = parse_timestamp(text, "since")
    return AuditQuery(limit=limit, events=events, since=since)


def _once(values: list[str], name: str) -> list[str]:
    if len(values) != 1:
        raise InvalidRequest(f"repeated_{name}")
    return values


@attrs.frozen
class AuditScope:
    """
    The lines one agent certificate may read: server lines carrying both
    its C{tenant_id} and its C{agent_id}.

    Lines without a C{tenant_id} are never in scope, even when their
    C{agent_id} matches: lease lines (reduced envelope) carry only the
    holder's agent id, and agent ids are only unique within a tenant, so
    returning them could show one tenant another tenant's activity. The
    same goes for sweep, purge and C{http_auth} lines (no agent id).
    """

    tenant_id: str
    agent_id: str

    @classmethod
    def of_agent(cls, identity: AgentIdentity) -> AuditScope:
        """The scope of an admitted agent certificate."""
        return cls(identity.tenant_id, identity.agent_id)

    def admits(self, line: Mapping[str, object]) -> bool:
        """Whether the parsed C{line} is in this scope."""
        return line.get("tenant_id") == self.tenant_id and line.get("agent_id") == self.agent_id


def lines_from_end(
    handle: BinaryIO,
    *,
    block_size: int = BLOCK_SIZE,
    max_scan_bytes: int = MAX_SCAN_BYTES,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> Iterator[bytes]:
    """
    The complete lines of C{handle}, newest first, without their newline.

    Trailing bytes without a newline (a line still being written) are left
    out; so is a line cut by the C{max_scan_bytes} window and any line longer
    than C{max_line_bytes}. Empty lines are skipped.
    """
    if block_size < 1 or max_scan_bytes < 0 or max_line_bytes < 1:
        raise ValueError("block size and line size must be positive, scan window not negative")
    position = handle.seek(0, os.SEEK_END)
    # One byte more than the window: whether the byte before the window's
    # first line is a newline tells if that line is complete.
    floor = max(0, position - max_scan_bytes - 1)
    carry = b""
    # The last piece of the first split is the unterminated tail of the file
    # (or of a line dropped for being too long): never yielded.
    drop_last = True
    while position > floor:
        size = min(block_size, position - floor)
        position -= size
        handle.seek(position)
        pieces = (handle.read(size) + carry).split(b"\n")
        carry = pieces[0]
        complete = pieces[1:]
        if drop_last and complete:
            complete = complete[:-1]
            drop_last = False
        for raw in reversed(complete):
            if raw and len(raw) <= max_line_bytes:
                yield raw
        if len(carry) > max_line_bytes:
            carry = b""
            drop_last = True
    if position == 0 and carry and not drop_last:
        yield carry


def _line_time(line: Mapping[str, object]) -> datetime | None:
    value = line.get("ts")
    if not isinstance(value, str):
        return None
    try:
        return names.check_utc(datetime.fromisoformat(value), "ts")
    except ValueError:
        return None


def select_records(
    raw_lines: Iterable[bytes], scope: AuditScope, query: AuditQuery
) -> list[dict[str, object]]:
    """
    From C{raw_lines} (newest first), the newest C{query.limit} parsed lines
    in C{scope} that pass the event filter, returned oldest first. With
    C{since}, the scan stops at the first line older than it. Malformed
    lines and lines without a readable C{ts} are skipped.
    """
    found: list[dict[str, object]] = []
    for raw in raw_lines:
        if len(found) >= query.limit:
            break
        line = parse_line(raw)
        if line is None:
            continue
        moment = _line_time(line)
        if moment is None:
            continue
        if query.since is not None and moment < query.since:
            break
        if not scope.admits(line):
            continue
        if query.events and line.get("event") not in query.events:
            continue
        found.append(line)
    found.reverse()
    return found


def read_audit_records(
    path: Path,
    scope: AuditScope,
    query: AuditQuery,
    *,
    block_size: int = BLOCK_SIZE,
    max_scan_bytes: int = MAX_SCAN_BYTES,
) -> list[dict[str, object]]:
    """
    The records of the audit log at C{path} that C{GET /audit} returns for
    C{scope} and C{query} (blocking). A missing file has no records.
    """
    try:
        handle = open(path, "rb")
    except FileNotFoundError:
        return []
    with handle:
        lines = lines_from_end(handle, block_size=block_size, max_scan_bytes=max_scan_bytes)
        return select_records(lines, scope, query)
