"""
The chunks a tenant storage knows are stored without asking its chunk store
(``docs/specifications/storage-engine.md``, "Commit rules", step 2): a
manifest change checks the chunk store only for the chunks it names that are
not among them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

RECENT_CHUNKS = 65536
"""Chunks whose completed upload a tenant storage remembers (L{RecentChunks})."""


class RecentChunks:
    """
    Chunks known to be stored without asking the chunk store: those whose
    upload completed (durably) since the last deletion. L{deleted} is
    called, still holding the commit gate, once a deletion has ended (however
    it ended); it forgets them all, including uploads that completed while
    it ran. Manifest changes wait for the commit gate, so none trusts a
    chunk a deletion may have removed. At most C{limit} are remembered (the
    oldest forgotten first). Forgetting is always safe: the chunk store is
    asked instead.
    """

    def __init__(self, limit: int = RECENT_CHUNKS) -> None:
        self._limit = limit
        self._stored: OrderedDict[str, None] = OrderedDict()

    def stored(self, chunk_hash: str) -> None:
        """An upload of C{chunk_hash} completed."""
        self._stored[chunk_hash] = None
        self._stored.move_to_end(chunk_hash)
        while len(self._stored) > self._limit:
            self._stored.popitem(last=False)

    def unknown(self, hashes: Sequence[str]) -> list[str]:
        """Those of C{hashes} not known to be stored."""
        return [h for h in hashes if h not in self._stored]

    def forget(self, chunk_hash: str) -> None:
        """
        C{chunk_hash} may be gone (withdrawn as corrupt, or deleted by a
        reclaim pass: it deletes only chunks nothing names, holding the
        commit gate, so the others it leaves are still stored).
        """
        self._stored.pop(chunk_hash, None)

    def deleted(self) -> None:
        """Chunks may have been deleted: nothing is known any more."""
        self._stored.clear()
