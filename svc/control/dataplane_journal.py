"""
The values and codecs of the two journal calls the control plane makes to a
data-plane server (C{GET /control/journal}, C{POST /control/journal/revert};
C{docs/specifications/control-dataplane.md}). Pure: building the query
string and body, and checking the answers. L{DataPlaneClient.journal} and
L{DataPlaneClient.journal_revert} in L{svc.control.dataplane_client} make
the calls.

A malformed answer raises L{MalformedAnswer}; the client turns it into
L{svc.control.dataplane_client.DataPlaneCallFailed}.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

import attrs

from svc.web.errors import JsonValue

MAX_WAIT_SECONDS = 30.0
"""The longest long-poll a data-plane server accepts."""

MAX_LIMIT = 1000
"""The largest page a data-plane server returns."""

ORDERS = ("asc", "desc")


class MalformedAnswer(ValueError):
    """A journal answer that is not the documented shape; the message says why."""


def _check_wait(instance: JournalRequest, attribute: object, value: float) -> None:
    if isinstance(value, bool) or not 0 <= value <= MAX_WAIT_SECONDS:
        raise ValueError(f"wait_seconds must be between 0 and {MAX_WAIT_SECONDS}")
    if value > 0 and instance.order != "asc":
        raise ValueError("wait_seconds needs order 'asc'")


def _check_limit(instance: JournalRequest, attribute: object, value: int | None) -> None:
    if value is not None and not 1 <= value <= MAX_LIMIT:
        raise ValueError(f"limit must be between 1 and {MAX_LIMIT}")


def _check_order(instance: JournalRequest, attribute: object, value: str) -> None:
    if value not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}")


@attrs.frozen
class JournalRequest:
    """
    Which page of a tenant's journal to ask for: rows about C{path} (and
    below it, with C{below}), written by C{agent}, with
    C{since_ms <= at_ms < until_ms}, after C{cursor} in C{order}, at most
    C{limit} (L{None}: the server's default, 100). With C{wait_seconds}
    (only with C{order} C{asc}) the server holds an empty page until a row
    arrives or that long has passed.
    """

    path: str | None = None
    below: bool = False
    agent: str | None = None
    since_ms: int | None = None
    until_ms: int | None = None
    cursor: int | None = None
    limit: int | None = attrs.field(default=None, validator=_check_limit)
    order: str = attrs.field(default="asc", validator=_check_order)
    wait_seconds: float = attrs.field(default=0.0, validator=_check_wait)

    def parameters(self, owner: str, tenant: str) -> list[tuple[str, str]]:
        """The query parameters, optional ones only when set."""
        found: list[tuple[str, str]] = [("owner", owner), ("tenant", tenant)]
        if self.path is not None:
            found.append(("path", self.path))
        if self.below:
            found.append(("below", "1"))
        if self.agent is not None:
            found.append(("agent", self.agent))
        for name in ("since_ms", "until_ms", "cursor", "limit"):
            value = getattr(self, name)
            if value is not None:
                found.append((name, str(value)))
        found.append(("order", self.order))
        if self.wait_seconds > 0:
            found.append(("wait", format_seconds(self.wait_seconds)))
        return found


def format_seconds(seconds: float) -> str:
    """C{seconds} in the form the server accepts: up to six decimals, no exponent."""
    return f"{seconds:.6f}".rstrip("0").rstrip(".")


@attrs.frozen
class JournalAnswer:
    """
    One page: C{entries} are the entry maps as received (C{at_ms} in
    milliseconds), C{next_cursor} L{None} at the end, C{last_seq} the
    tenant's newest row whatever the filters (0: empty journal).
    """

    entries: tuple[Mapping[str, JsonValue], ...]
    next_cursor: int | None
    last_seq: int


@attrs.frozen
class RevertAnswer:
    """
    A committed owner revert: C{journal_seq} is the new row (L{None}: the
    path already was in that state); C{kind}, C{version} and C{size} are
    set when the path exists afterwards.
    """

    path: str
    reverted_seq: int
    journal_seq: int | None
    exists: bool
    kind: str | None = None
    version: int | None = None
    size: int | None = None


def _object(answer: object) -> Mapping[str, object]:
    if not isinstance(answer, dict):
        raise MalformedAnswer("answer is not a JSON object")
    return cast(Mapping[str, object], answer)


def _count(answer: Mapping[str, object], name: str, *, optional: bool = False) -> int | None:
    value = answer.get(name)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MalformedAnswer(f"{name} is not a non-negative integer")
    return value


def parse_journal_answer(answer: object) -> JournalAnswer:
    """
    C{{"entries": [...], "next_cursor", "last_seq"}}; every entry must be
    an object with an integer C{seq}.
    """
    body = _object(answer)
    entries = body.get("entries")
    if not isinstance(entries, list):
        raise MalformedAnswer("entries is not an array")
    for entry in entries:
        if not isinstance(entry, dict):
            raise MalformedAnswer("an entry is not an object")
        _count(entry, "seq")
    last_seq = _count(body, "last_seq")
    assert last_seq is not None
    return JournalAnswer(
        entries=tuple(cast(list[Mapping[str, JsonValue]], entries)),
        next_cursor=_count(body, "next_cursor", optional=True),
        last_seq=last_seq,
    )


def parse_revert_answer(answer: object) -> RevertAnswer:
    """
    C{{"path", "reverted_seq", "journal_seq", "exists"}} and, when the path
    exists, C{kind}, C{version}, C{size}.
    """
    body = _object(answer)
    path = body.get("path")
    exists = body.get("exists")
    kind = body.get("kind")
    if not isinstance(path, str):
        raise MalformedAnswer("path is not a string")
    if not isinstance(exists, bool):
        raise MalformedAnswer("exists is not a boolean")
    if kind is not None and not isinstance(kind, str):
        raise MalformedAnswer("kind is not a string")
    reverted_seq = _count(body, "reverted_seq")
    assert reverted_seq is not None
    return RevertAnswer(
        path=path,
        reverted_seq=reverted_seq,
        journal_seq=_count(body, "journal_seq", optional=True),
        exists=exists,
        kind=kind,
        version=_count(body, "version", optional=True),
        size=_count(body, "size", optional=True),
    )
