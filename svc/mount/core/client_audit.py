"""
The mount client's audit lines (``docs/specifications/audit-log.md``
section 3.1), written through an injected C{emit} callable.

L{ClientAudit.line} gives a context manager that writes exactly one line
per operation when the operation ends: C{allowed: true} with the fields
gathered on success, C{allowed: false} when it raised (a policy denial,
read-only mode, a server refusal...), except for errnos the operation names
as an ordinary outcome (a C{lookup} miss). Paths are mount-relative with a
leading C{/} (C{/} is the mount root).
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any

from svc.audit.events import AuditEvent, CallerProcess, ExtraValue, client_event
from svc.mount.core.errors import FSError


def audit_path(rel: str) -> str:
    """The audit C{path} of a mount-relative path (C{""} is the root)."""
    return "/" + rel


class AuditLine:
    """One pending line; see L{ClientAudit.line}."""

    def __init__(
        self,
        audit: ClientAudit,
        event: str,
        path: str,
        caller: CallerProcess,
        session_id: str | None,
        ordinary: frozenset[int],
        extra: dict[str, ExtraValue | None],
    ) -> None:
        self._audit = audit
        self.event = event
        self.path = path
        self.caller = caller
        self.session_id = session_id
        self._ordinary = ordinary
        self.extra = extra
        self.size: int | None = None
        self.offset: int | None = None
        self.allowed: bool | None = None
        self.written = False

    def __enter__(self) -> AuditLine:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self.written:
            return
        if error is None:
            allowed = True if self.allowed is None else self.allowed
        else:
            allowed = isinstance(error, FSError) and error.errno in self._ordinary
            self.size = None
        self.write(allowed)

    def defer(self) -> AuditLine:
        """
        Leave the line to a later L{write} (an operation whose outcome
        arrives after its call returned): the block's end writes nothing.
        """
        self.written = True
        return self

    def write(self, allowed: bool) -> None:
        """Write the line now (the block's end then writes nothing)."""
        self.written = True
        extra: dict[str, Any] = self.extra  # keys are event fields, never envelope ones
        self._audit.emit(
            client_event(
                self.event,
                ts=self._audit.now(),
                path=self.path,
                allowed=allowed,
                caller=self.caller,
                size=self.size,
                offset=self.offset,
                session_id=self.session_id,
                **extra,
            )
        )


class ClientAudit:
    """Writes client audit lines; see the module docstring."""

    def __init__(self, emit: Callable[[AuditEvent], object], now: Callable[[], float]) -> None:
        self._emit = emit
        self.now = now

    def emit(self, event: AuditEvent) -> None:
        """Write one ready-made line."""
        self._emit(event)

    def line(
        self,
        event: str,
        rel: str,
        caller: CallerProcess,
        *,
        session_id: str | None = None,
        ordinary: frozenset[int] = frozenset(),
        **extra: ExtraValue | None,
    ) -> AuditLine:
        """
        A line for C{event} on mount-relative path C{rel}, written when the
        C{with} block ends. C{session_id} is given for write events only.
        """
        return AuditLine(self, event, audit_path(rel), caller, session_id, ordinary, dict(extra))

    def simple(
        self,
        event: str,
        rel: str,
        caller: CallerProcess,
        *,
        allowed: bool = True,
        size: int | None = None,
        **extra: ExtraValue | None,
    ) -> None:
        """Write one line at once (e.g. a C{readdir_entry})."""
        fields: dict[str, Any] = extra
        self._emit(
            client_event(
                event,
                ts=self.now(),
                path=audit_path(rel),
                allowed=allowed,
                caller=caller,
                size=size,
                **fields,
            )
        )
