"""
Writes into open files (``docs/specifications/mount-runtime.md`` section 1,
``mount-consistency.md`` section 2): a write goes to the file's spill (in
memory, or a spill file whose C{pwrite} runs on the FUSE thread), under the
file's lock, which a finished write leaves to the next one as a
L{WriteGrant} so later writes skip the reactor; a write that reaches past
the file's first cut starts or pokes its write-behind
(L{svc.mount.writeback.write_behind}). The rest of an open file's life is
L{svc.mount.ops.files}; its write-back, L{svc.mount.writeback.file_write_back}.
"""

from __future__ import annotations

import errno
from functools import partial

from twisted.internet.defer import Deferred, fail, succeed

from svc.audit.events import CallerProcess
from svc.chunking import MAX_CHUNK_SIZE
from svc.mount.core.errors import FSError
from svc.mount.core.file_size_limit import MAX_FILE_BYTES
from svc.mount.core.file_state import FileState
from svc.mount.core.fs_context import FSContext
from svc.mount.core.spill_writes import SpillWrite, WriteGrant
from svc.mount.writeback.file_write_back import WriteBack
from svc.mount.writeback.write_behind import WriteBehind


class FileWrites:
    """See the module docstring."""

    def __init__(self, context: FSContext, write_back: WriteBack) -> None:
        self._ctx = context
        self._write_back = write_back

    def offer_first_grant(self, state: FileState) -> None:
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
        either; L{svc.mount.remote.quota_room}), before taking the file's lock.
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
        handle = self._ctx.files.existing(fh)
        if not handle.writable:
            raise FSError(errno.EBADF, f"file {fh} is not open for writing")
        if ctx.read_only_reason is not None:
            raise FSError(errno.EROFS, f"read-only: {ctx.read_only_reason}")
        node = ctx.table.get(handle.state.ino)
        rel = ctx.table.path_of(node) if node is not None else None
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
        L{svc.mount.writeback.write_behind}.
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
            uploader = self._write_back.uploader(ctx.write_session())
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
