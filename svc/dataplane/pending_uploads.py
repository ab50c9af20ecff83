"""
The C{chunk_put}s in flight on one connection (``dataplane-ops.md`` section
7): a C{chunk_put} starts at once, and a later request naming its hash
(C{manifest_put}, C{chunk_get}, C{chunk_has}) waits until that upload has
finished, however it ended. So a client may pipeline C{chunk_put}s and the
C{manifest_put} naming them.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred, gatherResults, succeed

from svc.wire.messages import (
    ChunkGetRequest,
    ChunkHasRequest,
    ChunkPutRequest,
    ManifestPutRequest,
)


class _Upload:
    """A C{chunk_put} in flight on this connection; later requests wait for it."""

    def __init__(self) -> None:
        self.done = False
        self._waiters: list[Deferred[None]] = []

    def wait(self) -> Deferred[None]:
        if self.done:
            return succeed(None)
        waiter: Deferred[None] = Deferred()
        self._waiters.append(waiter)
        return waiter

    def finish(self) -> None:
        self.done = True
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.callback(None)


class PendingUploads:
    """The C{chunk_put}s in flight on one connection, by hash."""

    def __init__(self) -> None:
        self._uploads: dict[str, list[_Upload]] = {}

    def begin(self, request: object) -> _Upload | None:
        """A request starts: if it is a C{chunk_put}, its upload, in flight until L{end}."""
        if not isinstance(request, ChunkPutRequest):
            return None
        upload = _Upload()
        self._uploads.setdefault(request.hash, []).append(upload)
        return upload

    def end(self, request: object, upload: _Upload | None) -> None:
        """The request L{begin} was given has ended: its upload (if any) has finished."""
        if upload is None or not isinstance(request, ChunkPutRequest):
            return
        pending = self._uploads.get(request.hash, [])
        if upload in pending:
            pending.remove(upload)
        if not pending:
            self._uploads.pop(request.hash, None)
        upload.finish()

    def wait(self, hashes: list[str]) -> Deferred[object]:
        """Fires once every C{chunk_put} in flight for C{hashes} has finished."""
        waits = [u.wait() for h in dict.fromkeys(hashes) for u in self._uploads.get(h, ())]
        if not waits:
            return succeed(None)
        return gatherResults(waits).addCallback(lambda _: None)


def named_hashes(request: object) -> list[str]:
    """The chunk hashes a C{manifest_put}, C{chunk_get} or C{chunk_has} names."""
    if isinstance(request, ManifestPutRequest):
        return [chunk.hash for chunk in request.chunks]
    if isinstance(request, ChunkGetRequest):
        return [request.hash]
    if isinstance(request, ChunkHasRequest):
        return list(request.hashes)
    return []
