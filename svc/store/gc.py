"""
Garbage collection and purge: which chunks may go, and the reports the
server turns into C{gc_swept_chunks} and C{agent_data_purged} audit lines.

A chunk is garbage when no live file references it, no journal row inside
the retention window references it, and it is older than the grace period
(a chunk uploaded moments ago may belong to a manifest not committed yet; a
deduplicated re-upload refreshes the chunk's age, see the chunk store). The
selection here is pure; L{svc.store.tenant.TenantStorage} runs it holding
the tenant's commit gate exclusively (L{svc.store.commit_gate}) so that no
manifest can commit a reference to a chunk being deleted.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from svc.store.chunks import ChunkInfo


@attrs.frozen
class SweepReport:
    """
    The outcome of one sweep of one tenant (audit C{gc_swept_chunks}).

    ``count`` and ``bytes_freed`` are what was deleted, or with ``dry_run``
    what would have been; ``kept_young`` counts unreferenced chunks spared by
    the grace period.
    """

    tenant_id: str
    count: int
    bytes_freed: int
    dry_run: bool
    kept_young: int = 0


@attrs.frozen
class PurgeReport:
    """
    The outcome of purging one agent's subtree (audit C{agent_data_purged}):
    ``count`` manifests deleted and ``bytes_freed`` by chunks no longer
    referenced anywhere in the tenant.
    """

    tenant_id: str
    agent_id: str
    count: int
    bytes_freed: int


def unreferenced(chunks: Iterable[ChunkInfo], referenced: frozenset[str]) -> list[ChunkInfo]:
    """
    The stored chunks that nothing references, in hash order.
    """
    return sorted((chunk for chunk in chunks if chunk.hash not in referenced), key=lambda c: c.hash)


def split_by_age(
    candidates: Iterable[ChunkInfo], modified_before_ns: int
) -> tuple[list[ChunkInfo], list[ChunkInfo]]:
    """
    Split candidates into those old enough to delete (modified strictly
    before ``modified_before_ns``) and those inside the grace period.
    """
    old: list[ChunkInfo] = []
    young: list[ChunkInfo] = []
    for chunk in candidates:
        (old if chunk.mtime_ns < modified_before_ns else young).append(chunk)
    return old, young
