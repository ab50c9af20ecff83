"""
Erasing one revoked allocation's data: the step both the purge sweep
(C{POST /v1/admin/purge-sweep}) and the operator's per-allocation purge
(C{POST /v1/admin/allocations/{id}/purge}, L{svc.control.routes_fleet})
take for each allocation.

The agent's subtree is erased on the data-plane server its tenant is placed
on (C{POST /control/purge-agent}), then the allocation is marked purged; an
allocation marked meanwhile by another sweep is left as it is. An
owner-scoped allocation, or one whose tenant was never placed, has nothing
on any server and is only marked.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from twisted.logger import Logger

from svc.control.dataplane_client import DataPlaneClient, DataPlaneTarget
from svc.control.store import errors as store_errors
from svc.control.store.interface import ControlStore
from svc.control.store.values import Allocation, Server
from svc.web.errors import JsonValue

_log = Logger()


async def purge_allocation(
    store: ControlStore,
    client: DataPlaneClient,
    target_of: Callable[[Server], DataPlaneTarget],
    allocation: Allocation,
    now: datetime,
) -> dict[str, JsonValue]:
    """
    Erase C{allocation}'s data and mark it purged; the answer entry of the
    purge sweep: C{allocation_id}, C{agent_id}, C{owner}, C{tenant},
    C{count} (manifests deleted), C{bytes_freed}.

    @raise svc.control.dataplane_client.DataPlaneCallFailed: the server
        could not erase it (the allocation stays revoked, for the next sweep).
    @raise svc.control.store.errors.ControlStoreError: the store refused.
    """
    count = freed = 0
    placement = await store.get_placement(allocation.tenant_id)
    if allocation.agent_id is not None and placement is not None:
        result = await client.purge_agent(
            target_of(placement.server),
            allocation.owner_id,
            allocation.tenant_id,
            allocation.agent_id,
        )
        count, freed = result.count, result.bytes_freed
    try:
        await store.mark_purged(allocation.allocation_id, now)
    except store_errors.Conflict:
        pass  # purged meanwhile by another sweep
    _log.info(
        "purged allocation {allocation_id} agent={agent_id}: {count} manifests,"
        " {bytes_freed} bytes",
        allocation_id=allocation.allocation_id,
        agent_id=allocation.agent_id,
        count=count,
        bytes_freed=freed,
    )
    return {
        "allocation_id": allocation.allocation_id,
        "agent_id": allocation.agent_id,
        "owner": allocation.owner_id,
        "tenant": allocation.tenant_id,
        "count": count,
        "bytes_freed": freed,
    }
