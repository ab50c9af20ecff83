"""
The file operations of the filesystem core: create, open, read, write,
truncate, flush, fsync, release, and the write-back that commits an open
file's changes (``docs/specifications/mount-consistency.md``).

Write-back runs on C{flush}, C{fsync} and the last C{release} of a dirty
file, holding the file's lock (writes to that file wait): the content is
re-chunked and its novel chunks uploaded (L{svc.mount.writeback}; a new
file's write-behind, L{svc.mount.write_behind}, started by its writes, has
usually cut and uploaded all but the tail already), then
committed with a compare-and-swap under the namespace lock
(L{svc.mount.commit}). A lost compare-and-swap that is not provably
compatible saves this mount's version as a conflict copy beside the file,
keeps the other writer's version at the path (L{svc.mount.conflicts}), and
fails the flush with ESTALE; the C{flush} audit line carries the
C{recovery_*} fields.

A file created in a complete directory is I{pending} (known to this mount
only) until its first write-back commits it with C{expected_version} 0, or
an operation that needs it on the data plane creates it first
(L{svc.mount.namespace.NamespaceOps.materialize}).
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path

import attrs
from twisted.internet.defer import Deferred, fail, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure

from svc.audit.events import NO_PROCESS, CallerProcess
from svc.audit.names import EventName
from svc.chunking import MAX_CHUNK_SIZE, chunk_hash
from svc.mount.attributes import AttributeChanges, Attributes, Entry, FileKind, OpenResult
from svc.mount.client_audit import AuditLine
from svc.mount.close_hand_off import HandOffs
from svc.mount.commit import (
    CommitRequest,
    Committed,
    Conflict,
    commit,
)
from svc.mount.conflicts import adopt, recovery_fields, save_copy
from svc.mount.errors import FSError, RemoteFailure
from svc.mount.extents import chunk_layout
from svc.mount.fs_context import FSContext, audit_name, decode_name, join
from svc.mount.inodes import Node
from svc.mount.kept_write_backs import KeptWriteBacks, Try
from svc.mount.namespace import NamespaceOps, new_mode, new_owner
from svc.mount.open_files import MAX_FILE_BYTES, FileState, Handle, SpillWrite, WriteGrant
from svc.mount.outbox.entries import Commit
from svc.mount.outbox.outbox import INLINE_HELD_BYTES
from svc.mount.outbox.recorded import commit_entry, new_chunk_bytes
from svc.mount.remote import MANIFEST_CHUNK_LIMIT
from svc.mount.unanswered import replay_rename, send_setattr, take_replay
from svc.mount.write_behind import WriteBehind
from svc.mount.writeback import ChunkUploader, rechunk

_log = Logger()

RELEASE_SWEEP_SECONDS = 0.05
"""How long after a FUSE thread released a clean file's last read-only
handle the reactor retires the states so left (together, one wake-up)."""


def _writable(flags: int) -> bool:
    return flags & os.O_ACCMODE != os.O_RDONLY


class FileOps:
    """See the module docstring."""

    def __init__(self, context: FSContext, namespace: NamespaceOps) -> None:
        self._ctx = context
        self._namespace = namespace
        # Closes that hand their commit off, and the write-backs nobody
        # waits for (theirs and releases'), which shutdown waits for.
        self._hand_offs = HandOffs(
            durable_close=context.settings.durable_close,
            quota=context.quota,
            connected=context.connected,
        )
        # Files whose last release could not reach the data plane.
        self._kept = KeptWriteBacks(context.clock)
        self._kept_copies: dict[int, tuple[Path, int]] = {}
        """Kept files' copies on the mount's disk: the path, and the layout's edits then."""
        # States whose last (read-only, clean) handle a FUSE thread released,
        # waiting for the reactor's sweep (release_here).
        self._released_guard = threading.Lock()
        self._released: list[FileState] = []
        self._sweep_due = False
        context.leases.on_yield(self._yield_file)

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

    def _yield_file(self, ino: int) -> Deferred[None]:
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

    def write_backs_settled(self) -> Deferred[None]:
        """
        Fires once no release's or handed-off close's write-back is running
        (at once when none is).
        """
        return self._hand_offs.settled()

    def reconnected(self) -> None:
        """A new data-plane connection is open: write back the kept files now."""
        self._kept.now()

    def last_write_backs(self) -> Deferred[None]:
        """
        Shutdown: the final attempt at every file kept through an outage
        (discarded, with a warning, when it fails too); fires once all ended.
        """
        return self._kept.last_round()

    @property
    def kept(self) -> int:
        """How many files are kept through an outage."""
        return len(self._kept)

    # Opening

    async def create(
        self, parent: int, name: bytes, mode: int, flags: int, caller: CallerProcess
    ) -> tuple[OpenResult, Entry]:
        """
        Create regular file C{name} in C{parent} and open it. Without
        C{O_EXCL}, a name that turns out to exist (the data plane has it,
        in a directory the mount has not listed whole: a create whose
        answer was lost with the connection, say) is opened instead, as
        the kernel would have opened it had its lookup found it.
        """
        try:
            return await self._create(parent, name, mode, flags, caller)
        except FSError as error:
            if error.errno != errno.EEXIST or flags & os.O_EXCL:
                raise
        entry = await self._namespace.lookup(parent, name, caller)
        return await self.open(entry.ino, flags, caller), entry

    async def _create(
        self, parent: int, name: bytes, mode: int, flags: int, caller: CallerProcess
    ) -> tuple[OpenResult, Entry]:
        ctx = self._ctx
        await self._namespace.settled_at(parent, name)
        # The name is free (checked below), so no commit in flight is about it.
        async with ctx.namespace_lock.beside_commits():
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
                if ctx.table.child(directory, decoded) is not None:
                    raise FSError(errno.EEXIST, f"{rel!r} exists")
                if directory.complete:
                    node = ctx.table.add_pending(
                        directory, decoded, self._new_file(mode, caller, directory)
                    )
                else:
                    node = await self._namespace.make_node(
                        directory, rel, decoded, FileKind.FILE, mode, 0, caller
                    )
        handle = ctx.files.open(self._new_state(node), _writable(flags))
        state = handle.state
        node.kernel_version = state.version
        ctx.table.looked_up(node)
        if handle.writable:
            self._offer_first_grant(state)
        return OpenResult(handle.fh, keep_cache=False), Entry(node.ino, ctx.attributes(node))

    def _offer_first_grant(self, state: FileState) -> None:
        """
        Leave a new file's first write a L{WriteGrant} into an in-memory
        spill, so it skips the reactor as later writes do (when the memory
        budget allows; otherwise the first write starts on the reactor).
        """
        if self._ctx.read_only_reason is not None or state.lock.locked:
            return
        if not state.ensure_memory_spill():
            return
        state.lock.acquire()  # free: taken at once
        grant = state.write_grant(self._ctx.table.generation, partial(self._after_write, state))
        if grant is None:
            state.lock.release()
            return
        state.offer_grant(grant)

    def _new_file(self, mode: int, caller: CallerProcess, directory: Node) -> Attributes:
        """The attributes of a pending file until its first commit."""
        now = self._ctx.now_ns()
        uid, gid = new_owner(caller, directory)
        return Attributes(
            server_inode=0,
            kind=FileKind.FILE,
            mode=new_mode(mode, directory, FileKind.FILE),
            uid=uid,
            gid=gid,
            size=0,
            mtime_ns=now,
            atime_ns=now,
            ctime_ns=now,
            version=0,
            nlink=1,
        )

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
            handle = ctx.files.open(state, writable)
            state = handle.state  # one opened meanwhile on a FUSE thread, perhaps
            if writable:
                self._ask_write_lease(node, rel, state, caller)
            keep_cache = node.kernel_version == state.version
            node.kernel_version = state.version
            if writable and flags & os.O_TRUNC and state.size:
                async with state.lock:
                    await state.truncate(0)
            if not writable:
                line.size = state.size
            return OpenResult(handle.fh, keep_cache)

    def known_open(self, ino: int, flags: int, caller: CallerProcess) -> OpenResult | None:
        """
        Any thread: what L{open} would answer with no I/O, when it would,
        with its audit line: a read-only open of a regular file that no
        handle has open, whose attributes are fresh and whose chunk list is
        cached for its version, at a path the policy lets it read. Otherwise
        L{None}, and the reactor answers (a write, a pending or stale file,
        a chunk list to fetch, an open state to share, a refusal to audit).
        Python's imports and compilers open many files only to read them.
        """
        ctx = self._ctx
        if _writable(flags) or flags & os.O_TRUNC:
            return None
        node = ctx.table.get(ino)
        if (
            node is None
            or node.kind is not FileKind.FILE
            or node.pending
            or node.stale
            or node.chunks is None
            or node.chunks_version != node.attributes.version
        ):
            return None
        rel = ctx.table.path_from_any_thread(node)
        if rel is None or not ctx.policy.check(rel, write=False).allowed:
            return None
        handle = ctx.files.open_unopened(ino, lambda: self._new_state(node))
        if handle is None:
            return None
        state = handle.state
        keep_cache = node.kernel_version == state.version
        node.kernel_version = state.version
        ctx.audit.simple(EventName.OPEN, rel, caller, size=state.size)
        return OpenResult(handle.fh, keep_cache)

    def _ask_write_lease(
        self, node: Node, rel: str | None, state: FileState, caller: CallerProcess
    ) -> None:
        """
        Ask for the write lease of a file opened for writing that exists on
        the data plane (L{svc.mount.write_leases}), not waiting for the
        answer: the grant goes out before any commit of the file on the
        connection, so the server decides it first. A refusal is audited
        C{lease_denied} and leaves the file uncached (its closes wait for
        their commits' answers). A request the lost connection took is no
        refusal: the file goes on without the lease (logged; the
        compare-and-swap guards its commits). Nothing is asked for a pending
        or unlinked file, or with leases turned off in the settings.
        """
        ctx = self._ctx
        if rel is None or node.pending or not ctx.settings.write_leases:
            return

        def answered(granted: bool | None) -> None:
            if granted is None:
                return
            state.uncached = not granted
            if not granted:
                ctx.audit.simple(EventName.LEASE_DENIED, rel, caller)

        ctx.leases.acquire(node.ino, ctx.server_path(rel)).addCallback(answered)

    async def _load_state(self, node: Node, rel: str) -> FileState:
        ctx = self._ctx
        if node.chunks is None or node.chunks_version != node.attributes.version:
            manifest = await ctx.remote.manifest_get(
                ctx.server_path(rel), inline_max=ctx.inline_reads.inline_max()
            )
            node.set_attributes(manifest.attributes)
            try:
                node.chunks = chunk_layout([(c.hash, c.size) for c in manifest.chunks])
            except ValueError as error:
                raise FSError(errno.EIO, f"bad chunk list for {rel!r}: {error}") from None
            node.chunks_version = manifest.attributes.version
            self._keep_inline(rel, manifest.inline)
        loaded = ctx.files.state(node.ino)  # another open finished first
        return loaded if loaded is not None else self._new_state(node)

    def _new_state(self, node: Node) -> FileState:
        ctx = self._ctx
        return FileState(
            node.ino,
            node.attributes.version,
            node.chunks or (),
            worker=ctx.spill_worker,
            spill_dir=ctx.spill,
            memo=ctx.memo,
            now_ns=ctx.now_ns,
            room=ctx.quota_room,
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
        started: int | SpillWrite = await self.start_write(fh, offset, data, caller)
        if isinstance(started, int):
            return started
        try:
            await self._ctx.spill_worker.submit(started.store)
        except BaseException:
            started.finish(False)
            raise
        started.finish(True)
        return len(data)

    def start_write(
        self, fh: int, offset: int, data: bytes, caller: CallerProcess
    ) -> Deferred[int | SpillWrite]:
        """
        L{write}, left for the caller to finish when the bytes go to a
        spill file: the returned L{SpillWrite} holds the file's lock until
        its C{finish} (on the reactor thread), and its C{store} may run on
        the caller's own thread (the FUSE thread that would otherwise wait
        for two more thread hand-offs). Bytes kept in memory are written at
        once: the count is returned.

        The common case (the lock free, the spill file already on disk)
        is answered synchronously, without a coroutine: this runs on the
        reactor thread for every 128 KiB the kernel sends.
        """
        try:
            state = self._writable_state(fh)
            if offset + len(data) > MAX_FILE_BYTES:
                raise FSError(errno.EFBIG, f"a file may hold at most {MAX_FILE_BYTES} bytes")
            if not state.fits_quota(offset, len(data)):
                return Deferred.fromCoroutine(self._start_write_near_quota(state, offset, data))
            if not state.lock.locked:
                pending = state.begin_spill_write(offset, data)
                if pending is not None:
                    state.lock.acquire()  # free: taken at once
                    return succeed(self._locked_write(state, pending))
        except FSError:
            return fail()
        return Deferred.fromCoroutine(self._start_write_waiting(state, offset, data))

    async def _start_write_near_quota(
        self, state: FileState, offset: int, data: bytes
    ) -> int | SpillWrite:
        """
        L{start_write} of a write the quota estimate has no room for: a
        fresh look at the server's usage first (C{EDQUOT} if it has none
        either; L{svc.mount.quota_room}), before taking the file's lock.
        """
        await self._ctx.quota_room.check(state.growth_of(offset, len(data)))
        return await self._start_write_waiting(state, offset, data)

    async def _start_write_waiting(
        self, state: FileState, offset: int, data: bytes
    ) -> int | SpillWrite:
        await state.lock.acquire()
        try:
            pending = await state.begin_write(offset, data)
        except BaseException:
            state.lock.release()
            raise
        if pending is None:  # stored in memory
            self._after_write(state, True)
            return len(data)
        return self._locked_write(state, pending)

    def _writable_state(self, fh: int) -> FileState:
        """The state of C{fh}, if a write to it is allowed now (else L{FSError})."""
        ctx = self._ctx
        handle = self._handle(fh)
        if not handle.writable:
            raise FSError(errno.EBADF, f"file {fh} is not open for writing")
        if ctx.read_only_reason is not None:
            raise FSError(errno.EROFS, f"read-only: {ctx.read_only_reason}")
        rel = self._rel(handle)
        if rel is not None:
            ctx.check_write(rel)
        return handle.state

    def _locked_write(self, state: FileState, pending: SpillWrite) -> SpillWrite:
        """C{pending}, whose finish also ends C{state}'s lock (held by the caller)."""

        def finish(stored: bool) -> None:
            try:
                pending.finish(stored)
            except BaseException:
                state.lock.release()
                raise
            self._after_write(state, stored)

        return SpillWrite(pending.store, finish)

    def _after_write(self, state: FileState, stored: bool) -> None:
        """
        On the reactor, holding C{state}'s lock, a write just ended: leave
        the lock to the file's next write as a L{WriteGrant} when it can
        take one (the write was stored, nobody waits for the lock, the
        mount is writable, the bytes are in a spill file), else release it.
        """
        if stored:
            self._write_behind(state)
            if not state.lock.waiting and self._ctx.read_only_reason is None:
                after = partial(self._after_write, state)
                grant = state.write_grant(self._ctx.table.generation, after)
                if grant is not None:
                    state.offer_grant(grant)
                    return
        state.lock.release()

    def take_write_grant(self, fh: int) -> WriteGrant | None:
        """
        Any thread: the grant left for the next write of C{fh}'s file, if
        any. Its C{usable} says whether this write may use it: C{fh} is open
        for writing, the mount is not read-only, and no path changed since
        the grant was made (the policy was checked for the file's path
        then). A grant taken must be used or given back on the reactor.
        """
        handle = self._ctx.files.handle(fh)
        if handle is None:
            return None
        grant = handle.state.take_grant()
        if grant is not None:
            grant.usable = (
                handle.writable
                and self._ctx.read_only_reason is None
                and grant.generation == self._ctx.table.generation
            )
        return grant

    def _write_behind(self, state: FileState) -> None:
        """
        Start or poke the write-behind of a file whose new bytes (a new
        file, or an append) reach past its first cut; see
        L{svc.mount.write_behind}.
        """
        ctx = self._ctx
        settings = ctx.settings
        if settings.write_behind_files <= 0 or ctx.read_only_reason is not None:
            return
        behind = state.write_behind
        if behind is None:
            layout, lead = state.layout, settings.write_behind_lead_bytes
            # The first cut starts at most one chunk before the clean limit.
            if state.size < layout.clean_limit + lead:
                return
            origin = layout.first_cut()
            if state.size < origin + MAX_CHUNK_SIZE + lead or layout.unchanged_beyond(origin):
                return  # not due yet, or an edit inside the file: unchanged bytes follow
            uploader = self._uploader(ctx.write_session())
            behind = state.write_behind = WriteBehind(
                state.read,
                lambda: state.size,
                ctx.worker,
                uploader,
                ctx.write_behind_slots,
                lead=lead,
                origin=origin,
                cut=state.release_pages,
            )
        behind.poke()

    def _uploader(
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
            on_uploaded=self._uploaded,
            batch_bytes=settings.batch_bytes,
            probe_min_bytes=settings.probe_min_bytes,
            inline_max_bytes=settings.inline_max_bytes if commits else 0,
            keep=keep,
        )

    async def truncate(self, node: Node, size: int, caller: CallerProcess) -> None:
        """
        Truncate or extend regular file C{node}: in its open state if it
        is open (committed by its next write-back), else at once.
        """
        ctx = self._ctx
        state = ctx.files.state(node.ino)
        if state is not None:
            # A handle of our own keeps the state registered while we wait
            # for its lock: the last handle's release may be writing it back
            # meanwhile (a close just handed off), and would otherwise
            # retire it with our change in it, uncommitted. Released last,
            # ours commits the change; with other handles open it stays for
            # their write-back, as before.
            handle = ctx.files.open(state, writable=True)
            try:
                async with handle.state.lock:
                    await handle.state.truncate(size)
            finally:
                await self.release(handle.fh, caller, keep=False)
            return
        if size == 0:
            async with ctx.namespace_lock:
                path = ctx.server_path(ctx.rel_of(node))
                emptied = await self._namespace.write(
                    send_setattr(
                        ctx,
                        path,
                        lambda: ctx.remote.setattr(
                            path, AttributeChanges(size=0), session_id=ctx.write_session()
                        ),
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
            await self.release(handle.fh, caller, keep=False)

    # Write-back

    def nothing_to_flush(self, fh: int) -> bool:
        """
        Any thread: whether a flush of C{fh} now would find nothing to
        commit now and nothing in progress, so the FUSE thread may answer it
        without the reactor: a clean file, not pending, or an empty one
        whose close waits (L{_empty_close_waits}); its lock free or held
        only for a write grant nobody has taken (no write or write-back
        running). A write that starts after this look is later than the
        close, whose flush it needs no more than any later write does. A
        flush with nothing to commit writes no audit line.
        """
        handle = self._ctx.files.handle(fh)
        if handle is None:
            return False  # the reactor answers EBADF
        if not handle.writable:
            return True  # a read-only handle's close commits nothing (flush)
        state = handle.state
        if state.lock.locked and not state.grant_offered:
            return False
        node = self._ctx.table.get(state.ino)
        if node is None:
            return False
        if not (state.dirty or node.pending):
            return True
        return self._empty_close_waits(state, node)

    def _empty_close_waits(self, state: FileState, node: Node) -> bool:
        """
        Whether a close leaves the commit of C{state}'s file to a later
        one: the file is empty now (new, or truncated to nothing) with no
        change of mode, owner or times kept, this is its only open handle,
        and closes may hand their commits off (no C{durable_close}, the
        mount writable, the data plane's connection open, the file not
        written uncached). The shell's C{>}
        (open, C{dup2}, close, write, close) and C{touch} then commit once,
        not twice, and readers of the data plane never see the file empty
        between its old content and its new. The handle's next close with
        content or a change, an C{fsync}, or its release commits it
        (``mount-consistency.md`` section 2.5, "An empty file's close").
        """
        return (
            state.size == 0
            and not state.attributes_changed
            and state.handles == 1
            and not state.uncached
            and node.kind is FileKind.FILE
            and self._hand_offs.may_return_early(read_only=self._ctx.read_only_reason is not None)
        )

    async def flush(self, fh: int, caller: CallerProcess) -> None:
        """
        Write back the file's changes, if any (C{close}). Returns once the
        commit is sent when L{HandOffs.allowed} says so, else once it is
        answered (``mount-consistency.md`` section 2.5). The close of a
        handle opened read-only commits nothing, as on NFS: the changes
        are its writers' to commit (at their close, or the last release),
        and their failure (C{EDQUOT}, say) is not the reader's.
        """
        ctx = self._ctx
        handle = self._handle(fh)
        if not handle.writable:
            return
        state = handle.state
        node = ctx.table.get(state.ino)
        due = state.dirty or (node is not None and node.pending)
        if due and node is not None and self._empty_close_waits(state, node):
            return
        if (
            due
            and not state.uncached
            and await self._hand_offs.allowed(
                state.size, read_only=ctx.read_only_reason is not None
            )
        ):
            await self._hand_offs.hand_off(
                state.ino, state.size, partial(self.write_back, state, caller)
            )
        else:
            await self.write_back(state, caller)

    async def fsync(self, fh: int, datasync: bool, caller: CallerProcess) -> None:
        """Write back the file's changes, if any."""
        await self.write_back(self._handle(fh).state, caller)

    def release_here(self, fh: int) -> bool | None:
        """
        Any thread: release read-only handle C{fh} without the reactor when
        nothing must happen at once (L{OpenFiles.release_reader}): its file
        keeps other handles, or it is clean and its state's release may come
        later. L{None}: not released (the reactor's L{release} must run).
        C{True}: released, and the caller must post L{sweep_released} to
        the reactor (the first state left for it since the last sweep);
        C{False}: released, nothing to post. States left are released
        together, L{RELEASE_SWEEP_SECONDS} after the first, by the same
        steps as a reactor release (``mount-runtime.md`` section 1).
        """
        state = self._ctx.files.release_reader(fh)
        if state is None:
            return None
        if state.handles:
            return False
        with self._released_guard:
            self._released.append(state)
            due, self._sweep_due = not self._sweep_due, True
        return due

    def sweep_released(self) -> None:
        """On the reactor: release the states L{release_here} left, a moment from now."""
        self._ctx.clock.callLater(RELEASE_SWEEP_SECONDS, self._sweep)

    def _sweep(self) -> None:
        with self._released_guard:
            states, self._released = self._released, []
            self._sweep_due = False
        for state in states:
            if state.handles:
                continue  # opened again meanwhile: its handles release it
            self._hand_offs.started()
            released = Deferred.fromCoroutine(
                self._release_state(state, NO_PROCESS, keep=True, try_first=self._ctx.connected())
            )
            released.addBoth(self._swept, state.ino)

    def _swept(self, result: object, ino: int) -> None:
        self._hand_offs.finished()
        if isinstance(result, Failure):
            _log.failure("release of inode {ino} failed", result, ino=ino)

    async def release(self, fh: int, caller: CallerProcess, *, keep: bool = True) -> None:
        """
        Close handle C{fh}; the last one writes back what is left and then
        drops the spill file. Changes that got no answer from the data plane
        are kept, and written back once it answers (C{keep}, L{_keep}); so
        are changes left at a release while the data plane's connection is
        down, without trying first (the close that left them has just
        waited for a connection in vain); changes that could not be
        committed otherwise are lost, with a warning.
        """
        await self._release(fh, caller, keep=keep, try_first=self._ctx.connected())

    async def _release(
        self,
        fh: int,
        caller: CallerProcess,
        *,
        keep: bool,
        write: bool = True,
        try_first: bool = True,
    ) -> bool:
        """L{release}; whether the file was kept (never without C{write}: no write-back)."""
        ctx = self._ctx
        handle = ctx.files.release(fh)
        if handle is None:
            raise FSError(errno.EBADF, f"no open file {fh}")
        self._hand_offs.started()
        try:
            return await self._release_state(
                handle.state, caller, keep=keep, write=write, try_first=try_first
            )
        finally:
            self._hand_offs.finished()

    async def abandon_create(self, fh: int, caller: CallerProcess) -> None:
        """
        A C{create} answered after the program was told C{EIO} (the bridge's
        timeout): nobody holds C{fh}. A new file that never reached the
        server, and that nobody else opened or wrote meanwhile, is forgotten
        (its name dropped), so the failed C{open} left nothing behind and a
        program trying again with C{O_EXCL} does not meet C{EEXIST}.
        Otherwise C{fh} is released as any handle.
        """
        ctx = self._ctx
        handle = ctx.files.handle(fh)
        if handle is not None:
            state = handle.state
            state.revoke_grant()  # the create's write grant holds the lock
            node = ctx.table.get(state.ino)
            if (
                node is not None
                and node.pending
                and state.handles == 1
                and not state.dirty
                and not state.lock.locked
            ):
                _log.info(
                    "file inode {ino} created after its call timed out is forgotten", ino=node.ino
                )
                for parent_ino, name in list(node.names):
                    parent = ctx.table.get(parent_ino)
                    if parent is not None:
                        ctx.table.unlink(parent, name)
        await self.release(fh, caller)

    async def _release_state(
        self,
        state: FileState,
        caller: CallerProcess,
        *,
        keep: bool,
        write: bool = True,
        try_first: bool = True,
    ) -> bool:
        """
        The release of a handle of C{state}: with no handle left, write it
        back (unless not C{write}), then let it go, or keep it (C{keep},
        L{_keeps}; at once, without writing back, when not C{try_first});
        whether it was kept.
        """
        ctx = self._ctx
        if state.handles:
            return False
        if write and keep and not try_first and self._may_keep(state):
            self._keep(state, caller, "the data plane's connection is down")
            return True
        failure: FSError | None = None
        try:
            while write:
                version = state.version
                await self.write_back(state, caller)
                # A change kept while that commit was in flight (a chmod
                # right after the close) is still to go: commit it before
                # letting the state go, as long as commits get through.
                if not state.dirty or state.handles or state.version == version:
                    break
        except FSError as error:
            if keep and self._keeps(state, error):
                self._keep(state, caller, error)
                return True
            failure = error
        if ctx.files.retire_if_idle(state):
            ctx.leases.release(state.ino)
            node = ctx.table.get(state.ino)
            discarded = state.dirty
            held = self._kept_copies.pop(state.ino, None)
            if discarded:
                await self._discarding(state, node, held)
            elif held is not None:
                await ctx.unsent.remove(held[0])  # written back: the copy is not needed
            if node is not None and node.pending:
                # Not worth another wait when the data plane was out of reach.
                await self._settle_pending(node, reach=write and not _out_of_reach(failure))
            done = state.close()
            if discarded:
                # The kernel cached the discarded size and pages (long
                # attribute timeouts, keep_cache): make it ask again; and
                # attributes kept for the write-back are the server's again.
                if node is not None:
                    node.kernel_version = None
                    if state.attributes_changed and not node.pending:
                        node.stale = True
                ctx.invalidate(state.ino)
            if node is not None:
                ctx.table.discard_if_unused(node)
            if done is not None:
                await done
        if failure is not None:
            raise failure
        return False

    async def _discarding(
        self, state: FileState, node: Node | None, held: tuple[Path, int] | None
    ) -> None:
        """
        C{state}'s changes are given up: its content is saved on the mount's
        disk first, when it still has a name (L{svc.mount.unsent}; the copy
        made while it was kept, C{held}, serves when the content has not
        changed since), and the warning says where.
        """
        ctx = self._ctx
        rel = ctx.table.path_of(node) if node is not None else None
        if held is not None and held[1] == state.layout.edits:
            saved: Path | None = held[0]
        elif rel is not None:
            saved = await ctx.unsent.save(rel, state.ino, state.size, state.read)
            if held is not None:
                if saved is None:
                    _log.warn(
                        "the copy of inode {ino} made while it was kept, older than the"
                        " changes given up, stays at {copy}",
                        ino=state.ino,
                        copy=str(held[0]),
                    )
                else:
                    await ctx.unsent.remove(held[0])
        else:
            saved = None
            if held is not None:
                await ctx.unsent.remove(held[0])  # unlinked: nobody can want it
        if saved is None and rel is None:
            # Unlinked: its changes go with it, as on any file system.
            _log.info(
                "dropping the uncommitted changes to unlinked inode {ino} ({size} bytes)",
                size=state.size,
                ino=state.ino,
            )
            return
        if saved is None:
            _log.warn(
                "discarding {size} bytes of uncommitted changes to inode {ino}",
                size=state.size,
                ino=state.ino,
            )
            return
        _log.warn(
            "discarding {size} bytes of uncommitted changes to {path} (inode {ino});"
            " the file as it stood is saved at {saved}",
            size=state.size,
            path=rel,
            ino=state.ino,
            saved=str(saved),
        )

    def _keeps(self, state: FileState, error: FSError) -> bool:
        """
        Whether a last release whose write-back failed with C{error} keeps
        the file for a later attempt: the data plane gave no answer (the
        connection could not be had, or was lost), and L{_may_keep}.
        """
        return _out_of_reach(error) and self._may_keep(state)

    def _may_keep(self, state: FileState) -> bool:
        """
        Whether C{state}'s file may be kept: it still has something to
        commit, the mount is writable, and L{KeptWriteBacks.room} says yes.
        """
        node = self._ctx.table.get(state.ino)
        return (
            node is not None
            and (state.dirty or node.pending)
            and self._ctx.read_only_reason is None
            and self._kept.room()
        )

    def _keep(self, state: FileState, caller: CallerProcess, error: object) -> None:
        """
        Keep C{state} open (a handle of the mount's own, so its state,
        spill file and write lease stay) and leave its write-back to
        L{KeptWriteBacks}: each attempt releases that handle again, which
        writes back and, failing the same way, keeps it again.
        """
        handle = self._ctx.files.open(state, writable=True)
        if state.ino not in self._kept:
            _log.warn(
                "could not write back inode {ino} ({error}): its {size} bytes are kept "
                "and written back once the data plane answers",
                ino=state.ino,
                error=error,
                size=state.size,
            )
        self._copy_kept(state)

        async def attempt(how: Try) -> bool:
            try:
                kept = await self._release(
                    handle.fh, caller, keep=how is Try.AGAIN, write=how is not Try.GIVE_UP
                )
            except FSError as failure:  # the changes discarded (and logged) by the release
                return not _out_of_reach(failure)
            return not kept and how is not Try.GIVE_UP

        self._kept.keep(state.ino, attempt)

    def _copy_kept(self, state: FileState) -> None:
        """
        A kept file lives in the mount's memory and spill files: keep a copy
        of its content on the mount's disk too (L{svc.mount.unsent}), so that
        a mount killed before the data plane answers loses nothing. Made
        again when the content changed since the last copy; removed once the
        file is written back (L{_release_state}).
        """
        ctx = self._ctx
        ino = state.ino
        held = self._kept_copies.get(ino)
        edits = state.layout.edits
        if held is not None and held[1] == edits:
            return
        node = ctx.table.get(ino)
        rel = ctx.table.path_of(node) if node is not None else None
        if rel is None:
            return

        async def copying() -> None:
            async with state.lock:
                if ctx.files.state(ino) is not state:
                    return  # retired meanwhile
                saved = await ctx.unsent.save(rel, ino, state.size, state.read)
            if saved is None:
                return
            if ctx.files.state(ino) is not state:
                await ctx.unsent.remove(saved)  # retired while it was being copied
                return
            previous = self._kept_copies.get(ino)
            self._kept_copies[ino] = (saved, edits)
            if previous is not None and previous[0] != saved:
                await ctx.unsent.remove(previous[0])

        Deferred.fromCoroutine(copying()).addErrback(
            lambda failure: _log.failure("copying kept inode {ino} failed", failure, ino=ino)
        )

    async def _settle_pending(self, node: Node, *, reach: bool) -> None:
        """
        The last handle of a file never committed closed with its write-back
        failed: its changes are discarded (as for any file), and it is
        created empty, as C{create} otherwise does; when even that cannot be
        done (read-only mode, the server refuses, not C{reach}: the data
        plane is not to be asked), its name is dropped.
        """
        ctx = self._ctx
        if ctx.read_only_reason is None and reach:
            try:
                async with ctx.namespace_lock:
                    await self._namespace.materialize(node)
            except FSError as error:
                _log.warn(
                    "could not create file inode {ino} empty either: {error}",
                    ino=node.ino,
                    error=error,
                )
            else:
                return
        table = ctx.table
        for parent_ino, name in list(node.names):
            parent = table.get(parent_ino)
            if parent is not None:
                _log.warn(
                    "file {name} (inode {ino}) was never committed: its name is dropped",
                    name=name,
                    ino=node.ino,
                )
                table.unlink(parent, name)
                parent.complete = False  # the name may be taken on the data plane
                ctx.invalidate_entry(parent_ino, name.encode("utf-8"))

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
        ctx = self._ctx
        async with state.lock:
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
                # A close returning once the commit is sent records it with its new chunks.
                added: dict[str, bytes | memoryview] | None = (
                    {} if on_sent is not None and ctx.outbox is not None else None
                )
                uploader = self._uploader(session, commits=True, keep=added)
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
        (L{svc.mount.namespace_lock}): operations that may touch this file
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
        async with ctx.namespace_lock.sending_commit():
            rel = ctx.table.path_of(node)
            if rel is None:
                return  # unlinked meanwhile
            replay = take_replay(ctx, node, state)
            line.path = "/" + (rel if replay is None else replay.via)
            request = CommitRequest(
                path=ctx.server_path(rel if replay is None else replay.via),
                expected_version=_expected_version(node, state),
                base=state.layout.base,
                chunks=chunks,
                size=state.size,
                mode=node.attributes.mode,
                mtime_ns=state.mtime_ns if state.mtime_ns is not None else ctx.now_ns(),
                uid=node.attributes.uid,
                gid=node.attributes.gid,
                atime_ns=state.atime_ns,
            )
            changes_sent = state.attribute_changes
            if outbox is not None and held is not None:
                record = partial(outbox.append, partial(commit_entry, request), held, send=False)
                if sum(map(len, held.values())) <= INLINE_HELD_BYTES:
                    recorded = record()  # one write(2) to the log: less than a worker's round trip
                else:
                    recorded = await ctx.spill_worker.submit(record)
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
        try:
            if on_sent is not None:
                on_sent()
            await self._answered(
                node, state, line, uploader, request, rel, sent_behind, answer, changes_sent
            )
            if replay is not None:
                await replay_rename(ctx, node, replay, line.caller, session)
        finally:
            state.commits_in_flight -= 1
            settled()
            if outbox is not None and recorded is not None:
                outbox.done(recorded)

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

    def _uploaded(self, chunk_hash: str, data: bytes | memoryview) -> None:
        """
        Keep a chunk just stored (uploaded, or read inline) for reads, and
        cache it on disk unless it is small enough to come inline with a
        C{manifest_get} (C{inline_read_bytes}): the next mount's first open
        of its file asks for the chunk list anyway, and gets such a chunk
        with it, so a disk copy would save nothing but cost every small
        file's close a cache file and an index row (``docs/decisions.md``,
        session 25).
        """
        self._ctx.memo.remember(chunk_hash, data)
        if len(data) <= self._ctx.settings.inline_read_bytes:
            return
        stored = self._ctx.chunks.put(chunk_hash, data)
        if isinstance(stored, Deferred):
            stored.addErrback(
                lambda failure: _log.failure(
                    "caching chunk {chunk} failed", failure, chunk=chunk_hash
                )
            )

    def _keep_inline(self, rel: str, carried: tuple[tuple[str, bytes], ...]) -> None:
        """
        The chunks a C{manifest_get} carried, for the reads that follow the
        open: each one not held already is checked here (BLAKE3 of at most
        C{inline_read_bytes}), then kept as an uploaded chunk is. Bytes that
        do not hash to their name are dropped with a warning: the read
        fetches that chunk. Whether they were held decides whether later
        opens ask (L{svc.mount.inline_reads.InlineReads}).
        """
        memo = self._ctx.memo
        for name, data in carried:
            held = memo.holds(name)
            self._ctx.inline_reads.came(held)
            if held:
                continue
            if chunk_hash(data) != name:
                _log.warn(
                    "chunk {chunk} of {path!r} came inline with other bytes; fetching it",
                    chunk=name,
                    path=rel,
                )
                continue
            self._uploaded(name, data)

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


def _out_of_reach(error: FSError | None) -> bool:
    """Whether C{error} says the data plane gave no answer (not a refusal)."""
    return isinstance(error, RemoteFailure) and error.wire is None


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
