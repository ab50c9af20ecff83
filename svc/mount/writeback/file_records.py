"""
Records of a file's content in the outbox that no request carries yet
(``mount-outbox.md`` section 8): the file's L{FileState.recorded}, which
its next commit replaces. So a mount killed before that commit leaves the
content to the next mount on the same cache, which sends it before it
serves.

Two calls append one without sending it:

 - L{FileRecords.record_empty}: a close leaving the commit of an empty file
   to a later close or the release (``mount-consistency.md`` section 2.5,
   "An empty file's close");
 - L{FileRecords.record_kept}: a file kept through a data-plane outage
   (L{svc.mount.writeback.kept_write_backs}) whose content no record holds
   yet (its last write-back recorded nothing, or the file changed since).

The write-back records the commits it sends for closes that return early,
and a commit that gets no answer stays the file's record
(L{svc.mount.writeback.file_write_back}).
"""

from __future__ import annotations

import errno
from functools import partial

from twisted.logger import Logger

from svc.chunking import ChunkRef
from svc.mount.core.errors import FSError
from svc.mount.core.file_state import FileState
from svc.mount.core.fs_context import FSContext
from svc.mount.core.inodes import Node
from svc.mount.outbox.entries import Commit
from svc.mount.outbox.outbox import INLINE_HELD_BYTES, Outbox
from svc.mount.outbox.recorded import commit_entry, settle_record, take_record
from svc.mount.writeback.commit import CommitRequest
from svc.mount.writeback.uploads import rechunk
from svc.worker import IWorker

_log = Logger()


def content_request(
    ctx: FSContext,
    node: Node,
    state: FileState,
    path: str,
    expected_version: int,
    chunks: tuple[ChunkRef, ...],
) -> CommitRequest:
    """The commit of C{state}'s content as C{chunks} at server path C{path}."""
    return CommitRequest(
        path=path,
        expected_version=expected_version,
        base=state.layout.base,
        chunks=chunks,
        size=state.size,
        mode=node.attributes.mode,
        mtime_ns=state.mtime_ns if state.mtime_ns is not None else ctx.now_ns(),
        uid=node.attributes.uid,
        gid=node.attributes.gid,
        atime_ns=state.atime_ns,
    )


class FileRecords:
    """See the module docstring."""

    def __init__(self, context: FSContext) -> None:
        self._ctx = context

    def _recordable(self, state: FileState) -> tuple[Outbox, Node, str] | None:
        """
        The outbox, node and path of a record of C{state} to make now, or
        L{None}: no outbox (or a stopped one), a record of the file as it stands exists, an
        atomic save is being replayed (its commit goes elsewhere), or the
        file has no name.
        """
        ctx = self._ctx
        outbox = ctx.outbox
        node = ctx.table.get(state.ino)
        if (
            outbox is None
            or outbox.stopped
            or node is None
            or state.recorded_now
            or state.replaces_version is not None
            or state.replay_via is not None
        ):
            return None
        rel = ctx.table.path_of(node)
        if rel is None:
            return None
        return outbox, node, ctx.server_path(rel)

    def record_empty(self, state: FileState) -> None:
        """
        Reactor: a close leaves the commit of C{state}'s empty file to a
        later close or the release (L{svc.mount.ops.file_closes}): record it
        first, unsent, once.

        @raise FSError: the outbox could not write it (the close fails).
        """
        found = self._recordable(state)
        if found is None:
            return
        outbox, node, path = found
        request = content_request(self._ctx, node, state, path, state.version, ())
        try:
            entry = outbox.append(partial(commit_entry, request), send=False)
        except OSError as error:
            raise FSError(
                error.errno or errno.EIO, f"recording the empty file in the outbox: {error}"
            ) from None
        take_record(outbox, state, entry, state.changes_now())

    async def record_kept(self, state: FileState) -> None:
        """
        Reactor: C{state}'s file is kept through an outage: record its
        content, unsent, unless a record of it as it stands exists. Under
        the file's lock: the content is cut into chunks here (nothing is
        uploaded), and the chunks not in its base are written to the
        outbox piece by piece when they pass L{INLINE_HELD_BYTES} (a big
        file is never whole in memory). A failure (a base chunk that cannot
        be read in the outage, the cache disk) is logged; the file stays
        kept in memory.
        """
        ctx = self._ctx
        async with state.lock:
            if ctx.files.state(state.ino) is not state:
                return  # let go meanwhile
            found = self._recordable(state)
            if found is None:
                return
            outbox, node, path = found
            at = state.changes_now()
            held = _Held(outbox, ctx.spill_worker)
            try:
                chunks = await rechunk(state.layout, state.read, ctx.worker, held)
                request = content_request(ctx, node, state, path, state.version, chunks)
                entry = outbox.append(
                    partial(commit_entry, request), held.chunks, send=False, staged=held.staged
                )
            except (OSError, FSError) as error:
                held.drop()
                _log.error(
                    "could not record kept inode {ino} in the outbox ({error}): a mount"
                    " killed before it is written back loses its changes",
                    ino=state.ino,
                    error=error,
                )
                return
            take_record(outbox, state, entry, at)

    def settle(self, state: FileState, entry: Commit | None) -> None:
        """Reactor: L{settle_record} with this mount's outbox."""
        settle_record(self._ctx.outbox, state, entry)


class _Held:
    """
    Where L{rechunk} puts the chunks of a kept file's record, in place of an
    uploader (nothing is sent): in memory up to L{INLINE_HELD_BYTES}, then
    staged in the outbox's chunk files (L{Outbox.stage}) on the spill worker.
    """

    def __init__(self, outbox: Outbox, worker: IWorker) -> None:
        self._outbox = outbox
        self._worker = worker
        self._names: set[str] = set()
        self._bytes = 0
        self.chunks: dict[str, bytes] = {}
        """The chunks kept in memory (none once staging began)."""
        self.staged: int | None = None
        """The outbox staging the chunks went to, once they passed L{INLINE_HELD_BYTES}."""

    def knows(self, chunk_hash: str) -> bool:
        return chunk_hash in self._names

    async def add(self, chunk_hash: str, data: bytes | memoryview) -> None:
        if chunk_hash in self._names:
            return
        self._names.add(chunk_hash)
        if self.staged is None:
            self.chunks[chunk_hash] = bytes(data)
            self._bytes += len(data)
            if self._bytes <= INLINE_HELD_BYTES:
                return
            staging = self.staged = self._outbox.staging()
            pending, self.chunks = self.chunks, {}
            for name, piece in pending.items():
                await self._worker.submit(partial(self._outbox.stage, staging, name, piece))
            return
        await self._worker.submit(partial(self._outbox.stage, self.staged, chunk_hash, bytes(data)))

    async def finish(self) -> None:
        """Nothing is in flight: each chunk was kept as it came."""

    def drop(self) -> None:
        """The record was not made: the staged chunks go."""
        if self.staged is not None:
            self._outbox.unstage(self.staged)
