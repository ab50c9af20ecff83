"""
Open files: per-inode content state and per-open handles.

All handles of one inode share one L{FileState} (POSIX: a write through one
descriptor is visible through every other). A L{FileState} holds the base
version the file was opened at (its chunk list), a
L{svc.mount.extents.FileLayout} of local changes, and the
L{svc.mount.spill.SpillFile} holding the changed bytes. Reads stitch base
chunks (through L{ChunkMemo} and the injected chunk source) and spill
ranges; writes and truncations only touch the spill file and the layout.

Writes, truncations and write-back hold the state's lock, so a write-back
sees one consistent content. Reads do not wait for it: they take a snapshot
of the layout and keep the spill file they read from alive
(L{SpillHandle}) even if a write-back finishes meanwhile and retires it.
"""

from __future__ import annotations

import errno
import itertools
import threading
from collections import OrderedDict
from collections.abc import Callable
from functools import partial

from twisted.internet.defer import Deferred, DeferredLock, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure

from svc.buffer_pool import footprint
from svc.chunking import MAX_CHUNK_SIZE, ChunkRef
from svc.mount.errors import FSError
from svc.mount.extents import FileLayout, Source
from svc.mount.quota_room import QuotaRoom
from svc.mount.remote import MANIFEST_CHUNK_LIMIT, IChunkSource, gather
from svc.mount.spill import MemorySpill, SpillDirectory, SpillFile
from svc.mount.write_behind import WriteBehind
from svc.worker import IWorker

_log = Logger()

DEFAULT_MEMO_BYTES = 64 << 20
"""Chunk bytes kept in memory for reads (a few maximum-size chunks)."""

MAX_FILE_BYTES = MANIFEST_CHUNK_LIMIT * MAX_CHUNK_SIZE
"""
The largest file a commit could name (12000 chunks of at most 16 MiB:
187.5 GiB): a write or truncate beyond it fails C{EFBIG} at once, instead
of being accepted and then refused whole by the write-back.
"""

READ_AHEAD_BYTES = 16 << 20
"""
How far past a sequential read the chunks of the committed content are
fetched before they are asked for: one maximum-size chunk, about four
average ones, so the next chunk's C{chunk_get} overlaps reading this one.
"""


class ChunkMemo:
    """
    The most recently read chunks' bytes, least recently used dropped first
    beyond C{budget} bytes, so that many small reads of one chunk cost one
    fetch. Concurrent fetches of one chunk share one request.

    Read-ahead (L{prefetch}) may hold at most half the budget in chunks
    fetched ahead and not yet asked for (L{ahead_bytes}); past that,
    prefetches are skipped. Without the bound, readers that together read
    ahead more than the budget pushed each other's chunks out before they
    were read (the chunk a reader was in the middle of included), and
    every later read of such a chunk fetched all of it again: eight
    concurrent readers of cold 32 MiB files with two FUSE workers read each
    4 MiB chunk back from the disk cache about once per 128 KiB read.
    """

    def __init__(self, source: IChunkSource, budget: int = DEFAULT_MEMO_BYTES) -> None:
        self.source = source
        self._budget = budget
        self._held = 0
        self._chunks: OrderedDict[str, bytes | memoryview] = OrderedDict()
        self._pending: dict[str, list[Deferred[bytes | memoryview]]] = {}
        self._ahead: dict[str, int] = {}
        self.ahead_bytes = 0
        """Bytes of the chunks prefetched (on their way or held) and not yet asked for."""

    @property
    def ahead_budget(self) -> int:
        """The most L{ahead_bytes} a prefetch may bring about: half the budget."""
        return self._budget // 2

    def prefetch(self, chunk_hash: str, size: int) -> bool:
        """
        Start fetching C{chunk_hash} (of C{size} bytes) unless it is held
        or on its way, or the read-ahead allowance (L{ahead_budget}) has no
        room for it; a later L{get} shares the fetch. A failure is
        forgotten (the reader that needs the chunk fetches it again and
        sees the error). Whether the chunk is held or on its way now.
        """
        if chunk_hash in self._chunks or chunk_hash in self._pending:
            return True
        if self.ahead_bytes + size > self.ahead_budget:
            return False
        self._ahead[chunk_hash] = size
        self.ahead_bytes += size
        self._pending[chunk_hash] = []
        self.source.fetch(chunk_hash).addBoth(self._fetched, chunk_hash)
        return True

    def get(self, chunk_hash: str) -> Deferred[bytes | memoryview]:
        """The bytes of C{chunk_hash} (a view of C{bytes} if so remembered)."""
        self._arrived(chunk_hash)
        data = self._chunks.get(chunk_hash)
        if data is not None:
            self._chunks.move_to_end(chunk_hash)
            return succeed(data)
        waiter: Deferred[bytes | memoryview] = Deferred()
        waiters = self._pending.get(chunk_hash)
        if waiters is not None:
            waiters.append(waiter)
            return waiter
        self._pending[chunk_hash] = [waiter]
        self.source.fetch(chunk_hash).addBoth(self._fetched, chunk_hash)
        return waiter

    def _arrived(self, chunk_hash: str) -> None:
        """A chunk fetched ahead was asked for (or dropped): it no longer counts as ahead."""
        size = self._ahead.pop(chunk_hash, None)
        if size is not None:
            self.ahead_bytes -= size

    def _fetched(self, result: bytes | Failure, chunk_hash: str) -> None:
        waiters = self._pending.pop(chunk_hash, [])
        if isinstance(result, Failure):
            self._arrived(chunk_hash)
            for waiter in waiters:
                waiter.errback(result)
        else:
            self.remember(chunk_hash, result)
            if chunk_hash not in self._chunks:
                self._arrived(chunk_hash)  # not kept (larger than the budget)
            for waiter in waiters:
                waiter.callback(result)

    def holds(self, chunk_hash: str) -> bool:
        """Whether C{chunk_hash} is held here or in the source (no fetch needed, most likely)."""
        return chunk_hash in self._chunks or self.source.holds(chunk_hash)

    def remember(self, chunk_hash: str, data: bytes | memoryview) -> None:
        """
        Keep C{data} (also offered to the source, e.g. after an upload). A
        view must be of C{bytes}; it counts as the whole object it keeps
        alive.
        """
        size = footprint(data)
        if size > self._budget:
            return
        if chunk_hash in self._chunks:
            self._chunks.move_to_end(chunk_hash)
            return
        self._chunks[chunk_hash] = data
        self._held += size
        while self._held > self._budget:
            dropped_hash, dropped = self._chunks.popitem(last=False)
            self._held -= footprint(dropped)
            self._arrived(dropped_hash)


Spill = SpillFile | MemorySpill
"""Where an open file's written bytes are (on disk, or in memory for small files)."""


class SpillWrite:
    """
    Bytes on their way into a spill file (L{FileState.begin_write}):
    L{store} them on a thread that may block, then L{finish} on the
    reactor thread, saying whether they were stored.
    """

    def __init__(self, store: Callable[[], None], finish: Callable[[bool], None]) -> None:
        self._store = store
        self._finish: Callable[[bool], None] | None = finish

    def store(self) -> None:
        """C{pwrite} the bytes (blocking)."""
        self._store()

    def finish(self, stored: bool) -> None:
        """On the reactor thread, once: the bytes count only if C{stored}."""
        finish, self._finish = self._finish, None
        if finish is not None:
            finish(stored)


class FileLock(DeferredLock):
    """
    A L{FileState}'s lock, which says when someone has to wait for it
    (C{contended}), so that a L{WriteGrant} nobody is using gives it back.
    """

    def __init__(self) -> None:
        super().__init__()
        self.contended: Callable[[], object] = lambda: None

    def acquire(self) -> Deferred[FileLock]:
        acquired = super().acquire()
        if self.waiting:
            self.contended()
        return acquired


class WriteGrant:
    """
    The right to store the next write of a file straight into its spill
    (a file, or memory below its limit: L{accepts}), from a FUSE thread,
    without first asking the reactor. A grant holds the file's lock (and
    keeps its spill open) from the moment a stored write, or the create of
    a new file, hands it over until it is used or given back, so the
    reactor's view is the same as for a write in progress: flush, fsync,
    truncate, the write-back and other writes wait for it, and asking for
    the lock gives an unused grant back (L{FileLock}). Taking it is the
    only step off the reactor thread (L{FileState.take_grant}); C{usable}
    is set by the taker (L{svc.mount.files.FileOps.take_write_grant}).

    A taken grant must end in exactly one of L{finish} (after L{store})
    or L{give_back}, both on the reactor thread.
    """

    def __init__(
        self,
        spill: Spill,
        generation: int,
        used: Callable[[int, bytes, bool], None],
        give_back: Callable[[], None],
        fits: Callable[[int, int], bool] = lambda offset, length: True,
    ) -> None:
        self.generation = generation
        self.usable = False
        self._fits = fits
        self._spill = spill
        self._used = used
        self._give_back = give_back
        self._ended = False

    def accepts(self, offset: int, length: int) -> bool:
        """
        Whether a write of C{length} bytes at C{offset} can be stored with
        this grant: always in a spill file; in a memory spill, below its
        limit only (a larger one goes to the reactor, which moves the bytes
        to a spill file).
        """
        spill = self._spill
        if offset + length > MAX_FILE_BYTES or not self._fits(offset, length):
            return False  # the reactor refuses it, or looks again at the quota
        return not isinstance(spill, MemorySpill) or spill.fits(offset + length)

    def store(self, offset: int, data: bytes) -> None:
        """Store C{data} at C{offset} (a C{pwrite}, blocking; any thread)."""
        self._spill.write(offset, data)

    def finish(self, offset: int, data: bytes, stored: bool) -> None:
        """On the reactor: the write ended; its bytes count only if C{stored}."""
        if not self._ended:
            self._ended = True
            self._used(offset, data, stored)

    def give_back(self) -> None:
        """On the reactor: the grant was not used; the lock is released."""
        if not self._ended:
            self._ended = True
            self._give_back()


class SpillHandle:
    """
    A spill file shared by a L{FileState} and its in-flight reads: removed
    once retired and no read uses it.
    """

    def __init__(self, spill: Spill, worker: IWorker) -> None:
        self.spill = spill
        self._worker = worker
        self._users = 0
        self._retired = False

    def acquire(self) -> None:
        self._users += 1

    def release(self) -> Deferred[None] | None:
        self._users -= 1
        return self._maybe_remove()

    def retire(self) -> Deferred[None] | None:
        self._retired = True
        return self._maybe_remove()

    def _maybe_remove(self) -> Deferred[None] | None:
        if self._retired and self._users == 0:
            self._users = -1  # removed once
            if self.spill.in_memory:
                self.spill.remove()
                return None
            return self._worker.submit(self.spill.remove)
        return None


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
        (L{svc.mount.namespace.NamespaceOps.setattr}); that write-back
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
        (L{svc.mount.write_behind}), if started; told of every change here.
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
        self.lock = FileLock()
        self.lock.contended = self.revoke_grant
        self._grant_guard = threading.Lock()
        self._grant: WriteGrant | None = None
        self._worker = worker
        self._spill_dir = spill_dir
        self._memo = memo
        self._now_ns = now_ns
        self._spill: SpillHandle | None = None
        self._read_end: int | None = None
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
        current content.
        """
        segments = self.layout.segments(offset, length)
        if offset == self._read_end:
            self._read_ahead(offset + length)
        self._read_end = offset + length
        spill = self._spill
        reads: list[Deferred[bytes]] = []
        if spill is not None:
            spill.acquire()
        for segment in segments:
            if segment.source is Source.ORIGINAL:
                refs = self.layout.base_chunks(segment.start, segment.end)
                reads.append(self._read_original(refs, segment.start, segment.end))
            elif spill is None:
                reads.append(succeed(bytes(segment.length)))
            else:
                reads.append(self._read_spill(spill.spill, segment.start, segment.length))

        async def reading() -> bytes:
            try:
                return b"".join(await gather(reads))
            finally:
                if spill is not None:
                    done = spill.release()
                    if done is not None:
                        await done

        return Deferred.fromCoroutine(reading())

    def _read_ahead(self, end: int) -> None:
        """
        A sequential reader reached C{end}: start fetching the committed
        chunks of the next L{READ_AHEAD_BYTES} that it will read from the
        original content (not bytes written since the open), in order,
        while the memo's read-ahead allowance has room
        (L{ChunkMemo.prefetch}).
        """
        layout = self.layout
        for segment in layout.segments(end, READ_AHEAD_BYTES):
            if segment.source is Source.ORIGINAL:
                for ref in layout.base_chunks(segment.start, segment.end):
                    if not self._memo.prefetch(ref.hash, ref.length):
                        return

    def _read_spill(self, spill: Spill, offset: int, length: int) -> Deferred[bytes]:
        if spill.in_memory:
            return succeed(spill.read(offset, length))
        return self._worker.submit(lambda: spill.read(offset, length))

    def _read_original(self, refs: list[ChunkRef], start: int, end: int) -> Deferred[bytes]:
        fetches = [self._memo.get(ref.hash) for ref in refs]

        async def stitching() -> bytes:
            pieces = await gather(fetches)
            parts = []
            for ref, data in zip(refs, pieces, strict=True):
                low = max(start, ref.offset) - ref.offset
                high = min(end, ref.end) - ref.offset
                parts.append(data[low:high] if (low, high) != (0, len(data)) else data)
            return b"".join(parts)

        return Deferred.fromCoroutine(stitching())

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
        (L{svc.mount.write_behind}): let the kernel write the spill file's
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
        (L{svc.mount.quota_room}). Reads the layout: any thread, while
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
        the mount estimates it (L{svc.mount.quota_room.QuotaRoom.fits}); any
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


class Handle:
    """One open file handle: its inode, state, and whether it may write."""

    def __init__(self, fh: int, state: FileState, writable: bool) -> None:
        self.fh = fh
        self.state = state
        self.writable = writable


class OpenFiles:
    """
    File handles by number, and the shared L{FileState} of each inode.
    Changed from the reactor and, for a read-only open answered without it
    (L{open_unopened}), from a FUSE thread: every change holds a guard, so
    an inode never has two states.
    """

    def __init__(self) -> None:
        self._handles: dict[int, Handle] = {}
        self._states: dict[int, FileState] = {}
        self._numbers = itertools.count(1)
        self._guard = threading.Lock()

    def state(self, ino: int) -> FileState | None:
        """The open state of C{ino}, if any handle is open."""
        return self._states.get(ino)

    def open(self, state: FileState, writable: bool) -> Handle:
        """
        A new handle on C{state}, registered as C{state.ino}'s state, or on
        the state already registered for that inode (opened meanwhile on a
        FUSE thread): use the handle's C{state}.
        """
        with self._guard:
            return self._open_locked(self._states.get(state.ino, state), writable)

    def open_unopened(self, ino: int, new_state: Callable[[], FileState]) -> Handle | None:
        """
        Any thread: a read-only handle on a new state from C{new_state()},
        if C{ino} has no state yet; else L{None}.
        """
        with self._guard:
            if ino in self._states:
                return None
            return self._open_locked(new_state(), False)

    def _open_locked(self, state: FileState, writable: bool) -> Handle:
        self._states[state.ino] = state
        state.handles += 1
        handle = Handle(next(self._numbers), state, writable)
        self._handles[handle.fh] = handle
        return handle

    def handle(self, fh: int) -> Handle | None:
        """The handle C{fh}, if open."""
        return self._handles.get(fh)

    def existing(self, fh: int) -> Handle:
        """The handle C{fh}; L{FSError} C{EBADF} when it is not open."""
        handle = self._handles.get(fh)
        if handle is None:
            raise FSError(errno.EBADF, f"no open file {fh}")
        return handle

    def release(self, fh: int) -> Handle | None:
        """
        Forget handle C{fh} (its state's handle count drops; the state stays
        registered until L{retire_if_idle}).
        """
        with self._guard:
            handle = self._handles.pop(fh, None)
            if handle is not None:
                handle.state.handles -= 1
            return handle

    def release_reader(self, fh: int) -> FileState | None:
        """
        Any thread: forget read-only handle C{fh} when its release needs
        the reactor at once for nothing: another handle keeps its state,
        or it was the state's last handle and the state is clean (no change
        to commit, none in flight, no lock held, no spill), so retiring it
        may wait. The handle's state, its count lowered (the caller has the
        state retired on the reactor later if no handle is left); L{None},
        and nothing changed, otherwise (a writable handle, an unknown one,
        a state with something to do).
        """
        with self._guard:
            handle = self._handles.get(fh)
            if handle is None or handle.writable:
                return None
            state = handle.state
            last = state.handles == 1
            if last and (
                state.dirty
                or state.commits_in_flight
                or state.lock.locked
                or state.spill is not None
            ):
                return None
            del self._handles[fh]
            state.handles -= 1
            return state

    def retire_if_idle(self, state: FileState) -> bool:
        """Unregister C{state} if no handle uses it any more; whether it was."""
        with self._guard:
            if state.handles == 0 and self._states.get(state.ino) is state:
                del self._states[state.ino]
                return True
            return False

    def __len__(self) -> int:
        return len(self._handles)
