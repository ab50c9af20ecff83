"""
The write-back that commits an open file's changes
(``docs/specifications/mount-consistency.md``), for the close, C{fsync} and
the last release (L{svc.mount.ops.file_closes}) and a write lease asked back.

Write-back holds the file's lock (writes to that file wait): the content is
re-chunked and its novel chunks uploaded (L{svc.mount.writeback.uploads}; a new
file's write-behind, L{svc.mount.writeback.write_behind}, started by its writes, has
usually cut and uploaded all but the tail already), then committed with a
compare-and-swap under the namespace lock (L{svc.mount.writeback.commit}). A commit
whose close returns before the answer is recorded in the outbox first
(``mount-outbox.md`` section 8). A lost compare-and-swap that is not
provably compatible saves this mount's version as a conflict copy beside
the file, keeps the other writer's version at the path
(L{svc.mount.ops.conflicts}), and fails the flush with ESTALE; the C{flush}
audit line carries the C{recovery_*} fields.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from functools import partial
from typing import TypeVar

import attrs
from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger

from svc.audit.events import NO_PROCESS, CallerProcess
from svc.audit.names import EventName
from svc.mount.core.attributes import Attributes
from svc.mount.core.client_audit import AuditLine
from svc.mount.core.errors import FSError, RemoteFailure, no_answer
from svc.mount.core.file_state import FileState
from svc.mount.core.fs_context import FSContext
from svc.mount.core.inodes import Node
from svc.mount.core.namespace_lock import CommitCount
from svc.mount.ops.conflicts import adopt, recovery_fields, save_copy
from svc.mount.outbox.entries import Commit
from svc.mount.outbox.outbox import INLINE_HELD_BYTES, Outbox
from svc.mount.outbox.recorded import commit_entry, new_chunk_bytes, settle_record, take_record
from svc.mount.remote.data_plane import MANIFEST_CHUNK_LIMIT
from svc.mount.remote.never_created import replay_rename, take_replay
from svc.mount.writeback.close_hand_off import HandOffs
from svc.mount.writeback.commit import CommitRequest, Committed, Conflict, commit
from svc.mount.writeback.file_records import content_request
from svc.mount.writeback.kept_chunks import KeptChunks
from svc.mount.writeback.uploads import ChunkUploader, rechunk

_log = Logger()

T = TypeVar("T")


class WriteBack:
    """See the module docstring."""

    def __init__(self, context: FSContext, hand_offs: HandOffs, kept: KeptChunks) -> None:
        self._ctx = context
        self._hand_offs = hand_offs
        self._kept = kept
        context.leases.on_yield(self.yield_file)

    def _wait_for_lease(self, state: FileState, path: str) -> Deferred[bool | None]:
        """
        A commit of C{state} at server path C{path} met another connection's
        write lease: take it, waiting for the holder to yield (L{None}: the
        wait was not answered).
        """

        def held(granted: bool | None) -> bool | None:
            if granted:
                state.uncached = False
            return granted

        return self._ctx.leases.wait_for(state.ino, path).addCallback(held)

    def yield_file(self, ino: int) -> Deferred[None]:
        """
        The data plane asks back the write lease of C{ino}'s open file:
        write its changes back first; it is written uncached afterwards.
        """
        state = self._ctx.files.state(ino)
        if state is None:
            return succeed(None)

        async def yielding() -> None:
            self._hand_offs.started()
            try:
                await self.write_back(state, NO_PROCESS)
            finally:
                state.uncached = True
                self._hand_offs.finished()

        return Deferred.fromCoroutine(yielding())

    def uploader(
        self,
        session: str | None,
        *,
        commits: bool = False,
        keep: dict[str, bytes | memoryview] | None = None,
    ) -> ChunkUploader:
        """
        An uploader; one whose chunks a commit follows (C{commits}) may hold
        them inline; with C{keep}, the chunks added are kept there too.
        """
        settings = self._ctx.settings
        return ChunkUploader(
            self._ctx.remote,
            session,
            on_uploaded=self._kept.uploaded,
            batch_bytes=settings.batch_bytes,
            probe_min_bytes=settings.probe_min_bytes,
            inline_max_bytes=settings.inline_max_bytes if commits else 0,
            keep=keep,
        )

    async def write_back(
        self,
        state: FileState,
        caller: CallerProcess,
        on_sent: Callable[[], None] | None = None,
    ) -> None:
        """
        Commit C{state}'s changes; see the module docstring. C{on_sent} is
        called once the commit is sent (not when there is nothing to send).
        """
        async with state.lock:
            record = state.recorded
            await self._write_back(state, caller, on_sent, record)
            # Committed, or nothing left to commit: the file's record is
            # not needed (after a failure it stays for the next attempt).
            settle_record(self._ctx.outbox, state, record)

    async def _write_back(
        self,
        state: FileState,
        caller: CallerProcess,
        on_sent: Callable[[], None] | None,
        record: Commit | None,
    ) -> None:
        """L{write_back} under the file's lock; C{record}: L{FileState.recorded} then."""
        ctx = self._ctx
        node = ctx.table.get(state.ino)
        if node is None or not (state.dirty or node.pending):
            return  # nothing to commit
        if ctx.namespace_lock.moving(state.ino):
            # A rename handed off behind an earlier commit: its answer
            # first (a refused one moves the name back).
            await ctx.namespace_lock.moves_settled(state.ino)
        rel = ctx.table.path_of(node)
        if rel is None:
            return  # no name to commit it at
        session = ctx.write_session()
        with ctx.audit.line(EventName.FLUSH, rel, caller, session_id=session) as line:
            ctx.check_write(rel)
            # A close returning once the commit is sent records it with
            # its new chunks; so does the commit that follows a record of
            # the file (settled once this one is recorded).
            added: dict[str, bytes | memoryview] | None = (
                {}
                if ctx.outbox is not None
                and not ctx.outbox.stopped
                and (on_sent is not None or record is not None)
                else None
            )
            uploader = self.uploader(session, commits=True, keep=added)
            try:
                await self._commit_changes(node, state, line, uploader, session, on_sent, added)
            finally:
                await uploader.drain()

    async def _commit_changes(
        self,
        node: Node,
        state: FileState,
        line: AuditLine,
        uploader: ChunkUploader,
        session: str | None,
        on_sent: Callable[[], None] | None,
        added: dict[str, bytes | memoryview] | None = None,
    ) -> None:
        """
        Rechunk, upload and commit C{state} (under its lock); see
        L{write_back}. With C{added} (the chunks the uploader was given),
        the commit is recorded in the outbox before it is sent. The commit
        is sent under the namespace lock, and answered without it
        (L{svc.mount.core.namespace_lock}): operations that may touch this file
        wait until the inode table is updated from the answer.
        """
        ctx = self._ctx
        behind, state.write_behind = state.write_behind, None
        sent_behind = await behind.stop() if behind is not None else 0
        precut = behind.at if behind is not None and behind.chunks else None
        try:
            chunks = await rechunk(state.layout, state.read, ctx.worker, uploader, precut)
        except RemoteFailure as failure:
            raise ctx.write_failed(failure) from None
        if len(chunks) > MANIFEST_CHUNK_LIMIT:
            raise FSError(errno.EFBIG, f"{len(chunks)} chunks exceed one manifest")
        line.size = state.size
        outbox = ctx.outbox if added is not None else None
        held = (
            None
            if outbox is None or added is None
            else await new_chunk_bytes(state.read, chunks, state.layout.base, added)
        )
        recorded: Commit | None = None
        unanswered = False  # the commit got no answer: its record stays the file's
        async with ctx.namespace_lock.sending_commit():
            rel = ctx.table.path_of(node)
            if rel is None:
                return  # unlinked meanwhile
            replay = take_replay(ctx, node, state)
            line.path = "/" + (rel if replay is None else replay.via)
            request = content_request(
                ctx,
                node,
                state,
                ctx.server_path(rel if replay is None else replay.via),
                _expected_version(node, state),
                chunks,
            )
            changes_sent = state.attribute_changes
            at = state.changes_now()
            if outbox is not None and held is not None:
                recorded = await self._record(outbox, state, request, held)
            # Runs up to its first wait: the first manifest_put is sent.
            answer = Deferred.fromCoroutine(
                commit(
                    ctx.remote,
                    request,
                    session_id=session,
                    uploader=uploader,
                    read=state.read,
                    max_retries=ctx.settings.max_cas_retries,
                    moved=lambda: ctx.table.path_of(node) != rel,
                    wait_for_lease=(
                        partial(self._wait_for_lease, state, request.path)
                        if ctx.settings.write_leases
                        else None
                    ),
                    tag=None if outbox is None or recorded is None else outbox.tag(recorded),
                )
            )
            settled = ctx.namespace_lock.commit_sent()
            state.commits_in_flight += 1
            answer.addBoth(_answered_now, state, settled)
        try:
            if on_sent is not None:
                on_sent()
            try:
                await self._answered(
                    node, state, line, uploader, request, rel, sent_behind, answer, changes_sent
                )
            except FSError as error:
                unanswered = no_answer(error)
                raise
            if replay is not None:
                # Counted in flight until its rename is answered too.
                await replay_rename(ctx, node, replay, line.caller, session)
        finally:
            settled()
            if outbox is not None and recorded is not None:
                _seen_through(outbox, state, recorded, at, unanswered=unanswered)

    async def _record(
        self, outbox: Outbox, state: FileState, request: CommitRequest, held: dict[str, bytes]
    ) -> Commit:
        """
        Record C{request} (adding the chunks C{held}) in the outbox before
        it is sent; it replaces the file's record, if any.
        """
        record = partial(outbox.append, partial(commit_entry, request), held, send=False)
        try:
            if sum(map(len, held.values())) <= INLINE_HELD_BYTES:
                recorded = record()  # one write(2) to the log: less than a worker's
            else:
                recorded = await self._ctx.spill_worker.submit(record)
        except OSError as error:
            raise FSError(
                error.errno or errno.EIO, f"recording the commit in the outbox: {error}"
            ) from None
        settle_record(outbox, state, state.recorded)  # this commit replaces it
        return recorded

    async def _answered(
        self,
        node: Node,
        state: FileState,
        line: AuditLine,
        uploader: ChunkUploader,
        request: CommitRequest,
        rel: str,
        sent_behind: int,
        answer: Deferred[Committed | Conflict],
        changes_sent: int,
    ) -> None:
        """
        The commit of C{request} at C{rel} is sent (C{changes_sent}: the
        state's L{FileState.attribute_changes} then): handle its C{answer}.
        """
        ctx = self._ctx
        try:
            outcome = await answer
        except RemoteFailure as failure:
            raise ctx.write_failed(failure) from None
        copy = None
        if isinstance(outcome, Conflict):
            async with ctx.namespace_lock.beside_commits():
                copy = await save_copy(ctx, node, request, line.session_id)
        chunks_new = uploader.uploaded + sent_behind
        line.extra.update(
            chunks_new=chunks_new,
            chunks_reused=max(0, len(request.chunks) - chunks_new),
            cas_retries=outcome.cas_retries,
        )
        if isinstance(outcome, Committed):
            line.extra["version_new"] = outcome.version
            await self._committed(node, state, request, outcome, changes_sent)
            return
        recovery_fields(line.extra, rel, copy, outcome)
        if copy is not None:
            await adopt(ctx, node, state, outcome)
        line.write(allowed=False)
        raise FSError(errno.ESTALE, f"{rel!r} was changed by another writer")

    async def _committed(
        self,
        node: Node,
        state: FileState,
        request: CommitRequest,
        outcome: Committed,
        changes_sent: int,
    ) -> None:
        kept_mtime = state.mtime_ns if state.kept_since(changes_sent) else None
        attributes = attrs.evolve(
            node.attributes,
            size=request.size,
            version=outcome.version,
            mtime_ns=request.mtime_ns if kept_mtime is None else kept_mtime,
            ctime_ns=self._ctx.now_ns() if outcome.ctime_ns is None else outcome.ctime_ns,
        )
        if node.pending:
            self._created(node, attributes, outcome.inode, adopted=outcome.adopted)
        else:
            node.set_attributes(attributes)
        node.chunks = request.chunks
        node.chunks_version = outcome.version
        node.kernel_version = outcome.version  # the kernel cached what it wrote
        # A getattr answered while the commit was in flight (a close hands it
        # off) left the kernel the old ctime, for the attribute timeout.
        self._ctx.forget_attributes(node.ino)
        self._hand_offs.committed()
        done = state.committed(outcome.version, request.chunks, changes_sent)
        if done is not None:
            await done

    def _created(
        self, node: Node, attributes: Attributes, inode: int | None, *, adopted: bool
    ) -> None:
        """
        Pending C{node} was created on the data plane by its first commit
        (or, C{adopted}, by that commit's first sending, whose answer was
        lost: it ran earlier, and later changes may have moved the
        directory's times on since).
        """
        table = self._ctx.table
        link = table.primary_name(node)
        if link is not None:
            if attributes.version == 1 and not adopted:
                # The data plane stamped the directory with the file's ctime
                # (the client's clock stands in for a server that does not
                # say).
                link[0].entry_added(attributes)
            else:
                # The commit found the file there already (its creation's
                # answer was lost with the connection, and a compatible retry
                # overwrote it, or the version found was adopted): the
                # directory did not change now. Ask.
                link[0].stale = True
            # The kernel may hold the directory's attributes from before the
            # commit (a getattr while it was in flight), so it forgets them.
            self._ctx.forget_attributes(link[0].ino)
        if inode is None:  # a server that does not say: unbound, refetched when asked
            node.set_attributes(attributes)
            node.pending = False
            node.stale = True
        else:
            table.bind(node, attrs.evolve(attributes, server_inode=inode))


def _answered_now(result: T, state: FileState, count: CommitCount) -> T:
    """
    A commit's answer came (or its failure): it is no longer unanswered,
    though its write-back goes on (conflict copy, the mount's picture, a
    replayed save's rename) until C{count} is called.
    """
    state.commits_in_flight -= 1
    count.answered()
    return result


def _seen_through(
    outbox: Outbox, state: FileState, entry: Commit, at: tuple[int, int], *, unanswered: bool
) -> None:
    """
    The write-back that recorded C{entry} (C{state} standing at C{at}) is
    over. C{unanswered} (unsent, or its answer lost): it stays the file's
    record (L{FileState.recorded}), which the next mount on the cache sends
    if this one dies before a later commit replaces it, unless a newer
    record of the file was made meanwhile. Otherwise it is done.
    """
    if unanswered and state.recorded is None:
        take_record(outbox, state, entry, at)
    else:
        outbox.done(entry)


def _expected_version(node: Node, state: FileState) -> int:
    """
    The compare-and-swap token of C{state}'s next commit: its base version,
    or for a new file whose lost atomic save is replayed by replacing the
    file it was saved over, that file's version (once:
    L{FileState.replaces_version} is cleared).
    """
    replaces, state.replaces_version = state.replaces_version, None
    if replaces is not None and node.pending:
        return replaces
    return state.version
