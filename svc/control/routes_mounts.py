"""
The exclusive mount lease of an allocation, taken by the enrolled agent
itself (agent identity: its leaf over mTLS, or C{agent_fingerprint}).

  - C{POST /allocations/{id}/mount} (optional body C{{"force": bool}})
    acquires the lease: 200 with the lease and its mount session id; 409
    C{wrong_agent}, C{already_mounted}, C{lease_live} (with the incumbent's
    C{bound_at}, C{lease_expires_at}), C{insufficient_capacity}; 410
    C{revoked}. Every grant (a new epoch) is told to the push loop, which
    has the tenant's server fence the agent's older sessions at once: a
    forced takeover's displaced mount (demoted, not revoked) is told to stop
    writing within a push.
  - C{POST /allocations/{id}/mount/refresh} extends it (410 C{lease_lost}
    when the caller no longer holds it, also when its leaf was revoked
    because its lease ended: C{AuthKind.LEASE_HOLDER}).
  - C{DELETE /allocations/{id}/mount} releases it (204); every unexpired
    leaf of the holder's enrollment (its leaf and those it was renewed
    from) goes into C{cert_revocations} and the push loop is told at once.

The caller is identified by the enrollment's leaf (its serial), never by the
body. Bodies: C{docs/specifications/control-routes.md}.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Protocol, runtime_checkable

import attrs
from twisted.logger import Logger

from svc.control.dataplane_client import SessionFence, rfc3339
from svc.control.http import Call
from svc.control.revocation_push import PushNotices
from svc.control.routes_entities import from_store, utc_now
from svc.control.routing import AuthKind, Feature, HandlerResult, Reply, Route
from svc.control.store.interface import ControlStore
from svc.control.store.outcomes import (
    InsufficientCapacity,
    MountConflict,
    MountConflictCode,
)
from svc.control.store.values import Allocation, MountHolder, MountLease
from svc.web import errors as api
from svc.web.errors import JsonValue

DEFAULT_MOUNT_LEASE_TTL_SECONDS = 120
"""How long a mount lease lives without a refresh (C{SVC_MOUNT_LEASE_TTL_SECONDS})."""

_log = Logger()


@runtime_checkable
class AgentCaller(Protocol):
    """
    The agent-identity principal as this module reads it (the attributes of
    C{svc.control.agent_auth.AgentPrincipal}).
    """

    @property
    def tenant_id(self) -> str:
        """The leaf's tenant."""

    @property
    def agent_id(self) -> str:
        """The leaf's agent."""

    @property
    def serial(self) -> str:
        """The leaf's serial: identifies the enrollment."""

    @property
    def not_after(self) -> datetime:
        """The leaf's expiry."""

    @property
    def fingerprint(self) -> str | None:
        """The leaf's fingerprint."""


@attrs.frozen
class MountDeps:
    """
    What the mount routes work with.

    @ivar clock: the reactor's time.
    @ivar lease_ttl: the lease lifetime granted by acquisition and refresh.
    @ivar pushes: told when a release revoked leaves, and of every grant's epoch.
    """

    store: ControlStore
    clock: Any
    pushes: PushNotices
    lease_ttl: timedelta = timedelta(seconds=DEFAULT_MOUNT_LEASE_TTL_SECONDS)


def lease_body(lease: MountLease, server_addr: str | None = None) -> dict[str, JsonValue]:
    """The JSON of a granted or refreshed lease."""
    body: dict[str, JsonValue] = {
        "allocation_id": lease.allocation_id,
        "agent_id": lease.holder.agent_id,
        "session_id": lease.session_id,
        "bound_at": rfc3339(lease.bound_at),
        "lease_expires_at": rfc3339(lease.expires_at),
        "ttl_seconds": int((lease.expires_at - lease.bound_at).total_seconds()),
    }
    if server_addr is not None:
        body["server_addr"] = server_addr
    return body


def conflict_error(conflict: MountConflict) -> api.ApiError:
    """The 409 for a refused acquisition."""
    incumbent = conflict.incumbent
    if conflict.code is MountConflictCode.LEASE_LIVE and incumbent is not None:
        return api.LeaseLive(rfc3339(incumbent.bound_at), rfc3339(incumbent.expires_at))
    if conflict.code is MountConflictCode.ALREADY_MOUNTED and incumbent is not None:
        return api.Conflict(
            api.ALREADY_MOUNTED,
            extra={
                "bound_at": rfc3339(incumbent.bound_at),
                "lease_expires_at": rfc3339(incumbent.expires_at),
            },
        )
    return api.Conflict(api.WRONG_AGENT)


class MountRoutes:
    """The handlers; L{routes} declares them."""

    def __init__(self, deps: MountDeps) -> None:
        self._deps = deps
        self._store = deps.store

    def routes(self) -> list[Route]:
        """Every route of this module."""
        path = "/allocations/<id>/mount"
        agent = AuthKind.AGENT_IDENTITY
        holder = AuthKind.LEASE_HOLDER
        database = {Feature.DATABASE}
        return [
            Route("POST", path, agent, self.acquire, mounted_with=database),
            Route("POST", path + "/refresh", holder, self.refresh, mounted_with=database),
            Route("DELETE", path, holder, self.release, mounted_with=database),
        ]

    async def acquire(self, call: Call) -> HandlerResult:
        """C{POST /allocations/{id}/mount}."""
        caller, holder = _holder(call)
        force = call.json_body(optional=True).get("force", False)
        if not isinstance(force, bool):
            raise api.InvalidRequest("invalid_force")
        allocation = await self._allocation_of(call, caller)
        now = utc_now(self._deps.clock)
        placement = await from_store(self._store.place_tenant(allocation.tenant_id, now))
        if isinstance(placement, InsufficientCapacity):
            raise api.Conflict(api.INSUFFICIENT_CAPACITY)
        outcome = await from_store(
            self._store.acquire_mount(
                allocation.allocation_id, holder, now, self._deps.lease_ttl, force
            )
        )
        if isinstance(outcome, MountConflict):
            raise conflict_error(outcome)
        self._deps.pushes.session_granted(
            SessionFence(
                allocation.owner_id, allocation.tenant_id, holder.agent_id, outcome.lease.epoch
            )
        )
        if outcome.displaced is not None:
            _log.info(
                "mount lease of {allocation_id} taken over by serial {serial}"
                " from serial {displaced}",
                allocation_id=allocation.allocation_id,
                serial=holder.leaf_serial,
                displaced=outcome.displaced.holder.leaf_serial,
            )
        return lease_body(outcome.lease, placement.server.address)

    async def refresh(self, call: Call) -> HandlerResult:
        """C{POST /allocations/{id}/mount/refresh}."""
        caller, holder = _holder(call)
        allocation = await self._allocation_of(call, caller)
        lease = await from_store(
            self._store.refresh_mount(
                allocation.allocation_id, holder, utc_now(self._deps.clock), self._deps.lease_ttl
            )
        )
        return lease_body(lease)

    async def release(self, call: Call) -> HandlerResult:
        """C{DELETE /allocations/{id}/mount}: 204, the enrollment's leaves revoked."""
        caller, holder = _holder(call)
        allocation = await self._allocation_of(call, caller)
        await from_store(
            self._store.release_mount(allocation.allocation_id, holder, utc_now(self._deps.clock))
        )
        _log.info(
            "mount lease of {allocation_id} released; the enrollment of serial {serial} revoked",
            allocation_id=allocation.allocation_id,
            serial=holder.leaf_serial,
        )
        self._deps.pushes.revocations_changed()
        return Reply.no_content()

    async def _allocation_of(self, call: Call, caller: AgentCaller) -> Allocation:
        allocation = await from_store(self._store.get_allocation(call.params["id"]))
        if not allocation.live:
            raise api.Gone(api.REVOKED)
        if allocation.agent_id != caller.agent_id or allocation.tenant_id != caller.tenant_id:
            raise api.Conflict(api.WRONG_AGENT)
        return allocation


def _holder(call: Call) -> tuple[AgentCaller, MountHolder]:
    caller = call.principal
    if not isinstance(caller, AgentCaller):
        raise TypeError(f"principal is {type(caller).__name__}, not an agent identity")
    return caller, MountHolder(
        agent_id=caller.agent_id,
        leaf_serial=caller.serial,
        leaf_not_after=caller.not_after,
        fingerprint=caller.fingerprint,
    )


def mount_routes(deps: MountDeps) -> list[Route]:
    """The agent-identity mount-lease routes."""
    return MountRoutes(deps).routes()
