"""
Chunk bytes the mount came by without reading them for a reader: chunks it
just uploaded, and chunks a C{manifest_get} or a C{list} carried inline
(``docs/specifications/mount-fs.md`` section 6). They are kept where a read
of their file finds them.
"""

from __future__ import annotations

from collections.abc import Iterable

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from svc.chunking import chunk_hash
from svc.mount.core.fs_context import FSContext

_log = Logger()


class KeptChunks:
    """See the module docstring."""

    def __init__(self, context: FSContext) -> None:
        self._ctx = context

    def uploaded(self, name: str, data: bytes | memoryview) -> None:
        """
        Keep a chunk just stored (uploaded, or read inline) for reads, and
        cache it on disk unless it is small enough to come inline with a
        C{manifest_get} (C{inline_read_bytes}): the next mount's first open
        of its file asks for the chunk list anyway, and gets such a chunk
        with it, so a disk copy would save nothing but cost every small
        file's close a cache file and an index row (``docs/decisions.md``,
        session 25).
        """
        ctx = self._ctx
        ctx.memo.remember(name, data)
        if len(data) <= ctx.settings.inline_read_bytes:
            return
        stored = ctx.chunks.put(name, data)
        if isinstance(stored, Deferred):
            stored.addErrback(
                lambda failure: _log.failure("caching chunk {chunk} failed", failure, chunk=name)
            )

    def carried(self, rel: str, carried: Iterable[tuple[str, bytes]]) -> None:
        """
        The chunks of C{rel} a reply carried inline, for the reads that
        follow: each one not held already is checked here (BLAKE3 of at
        most C{inline_read_bytes}), then kept as an uploaded chunk is.
        Bytes that do not hash to their name are dropped with a warning: the
        read fetches that chunk. Whether they were held decides whether
        later opens and listings ask (L{svc.mount.chunks.inline_reads.InlineReads}).
        """
        ctx = self._ctx
        for name, data in carried:
            held = ctx.memo.holds(name)
            ctx.inline_reads.came(held)
            if held:
                continue
            if chunk_hash(data) != name:
                _log.warn(
                    "chunk {chunk} of {path!r} came inline with other bytes; fetching it",
                    chunk=name,
                    path=rel,
                )
                continue
            self.uploaded(name, data)
