"""
The open state of one inode (L{FileState}): its content and what a
write-back of it will commit.

All handles of one inode share one L{FileState} (POSIX: a write through one
descriptor is visible through every other; L{svc.mount.core.open_files.OpenFiles}
keeps one per inode). A L{FileState} holds the base version the file was
opened at (its chunk list), a L{svc.mount.core.extents.FileLayout} of local
changes, and the L{svc.mount.core.spill.SpillFile} holding the changed bytes.
Reads stitch base chunks and spill ranges
(L{svc.mount.core.file_reader.FileReader}); writes and truncations only touch
the spill file and the layout.

Writes, truncations and write-back hold the state's lock, so a write-back
sees one consistent content. Reads do not wait for it: they take a snapshot
of the layout and keep the spill file they read from alive
(L{svc.mount.core.spill.SpillHandle}) even if a write-back finishes meanwhile
and retires it. A write may be stored off the reactor thread, through a
L{svc.mount.core.spill_writes.SpillWrite} or a
L{svc.mount.core.spill_writes.WriteGrant} holding the lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from svc.chunking import ChunkRef
from svc.mount.chunks.chunk_memo import ChunkMemo
from svc.mount.core.extents import FileLayout
from svc.mount.core.file_reader import FileReader
from svc.mount.core.spill import MemorySpill, Spill, SpillDirectory, SpillFile, SpillHandle
from svc.mount.core.spill_writes import FileLock, SpillWrite, WriteGrant
from svc.mount.outbox.entries import Commit
from svc.mount.remote.quota_room import QuotaRoom
from svc.mount.writeback.write_behind import WriteBehind
from svc.worker import IWorker

_log = Logger()


class FileState:
    """
    The content of one open inode; see the module docstring.

    @ivar version: the base version (the compare-and-swap token of a flush).
    @ivar mtime_ns: the modification time to commit (set by writes and by
        C{setattr}), L{None} when unchanged since the base.
    @ivar atime_ns: the access time to commit (set by C{setattr}), L{None}
        when not changed since the base.
    @ivar attributes_changed: a C{setattr} of mode, owner or mtime was kept
        for the next write-back instead of being sent
        (L{svc.mount.ops.attribute_updates.AttributeUpdates.setattr}); that write-back
        commits even if the content is back to the base.
    @ivar attribute_changes: how many C{setattr}s were kept so far; a
        commit notes it when sent, so one kept while that commit was in
        flight (which it does not carry) is kept for the next
        (L{committed}).
    @ivar handles: open handles sharing this state.
    @ivar commits_in_flight: commits of this state sent and not yet
        answered (a closed file's handed-off commit); a rename of the file
        may go out behind it (``mount-consistency.md`` section 2.6).
    @ivar write_behind: the uploads running ahead of the write-back
        (L{svc.mount.writeback.write_behind}), if started; told of every change here.
    @ivar replaces_version: a new file's atomic save to replay by
        replacing: its next commit goes to its own name with this
        C{expected_version}, the version of the file its save replaced
        there. Set when neither the save's commit nor its rename over an
        existing file with no other link reached the server
        (``mount-consistency.md`` section 2.6).
    @ivar replay_via: a new file's atomic save to replay through its
        temporary name: its next commit goes to this C{(directory inode,
        name)}, and the file is then renamed to its own name. Set instead
        of C{replaces_version} when the file replaced had other links.
    @ivar uncached: the file's write lease was refused at an open for
        writing (another connection holds it): its closes wait for their
        commits' answers until a lease is held (``mount-consistency.md``
        section 6).
    @ivar recorded: an outbox entry recording the file's content, unsent
        or unanswered, that its next commit replaces (``mount-outbox.md``
        section 8): an empty close's, which left its commit to a later
        close or the release, or the last commit's when it got no answer,
        or a kept file's. Settled once a later commit is recorded, or a
        write-back ends with nothing left to commit, or the file never
        reaches the data plane, or its state is let go.
    @ivar recorded_at: the layout's C{edits} and L{attribute_changes} when
        L{recorded} was recorded (L{recorded_now}).
    """

    def __init__(
        self,
        ino: int,
        version: int,
        base: tuple[ChunkRef, ...],
        *,
        worker: IWorker,
        spill_dir: SpillDirectory,
        memo: ChunkMemo,
        now_ns: Callable[[], int],
        room: QuotaRoom | None = None,
    ) -> None:
        self.ino = ino
        self.version = version
        self.layout = FileLayout(base)
        self.mtime_ns: int | None = None
        self.atime_ns: int | None = None
        self.attributes_changed = False
        self.attribute_changes = 0
        self.handles = 0
        self.commits_in_flight = 0
        self.replaces_version: int | None = None
        self.replay_via: tuple[int, str] | None = None
        self.uncached = False
        self.recorded: Commit | None = None
        self.recorded_at: tuple[int, int] | None = None
        self.lock = FileLock()
        self.lock.contended = self.revoke_grant
        self._grant_guard = threading.Lock()
        self._grant: WriteGrant | None = None
        self._worker = worker
        self._spill_dir = spill_dir
        self._reader = FileReader(self.layout, memo, worker)
        self._now_ns = now_ns
        self._spill: SpillHandle | None = None
        self.write_behind: WriteBehind | None = None
        self._room = room
        self.grown = 0

    @property
    def dirty(self) -> bool:
        """Whether there is anything to write back: content or kept attributes."""
        return self.layout.dirty or self.attributes_changed

    @property
    def size(self) -> int:
        """The current size."""
        return self.layout.size

    @property
    def spill(self) -> Spill | None:
        """The current spill file, if any write created one."""
        return self._spill.spill if self._spill is not None else None

    # Reading

    def read(self, offset: int, length: int) -> Deferred[bytes]:
        """
        C{length} bytes at C{offset} (fewer at the end of the file) of the
        current content (L{FileReader.read}).
        """
        return self._reader.read(offset, length, self._spill)

    # Changing (callers hold C{lock})

    async def write(self, offset: int, data: bytes) -> None:
        """Store C{data} at C{offset} in the spill file (on the worker)."""
        pending = await self.begin_write(offset, data)
        if pending is None:
            return
        try:
            await self._worker.submit(pending.store)
        except BaseException:
            pending.finish(False)
            raise
        pending.finish(True)

    async def begin_write(self, offset: int, data: bytes) -> SpillWrite | None:
        """
        Start storing C{data} at C{offset}. Bytes kept in memory are stored
        at once (C{None}: done). Otherwise the returned L{SpillWrite} holds
        the spill file open; its C{store} may run on any thread but this
        one, and its C{finish} must follow here, before the lock is given
        back: only then do the bytes become part of the content.
        """
        if not data:
            return None
        spill = await self._spill_for(offset + len(data))
        if spill.in_memory:
            spill.write(offset, data)
            self._wrote(offset, data)
            return None
        pending = self.begin_spill_write(offset, data)
        assert pending is not None
        return pending

    def begin_spill_write(self, offset: int, data: bytes) -> SpillWrite | None:
        """
        L{begin_write} when it needs no waiting: the bytes go to the spill
        file the state already has on disk. C{None} otherwise (nothing
        done; use L{begin_write}).
        """
        held = self._hold_disk_spill() if data else None
        if held is None:
            return None
        handle, spill = held

        def finish(stored: bool) -> None:
            if stored:
                self._wrote(offset, data)
            self._release_spill(handle)

        return SpillWrite(partial(spill.write, offset, data), finish)

    def release_pages(self, end: int) -> None:
        """
        The content before C{end} was cut and sent ahead of the write-back
        (L{svc.mount.writeback.write_behind}): let the kernel write the spill file's
        pages for it to disk and free them (L{SpillFile.release_pages}).
        Best effort, on the worker.
        """
        held = self._hold_disk_spill()
        if held is None:
            return
        handle, spill = held

        def released(result: object) -> None:
            if isinstance(result, Failure):
                _log.failure("releasing spill pages", result)
            self._release_spill(handle)

        self._worker.submit(partial(spill.release_pages, end)).addBoth(released)

    def growth_of(self, offset: int, length: int) -> int:
        """
        How many bytes of growth (written beyond the committed size, not
        written before) a write of C{length} bytes at C{offset} would add
        (L{svc.mount.remote.quota_room}). Reads the layout: any thread, while
        the caller holds the lock or is the reactor.
        """
        start, end = max(offset, self.layout.base_size), offset + length
        return end - start - self._written_between(start, end) if end > start else 0

    def _written_between(self, start: int, end: int) -> int:
        """Bytes written since the last commit within C{[start, end)}."""
        return sum(high - low for low, high in self.layout.written.within(start, end))

    def fits_quota(self, offset: int, length: int) -> bool:
        """
        Whether a write of C{length} bytes at C{offset} fits the quota as
        the mount estimates it (L{svc.mount.remote.quota_room.QuotaRoom.fits}); any
        thread, as L{growth_of}.
        """
        room = self._room
        return room is None or room.fits(self.growth_of(offset, length))

    def _grow(self, delta: int) -> None:
        self.grown += delta
        if self._room is not None and delta:
            self._room.grew(delta)

    def _wrote(self, offset: int, data: bytes) -> None:
        self._grow(self.growth_of(offset, len(data)))
        self.layout.write(offset, len(data))
        self.mtime_ns = self._now_ns()
        if self.write_behind is not None:
            self.write_behind.touched(offset, offset + len(data))

    async def truncate(self, size: int) -> None:
        """Truncate or extend to C{size} (new bytes read as zeros)."""
        spill = self.spill
        if spill is not None and size < self.layout.size:
            if spill.in_memory:
                spill.truncate(size)
            else:
                await self._worker.submit(lambda: spill.truncate(size))
        if self.write_behind is not None and size < self.layout.size:
            self.write_behind.touched(size)
        self.layout.truncate(size)
        self.mtime_ns = self._now_ns()
        start = self.layout.base_size
        grown = self._written_between(start, size) if size > start else 0
        self._grow(grown - self.grown)

    async def _spill_for(self, end: int) -> Spill:
        """The spill to write bytes ending at C{end} into (moved to disk if needed)."""
        current = self._spill
        if current is None:
            memory = self._spill_dir.in_memory(end)
            if memory is not None:
                self._spill = SpillHandle(memory, self._worker)
                return memory
            disk = await self._worker.submit(lambda: self._spill_dir.create(self.ino))
            self._spill = SpillHandle(disk, self._worker)
            return disk
        spill = current.spill
        if not isinstance(spill, MemorySpill) or spill.fits(end):
            return spill
        # Outgrown: the bytes so far go to a spill file (reads of the memory
        # spill are never in flight: they complete at once).
        held = spill.contents()

        def moving() -> SpillFile:
            disk = self._spill_dir.create(self.ino)
            if held:
                disk.write(0, held)
            return disk

        disk = await self._worker.submit(moving)
        self._spill = SpillHandle(disk, self._worker)
        current.retire()
        return disk

    def keep_attributes(self, mtime_ns: int | None, atime_ns: int | None = None) -> None:
        """
        A C{setattr} of mode, owner or times (C{mtime_ns}, C{atime_ns},
        when it set them) is kept for the next write-back.
        """
        self.attributes_changed = True
        self.attribute_changes += 1
        if mtime_ns is not None:
            self.mtime_ns = mtime_ns
        if atime_ns is not None:
            self.atime_ns = atime_ns

    def changes_now(self) -> tuple[int, int]:
        """The layout's edits and the attribute changes so far (L{recorded_at})."""
        return (self.layout.edits, self.attribute_changes)

    @property
    def recorded_now(self) -> bool:
        """Whether L{recorded} records the file as it stands (nothing changed since)."""
        return self.recorded is not None and self.recorded_at == self.changes_now()

    def kept_since(self, changes_sent: int | None) -> bool:
        """
        Whether a C{setattr} was kept after a commit that noted
        L{attribute_changes} as C{changes_sent} was sent (L{None}: none
        noted).
        """
        return changes_sent is not None and self.attribute_changes != changes_sent

    def committed(
        self, version: int, base: tuple[ChunkRef, ...], changes_sent: int | None = None
    ) -> Deferred[None] | None:
        """
        The content was committed (or replaced) as C{version} with chunks
        C{base}: it is the new base, and the spill file is retired. A
        C{setattr} kept after the commit was sent (it noted
        L{attribute_changes} as C{changes_sent}) stays kept, with its mtime,
        for the next write-back.
        """
        kept = self.kept_since(changes_sent)
        self.version = version
        self.layout.reset(base)
        grown, self.grown = self.grown, 0
        if self._room is not None and grown:
            self._room.committed(grown)
        if not kept:
            self.mtime_ns = None
            self.atime_ns = None
        self.attributes_changed = kept
        self.write_behind = None
        return self._retire()

    # Write grants (see WriteGrant)

    def write_grant(self, generation: int, after: Callable[[bool], None]) -> WriteGrant | None:
        """
        A grant to store the next write straight into the spill (a file on
        disk, or memory), for a caller that holds the lock and hands it over
        (C{None} if there is no spill yet). C{after(stored)} runs on the
        reactor once the grant is used, holding the lock.
        """
        held = self._hold_spill()
        if held is None:
            return None
        handle, spill = held

        def used(offset: int, data: bytes, stored: bool) -> None:
            if stored:
                self._wrote(offset, data)
            self._release_spill(handle)
            after(stored)

        def given_back() -> None:
            self._release_spill(handle)
            self.lock.release()

        return WriteGrant(spill, generation, used, given_back, self.fits_quota)

    def offer_grant(self, grant: WriteGrant) -> None:
        """Leave C{grant} (holding the lock) for the next write (reactor thread)."""
        with self._grant_guard:
            assert self._grant is None, "one grant at a time"
            self._grant = grant

    @property
    def grant_offered(self) -> bool:
        """
        Any thread: whether a grant waits for the next write, untaken. The
        lock is then held for it alone: no write or write-back is running.
        """
        return self._grant is not None

    def take_grant(self) -> WriteGrant | None:
        """The grant left for the next write, if any, now the caller's (any thread)."""
        with self._grant_guard:
            grant, self._grant = self._grant, None
        return grant

    def revoke_grant(self) -> None:
        """Give back a grant nobody has taken, and so the lock (reactor thread)."""
        grant = self.take_grant()
        if grant is not None:
            grant.give_back()

    def ensure_memory_spill(self) -> bool:
        """
        Give a file with no spill yet an in-memory one, so its first write
        can take a grant (L{write_grant}); whether it has a spill now (the
        memory budget may be spent).
        """
        if self._spill is None:
            memory = self._spill_dir.in_memory(1)
            if memory is None:
                return False
            self._spill = SpillHandle(memory, self._worker)
        return True

    def _hold_spill(self) -> tuple[SpillHandle, Spill] | None:
        """The spill, kept until L{_release_spill}; C{None} if none."""
        handle = self._spill
        if handle is None:
            return None
        handle.acquire()
        return handle, handle.spill

    def _hold_disk_spill(self) -> tuple[SpillHandle, SpillFile] | None:
        """The spill file on disk, kept open until L{_release_spill}; C{None} if none."""
        handle = self._spill
        if handle is None or not isinstance(handle.spill, SpillFile):
            return None
        handle.acquire()
        return handle, handle.spill

    @staticmethod
    def _release_spill(handle: SpillHandle) -> None:
        removed = handle.release()
        if removed is not None:
            removed.addErrback(lambda failure: _log.failure("removing a spill file", failure))

    def close(self) -> Deferred[None] | None:
        """
        The last handle is gone: stop any write-behind, retire the spill
        file; growth not committed by now is dropped with it.
        """
        self.revoke_grant()
        self._grow(-self.grown)
        if self.write_behind is not None:
            self.write_behind.cancel()
            self.write_behind = None
        return self._retire()

    def _retire(self) -> Deferred[None] | None:
        spill, self._spill = self._spill, None
        return spill.retire() if spill is not None else None
