"""
A journal revert as a tenant storage runs it: the entry must exist and
concern the path (L{svc.store.errors.NotFound} otherwise); the chunks the
path's earlier state names are looked up in the chunk store first, and the
restore in C{routes.db} (L{svc.store.journal.revert}) refuses with
L{svc.store.errors.ChunksCollected} when one is gone
(``docs/specifications/storage-engine.md``, "Garbage collection").
L{svc.store.tenant.TenantStorage.journal_revert} runs it holding the commit
gate shared, so the chunk check and the restore see the same store.
"""

from __future__ import annotations

from collections.abc import Callable

from svc.store.chunks import IChunkStore
from svc.store.errors import NotFound
from svc.store.journal import RevertResult
from svc.store.manifest_values import Writer
from svc.store.manifests import ManifestStore


async def revert(
    manifests: ManifestStore,
    chunks: IChunkStore,
    path: str,
    seq: int,
    *,
    writer: Writer,
    retained_cap: Callable[[str], int],
) -> RevertResult:
    """
    Restore ``path`` to its state just before journal entry ``seq``, as a
    new journaled change by ``writer``; then bring the retained bytes of
    the disk holding ``path`` within ``retained_cap(path)``, read as the
    restore is submitted.
    """
    entry = await manifests.journal_entry(seq)
    if entry is None:
        raise NotFound(f"journal entry {seq}")
    if not entry.concerns(path):
        raise NotFound(f"journal entry {seq} does not concern {path}")
    before = entry.state_before(path)
    needed = [c.hash for c in (before.chunks if before is not None else ())]
    present: frozenset[str] = frozenset()
    if needed:
        present = frozenset((await chunks.has(needed)).present)
    return await manifests.journal_revert(
        path,
        seq,
        writer=writer,
        missing_chunks=lambda hashes: [h for h in hashes if h not in present],
        retained_cap=retained_cap(path),
    )
