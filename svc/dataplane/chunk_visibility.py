"""
Which chunks an agent may see.

Chunks are stored once per tenant store, but an agent must not learn that
another agent of the same store holds some content. So a chunk is
I{visible} to an agent only when a live file of its own disk references it
(C{chunk_refs} rows of its top-level directory in C{routes.db}) or when the
agent proved it holds the bytes by uploading them on this connection.
C{chunk_get}, C{chunk_has} and C{manifest_put} treat invisible chunks
exactly as absent ones. See ``docs/specifications/dataplane-ops.md``,
"Chunk visibility".

L{VisibleChunks} is a connection's bounded memory of hashes already known
visible, which spares most lookups; L{referenced_by_disk} asks the tenant's
C{routes.db}.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

from twisted.internet.defer import Deferred

from svc.store.tenant import TenantStorage

DEFAULT_MEMORY = 65536
"""How many hashes a connection remembers as visible (about 10 MB at most)."""


class VisibleChunks:
    """
    A bounded, least-recently-used set of chunk hashes known to be visible
    to one connection's agent.
    """

    def __init__(self, limit: int = DEFAULT_MEMORY) -> None:
        if limit < 1:
            raise ValueError("limit must be positive")
        self._limit = limit
        self._hashes: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, chunk_hash: object) -> bool:
        return chunk_hash in self._hashes

    def __len__(self) -> int:
        return len(self._hashes)

    def add(self, hashes: Iterable[str]) -> None:
        """Remember C{hashes} as visible (most recent last)."""
        for chunk_hash in hashes:
            self._hashes[chunk_hash] = None
            self._hashes.move_to_end(chunk_hash)
        while len(self._hashes) > self._limit:
            self._hashes.popitem(last=False)

    def unknown(self, hashes: Iterable[str]) -> list[str]:
        """The distinct C{hashes} not remembered, in first-seen order."""
        return [h for h in dict.fromkeys(hashes) if h not in self._hashes]


def referenced_by_disk(
    storage: TenantStorage, agent_id: str, hashes: Sequence[str]
) -> Deferred[frozenset[str]]:
    """
    Those of C{hashes} (well-formed chunk hashes) that a live file under
    C{/<agent_id>} references, read through the tenant's C{routes.db}
    queue (so the answer reflects every change submitted before it).
    """
    wanted = list(dict.fromkeys(hashes))
    if not wanted:
        return Deferred.fromCoroutine(_nothing())
    return storage.manifests.referenced_hashes(agent_id, wanted)


async def _nothing() -> frozenset[str]:
    return frozenset()
