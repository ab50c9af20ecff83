"""
The operator's service-token routes over the whole fleet, for the C{svc}
fleet commands (L{svc.control.fleet_cli}): every allocation page by page,
one allocation's purge, the registered data-plane servers, and one
server's garbage collection run now.

  - C{GET /v1/admin/allocations?state=&after=&limit=}
  - C{POST /v1/admin/allocations/{id}/purge} (503 until the agent CA is ready)
  - C{GET /v1/admin/servers}
  - C{POST /v1/admin/servers/{fqdn}/gc} (503 until the agent CA is ready)

Mounted with the database, served under C{/api} too, outside the OpenAPI
document's provisioning surface. Bodies: C{docs/specifications/control-routes.md}
("Operator routes").
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import attrs
from twisted.internet.defer import Deferred
from twisted.logger import Logger

from svc.control.dataplane_client import (
    DataPlaneCallFailed,
    DataPlaneClient,
    DataPlaneTarget,
    rfc3339,
    target_for,
)
from svc.control.http import Call
from svc.control.purging import purge_allocation
from svc.control.routes_entities import check_path_id, from_store, utc_now
from svc.control.routing import AuthKind, Feature, HandlerResult, Route
from svc.control.store.interface import ControlStore
from svc.control.store.transactions.accounts import MAX_PAGE
from svc.control.store.values import Allocation, AllocationState, Server
from svc.pki import names
from svc.pki.errors import InvalidName
from svc.web import errors as api
from svc.web.errors import JsonValue

DEFAULT_PAGE = 500
"""Allocations per page when C{limit} is not given."""

NOT_REVOKED = "not_revoked"
DATAPLANE_UNREACHABLE = "dataplane_unreachable"

_log = Logger()


@attrs.frozen
class FleetDeps:
    """
    What the fleet routes work with.

    @ivar clock: the reactor's time.
    @ivar client: the data-plane calls (purge, gc).
    @ivar target_of: where a server's HTTPS surface is.
    """

    store: ControlStore
    clock: Any
    client: DataPlaneClient
    target_of: Callable[[Server], DataPlaneTarget] = target_for


def allocation_json(allocation: Allocation) -> dict[str, JsonValue]:
    """One allocation of the listing."""
    return {
        "allocation_id": allocation.allocation_id,
        "agent_id": allocation.agent_id,
        "owner": allocation.owner_id,
        "tenant": allocation.tenant_id,
        "grant_bytes": allocation.grant_bytes,
        "state": allocation.state.value,
        "created_at": rfc3339(allocation.created_at),
        "revoked_at": _time(allocation.revoked_at),
        "purged_at": _time(allocation.purged_at),
    }


def server_json(server: Server) -> dict[str, JsonValue]:
    """One registered server."""
    return {
        "fqdn": server.fqdn,
        "address": server.address,
        "http_address": server.http_address,
        "capacity": server.capacity,
        "registered_at": rfc3339(server.registered_at),
        "last_seen_at": rfc3339(server.last_seen_at),
        "cert_not_after": _time(server.cert_not_after),
    }


class FleetRoutes:
    """The handlers; L{routes} declares them."""

    def __init__(self, deps: FleetDeps) -> None:
        self._deps = deps
        self._store = deps.store

    def routes(self) -> list[Route]:
        """Every route of this module."""

        def admin(method: str, path: str, handler: Any, **extra: Any) -> Route:
            return Route(
                method,
                path,
                AuthKind.SERVICE_TOKEN,
                handler,
                mounted_with={Feature.DATABASE},
                api_alias=True,
                **extra,
            )

        ca = {Feature.AGENT_CA}
        return [
            admin("GET", "/v1/admin/allocations", self.allocations),
            admin("POST", "/v1/admin/allocations/<id>/purge", self.purge, serves_with=ca),
            admin("GET", "/v1/admin/servers", self.servers),
            admin("POST", "/v1/admin/servers/<fqdn>/gc", self.gc, serves_with=ca),
        ]

    async def allocations(self, call: Call) -> HandlerResult:
        """One page of every owner's allocations, by allocation id."""
        state = _state(call.query_arg("state"))
        after = call.query_arg("after")
        if after is not None:
            after = check_path_id(after, "after")
        limit = _limit(call.query_arg("limit"))
        page = await from_store(self._store.list_allocations_page(after, limit, state))
        listed: list[JsonValue] = [allocation_json(a) for a in page]
        following = page[-1].allocation_id if len(page) == limit else None
        return {"allocations": listed, "next": following}

    async def purge(self, call: Call) -> HandlerResult:
        """Erase one revoked allocation's data (idempotent once purged)."""
        allocation_id = check_path_id(call.params["id"], "allocation_id")
        call.json_body(optional=True)
        allocation = await from_store(self._store.get_allocation(allocation_id))
        if allocation.state is AllocationState.PROVISIONED:
            raise api.Conflict(NOT_REVOKED, "revoke the allocation before purging it")
        if allocation.state is AllocationState.PURGED:
            entry: dict[str, JsonValue] = {
                "allocation_id": allocation.allocation_id,
                "agent_id": allocation.agent_id,
                "owner": allocation.owner_id,
                "tenant": allocation.tenant_id,
                "count": 0,
                "bytes_freed": 0,
            }
            return {**entry, "state": allocation.state.value}
        deps = self._deps
        try:
            entry = await from_store(
                Deferred.fromCoroutine(
                    purge_allocation(
                        self._store, deps.client, deps.target_of, allocation, self._now()
                    )
                )
            )
        except DataPlaneCallFailed as e:
            _log.warn(
                "purge of {allocation_id} failed: {reason}",
                allocation_id=allocation_id,
                reason=str(e),
            )
            raise api.ServiceUnavailable(DATAPLANE_UNREACHABLE) from None
        return {**entry, "state": AllocationState.PURGED.value}

    async def servers(self, call: Call) -> HandlerResult:
        """Every registered data-plane server, by FQDN."""
        servers = await from_store(self._store.list_servers())
        listed: list[JsonValue] = [server_json(s) for s in sorted(servers, key=lambda s: s.fqdn)]
        return {"servers": listed}

    async def gc(self, call: Call) -> HandlerResult:
        """Run one garbage-collection cycle on one server now; its totals."""
        fqdn = _fqdn(call.params["fqdn"])
        call.json_body(optional=True)
        servers = await from_store(self._store.list_servers())
        server = next((s for s in servers if s.fqdn == fqdn), None)
        if server is None:
            raise api.NotFound("unknown_server")
        try:
            result = await self._deps.client.gc(self._deps.target_of(server))
        except DataPlaneCallFailed as e:
            _log.warn("gc on {fqdn} failed: {reason}", fqdn=fqdn, reason=str(e))
            raise api.ServiceUnavailable(DATAPLANE_UNREACHABLE) from None
        _log.info(
            "gc on {fqdn}: {count} chunks, {bytes_freed} bytes over {tenants} tenants",
            fqdn=fqdn,
            count=result.count,
            bytes_freed=result.bytes_freed,
            tenants=result.tenants,
        )
        return {
            "fqdn": fqdn,
            "tenants": result.tenants,
            "count": result.count,
            "bytes_freed": result.bytes_freed,
            "kept_young": result.kept_young,
            "dry_run": result.dry_run,
        }

    def _now(self) -> datetime:
        return utc_now(self._deps.clock)


def fleet_routes(deps: FleetDeps) -> list[Route]:
    """The operator's fleet routes."""
    return FleetRoutes(deps).routes()


def _state(raw: str | None) -> AllocationState | None:
    if raw is None:
        return None
    try:
        return AllocationState(raw)
    except ValueError:
        raise api.InvalidRequest("invalid_state") from None


def _limit(raw: str | None) -> int:
    if raw is None:
        return DEFAULT_PAGE
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_PAGE:
        raise api.InvalidRequest("invalid_limit")
    return int(raw)


def _fqdn(raw: str) -> str:
    try:
        return names.check_fqdn(raw)
    except InvalidName:
        raise api.InvalidRequest("invalid_fqdn") from None


def _time(moment: datetime | None) -> str | None:
    return None if moment is None else rfc3339(moment)
