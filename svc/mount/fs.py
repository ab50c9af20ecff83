"""
The mount client's filesystem core: everything the FUSE bridge calls.

L{MountFS} runs on the reactor thread; every operation returns a
L{Deferred} (the bridge calls it from a FUSE thread with
C{blockingCallFromThread} and a timeout) and fails only with
L{svc.mount.core.errors.FSError}, whose C{errno} (local numbering) the bridge
raises as C{FUSEError}. Nothing here imports llfuse: inode numbers, modes
and flags are plain integers, names and symlink targets bytes.

The work is split by job: L{svc.mount.ops.namespace_reads} (lookups, attributes,
symlink targets), L{svc.mount.ops.attribute_updates} (C{setattr}),
L{svc.mount.ops.node_creation} (mkdir, symlink, mknod, link),
L{svc.mount.ops.removals} (unlink, rmdir), L{svc.mount.ops.renames},
L{svc.mount.ops.files} (open files, reads, writes), L{svc.mount.ops.file_closes}
(closes, releases), L{svc.mount.writeback.file_write_back} (the commit of a file's changes),
L{svc.mount.ops.directories} (directory listings), over shared
state in L{svc.mount.core.fs_context}. Design: ``docs/specifications/mount-fs.md``
and ``docs/specifications/mount-consistency.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from svc.audit.events import AuditEvent, CallerProcess
from svc.mount.core.attributes import (
    AttributeChanges,
    Attributes,
    DirEntry,
    Entry,
    FsStats,
    OpenResult,
    QuotaReport,
)
from svc.mount.core.fs_context import DEFAULT_SETTINGS, FSContext, FSSettings
from svc.mount.core.inodes import ROOT_INODE, Node
from svc.mount.core.spill_writes import SpillWrite, WriteGrant
from svc.mount.ops.attribute_updates import AttributeUpdates
from svc.mount.ops.directories import DEFAULT_READDIR_PAGE, DirectoryReader
from svc.mount.ops.file_closes import FileCloses
from svc.mount.ops.file_writes import FileWrites
from svc.mount.ops.files import FileOps
from svc.mount.ops.listings import Listings
from svc.mount.ops.namespace_reads import NamespaceReads
from svc.mount.ops.node_creation import NodeCreation
from svc.mount.ops.removals import Removals
from svc.mount.ops.renames import Renames
from svc.mount.outbox.outbox import Outbox
from svc.mount.remote.data_plane import IChunkSource, Remote
from svc.mount.remote.namespace_hand_off import NamespaceHandOffs
from svc.mount.remote.outside_changes import apply_outside_changes
from svc.mount.remote.quota_room import QuotaRoom
from svc.mount.remote.quota_source import quota_report
from svc.mount.writeback.close_hand_off import HandOffs
from svc.mount.writeback.file_records import FileRecords
from svc.mount.writeback.file_write_back import WriteBack
from svc.mount.writeback.kept_chunks import KeptChunks
from svc.policy import UNRESTRICTED, PathPolicy
from svc.timers import TimerClock
from svc.worker import IWorker

_log = Logger()

__all__ = ["ROOT_INODE", "FSSettings", "MountFS"]


class MountFS:
    """
    One mounted agent disk; see the module docstring. Call L{start} first.
    Every method taking a C{caller} uses it for the audit line (process
    name, pid, uid, gid) and, on creation, as the new node's owner.
    """

    def __init__(
        self,
        *,
        remote: Remote,
        chunks: IChunkSource,
        agent_id: str,
        session_id: str | None,
        spill_dir: Path,
        worker: IWorker,
        now: Callable[[], float],
        clock: TimerClock,
        emit: Callable[[AuditEvent], object],
        spill_worker: IWorker | None = None,
        policy: PathPolicy = UNRESTRICTED,
        quota: Callable[[], Deferred[QuotaReport]] | None = None,
        invalidate: Callable[[int], object] = lambda ino: None,
        invalidate_entry: Callable[[int, bytes], object] = lambda parent, name: None,
        forget_attributes: Callable[[int], object] = lambda ino: None,
        connected: Callable[[], bool] = lambda: True,
        settings: FSSettings = DEFAULT_SETTINGS,
        unsent_dir: Path | None = None,
        outbox: Outbox | None = None,
    ) -> None:
        """
        @param remote: the data-plane operations (L{svc.mount.remote.data_plane.Remote}).
        @param chunks: where chunk bytes come from (the chunk cache).
        @param agent_id: the disk is C{/<agent_id>} on the data plane.
        @param session_id: the mount lease's session id, sent with every write.
        @param spill_dir: a directory for spill files (emptied by L{start}).
        @param worker: runs blocking work (chunking, hashing).
        @param spill_worker: runs spill-file I/O (default: C{worker}). A
            worker of its own keeps an application's writes from queueing
            behind the write-behind's chunking and hashing.
        @param now: seconds since the epoch (C{reactor.seconds}).
        @param clock: schedules the refreshes of the files' write leases.
        @param emit: writes one audit line.
        @param quota: fires with the disk's grant and usage, for C{statfs}.
        @param invalidate: told the FUSE inode number whose content changed
            behind the kernel's page cache (after a write conflict).
        @param invalidate_entry: told a directory's FUSE inode number and a
            name that went away without a kernel request (a new file that
            could not be created), so the kernel forgets its entry.
        @param forget_attributes: told a FUSE inode number whose attributes
            changed after the kernel may have cached them (a commit answered
            after the C{close} that handed it off), so the kernel asks again.
        @param connected: whether the data plane's connection is open now (a
            C{close} does not hand its commit off while it is not).
        @param outbox: where a close that returns before its commit is
            answered records the commit first, so a killed mount's next run
            on the same cache sends it (L{svc.mount.outbox.replay}).
        """
        self._ctx = FSContext(
            remote=remote,
            chunks=chunks,
            agent_id=agent_id,
            session_id=session_id,
            spill_dir=spill_dir,
            worker=worker,
            spill_worker=spill_worker,
            now=now,
            clock=clock,
            emit=emit,
            policy=policy,
            quota=quota,
            invalidate=invalidate,
            invalidate_entry=invalidate_entry,
            forget_attributes=forget_attributes,
            connected=connected,
            settings=settings,
            unsent_dir=unsent_dir,
            outbox=outbox,
        )
        if outbox is not None:
            # While changes it sends again for lost answers get none, those
            # waiting for them fail at once (L{NamespaceLock.stalled}).
            outbox.on_held(self._ctx.namespace_lock.stalled)
            # A change sent again stays behind the commits sent beside it.
            outbox.on_resend(self._ctx.namespace_lock.commits_answered)
        kept = KeptChunks(self._ctx)
        listings = Listings(self._ctx, kept)
        self._reads = NamespaceReads(self._ctx, listings)
        self._creation = NodeCreation(self._ctx)
        self._attribute_updates = AttributeUpdates(self._ctx, self._creation, self._truncate)
        # Unlinks, rmdirs and renames that return once sent: one bound for all.
        namespace_hand_offs = NamespaceHandOffs(
            durable=self._ctx.settings.durable_close,
            connected=lambda: self._ctx.connected() and not (outbox is not None and outbox.holding),
        )
        self._removals = Removals(self._ctx, namespace_hand_offs)
        self._renames = Renames(self._ctx, self._creation, namespace_hand_offs)
        # Closes that hand their commit off, and the write-backs nobody
        # waits for (theirs and releases'), which shutdown waits for.
        hand_offs = HandOffs(
            durable_close=self._ctx.settings.durable_close, quota=quota, connected=connected
        )
        write_back = WriteBack(self._ctx, hand_offs, kept)
        self._closes = FileCloses(
            self._ctx, self._creation, hand_offs, write_back, FileRecords(self._ctx)
        )
        self._writes = FileWrites(self._ctx, write_back)
        self._files = FileOps(
            self._ctx,
            self._reads,
            self._creation,
            write_back,
            self._closes,
            self._writes,
            kept,
            listings,
        )
        self._directories = DirectoryReader(self._ctx, listings)
        if quota is not None:
            self._ctx.quota_room = QuotaRoom(
                lambda: remote.statfs().addCallback(quota_report), self.write_backs_settled
            )

    async def _truncate(self, node: Node, size: int, caller: CallerProcess) -> None:
        await self._files.truncate(node, size, caller)

    def start(self) -> Deferred[None]:
        """
        Remove leftover spill files, learn the disk root's attributes and
        (with a quota source) the disk's usage for write-time C{EDQUOT}.
        """

        async def starting() -> None:
            leftovers = await self._ctx.worker.submit(self._ctx.spill.sweep)
            if leftovers:
                _log.warn("removed {count} spill files of an earlier run", count=leftovers)
            self._ctx.started(await self._ctx.remote.head_file(self._ctx.disk))
            await self._ctx.quota_room.refresh()

        return Deferred.fromCoroutine(starting())

    # Mode

    def set_read_only(self, reason: str) -> None:
        """The mount lease is lost: every write fails with EROFS from now on."""
        self._ctx.set_read_only(reason)

    @property
    def read_only(self) -> str | None:
        """Why the mount is read-only, or L{None}."""
        return self._ctx.read_only_reason

    def set_session(self, session_id: str | None) -> None:
        """A new mount session (the lease was granted again)."""
        self._ctx.session_id = session_id

    def outside_changed(self, paths: Sequence[str], session_id: str | None) -> int:
        """
        Someone else changed C{paths} (server paths) on the data plane: drop
        what is cached for them (L{svc.mount.remote.outside_changes}); how many
        touched the cache.
        """
        return apply_outside_changes(self._ctx, paths, session_id)

    def lease_revoked(self, lease_id: str) -> None:
        """
        The data plane asks a file's write lease back: its changes are
        written back, then the lease is released (L{svc.mount.remote.write_leases}).
        """
        self._ctx.leases.revoked(lease_id)

    def reconnected(self) -> None:
        """
        A new data-plane connection replaced a lost one: the write leases
        are asked for again on it at once (L{svc.mount.remote.write_leases}), the
        changes whose answers were lost are sent again at once (the
        outbox's sender, L{svc.mount.outbox.sender}), and the files kept
        through the outage are written back right after the calls that
        waited for the connection are sent (L{svc.mount.writeback.kept_write_backs}).
        """
        self._ctx.leases.reconnected()
        if self._ctx.outbox is not None:
            self._ctx.outbox.reconnected()
        self._ctx.clock.callLater(0, self._closes.reconnected)

    def stopping(self) -> None:
        """
        Shutdown begins: changes the outbox's sender holds through an
        outage stop being waited for (their outbox entries stay for the
        next mount on the cache, unless answered first:
        L{svc.mount.outbox.outbox.Outbox.give_up_resends}), so
        L{write_backs_settled} is not held up by an outage.
        """
        if self._ctx.outbox is not None:
            self._ctx.outbox.give_up_resends("the mount is stopping")

    def last_write_backs(self) -> Deferred[None]:
        """
        Shutdown: the final attempt at the files kept through an outage;
        fires once all ended (the ones still failing are discarded, with a
        warning).
        """
        return self._closes.last_write_backs()

    @property
    def kept_files(self) -> int:
        """How many files are kept through an outage, waiting for the data plane."""
        return self._closes.kept

    def stop_leases(self) -> None:
        """Stop refreshing write leases (shutdown: closing the connection ends them)."""
        self._ctx.leases.close()

    @property
    def open_handles(self) -> int:
        """How many file handles are open."""
        return len(self._ctx.files)

    # Names and attributes

    def lookup(self, parent: int, name: bytes, caller: CallerProcess) -> Deferred[Entry]:
        """The entry of C{name} in directory C{parent}."""
        return Deferred.fromCoroutine(self._reads.lookup(parent, name, caller))

    def known_lookup(self, parent: int, name: bytes, caller: CallerProcess) -> Entry | None:
        """
        Any thread: C{lookup}'s answer when it can be given without the
        reactor (L{svc.mount.ops.namespace_reads.NamespaceReads.known_lookup}).
        """
        return self._reads.known_lookup(parent, name, caller)

    def known_open(self, ino: int, flags: int, caller: CallerProcess) -> OpenResult | None:
        """
        Any thread: C{open}'s answer when it can be given without the
        reactor (L{svc.mount.ops.files.FileOps.known_open}).
        """
        return self._files.known_open(ino, flags, caller)

    def known_attributes(self, ino: int) -> Attributes | None:
        """
        Any thread: C{ino}'s attributes when they can be answered without
        the reactor (L{svc.mount.ops.namespace_reads.NamespaceReads.known_attributes}).
        """
        return self._reads.known_attributes(ino)

    def getattr(self, ino: int, caller: CallerProcess) -> Deferred[Attributes]:
        """The attributes of C{ino}."""
        return Deferred.fromCoroutine(self._reads.getattr(ino, caller))

    def setattr(
        self, ino: int, changes: AttributeChanges, caller: CallerProcess
    ) -> Deferred[Attributes]:
        """Change attributes (mode, owner, size, times); the new attributes."""
        return Deferred.fromCoroutine(self._attribute_updates.setattr(ino, changes, caller))

    def forget(self, inodes: Sequence[tuple[int, int]]) -> None:
        """The kernel dropped C{count} lookups of each C{(ino, count)}."""
        self._reads.forget(inodes)

    def opendir(self, ino: int, caller: CallerProcess) -> Deferred[int]:
        """Open directory C{ino}; a directory handle."""
        return Deferred.fromCoroutine(self._directories.opendir(ino, caller))

    def readdir(
        self, fh: int, offset: int, caller: CallerProcess, limit: int = DEFAULT_READDIR_PAGE
    ) -> Sequence[DirEntry]:
        """Entries of open directory C{fh} from C{offset} (synchronous)."""
        return self._directories.readdir(fh, offset, caller, limit)

    def releasedir(self, fh: int) -> None:
        """Close directory handle C{fh}."""
        self._directories.releasedir(fh)

    def mkdir(self, parent: int, name: bytes, mode: int, caller: CallerProcess) -> Deferred[Entry]:
        """Create a directory."""
        return Deferred.fromCoroutine(self._creation.mkdir(parent, name, mode, caller))

    def rmdir(self, parent: int, name: bytes, caller: CallerProcess) -> Deferred[None]:
        """Remove an empty directory."""
        return Deferred.fromCoroutine(self._removals.rmdir(parent, name, caller))

    def unlink(self, parent: int, name: bytes, caller: CallerProcess) -> Deferred[None]:
        """Remove a non-directory name."""
        return Deferred.fromCoroutine(self._removals.unlink(parent, name, caller))

    def rename(
        self, parent: int, name: bytes, new_parent: int, new_name: bytes, caller: CallerProcess
    ) -> Deferred[None]:
        """Rename, replacing an existing target (an empty directory for a directory)."""
        return Deferred.fromCoroutine(
            self._renames.rename(parent, name, new_parent, new_name, caller)
        )

    def link(
        self, ino: int, new_parent: int, new_name: bytes, caller: CallerProcess
    ) -> Deferred[Entry]:
        """Add a hard link to C{ino}."""
        return Deferred.fromCoroutine(self._creation.link(ino, new_parent, new_name, caller))

    def symlink(
        self, parent: int, name: bytes, target: bytes, caller: CallerProcess
    ) -> Deferred[Entry]:
        """Create a symlink."""
        return Deferred.fromCoroutine(self._creation.symlink(parent, name, target, caller))

    def readlink(self, ino: int, caller: CallerProcess) -> Deferred[bytes]:
        """A symlink's target."""
        return Deferred.fromCoroutine(self._reads.readlink(ino, caller))

    def mknod(
        self, parent: int, name: bytes, mode: int, rdev: int, caller: CallerProcess
    ) -> Deferred[Entry]:
        """Create a regular file, FIFO, socket or device node (C{mode} has the type bits)."""
        return Deferred.fromCoroutine(self._creation.mknod(parent, name, mode, rdev, caller))

    def statfs(self, caller: CallerProcess) -> Deferred[FsStats]:
        """Capacity and usage (from the quota callable)."""

        async def stats() -> FsStats:
            quota = self._ctx.quota
            report = await quota() if quota is not None else QuotaReport(None, 0)
            return FsStats.from_quota(report)

        return Deferred.fromCoroutine(stats())

    # Files

    def create(
        self, parent: int, name: bytes, mode: int, flags: int, caller: CallerProcess
    ) -> Deferred[tuple[OpenResult, Entry]]:
        """Create and open a regular file."""
        return Deferred.fromCoroutine(self._files.create(parent, name, mode, flags, caller))

    def open(self, ino: int, flags: int, caller: CallerProcess) -> Deferred[OpenResult]:
        """Open a regular file (C{flags} as for C{open(2)})."""
        return Deferred.fromCoroutine(self._files.open(ino, flags, caller))

    def read(self, fh: int, offset: int, length: int, caller: CallerProcess) -> Deferred[bytes]:
        """Read from an open file."""
        return Deferred.fromCoroutine(self._files.read(fh, offset, length, caller))

    def write(self, fh: int, offset: int, data: bytes, caller: CallerProcess) -> Deferred[int]:
        """Write to an open file (kept locally until write-back)."""
        return Deferred.fromCoroutine(self._writes.write(fh, offset, data, caller))

    def start_write(
        self, fh: int, offset: int, data: bytes, caller: CallerProcess
    ) -> Deferred[int | SpillWrite]:
        """
        L{write}, with the C{pwrite} into a spill file left to the caller
        (L{svc.mount.ops.file_writes.FileWrites.start_write}).
        """
        return self._writes.start_write(fh, offset, data, caller)

    def take_write_grant(self, fh: int) -> WriteGrant | None:
        """
        Any thread: a grant to store the next write of C{fh} without the
        reactor (L{svc.mount.ops.file_writes.FileWrites.take_write_grant}).
        """
        return self._writes.take_write_grant(fh)

    def nothing_to_flush(self, fh: int) -> bool:
        """
        Any thread: a flush of C{fh} would do nothing now
        (L{svc.mount.ops.file_closes.FileCloses.nothing_to_flush}).
        """
        return self._closes.nothing_to_flush(fh)

    def flush(self, fh: int, caller: CallerProcess) -> Deferred[None]:
        """Write back (on every C{close} of a descriptor)."""
        return Deferred.fromCoroutine(self._closes.flush(fh, caller))

    def fsync(self, fh: int, datasync: bool, caller: CallerProcess) -> Deferred[None]:
        """Write back."""
        return Deferred.fromCoroutine(self._closes.fsync(fh, datasync, caller))

    def release_here(self, fh: int) -> bool | None:
        """
        Any thread: release read-only handle C{fh} without the reactor when
        nothing must happen at once; C{True} when L{sweep_released} must be
        posted to the reactor (L{svc.mount.ops.file_closes.FileCloses.release_here}).
        """
        return self._closes.release_here(fh)

    def sweep_released(self) -> None:
        """On the reactor: retire, soon, the states L{release_here} left."""
        self._closes.sweep_released()

    def release(self, fh: int, caller: CallerProcess) -> Deferred[None]:
        """Close a file handle (the last one writes back and drops the spill file)."""
        return Deferred.fromCoroutine(self._closes.release(fh, caller))

    def abandon_create(self, fh: int, caller: CallerProcess) -> Deferred[None]:
        """
        Release the handle of a C{create} the program was told had failed
        (answered after its timeout); a new file nobody else has is
        forgotten rather than created.
        """
        return Deferred.fromCoroutine(self._closes.abandon_create(fh, caller))

    def write_backs_settled(self) -> Deferred[None]:
        """
        Fires once no write-back a call stopped waiting for is still running
        (a release's, or a close's whose commit was sent) and no handed-off
        unlink is unanswered (for shutdown).
        """

        async def settling() -> None:
            await self._closes.write_backs_settled()
            await self._ctx.namespace_lock.hand_offs_settled()

        return Deferred.fromCoroutine(settling())
