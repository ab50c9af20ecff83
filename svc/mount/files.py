"""
The file operations of the filesystem core: create, open, read, write,
truncate, flush, fsync, release, and the write-back that commits an open
file's changes (``docs/specifications/mount-consistency.md``).

Write-back runs on C{flush}, C{fsync} and the last C{release} of a dirty
file, holding the file's lock (writes to that file wait): the content is
re-chunked and its novel chunks uploaded (L{svc.mount.writeback}), then
committed with a compare-and-swap under the namespace lock
(L{svc.mount.commit}). A lost compare-and-swap that is not provably
compatible saves this mount's version as a conflict copy beside the file,
keeps the other writer's version at the path, and fails the flush with
ESTALE; the C{flush} audit line carries the C{recovery_*} fields.
"""

from __future__ import annotations

import errno
import os
import stat

import attrs
from twisted.internet.defer import Deferred
from twisted.logger import Logger

from svc.audit.events import CallerProcess, ExtraValue
from svc.audit.names import EventName
from svc.mount.attributes import AttributeChanges, Entry, FileKind, OpenResult
from svc.mount.commit import (
    CommitRequest,
    Committed,
    Conflict,
    commit,
    conflict_name,
    entries,
)
from svc.mount.errors import FSError, RemoteFailure
from svc.mount.extents import chunk_layout
from svc.mount.fs_context import FSContext, audit_name, decode_name, join
from svc.mount.inodes import Node
from svc.mount.namespace import NamespaceOps
from svc.mount.open_files import FileState, Handle
from svc.mount.remote import MANIFEST_CHUNK_LIMIT
from svc.mount.writeback import ChunkUploader, rechunk
from svc.wire.errno import WireErrno

_log = Logger()

CONFLICT_COPY_ATTEMPTS = 5
"""Names tried for a conflict copy before giving up."""


def _writable(flags: int) -> bool:
    return flags & os.O_ACCMODE != os.O_RDONLY


class FileOps:
    """See the module docstring."""

    def __init__(self, context: FSContext, namespace: NamespaceOps) -> None:
        self._ctx = context
        self._namespace = namespace
        # Releases whose handle is already gone from the table but whose
        # write-back is still running: shutdown waits for them.
        self._releasing = 0
        self._released: list[Deferred[None]] = []

    def releases_settled(self) -> Deferred[None]:
        """
        Fires once no release write-back is in flight (at once when none is).
        """
        waiter: Deferred[None] = Deferred()
        if self._releasing == 0:
            waiter.callback(None)
        else:
            self._released.append(waiter)
        return waiter

    def _release_finished(self) -> None:
        self._releasing -= 1
        if self._releasing == 0:
            waiters, self._released = self._released, []
            for waiter in waiters:
                waiter.callback(None)

    # Opening

    async def create(
        self, parent: int, name: bytes, mode: int, flags: int, caller: CallerProcess
    ) -> tuple[OpenResult, Entry]:
        """Create regular file C{name} in C{parent} and open it."""
        ctx = self._ctx
        async with ctx.namespace_lock:
            directory = ctx.directory(parent)
            rel = join(ctx.rel_of(directory), audit_name(name))
            with ctx.audit.line(
                EventName.CREATE,
                rel,
                caller,
                session_id=ctx.write_session(),
                mode=stat.S_IMODE(mode),
            ):
                decoded = decode_name(name)
                ctx.check_write(rel)
                node = await self._namespace.make_node(
                    directory, rel, decoded, FileKind.FILE, mode, 0, caller
                )
        state = self._new_state(node)
        handle = ctx.files.open(state, _writable(flags))
        node.kernel_version = state.version
        ctx.table.looked_up(node)
        return OpenResult(handle.fh, keep_cache=False), Entry(node.ino, ctx.attributes(node))

    async def open(self, ino: int, flags: int, caller: CallerProcess) -> OpenResult:
        """Open regular file C{ino}."""
        ctx = self._ctx
        node = ctx.node(ino)
        rel = ctx.table.path_of(node)
        state = ctx.files.state(ino)
        if rel is None and state is None:
            raise FSError(errno.ENOENT, f"inode {ino} has no name")
        writable = _writable(flags)
        with ctx.audit.line(EventName.OPEN, rel or "", caller) as line:
            if node.kind is FileKind.DIR:
                raise FSError(errno.EISDIR, "open of a directory")
            if node.kind is not FileKind.FILE:
                raise FSError(errno.EINVAL, "open of a special file")
            if writable:
                if rel is None:
                    if ctx.read_only_reason is not None:
                        raise FSError(errno.EROFS, f"read-only: {ctx.read_only_reason}")
                else:
                    ctx.check_write(rel)
            elif rel is not None:
                ctx.check_read(rel, directory=False)
            if state is None:
                assert rel is not None
                state = await self._load_state(node, rel)
            keep_cache = node.kernel_version == state.version
            node.kernel_version = state.version
            handle = ctx.files.open(state, writable)
            if writable and flags & os.O_TRUNC and state.size:
                async with state.lock:
                    await state.truncate(0)
            if not writable:
                line.size = state.size
            return OpenResult(handle.fh, keep_cache)

    async def _load_state(self, node: Node, rel: str) -> FileState:
        ctx = self._ctx
        if node.chunks is None or node.chunks_version != node.attributes.version:
            manifest = await ctx.remote.manifest_get(ctx.server_path(rel))
            node.set_attributes(manifest.attributes)
            try:
                node.chunks = chunk_layout([(c.hash, c.size) for c in manifest.chunks])
            except ValueError as error:
                raise FSError(errno.EIO, f"bad chunk list for {rel!r}: {error}") from None
            node.chunks_version = manifest.attributes.version
        loaded = ctx.files.state(node.ino)  # another open finished first
        return loaded if loaded is not None else self._new_state(node)

    def _new_state(self, node: Node) -> FileState:
        ctx = self._ctx
        return FileState(
            node.ino,
            node.attributes.version,
            node.chunks or (),
            worker=ctx.worker,
            spill_dir=ctx.spill,
            memo=ctx.memo,
            now_ns=ctx.now_ns,
        )

    def _handle(self, fh: int) -> Handle:
        handle = self._ctx.files.handle(fh)
        if handle is None:
            raise FSError(errno.EBADF, f"no open file {fh}")
        return handle

    def _rel(self, handle: Handle) -> str | None:
        node = self._ctx.table.get(handle.state.ino)
        return self._ctx.table.path_of(node) if node is not None else None

    # Data

    async def read(self, fh: int, offset: int, length: int, caller: CallerProcess) -> bytes:
        """Up to C{length} bytes at C{offset} (fewer at the end of the file)."""
        ctx = self._ctx
        handle = self._handle(fh)
        rel = self._rel(handle)
        with ctx.audit.line(EventName.READ, rel or "", caller) as line:
            line.offset = offset
            if rel is not None:
                ctx.check_read(rel, directory=False)
            try:
                data = await handle.state.read(offset, length)
            except RemoteFailure as failure:
                raise FSError(errno.EIO, f"reading {rel!r}: {failure.message}") from None
            except FSError:
                raise
            except Exception:
                _log.failure("reading {path} failed", path=rel)
                raise FSError(errno.EIO, f"reading {rel!r} failed") from None
            line.size = len(data)
            return data

    async def write(self, fh: int, offset: int, data: bytes, caller: CallerProcess) -> int:
        """
        Write C{data} at C{offset} into the spill file; how many bytes.
        Not audited itself: the write-back's C{flush} line is.
        """
        ctx = self._ctx
        handle = self._handle(fh)
        if not handle.writable:
            raise FSError(errno.EBADF, f"file {fh} is not open for writing")
        if ctx.read_only_reason is not None:
            raise FSError(errno.EROFS, f"read-only: {ctx.read_only_reason}")
        rel = self._rel(handle)
        if rel is not None:
            ctx.check_write(rel)
        async with handle.state.lock:
            await handle.state.write(offset, data)
        return len(data)

    async def truncate(self, node: Node, size: int, caller: CallerProcess) -> None:
        """
        Truncate or extend regular file C{node}: in its open state if it
        is open (committed by its next write-back), else at once.
        """
        ctx = self._ctx
        state = ctx.files.state(node.ino)
        if state is not None:
            async with state.lock:
                await state.truncate(size)
            return
        if size == 0:
            async with ctx.namespace_lock:
                rel = ctx.rel_of(node)
                emptied = await self._namespace.write(
                    ctx.remote.setattr(
                        ctx.server_path(rel),
                        AttributeChanges(size=0),
                        session_id=ctx.write_session(),
                    )
                )
                node.set_attributes(emptied)
                node.chunks = ()
                node.chunks_version = emptied.version
            return
        handle = ctx.files.open(await self._load_state(node, ctx.rel_of(node)), writable=True)
        try:
            async with handle.state.lock:
                await handle.state.truncate(size)
        finally:
            await self.release(handle.fh, caller)

    # Write-back

    async def flush(self, fh: int, caller: CallerProcess) -> None:
        """Write back the file's changes, if any (C{close})."""
        await self.write_back(self._handle(fh).state, caller)

    async def fsync(self, fh: int, datasync: bool, caller: CallerProcess) -> None:
        """Write back the file's changes, if any."""
        await self.write_back(self._handle(fh).state, caller)

    async def release(self, fh: int, caller: CallerProcess) -> None:
        """
        Close handle C{fh}; the last one writes back what is left and then
        drops the spill file (changes that could not be committed are lost,
        with a warning).
        """
        ctx = self._ctx
        handle = ctx.files.release(fh)
        if handle is None:
            raise FSError(errno.EBADF, f"no open file {fh}")
        self._releasing += 1
        try:
            await self._release_state(handle.state, caller)
        finally:
            self._release_finished()

    async def _release_state(self, state: FileState, caller: CallerProcess) -> None:
        ctx = self._ctx
        if state.handles:
            return
        failure: FSError | None = None
        try:
            await self.write_back(state, caller)
        except FSError as error:
            failure = error
        if ctx.files.retire_if_idle(state):
            if state.dirty:
                _log.warn(
                    "discarding {size} bytes of uncommitted changes to inode {ino}",
                    size=state.size,
                    ino=state.ino,
                )
            done = state.close()
            node = ctx.table.get(state.ino)
            if node is not None:
                ctx.table.discard_if_unused(node)
            if done is not None:
                await done
        if failure is not None:
            raise failure

    async def write_back(self, state: FileState, caller: CallerProcess) -> None:
        """Commit C{state}'s changes; see the module docstring."""
        ctx = self._ctx
        async with state.lock:
            node = ctx.table.get(state.ino)
            rel = ctx.table.path_of(node) if node is not None else None
            if not state.dirty or node is None or rel is None:
                return  # nothing to commit, or no name to commit it at
            session = ctx.write_session()
            with ctx.audit.line(EventName.FLUSH, rel, caller, session_id=session) as line:
                ctx.check_write(rel)
                uploader = ChunkUploader(
                    ctx.remote,
                    session,
                    on_uploaded=self._uploaded,
                    batch_bytes=ctx.settings.batch_bytes,
                )
                try:
                    chunks = await rechunk(state.layout, state.read, ctx.worker, uploader)
                except RemoteFailure as failure:
                    raise ctx.write_failed(failure) from None
                if len(chunks) > MANIFEST_CHUNK_LIMIT:
                    raise FSError(errno.EFBIG, f"{len(chunks)} chunks exceed one manifest")
                line.size = state.size
                async with ctx.namespace_lock:
                    rel = ctx.table.path_of(node)
                    if rel is None:
                        return  # unlinked meanwhile
                    line.path = "/" + rel
                    request = CommitRequest(
                        path=ctx.server_path(rel),
                        expected_version=state.version,
                        base=state.layout.base,
                        chunks=chunks,
                        size=state.size,
                        mode=node.attributes.mode,
                        mtime_ns=state.mtime_ns if state.mtime_ns is not None else ctx.now_ns(),
                        uid=node.attributes.uid,
                        gid=node.attributes.gid,
                    )
                    try:
                        outcome = await commit(
                            ctx.remote,
                            request,
                            session_id=session,
                            uploader=uploader,
                            read=state.read,
                            max_retries=ctx.settings.max_cas_retries,
                        )
                    except RemoteFailure as failure:
                        raise ctx.write_failed(failure) from None
                    copy = None
                    if isinstance(outcome, Conflict):
                        copy = await self._save_copy(node, request, session)
                line.extra.update(
                    chunks_new=uploader.uploaded,
                    chunks_reused=max(0, len(chunks) - uploader.uploaded),
                    cas_retries=outcome.cas_retries,
                )
                if isinstance(outcome, Committed):
                    line.extra["version_new"] = outcome.version
                    await self._committed(node, state, request, outcome)
                    return
                self._conflicted(line.extra, rel, copy, outcome)
                if copy is not None:
                    await self._adopt(node, state, outcome)
                line.write(allowed=False)
                raise FSError(errno.ESTALE, f"{rel!r} was changed by another writer")

    def _uploaded(self, chunk_hash: str, data: bytes) -> None:
        self._ctx.memo.remember(chunk_hash, data)
        stored = self._ctx.chunks.put(chunk_hash, data)
        if isinstance(stored, Deferred):
            stored.addErrback(
                lambda failure: _log.failure(
                    "caching uploaded chunk {chunk} failed", failure, chunk=chunk_hash
                )
            )

    async def _committed(
        self, node: Node, state: FileState, request: CommitRequest, outcome: Committed
    ) -> None:
        node.set_attributes(
            attrs.evolve(
                node.attributes,
                size=request.size,
                version=outcome.version,
                mtime_ns=request.mtime_ns,
                ctime_ns=self._ctx.now_ns(),
            )
        )
        node.chunks = request.chunks
        node.chunks_version = outcome.version
        node.kernel_version = outcome.version  # the kernel cached what it wrote
        done = state.committed(outcome.version, request.chunks)
        if done is not None:
            await done

    def _conflicted(
        self, extra: dict[str, ExtraValue | None], rel: str, copy: str | None, conflict: Conflict
    ) -> None:
        if copy is not None:
            action = (
                f"the other writer's version stays at /{rel}; yours was saved as /{copy}: "
                f"compare them, merge into /{rel}, then delete the copy"
            )
        else:
            action = (
                f"the other writer's version stays at /{rel}; yours could not be saved as a "
                "copy and stays only in the open file: save it elsewhere before closing"
            )
        writer = conflict.last_writer
        extra.update(
            recovery_kind=conflict.kind,
            recovery_suggested_action=action,
            recovery_your_version=conflict.your_version,
            recovery_current_version=conflict.current_version,
            recovery_last_writer_agent_id=writer.agent_id,
            recovery_last_writer_session_id=writer.session_id,
            recovery_last_writer_at_unix_ms=writer.at_unix_ms,
        )

    async def _save_copy(
        self, node: Node, request: CommitRequest, session: str | None
    ) -> str | None:
        """Commit our content as a conflict copy beside the file (under the lock)."""
        ctx = self._ctx
        link = ctx.table.primary_name(node)
        if link is None:
            return None
        directory, name = link
        directory_rel = ctx.rel_of(directory)
        for attempt in range(CONFLICT_COPY_ATTEMPTS):
            copy_name = conflict_name(name, session, ctx.now(), attempt)
            copy_rel = join(directory_rel, copy_name)
            if not ctx.policy.check(copy_rel, write=True).allowed:
                return None
            try:
                await ctx.remote.manifest_put(
                    ctx.server_path(copy_rel),
                    expected_version=0,
                    chunks=entries(request.chunks),
                    size=request.size,
                    mode=request.mode,
                    mtime_ns=request.mtime_ns,
                    uid=request.uid,
                    gid=request.gid,
                    session_id=session,
                )
            except RemoteFailure as failure:
                if failure.wire in (WireErrno.ESTALE, WireErrno.EEXIST):
                    continue
                _log.warn(
                    "could not save conflict copy {path}: {error}", path=copy_rel, error=failure
                )
                return None
            try:
                found = await ctx.remote.head_file(ctx.server_path(copy_rel))
            except RemoteFailure:
                directory.complete = False
            else:
                ctx.table.learn(directory, copy_name, found)
            directory.stale = True
            return copy_rel
        return None

    async def _adopt(self, node: Node, state: FileState, conflict: Conflict) -> None:
        """After a conflict: the other writer's version becomes the file's content."""
        ctx = self._ctx
        current = conflict.current
        node.kernel_version = None
        if current is not None and current.attributes.kind is FileKind.FILE:
            base = chunk_layout([(c.hash, c.size) for c in current.chunks])
            node.set_attributes(current.attributes)
            node.chunks = base
            node.chunks_version = current.attributes.version
            done = state.committed(current.attributes.version, base)
        else:
            link = ctx.table.primary_name(node)
            if link is not None:
                directory, name = link
                ctx.table.unlink(directory, name)
                directory.complete = False
            done = state.committed(state.version, state.layout.base)
        ctx.invalidate(node.ino)
        if done is not None:
            await done
