"""
What the data-plane service gives each of its connections
(L{svc.dataplane.connection.AgentConnection}): the L{ConnectionContext}
every connection of one service shares (clock, metrics, audit, session
key, path policies, the callbacks into the service), and the
L{DiskHandle} of an agent's opened storage.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import attrs
from twisted.internet.defer import Deferred

from svc.audit.events import AuditEvent
from svc.dataplane.answer_budget import AnswerBudgets
from svc.dataplane.change_notices import ChangeNotice
from svc.dataplane.rate_limited_log import RateLimitedLog
from svc.dataplane.session_epochs import SessionEpochs
from svc.metrics import DataPlaneMetrics
from svc.pki.identity import AgentIdentity
from svc.policy import PathPolicy
from svc.store.layout import TenantLocation
from svc.store.tenant import TenantStorage

if TYPE_CHECKING:
    from svc.dataplane.connection import AgentConnection


class Seconds(Protocol):
    """The part of C{IReactorTime} the data plane uses."""

    def seconds(self) -> float:
        """Now, in seconds since the epoch."""


@attrs.frozen
class DiskHandle:
    """An agent's opened storage: its location, tenant storage and session epochs."""

    location: TenantLocation
    storage: TenantStorage
    epochs: SessionEpochs


@attrs.frozen
class ConnectionContext:
    """What every connection of one service shares."""

    clock: Seconds
    metrics: DataPlaneMetrics
    audit_emit: Callable[[AuditEvent], object]
    session_key: bytes
    policy_for: Callable[[str, str], PathPolicy | None]
    open_disk: Callable[[AgentIdentity], Deferred[DiskHandle]]
    forget: Callable[[AgentConnection], None]
    draining: Callable[[AgentConnection, Deferred[None]], None]
    visible_memory: int
    announce: Callable[[ChangeNotice], None]
    refusals: RateLimitedLog
    """Where refusals a peer can cause are logged, at a bounded rate."""
    answer_budgets: AnswerBudgets = attrs.field(factory=AnswerBudgets)
    """Where bulk answers reserve their bytes (L{svc.dataplane.answer_budget})."""
    fenced: Callable[[TenantLocation, str, int, AgentConnection], object] = (
        lambda location, agent_id, epoch, source: None
    )
    """Told when a session presented on C{source} raised its agent's newest
    epoch: older sessions are fenced from now on."""
