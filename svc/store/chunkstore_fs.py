"""
The chunk store on a local filesystem, in the spec's layout::

    <objects_dir>/<2 hex>/<hash>

Every blocking call runs on the injected L{IWorker}; a put fires only once
the chunk's bytes and its directory entry are on stable storage. The format,
the durability sequence, recovery at open and the accounting are specified
in C{docs/specifications/chunk-store.md}; this module is one implementation
of it.

One process owns an objects directory at a time: L{FilesystemChunkStore.open}
removes every temporary file it finds, and the running byte total is only
exact while this process is the only writer.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import attrs
from twisted.internet.defer import Deferred, fail, succeed
from twisted.logger import Logger

from svc.buffer_pool import BufferPool, is_immutable
from svc.direct_io import ALIGNMENT, DirectReader, DirectWriter
from svc.durable import fsync_directory
from svc.store.chunks import (
    MAX_CHUNK_SIZE,
    ChunkData,
    ChunkDeleteFailure,
    ChunkDeleteResult,
    ChunkHashMismatch,
    ChunkHasResult,
    ChunkInfo,
    ChunkPutResult,
    CorruptStoredChunk,
    check_chunk_hash,
    check_chunk_hashes,
    chunk_bytes_view,
    chunk_hash,
)
from svc.store.errors import NotFound, QuotaExceeded, StorageFull, StorageIOError, StoreError
from svc.store.layout import SHARD_HEX_LENGTH, is_chunk_hash, is_shard_name
from svc.worker import IWorker

A = TypeVar("A")
T = TypeVar("T")

TEMP_PREFIX = ".tmp."
"""Temporary files are C{<shard>/.tmp.<hash>.<16 hex>}; removed at open."""

QUARANTINE_DIR_NAME = "quarantine"
"""Chunks that failed verification are moved to C{<objects_dir>/quarantine/}."""

FILE_MODE = 0o600
DIR_MODE = 0o700

READ_BUFFERS = 8
"""Idle read buffers a store keeps by default: two per I/O thread of a busy server."""


def read_buffer_pool(keep: int = READ_BUFFERS) -> BufferPool:
    """
    A pool of chunk read buffers (one byte past the largest chunk, rounded
    to a block, shows a file that is too long), to share between the
    stores of one process: each idle buffer holds the pages of the largest
    chunk it read, so one pool per store would keep up to C{keep} of them
    per tenant. Trim it now and then (L{BufferPool.trim}).
    """
    return BufferPool(MAX_CHUNK_SIZE + ALIGNMENT, keep=keep)


_OPEN_FLAGS_READ = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW
_OPEN_FLAGS_TEMP = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW


@attrs.frozen
class OpenReport:
    """
    What L{FilesystemChunkStore.open} found: the chunks it counted, the
    temporary files left by an interrupted put that it removed, and the
    entries it did not recognise (left alone, not counted).
    """

    chunk_count: int
    total_bytes: int
    removed_temp_files: int
    ignored_entries: int


def _fsync_dir(path: str) -> None:
    fsync_directory(path)


def _make_dirs(path: str) -> None:
    """
    Create C{path} and any missing ancestors with L{DIR_MODE}, making each
    new entry durable in its parent.
    """
    missing: list[str] = []
    current = path
    while not os.path.isdir(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, DIR_MODE)
        except FileExistsError:
            if not os.path.isdir(directory):
                raise
        _fsync_dir(os.path.dirname(directory))


def _file_stat(path: str) -> os.stat_result | None:
    """
    C{lstat} of C{path} if it is a regular file; L{None} for anything else
    (absent, a symlink, a directory), none of which is a chunk.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def _names_in(directory: str) -> list[str]:
    try:
        return os.listdir(directory)
    except FileNotFoundError:
        return []


def _store_error(err: OSError) -> StoreError:
    if err.errno == errno.EDQUOT:
        return QuotaExceeded(f"disk quota exceeded: {err.strerror}")
    if err.errno == errno.ENOSPC:
        return StorageFull(f"no space left on the chunk store's device: {err.strerror}")
    return StorageIOError(f"chunk store I/O error: {err.strerror}")


class FilesystemChunkStore:
    """
    An L{svc.store.chunks.IChunkStore} over one C{objects} directory.

    Build it with the directory and a worker (a
    L{svc.worker.ThreadWorker} with 1 to 4 threads in production, an
    C{ImmediateWorker} in tests), then call L{open} once and wait for it
    before any other method. Several worker threads may run operations at
    once: a lock makes each chunk's final-name transition (rename, touch,
    unlink, quarantine) and the running total change together.
    """

    log = Logger()

    def __init__(
        self,
        objects_dir: Path,
        worker: IWorker,
        *,
        writer: DirectWriter | None = None,
        reader: DirectReader | None = None,
        read_buffers: int | BufferPool = READ_BUFFERS,
    ) -> None:
        """
        @param writer: how chunk files are written; by default with
            C{O_DIRECT} where the filesystem allows it (L{svc.direct_io}).
        @param reader: how they are read, likewise.
        @param read_buffers: the pool chunks are read into
            (L{read_buffer_pool}, shared), or how many idle buffers a pool
            of this store's own keeps.
        """
        self._dir = os.path.abspath(os.fspath(objects_dir))
        self._worker = worker
        self._writer = DirectWriter() if writer is None else writer
        self._reader = DirectReader() if reader is None else reader
        self._read_buffers = (
            read_buffers if isinstance(read_buffers, BufferPool) else read_buffer_pool(read_buffers)
        )
        self._lock = threading.Lock()
        self._total = 0
        self._durable_shards: set[str] = set()
        self._opened = False

    @property
    def objects_dir(self) -> Path:
        """
        The directory this store owns.
        """
        return Path(self._dir)

    def _submit(self, checked: Callable[[], A], blocking: Callable[[A], T]) -> Deferred[T]:
        """
        Validate the arguments on the calling thread (C{checked}), then run
        C{blocking} on the worker with OS errors translated.
        """
        if not self._opened:
            return fail(RuntimeError("FilesystemChunkStore used before open() fired"))
        try:
            arguments = checked()
        except StoreError:
            return fail()
        return self._worker.submit(lambda: self._translated(lambda: blocking(arguments)))

    def _translated(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except StoreError:
            raise
        except OSError as err:
            self.log.error(
                "Chunk store {objects_dir} I/O error: {error}", objects_dir=self._dir, error=err
            )
            raise _store_error(err) from err

    def _final_path(self, name: str) -> str:
        return os.path.join(self._dir, name[:SHARD_HEX_LENGTH], name)

    def open(self) -> Deferred[OpenReport]:
        """
        Create the directory if needed, remove leftover temporary files and
        count the stored chunks (the only full scan this store makes).
        """
        return self._worker.submit(self._open_blocking)

    def _open_blocking(self) -> OpenReport:
        _make_dirs(self._dir)
        found = {"chunks": 0, "bytes": 0, "removed": 0, "ignored": 0}
        shards: set[str] = set()
        with os.scandir(self._dir) as entries:
            for entry in entries:
                if is_shard_name(entry.name) and entry.is_dir(follow_symlinks=False):
                    shards.add(entry.name)
                    self._scan_shard_at_open(entry.name, found)
                elif entry.name != QUARANTINE_DIR_NAME or not entry.is_dir(follow_symlinks=False):
                    found["ignored"] += 1
        # One fsync of the objects directory makes every existing shard
        # entry durable, whoever created it.
        _fsync_dir(self._dir)
        with self._lock:
            self._total = found["bytes"]
            self._durable_shards = shards
            self._opened = True
        self.log.info(
            "Opened chunk store {objects_dir}: {chunks} chunks, {bytes} bytes, "
            "{removed} temporary files removed, {ignored} unrecognised entries",
            objects_dir=self._dir,
            **found,
        )
        return OpenReport(
            chunk_count=found["chunks"],
            total_bytes=found["bytes"],
            removed_temp_files=found["removed"],
            ignored_entries=found["ignored"],
        )

    def _scan_shard_at_open(self, shard: str, found: dict[str, int]) -> None:
        with os.scandir(os.path.join(self._dir, shard)) as entries:
            for entry in entries:
                name = entry.name
                if name.startswith(TEMP_PREFIX) and not entry.is_dir(follow_symlinks=False):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
                        found["removed"] += 1
                elif (
                    is_chunk_hash(name)
                    and name[:2] == shard
                    and entry.is_file(follow_symlinks=False)
                ):
                    found["chunks"] += 1
                    found["bytes"] += entry.stat(follow_symlinks=False).st_size
                else:
                    found["ignored"] += 1

    def put(self, chunk_hash: str, data: bytes | memoryview) -> Deferred[ChunkPutResult]:
        """
        See L{svc.store.chunks.IChunkStore.put}. Bytes that could change
        (not backed by C{bytes} nor a read-only view of a lent buffer,
        L{svc.buffer_pool.is_immutable}) are copied first, so the worker
        thread never reads a buffer the caller may change.
        """

        def checked() -> tuple[str, memoryview]:
            name, view = check_chunk_hash(chunk_hash), chunk_bytes_view(data)
            return name, view if is_immutable(view) else memoryview(view.tobytes())

        return self._submit(checked, self._put_blocking)

    def _put_blocking(self, arguments: tuple[str, memoryview]) -> ChunkPutResult:
        name, view = arguments
        actual = chunk_hash(view)
        if actual != name:
            raise ChunkHashMismatch(name, actual)
        size = view.nbytes
        shard = name[:SHARD_HEX_LENGTH]
        shard_dir = os.path.join(self._dir, shard)
        final = os.path.join(shard_dir, name)
        self._ensure_shard(shard)
        with self._lock:
            deduped = self._touch_intact_locked(final, size, _file_stat(final))
        if not deduped:
            temp = self._write_temp(shard_dir, name, view)
            try:
                deduped = self._install(temp, final, size)
            except BaseException:
                self._unlink_quietly(temp)
                raise
            if deduped:
                self._unlink_quietly(temp)
        # Fresh: makes the rename durable. Deduped: the entry may have been
        # renamed by a put that has not reached this fsync yet, or by a
        # process that crashed before it; either way it is durable now.
        _fsync_dir(shard_dir)
        return ChunkPutResult(hash=name, size=size, deduped=deduped)

    def _ensure_shard(self, shard: str) -> None:
        if shard in self._durable_shards:
            return
        try:
            os.mkdir(os.path.join(self._dir, shard), DIR_MODE)
        except FileExistsError:
            pass
        _fsync_dir(self._dir)
        self._durable_shards.add(shard)

    @staticmethod
    def _touch_intact_locked(final: str, size: int, st: os.stat_result | None) -> bool:
        """
        If C{st} shows an intact copy (a regular file of the right size),
        refresh its mtime and say so. The caller holds the lock.
        """
        if st is None or st.st_size != size:
            return False
        os.utime(final)
        return True

    def _write_temp(self, shard_dir: str, name: str, view: memoryview) -> str:
        temp = os.path.join(shard_dir, f"{TEMP_PREFIX}{name}.{secrets.token_hex(8)}")
        fd = self._writer.create(temp, _OPEN_FLAGS_TEMP, FILE_MODE)
        try:
            self._writer.write_all(fd, view)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            self._unlink_quietly(temp)
            raise
        os.close(fd)
        return temp

    def _install(self, temp: str, final: str, size: int) -> bool:
        """
        Rename the synced temporary file to its final name unless an intact
        copy got there first; return whether the put was deduplicated.
        """
        with self._lock:
            st = _file_stat(final)
            if self._touch_intact_locked(final, size, st):
                return True
            os.rename(temp, final)
            if st is not None:
                # A truncated or extended copy was replaced by good bytes.
                self._total += size - st.st_size
                self.log.warn(
                    "Replaced stored chunk {path} of wrong size {old_size} ({size} expected)",
                    path=final,
                    old_size=st.st_size,
                    size=size,
                )
            else:
                self._total += size
            return False

    def _unlink_quietly(self, path: str) -> None:
        try:
            os.unlink(path)
        except OSError as err:
            self.log.warn("Could not remove {path}: {error}", path=path, error=err)

    def get(self, chunk_hash: str) -> Deferred[bytes]:
        """
        See L{svc.store.chunks.IChunkStore.get}: L{read}, copied out.
        """

        def copied(chunk: ChunkData) -> bytes:
            try:
                return bytes(chunk.data)
            finally:
                chunk.release()

        return self.read(chunk_hash).addCallback(copied)

    def read(self, chunk_hash: str) -> Deferred[ChunkData]:
        """
        See L{svc.store.chunks.IChunkStore.read}. The file is read with
        C{O_DIRECT} where the filesystem allows it, into a buffer lent by
        this store's L{BufferPool}, and re-hashed there; a chunk that fails
        is moved to the quarantine directory, logged, and reported as
        L{CorruptStoredChunk}.
        """
        return self._submit(lambda: check_chunk_hash(chunk_hash), self._read_blocking)

    def _read_blocking(self, name: str) -> ChunkData:
        final = self._final_path(name)
        loan = self._read_buffers.lend()
        try:
            try:
                seen, count = self._reader.read_into(final, _OPEN_FLAGS_READ, loan.buffer)
            except FileNotFoundError:
                raise NotFound(f"chunk {name} not present") from None
            sane = stat.S_ISREG(seen.st_mode) and count == seen.st_size <= MAX_CHUNK_SIZE
            data = loan.view(count if sane else 0)
            if not sane or chunk_hash(data) != name:
                self._quarantine(name, final, seen)
                raise CorruptStoredChunk(name)
        except BaseException:
            loan.give_back()
            raise
        return ChunkData(data, loan.give_back)

    def _quarantine(self, name: str, final: str, seen: os.stat_result) -> None:
        quarantine_dir = os.path.join(self._dir, QUARANTINE_DIR_NAME)
        target = os.path.join(quarantine_dir, f"{name}.{secrets.token_hex(4)}")
        with self._lock:
            st = _file_stat(final)
            if st is None or (st.st_dev, st.st_ino) != (seen.st_dev, seen.st_ino):
                return  # Already withdrawn or replaced by a fresh put.
            try:
                os.makedirs(quarantine_dir, DIR_MODE, exist_ok=True)
                os.rename(final, target)
            except OSError as err:
                self.log.error(
                    "Chunk {hash} in {objects_dir} failed verification and could not be "
                    "quarantined: {error}",
                    hash=name,
                    objects_dir=self._dir,
                    error=err,
                )
                return
            self._total -= st.st_size
        self.log.error(
            "Chunk {hash} in {objects_dir} failed verification; moved to {target}",
            hash=name,
            objects_dir=self._dir,
            target=target,
        )

    def has(self, hashes: Sequence[str]) -> Deferred[ChunkHasResult]:
        """
        See L{svc.store.chunks.IChunkStore.has}.
        """
        return self._submit(lambda: check_chunk_hashes(hashes), self._has_blocking)

    def _has_blocking(self, names: tuple[str, ...]) -> ChunkHasResult:
        present: list[str] = []
        absent: list[str] = []
        for name in names:
            (present if _file_stat(self._final_path(name)) else absent).append(name)
        return ChunkHasResult(present=tuple(present), absent=tuple(absent))

    def stat(self, chunk_hash: str) -> Deferred[ChunkInfo]:
        """
        See L{svc.store.chunks.IChunkStore.stat}.
        """
        return self._submit(lambda: check_chunk_hash(chunk_hash), self._stat_blocking)

    def _stat_blocking(self, name: str) -> ChunkInfo:
        st = _file_stat(self._final_path(name))
        if st is None:
            raise NotFound(f"chunk {name} not present")
        return ChunkInfo(hash=name, size=st.st_size, mtime_ns=st.st_mtime_ns)

    def delete(
        self, hashes: Sequence[str], *, modified_before_ns: int | None = None
    ) -> Deferred[ChunkDeleteResult]:
        """
        See L{svc.store.chunks.IChunkStore.delete}. Each shard directory
        that lost an entry is fsynced once before the result fires, so a
        deleted chunk stays deleted across a crash.
        """
        return self._submit(
            lambda: (check_chunk_hashes(hashes), modified_before_ns), self._delete_blocking
        )

    def _delete_blocking(self, arguments: tuple[tuple[str, ...], int | None]) -> ChunkDeleteResult:
        names, modified_before_ns = arguments
        deleted: list[str] = []
        missing: list[str] = []
        kept: list[str] = []
        errors: list[ChunkDeleteFailure] = []
        freed = 0
        touched_shards: set[str] = set()
        for name in names:
            final = self._final_path(name)
            try:
                with self._lock:
                    st = _file_stat(final)
                    if st is None:
                        missing.append(name)
                        continue
                    if modified_before_ns is not None and st.st_mtime_ns >= modified_before_ns:
                        kept.append(name)
                        continue
                    os.unlink(final)
                    self._total -= st.st_size
            except OSError as err:
                errors.append(ChunkDeleteFailure(hash=name, reason=str(err)))
                continue
            deleted.append(name)
            freed += st.st_size
            touched_shards.add(name[:SHARD_HEX_LENGTH])
        for shard in sorted(touched_shards):
            _fsync_dir(os.path.join(self._dir, shard))
        if errors:
            self.log.warn(
                "Chunk store {objects_dir}: {count} chunk(s) could not be deleted",
                objects_dir=self._dir,
                count=len(errors),
            )
        return ChunkDeleteResult(
            deleted=tuple(deleted),
            missing=tuple(missing),
            kept=tuple(kept),
            errors=tuple(errors),
            bytes_freed=freed,
        )

    def list_chunks(self) -> Deferred[list[ChunkInfo]]:
        """
        See L{svc.store.chunks.IChunkStore.list_chunks}. Scans the
        directory tree on the worker; meant for the GC sweep, not hot paths.
        """
        return self._submit(lambda: None, self._list_blocking)

    def _list_blocking(self, _: None) -> list[ChunkInfo]:
        infos: list[ChunkInfo] = []
        with os.scandir(self._dir) as top:
            shards = [
                e.path for e in top if is_shard_name(e.name) and e.is_dir(follow_symlinks=False)
            ]
        for shard_dir in shards:
            shard = os.path.basename(shard_dir)
            for name in _names_in(shard_dir):
                if is_chunk_hash(name) and name[:2] == shard:
                    st = _file_stat(os.path.join(shard_dir, name))
                    if st is not None:  # Not deleted meanwhile, not a symlink.
                        infos.append(ChunkInfo(name, st.st_size, st.st_mtime_ns))
        infos.sort(key=lambda info: info.hash)
        return infos

    def total_bytes(self) -> Deferred[int]:
        """
        See L{svc.store.chunks.IChunkStore.total_bytes}: the running total
        counted at L{open} and kept up to date by put, delete and
        quarantine.
        """
        if not self._opened:
            return fail(RuntimeError("FilesystemChunkStore used before open() fired"))
        # No lock: the worker threads change the total under it, in one
        # assignment each, so a read sees it before or after a change, as
        # it would taking the lock; waiting for a thread that holds the
        # lock through a rename would stall the reactor.
        return succeed(self._total)


def open_filesystem_chunk_store(
    objects_dir: Path, worker: IWorker, *, read_buffers: int | BufferPool = READ_BUFFERS
) -> Deferred[FilesystemChunkStore]:
    """
    Build a L{FilesystemChunkStore} and fire with it once L{open
    <FilesystemChunkStore.open>} has finished.
    """
    store = FilesystemChunkStore(objects_dir, worker, read_buffers=read_buffers)
    return store.open().addCallback(lambda _: store)
