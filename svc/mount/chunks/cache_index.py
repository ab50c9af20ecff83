"""
The mount client's chunk cache on disk: chunk files and ``index.sqlite``.

Layout under the cache root::

    <root>/lock                       flock'ed by the one process using the cache
    <root>/index.sqlite               one row per cached chunk (schema below)
    <root>/chunks/<2 hex>/<hash>      the chunk's bytes, mode 0600
    <root>/chunks/<2 hex>/.tmp.<hash>.<16 hex>   a chunk being written

This is a cache: losing any of it is harmless, so nothing is fsynced, and
an index that cannot be read is rebuilt from the files. What matters is
never serving bytes that do not hash to their name, which
L{CacheDisk.read} checks on every read.

Everything here blocks. L{svc.mount.chunks.cache.ChunkCache} calls it through one
serial worker (one thread, calls run in submission order), and that
ordering is what keeps the files, the index and the cache's in-memory table
in step. C{docs/specifications/chunk-cache.md} describes the format.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import sqlite3
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Final

import attrs
from twisted.logger import Logger

from svc.chunking import chunk_hash
from svc.direct_io import DirectWriter
from svc.mount.chunks.cache_policy import is_chunk_hash

_log = Logger()

INDEX_NAME: Final = "index.sqlite"
CHUNKS_DIR_NAME: Final = "chunks"
LOCK_NAME: Final = "lock"
TEMP_PREFIX: Final = ".tmp."
SHARD_HEX_LENGTH: Final = 2
FILE_MODE: Final = 0o600
DIR_MODE: Final = 0o700

SCHEMA_VERSION: Final = 1
"""C{PRAGMA user_version} of an index this code writes."""

_SCHEMA: Final = (
    # One row per chunk file the cache holds. A row is inserted after its
    # file is renamed into place, deleted with (just after) the file, and its
    # last_used_ms rewritten in batches (see ChunkCache's recency flush).
    """
    CREATE TABLE chunks (
        hash         TEXT PRIMARY KEY CHECK (length(hash) = 64),
                                         -- lowercase hex BLAKE3-256 of the bytes;
                                         -- the file is chunks/<hash[:2]>/<hash>
        size         INTEGER NOT NULL CHECK (size >= 0),
                                         -- bytes in the file, counted against the budget
        last_used_ms INTEGER NOT NULL    -- the cache clock, in ms, at the last store or
                                         -- hit; 0 for files adopted at open. Orders LRU
                                         -- eviction across restarts
    ) STRICT, WITHOUT ROWID
    """,
)

_SHARD: Final = re.compile(r"[0-9a-f]{2}")
_OPEN_READ: Final = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW
_OPEN_TEMP: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW


class CacheInUse(Exception):
    """Another process (or another open cache in this one) holds the cache root."""


class ChunkBytesMismatch(ValueError):
    """Bytes offered as chunk C{expected} hash to C{actual}; nothing was stored."""

    def __init__(self, expected: str, actual: str) -> None:
        super().__init__(f"bytes offered as chunk {expected} hash to {actual}")
        self.expected = expected
        self.actual = actual


@attrs.frozen
class IndexRow:
    """A cached chunk as the index records it."""

    hash: str
    size: int
    last_used_ms: int


@attrs.frozen
class ReconcileReport:
    """
    What opening the cache found: the chunks kept, files adopted (no row),
    rows dropped (no file), rows whose size was corrected from the file,
    temporary files removed, unrecognised entries left alone, and whether
    an unreadable index was rebuilt.
    """

    chunk_count: int
    total_bytes: int
    adopted_files: int
    dropped_rows: int
    resized_rows: int
    removed_temp_files: int
    ignored_entries: int
    index_rebuilt: bool


@attrs.frozen
class CorruptChunk:
    """A cached file did not hash to its name (or had the wrong size); removed."""

    size: int


@attrs.frozen
class UnreadableChunk:
    """A cached file was missing or could not be read; its row was removed."""

    reason: str


ReadResult = bytes | CorruptChunk | UnreadableChunk


def chunk_path(chunks_dir: Path, name: str) -> Path:
    """Where chunk C{name} lives under C{chunks_dir}."""
    return chunks_dir / name[:SHARD_HEX_LENGTH] / name


def _remove_index_files(index: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{index}{suffix}")


def _connect(index: Path) -> sqlite3.Connection:
    """
    Open the index and bring its schema to L{SCHEMA_VERSION}. Any
    L{sqlite3.DatabaseError}, or an index of a different version, makes the
    caller rebuild it.
    """
    connection = sqlite3.connect(index, isolation_level=None, check_same_thread=False)
    try:
        # The index is rebuilt from the files if it is lost, so commits need
        # not reach the disk: no fsync, ever.
        connection.execute("PRAGMA journal_mode = WAL")
        connection.execute("PRAGMA synchronous = OFF")
        version = int(connection.execute("PRAGMA user_version").fetchone()[0])
        if version == 0:
            connection.execute("BEGIN IMMEDIATE")
            for statement in _SCHEMA:
                connection.execute(statement)
            connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION:d}")
            connection.execute("COMMIT")
        elif version != SCHEMA_VERSION:
            raise sqlite3.DatabaseError(
                f"index schema version {version}, expected {SCHEMA_VERSION}"
            )
        connection.execute("SELECT count(*) FROM chunks").fetchone()
    except BaseException:
        connection.close()
        raise
    return connection


def _lock(root: Path) -> int:
    fd = os.open(root / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise CacheInUse(f"chunk cache {root} is in use by another open cache") from None
    except BaseException:
        os.close(fd)
        raise
    return fd


class CacheDisk:
    """
    The open on-disk cache. Build it with L{CacheDisk.open}; every method
    blocks and must be called from the cache's serial worker, one call at
    a time (the SQLite connection is not shared between threads at once).
    """

    def __init__(self, root: Path, connection: sqlite3.Connection, lock_fd: int) -> None:
        self._root = root
        self._chunks = root / CHUNKS_DIR_NAME
        self._db = connection
        self._lock_fd = lock_fd
        self._shards: set[str] = set()
        # Chunk files go past the page cache: the kernel already keeps what
        # the mount serves in the FUSE file's own page cache, and a buffered
        # write of a new 4 MiB file costs several ms of kernel CPU here.
        self._writer = DirectWriter()

    @classmethod
    def open(cls, root: Path) -> tuple[CacheDisk, ReconcileReport, list[IndexRow]]:
        """
        Create the directories if needed, lock the root, open (or rebuild)
        the index and reconcile it with the files. Returns the rows from
        least to most recently used.
        """
        root = Path(os.path.abspath(root))
        os.makedirs(root / CHUNKS_DIR_NAME, DIR_MODE, exist_ok=True)
        lock_fd = _lock(root)
        try:
            index = root / INDEX_NAME
            rebuilt = False
            try:
                connection = _connect(index)
            except sqlite3.DatabaseError as err:
                _log.warn(
                    "Chunk cache index {index} unreadable ({error}); rebuilding it from the files",
                    index=str(index),
                    error=str(err),
                )
                _remove_index_files(index)
                connection = _connect(index)
                rebuilt = True
            disk = cls(root, connection, lock_fd)
            try:
                report, rows = disk._reconcile(rebuilt)
            except BaseException:
                connection.close()
                raise
        except BaseException:
            os.close(lock_fd)
            raise
        _log.info(
            "Opened chunk cache {root}: {chunks} chunks, {bytes} bytes; {adopted} files "
            "adopted, {dropped} rows dropped, {resized} rows resized, {temps} temporary "
            "files removed, {ignored} unrecognised entries",
            root=str(root),
            chunks=report.chunk_count,
            bytes=report.total_bytes,
            adopted=report.adopted_files,
            dropped=report.dropped_rows,
            resized=report.resized_rows,
            temps=report.removed_temp_files,
            ignored=report.ignored_entries,
        )
        return disk, report, rows

    def _scan(self) -> tuple[dict[str, int], int, int]:
        """The chunk files and their sizes; temporary files removed."""
        files: dict[str, int] = {}
        removed = ignored = 0
        shard_dirs: list[os.DirEntry[str]] = []
        with os.scandir(self._chunks) as top:
            for entry in top:
                if _SHARD.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False):
                    shard_dirs.append(entry)
                else:
                    ignored += 1
        for shard in shard_dirs:
            self._shards.add(shard.name)
            with os.scandir(shard.path) as entries:
                for entry in entries:
                    regular = entry.is_file(follow_symlinks=False)
                    if entry.name.startswith(TEMP_PREFIX) and regular:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(entry.path)
                            removed += 1
                    elif (
                        is_chunk_hash(entry.name) and entry.name.startswith(shard.name) and regular
                    ):
                        files[entry.name] = entry.stat(follow_symlinks=False).st_size
                    else:
                        ignored += 1
        return files, removed, ignored

    def _reconcile(self, rebuilt: bool) -> tuple[ReconcileReport, list[IndexRow]]:
        files, removed, ignored = self._scan()
        rows = {
            str(h): (int(size), int(used))
            for h, size, used in self._db.execute("SELECT hash, size, last_used_ms FROM chunks")
        }
        dropped = [h for h in rows if h not in files]
        adopted = [h for h in files if h not in rows]
        resized = [h for h, (size, _) in rows.items() if h in files and files[h] != size]
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._db.executemany("DELETE FROM chunks WHERE hash = ?", ((h,) for h in dropped))
            self._db.executemany(
                "INSERT INTO chunks (hash, size, last_used_ms) VALUES (?, ?, 0)",
                ((h, files[h]) for h in adopted),
            )
            self._db.executemany(
                "UPDATE chunks SET size = ? WHERE hash = ?", ((files[h], h) for h in resized)
            )
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        kept = [IndexRow(h, size, rows[h][1] if h in rows else 0) for h, size in files.items()]
        kept.sort(key=lambda row: (row.last_used_ms, row.hash))
        report = ReconcileReport(
            chunk_count=len(kept),
            total_bytes=sum(row.size for row in kept),
            adopted_files=len(adopted),
            dropped_rows=len(dropped),
            resized_rows=len(resized),
            removed_temp_files=removed,
            ignored_entries=ignored,
            index_rebuilt=rebuilt,
        )
        return report, kept

    def _path(self, name: str) -> Path:
        return chunk_path(self._chunks, name)

    def verify(self, name: str, data: bytes | memoryview) -> None:
        """Raise L{ChunkBytesMismatch} unless C{data} hashes to C{name}."""
        actual = chunk_hash(data)
        if actual != name:
            raise ChunkBytesMismatch(name, actual)

    def read(self, name: str, size: int) -> ReadResult:
        """
        The bytes of chunk C{name} (expected C{size} bytes), re-hashed. A
        file that fails is removed with its row and reported as
        L{CorruptChunk}; one that is missing or unreadable loses its row (and
        file) and is reported as L{UnreadableChunk}.
        """
        path = self._path(name)
        try:
            fd = os.open(path, _OPEN_READ)
            with open(fd, "rb", buffering=0, closefd=True) as f:
                st = os.fstat(fd)
                # Read one byte more than expected so a grown file is noticed.
                data = f.read(size + 1) if stat.S_ISREG(st.st_mode) else None
        except OSError as err:
            self.delete([name])
            return UnreadableChunk(reason=err.strerror or str(err))
        if data is None or len(data) != size or chunk_hash(data) != name:
            self.delete([name])
            return CorruptChunk(size=size)
        return data

    def write(self, name: str, data: bytes | memoryview, now_ms: int) -> bool:
        """
        Verify C{data}, then store it as chunk C{name} (temporary name, then
        rename) and record its row. L{ChunkBytesMismatch} if it does not
        verify; false, with nothing left behind, if the disk or index failed.
        """
        self.verify(name, data)
        if not self._write_file(name, data):
            return False
        return self._record([(name, len(data), now_ms)])

    def write_many(self, chunks: Sequence[tuple[str, bytes | memoryview, int]]) -> list[bool]:
        """
        L{write} of several C{(name, data, now_ms)} chunks, their rows
        recorded in one index transaction: whether each is stored. A chunk
        that does not verify, or whose file cannot be written, is not
        (logged); if the index fails, none is (their files are removed).
        """
        written: list[bool] = []
        for name, data, _now_ms in chunks:
            try:
                self.verify(name, data)
            except ChunkBytesMismatch as err:
                _log.warn("Chunk cache refused {hash}: {error}", hash=name, error=str(err))
                written.append(False)
                continue
            written.append(self._write_file(name, data))
        rows = [
            (name, len(data), now_ms)
            for (name, data, now_ms), ok in zip(chunks, written, strict=True)
            if ok
        ]
        if rows and not self._record(rows):
            return [False] * len(chunks)
        return written

    def _write_file(self, name: str, data: bytes | memoryview) -> bool:
        """Chunk C{name}'s file (temporary name, then rename); false, nothing left, on failure."""
        shard = name[:SHARD_HEX_LENGTH]
        final = self._path(name)
        temp = final.with_name(f"{TEMP_PREFIX}{name}.{secrets.token_hex(8)}")
        try:
            if shard not in self._shards:
                os.makedirs(final.parent, DIR_MODE, exist_ok=True)
                self._shards.add(shard)
            fd = self._writer.create(str(temp), _OPEN_TEMP, FILE_MODE, len(data))
            try:
                self._writer.write_all(fd, data)
            finally:
                os.close(fd)
            os.replace(temp, final)
        except OSError as err:
            _log.warn("Chunk cache could not store {hash}: {error}", hash=name, error=str(err))
            for path in (temp, final):
                with contextlib.suppress(OSError):
                    os.unlink(path)
            return False
        return True

    def _record(self, rows: Sequence[tuple[str, int, int]]) -> bool:
        """
        Insert the C{(hash, size, last_used_ms)} rows in one transaction;
        false, with their files removed, if the index failed.
        """
        inserted = self._run_batch(
            "INSERT OR REPLACE INTO chunks (hash, size, last_used_ms) VALUES (?, ?, ?)", rows
        )
        if not inserted:
            for name, _size, _ms in rows:
                with contextlib.suppress(OSError):
                    os.unlink(self._path(name))
        return inserted

    def delete(self, names: Sequence[str]) -> None:
        """
        Remove the files and rows of C{names}; absent ones are skipped, and
        failures are logged (a file left behind is adopted at next open).
        """
        for name in names:
            try:
                os.unlink(self._path(name))
            except FileNotFoundError:
                pass
            except OSError as err:
                _log.warn("Chunk cache could not remove {hash}: {error}", hash=name, error=str(err))
        self._run_batch("DELETE FROM chunks WHERE hash = ?", [(name,) for name in names])

    def record_use(self, uses: Sequence[tuple[str, int]]) -> None:
        """Write the C{(hash, last_used_ms)} pairs of recent hits."""
        self._run_batch(
            "UPDATE chunks SET last_used_ms = max(last_used_ms, ?) WHERE hash = ?",
            [(ms, name) for name, ms in uses],
        )

    def _run_batch(self, statement: str, rows: Iterable[tuple[object, ...]]) -> bool:
        """C{statement} for each of C{rows}, in one transaction; whether it committed."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(statement, rows)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        except sqlite3.Error as err:
            # Rows out of step with the files are corrected at next open.
            _log.warn("Chunk cache index update failed: {error}", error=str(err))
            return False
        return True

    def close(self) -> None:
        """Close the index and release the root's lock."""
        try:
            self._db.close()
        finally:
            os.close(self._lock_fd)
