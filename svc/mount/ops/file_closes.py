"""
Closing and releasing open files (``docs/specifications/mount-consistency.md``
section 2.5): C{flush} (a close) writes back, returning once the commit is
sent when L{svc.mount.writeback.close_hand_off.HandOffs} allows; C{fsync} writes back
and waits; the last release writes back what is left and lets the file's
state go, or keeps it through a data-plane outage
(L{svc.mount.writeback.kept_write_backs}), or gives its changes up, saving them under
the mount's C{unsent} directory first (L{svc.mount.ops.unsaved_changes}).
"""

from __future__ import annotations

import errno
import threading
from functools import partial

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from svc.audit.events import NO_PROCESS, CallerProcess
from svc.mount.core.attributes import FileKind
from svc.mount.core.errors import FSError, no_answer
from svc.mount.core.file_state import FileState
from svc.mount.core.fs_context import FSContext
from svc.mount.core.inodes import Node
from svc.mount.core.open_files import Handle
from svc.mount.ops.node_creation import NodeCreation
from svc.mount.ops.unsaved_changes import UnsavedChanges
from svc.mount.writeback.close_hand_off import HandOffs
from svc.mount.writeback.file_records import FileRecords
from svc.mount.writeback.file_write_back import WriteBack
from svc.mount.writeback.kept_write_backs import KeptWriteBacks, Try

_log = Logger()

RELEASE_SWEEP_SECONDS = 0.05
"""How long after a FUSE thread released a clean file's last read-only
handle the reactor retires the states so left (together, one wake-up)."""


class FileCloses:
    """See the module docstring."""

    def __init__(
        self,
        context: FSContext,
        creation: NodeCreation,
        hand_offs: HandOffs,
        write_back: WriteBack,
        records: FileRecords,
    ) -> None:
        self._ctx = context
        self._creation = creation
        self._hand_offs = hand_offs
        self._write_back = write_back
        self._records = records
        # Files whose last release could not reach the data plane.
        self._kept = KeptWriteBacks(context.clock)
        self._unsaved = UnsavedChanges(context, creation)
        # States whose last (read-only, clean) handle a FUSE thread released,
        # waiting for the reactor's sweep (release_here).
        self._released_guard = threading.Lock()
        self._released: list[FileState] = []
        self._sweep_due = False

    def _handle(self, fh: int) -> Handle:
        return self._ctx.files.existing(fh)

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
        # An empty close is recorded in the outbox (on the reactor) once.
        return self._empty_close_waits(state, node) and (
            self._ctx.outbox is None or state.recorded_now
        )

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
            self._records.record_empty(state)
            return
        if (
            due
            and not state.uncached
            and await self._hand_offs.allowed(
                state.size, read_only=ctx.read_only_reason is not None
            )
        ):
            await self._hand_offs.hand_off(
                state.ino, state.size, partial(self._write_back.write_back, state, caller)
            )
        else:
            await self._write_back.write_back(state, caller)

    async def fsync(self, fh: int, datasync: bool, caller: CallerProcess) -> None:
        """Write back the file's changes, if any."""
        await self._write_back.write_back(self._handle(fh).state, caller)

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
        last: bool = False,
    ) -> bool:
        """L{release}; whether the file was kept (never without C{write}: no write-back)."""
        ctx = self._ctx
        handle = ctx.files.release(fh)
        if handle is None:
            raise FSError(errno.EBADF, f"no open file {fh}")
        self._hand_offs.started()
        try:
            return await self._release_state(
                handle.state, caller, keep=keep, write=write, try_first=try_first, last=last
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
        last: bool = False,
    ) -> bool:
        """
        The release of a handle of C{state}: with no handle left, write it
        back (unless not C{write}), then let it go, or keep it (C{keep},
        L{_keeps}; at once, without writing back, when not C{try_first});
        whether it was kept. C{last}: shutdown's last attempt at a kept
        file; changes still not written back stay recorded in the outbox
        for the next mount on the cache when a record of them as they stand
        exists (L{_left_recorded}), else they are given up.
        """
        ctx = self._ctx
        if state.handles:
            return False
        if write and keep and not try_first and self._may_keep(state):
            await self._keep(state, caller, "the data plane's connection is down")
            return True
        failure: FSError | None = None
        try:
            while write:
                version = state.version
                await self._write_back.write_back(state, caller)
                # A change kept while that commit was in flight (a chmod
                # right after the close) is still to go: commit it before
                # letting the state go, as long as commits get through.
                if not state.dirty or state.handles or state.version == version:
                    break
        except FSError as error:
            if keep and self._keeps(state, error):
                await self._keep(state, caller, error)
                return True
            failure = error
        if ctx.files.retire_if_idle(state):
            # Written back, given up (and saved), left recorded for the next
            # mount, or never to reach the data plane.
            node = ctx.table.get(state.ino)
            left = last and self._left_recorded(state, node)
            if not left:
                self._records.settle(state, state.recorded)
            ctx.leases.release(state.ino)
            discarded = state.dirty
            await self._unsaved.let_go(state, node, discarded=discarded and not left)
            if node is not None and node.pending and not left:
                # Not worth another wait when the data plane was out of reach.
                await self._unsaved.settle_pending(node, reach=write and not no_answer(failure))
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

    def _left_recorded(self, state: FileState, node: Node | None) -> bool:
        """
        Shutdown: whether C{state}'s changes, not written back, stay in the
        outbox for the next mount on the cache (its record holds the file as
        it stands), said in the log.
        """
        if not (state.recorded_now and (state.dirty or (node is not None and node.pending))):
            return False
        path = None if node is None else self._ctx.table.path_of(node)
        _log.warn(
            "could not write back {path} (inode {ino}) before stopping: its {size} bytes"
            " stay in the outbox, and the next mount on this cache sends them",
            path=path,
            ino=state.ino,
            size=state.size,
        )
        return True

    def _keeps(self, state: FileState, error: FSError) -> bool:
        """
        Whether a last release whose write-back failed with C{error} keeps
        the file for a later attempt: the data plane gave no answer (the
        connection could not be had, or was lost), and L{_may_keep}.
        """
        return no_answer(error) and self._may_keep(state)

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

    async def _keep(self, state: FileState, caller: CallerProcess, error: object) -> None:
        """
        Keep C{state} open (a handle of the mount's own, so its state,
        spill file and write lease stay), record its content in the outbox
        unless a record of it as it stands exists (L{FileRecords.record_kept}:
        a mount killed meanwhile leaves it to the next one on the cache), and
        leave its write-back to L{KeptWriteBacks}: each attempt releases that
        handle again, which writes back and, failing the same way, keeps it
        again.
        """
        handle = self._ctx.files.open(state, writable=True)
        first = state.ino not in self._kept

        async def attempt(how: Try) -> bool:
            try:
                kept = await self._release(
                    handle.fh,
                    caller,
                    keep=how is Try.AGAIN,
                    write=how is not Try.GIVE_UP,
                    last=how is not Try.AGAIN,
                )
            except FSError as failure:  # the changes discarded (and logged) by the release
                return not no_answer(failure)
            return not kept and how is not Try.GIVE_UP

        self._kept.keep(state.ino, attempt)
        # An attempt waits for the file's lock, which the record holds.
        await self._records.record_kept(state)
        if first:
            _log.warn(
                "could not write back inode {ino} ({error}): its {size} bytes are kept "
                "and written back once the data plane answers",
                ino=state.ino,
                error=error,
                size=state.size,
            )
