"""
The audit lines of one agent connection (``docs/specifications/audit-log.md``,
"Data-plane events"): one line per request of an audited op, with its
outcome, and the line and counter of a path-confinement refusal.

C{statfs}, C{ping}, C{close} and the lease requests write no per-request
line: the specification names no event for them (lease events come from the
lease table). The chunk and journal ops carry an empty C{path}; a path is
written truncated to L{AUDIT_PATH_LIMIT} characters.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from twisted.logger import Logger

from svc.audit.events import AuditEvent, CertFields, ExtraValue, server_event
from svc.audit.names import Origin, event_for_op, shape_of
from svc.audit.server_events import path_denied_event
from svc.dataplane.calls import Call, Outcome
from svc.dataplane.request_paths import first_path
from svc.metrics import DataPlaneMetrics, op_label
from svc.wire.messages import ChunkGetRequest, ChunkHasRequest, ChunkPutRequest
from svc.wire.ops import Op

AUDIT_PATH_LIMIT = 4096
"""A refused path longer than this (in characters) is logged truncated."""

_PATH_EMPTY_OPS = frozenset(
    {Op.CHUNK_GET, Op.CHUNK_PUT, Op.CHUNK_HAS, Op.JOURNAL_QUERY, Op.JOURNAL_REVERT_PATH}
)
_AUDITED_OPS = frozenset(Op) - {
    Op.LEASE_GRANT,
    Op.LEASE_REFRESH,
    Op.LEASE_RELEASE,
    Op.LEASE_REVOKE,
    Op.CHANGED,
    Op.STATFS,
    Op.PING,
    Op.CLOSE,
}


class ConnectionAudit:
    """The audit lines of one agent's connection; see the module docstring."""

    _log = Logger()

    def __init__(
        self,
        *,
        agent_id: str,
        cert: CertFields,
        now: Callable[[], float],
        emit: Callable[[AuditEvent], object],
        metrics: DataPlaneMetrics,
    ) -> None:
        self._agent_id = agent_id
        self._cert = cert
        self._now = now
        self._emit = emit
        self._metrics = metrics

    def path_denied(self, op: Op, path: str) -> None:
        """A path-confinement refusal: its line (if the op has one) and the counter."""
        self._metrics.count_path_denied(op_label(op))
        if op in _AUDITED_OPS:
            self._emit(
                path_denied_event(
                    ts=self._now(),
                    op=op,
                    cert=self._cert,
                    path="" if op in _PATH_EMPTY_OPS else _audit_path(path),
                )
            )
        else:
            self._log.info(
                "{op} refused for {agent}: path outside agent subtree",
                op=op.value,
                agent=self._agent_id,
            )

    def succeeded(self, call: Call, outcome: Outcome) -> None:
        """The line of a request that succeeded with C{outcome}."""
        if call.op in _AUDITED_OPS:
            self._emit(
                self._line(
                    call.op,
                    first_path(call.request),
                    True,
                    call.session_id,
                    outcome.size,
                    outcome.extra,
                )
            )

    def failed(self, op: Op, path: str | None, call: Call | None) -> None:
        """The line of a request that failed (C{call}: L{None} if it did not parse)."""
        if op not in _AUDITED_OPS:
            return
        extra: dict[str, ExtraValue] = {}
        if call is not None:
            request = call.request
            if isinstance(request, ChunkGetRequest | ChunkPutRequest):
                extra["hash"] = request.hash
            elif isinstance(request, ChunkHasRequest):
                extra["count"] = len(request.hashes)
        session_id = None if call is None else call.session_id
        self._emit(self._line(op, path, False, session_id, None, extra))

    def _line(
        self,
        op: Op,
        path: str | None,
        allowed: bool,
        session_id: str | None,
        size: int | None = None,
        extra: Mapping[str, ExtraValue] | None = None,
    ) -> AuditEvent:
        event = event_for_op(op)
        if not shape_of(Origin.SERVER, event).session_id:
            session_id = None
        return server_event(
            event,
            ts=self._now(),
            cert=self._cert,
            path="" if op in _PATH_EMPTY_OPS else _audit_path(path or ""),
            allowed=allowed,
            size=size,
            session_id=session_id,
            **dict(extra or {}),
        )


def _audit_path(path: str) -> str:
    return path[:AUDIT_PATH_LIMIT]
