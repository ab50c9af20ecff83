"""
Which chunk uploads of each agent are in flight in one tenant storage, so an
upload that fails after its charge was recorded forgets that charge only when
that cannot uncharge a chunk another upload stored
(``docs/specifications/storage-engine.md``, "Uncommitted uploads").

An upload's charge is recorded before its bytes are written. If the write
fails (bytes that do not match the hash, a full disk), the charge it
recorded is taken back, unless another upload of the same chunk by the same
agent overlapped it: that one found the charge recorded and may have stored
the chunk, which must stay charged. Uploads that start after the failure
queue their charge behind the taking back, so they record it afresh.
"""

from __future__ import annotations

import attrs


@attrs.define
class _Uploads:
    in_flight: int = 0
    stored: bool = False


class UploadsInFlight:
    """See the module docstring. Used on the reactor thread only."""

    def __init__(self) -> None:
        self._uploads: dict[tuple[str, str], _Uploads] = {}

    def __len__(self) -> int:
        return len(self._uploads)

    def started(self, agent_id: str, chunk_hash: str) -> None:
        """An upload of C{chunk_hash} by C{agent_id} starts (before its charge)."""
        self._uploads.setdefault((agent_id, chunk_hash), _Uploads()).in_flight += 1

    def stored(self, agent_id: str, chunk_hash: str) -> None:
        """One such upload stored the chunk."""
        uploads = self._uploads[(agent_id, chunk_hash)]
        uploads.stored = True
        self._end(agent_id, chunk_hash, uploads)

    def failed(self, agent_id: str, chunk_hash: str) -> bool:
        """
        One such upload failed; returns whether the charge it recorded may
        be taken back now: no other upload of the chunk by the agent is in
        flight, and none that overlapped it stored the chunk.
        """
        uploads = self._uploads[(agent_id, chunk_hash)]
        alone = uploads.in_flight == 1 and not uploads.stored
        self._end(agent_id, chunk_hash, uploads)
        return alone

    def _end(self, agent_id: str, chunk_hash: str, uploads: _Uploads) -> None:
        uploads.in_flight -= 1
        if uploads.in_flight == 0:
            del self._uploads[(agent_id, chunk_hash)]
