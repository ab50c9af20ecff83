"""
How long a tenant storage keeps data nothing references any more: uploads
not yet committed, and the journal's history
(``docs/specifications/storage-engine.md``, "Footprint", "Garbage
collection", "Reclaim"). The engine gives one L{RetentionPolicy} to every
tenant storage it opens (the data plane's settings build it).
"""

from __future__ import annotations

import attrs

from svc.store.footprint import FootprintPolicy


@attrs.frozen
class RetentionPolicy:
    """
    How long unreferenced data is kept: an upload stays charged to its
    agent, and its chunk is not collected, for ``chunk_grace_seconds`` after
    its last C{chunk_put} (it may be about to be committed; an unrecorded
    chunk younger than that is not swept either); journal rows younger than
    ``journal_retention_seconds`` keep their chunks so the change can be
    reverted, within the bytes ``footprint`` lets each agent retain. A
    collectable chunk written or touched within ``reclaim_margin_seconds``
    is deleted by a later pass.
    """

    chunk_grace_seconds: float = 3600.0
    journal_retention_seconds: float = 7 * 24 * 3600.0
    footprint: FootprintPolicy = attrs.field(factory=FootprintPolicy)
    reclaim_margin_seconds: float = 0.5
