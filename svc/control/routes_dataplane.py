"""
What a data-plane server asks the control plane, with the service token
(besides C{POST /control/sign-server-cert}, L{svc.control.routes_enrollment};
bodies in C{docs/specifications/control-dataplane.md}):

  - C{GET /control/cert-revocations}: the active revocation set, in the body
    of the C{PUT /control/cert-revocations} push; a server pulls it before
    it accepts agents, so a leaf revoked while it was down is refused on its
    first attempt;
  - C{GET /control/placement?fqdn=&owner=&tenant=&agent_id=}: whether the
    agent identity C{(owner, tenant, agent_id)} is placed on the server
    C{fqdn}; a server asks when an identity it has not been told about
    (the quota pushes name the placed ones) opens its storage.

The placement decision is L{placement_of}, a pure function of the agent's
allocation and the tenant's placement.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from datetime import UTC, datetime

import attrs

from svc.control.dataplane_client import revocations_body
from svc.control.http import Call
from svc.control.routing import AuthKind, Feature, HandlerResult, Route
from svc.control.store.errors import NotFound
from svc.control.store.interface import ControlStore
from svc.control.store.values import Allocation, Placement
from svc.pki import names
from svc.pki.errors import InvalidName
from svc.web import errors as api

REVOCATIONS_PATH = "/control/cert-revocations"
PLACEMENT_PATH = "/control/placement"

_FEATURES = frozenset({Feature.DATABASE})


class PlacementVerdict(enum.Enum):
    """The C{reason} of a placement answer."""

    PLACED = "placed"
    UNKNOWN_AGENT = "unknown_agent"
    """No agent-scoped allocation has this agent id."""
    NOT_LIVE = "allocation_not_live"
    """The agent's allocation was revoked or purged."""
    OTHER_IDENTITY = "other_owner_or_tenant"
    """The agent's allocation is in another tenant or of another owner."""
    TENANT_NOT_PLACED = "tenant_not_placed"
    """The tenant has no server yet."""
    OTHER_SERVER = "placed_on_another_server"


@attrs.frozen
class PlacementQuery:
    """C{(owner, tenant, agent_id)} on server C{fqdn}: the question asked."""

    fqdn: str
    owner: str
    tenant: str
    agent_id: str


def placement_of(
    query: PlacementQuery, allocation: Allocation | None, placement: Placement | None
) -> PlacementVerdict:
    """
    Whether C{query}'s identity is placed on C{query.fqdn}: the agent has a
    live allocation in exactly that tenant for exactly that owner, and the
    tenant is placed on that server.

    @param allocation: the agent's allocation (L{None}: there is none).
    @param placement: the tenant's placement (L{None}: not placed).
    """
    if allocation is None:
        return PlacementVerdict.UNKNOWN_AGENT
    if not allocation.live:
        return PlacementVerdict.NOT_LIVE
    if (allocation.owner_id, allocation.tenant_id) != (query.owner, query.tenant):
        return PlacementVerdict.OTHER_IDENTITY
    if placement is None:
        return PlacementVerdict.TENANT_NOT_PLACED
    if placement.tenant_id != query.tenant or placement.server.fqdn != query.fqdn:
        return PlacementVerdict.OTHER_SERVER
    return PlacementVerdict.PLACED


def parse_placement_query(call: Call) -> PlacementQuery:
    """
    The four query parameters, each exactly once: C{fqdn} a host name
    (lower-cased), C{owner}, C{tenant}, C{agent_id} certificate ids.

    @raise api.InvalidRequest: C{missing_<name>} or C{bad_<name>}.
    """
    values: dict[str, str] = {}
    for name in ("fqdn", "owner", "tenant", "agent_id"):
        value = call.query_arg(name)
        if value is None:
            raise api.InvalidRequest(f"missing_{name}")
        try:
            values[name] = (
                names.check_fqdn(value) if name == "fqdn" else names.check_id(value, name)
            )
        except InvalidName:
            raise api.InvalidRequest(f"bad_{name}") from None
    return PlacementQuery(**values)


@attrs.frozen
class DataPlaneQueryDeps:
    """The store and the clock (Unix seconds)."""

    store: ControlStore
    now: Callable[[], float]


def dataplane_query_routes(deps: DataPlaneQueryDeps) -> list[Route]:
    """The route declarations, bound to C{deps}."""

    async def revocations(call: Call) -> HandlerResult:
        now = datetime.fromtimestamp(deps.now(), UTC)
        active = await deps.store.active_revocations(now)
        return revocations_body(active, now)

    async def placement(call: Call) -> HandlerResult:
        query = parse_placement_query(call)
        try:
            allocation: Allocation | None = await deps.store.get_agent_allocation(query.agent_id)
        except NotFound:
            allocation = None
        placed = await deps.store.get_placement(query.tenant)
        verdict = placement_of(query, allocation, placed)
        return {"placed": verdict is PlacementVerdict.PLACED, "reason": verdict.value}

    return [
        Route("GET", REVOCATIONS_PATH, AuthKind.SERVICE_TOKEN, revocations, _FEATURES),
        Route("GET", PLACEMENT_PATH, AuthKind.SERVICE_TOKEN, placement, _FEATURES),
    ]
