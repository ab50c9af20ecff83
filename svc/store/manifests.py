"""
The manifest store: one tenant's ``routes.db`` (namespace, compare-and-swap
manifests, chunk references, write journal) behind an asynchronous API.

Every call runs on the one injected L{IWorker} (a single-thread
L{svc.worker.ThreadWorker} in production: the database's only writer
thread), in submission order, through a L{TransactionQueue}: each mutation is
atomic on its own (a savepoint) and durable when its L{Deferred} fires; the
calls queued meanwhile share one commit. The format is specified in
C{docs/specifications/routes-db.md}.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from svc.store import journal, manifest_names, manifest_reads, manifest_writes
from svc.store.journal import JournalPage, JournalQuery, MissingChunks, RevertResult
from svc.store.journal_rows import JournalEntry
from svc.store.manifest_rows import Stamp, subtree_usage
from svc.store.manifest_values import (
    ChunkRef,
    CreateResult,
    DirectoryEntry,
    FileKind,
    Manifest,
    PurgeResult,
    PutResult,
    RemoveResult,
    RenameResult,
    SetattrResult,
    Writer,
)
from svc.store.routes_queue import StoreClosed, TransactionQueue
from svc.store.routes_schema import configure, migrate
from svc.worker import IWorker

__all__ = ["ManifestStore", "StoreClosed", "WallClock"]

T = TypeVar("T")

_NS_PER_SECOND = 1_000_000_000


class WallClock(Protocol):
    """
    The part of C{IReactorTime} the store uses (a reactor or a
    L{twisted.internet.task.Clock}).
    """

    def seconds(self) -> float:
        """The current time in seconds since the epoch."""


class ManifestStore:
    """
    One open ``routes.db``. Build it with L{ManifestStore.open}.
    """

    _log = Logger()

    def __init__(self, connection: sqlite3.Connection, worker: IWorker, clock: WallClock):
        self._queue = TransactionQueue(connection, worker)
        self._clock = clock

    @classmethod
    def open(
        cls, path: str | os.PathLike[str], worker: IWorker, clock: WallClock
    ) -> Deferred[ManifestStore]:
        """
        Open (creating if needed) the database at ``path`` and bring its
        schema up to date; ``clock`` stamps every change.
        """

        def opening() -> tuple[sqlite3.Connection, int]:
            # The worker serialises every use of the connection, but a
            # thread pool may replace its thread, so thread identity is not
            # what keeps the connection safe.
            connection = sqlite3.connect(
                os.fspath(path), isolation_level=None, check_same_thread=False
            )
            try:
                configure(connection)
                version = migrate(connection)
            except BaseException:
                connection.close()
                raise
            return connection, version

        def opened(result: tuple[sqlite3.Connection, int]) -> ManifestStore:
            connection, version = result
            cls._log.info(
                "opened {path} (schema version {version})", path=os.fspath(path), version=version
            )
            return cls(connection, worker, clock)

        return worker.submit(opening).addCallback(opened)

    def close(self) -> Deferred[None]:
        """
        Finish the work already submitted, then close the database; later
        calls fail with L{StoreClosed}.
        """
        return self._queue.close()

    def _read(self, work: Callable[[sqlite3.Connection], T]) -> Deferred[T]:
        return self._queue.submit(work, writes=False)

    def _write(self, writer: Writer, work: Callable[[sqlite3.Connection, Stamp], T]) -> Deferred[T]:
        def stamped(connection: sqlite3.Connection) -> T:
            return work(connection, Stamp(round(self._clock.seconds() * _NS_PER_SECOND), writer))

        return self._queue.submit(stamped, writes=True)

    # Reads

    def get(self, path: str) -> Deferred[Manifest]:
        """
        The manifest of ``path`` (attributes, chunk list, version, last
        writer); fails with L{svc.store.errors.NotFound}.
        """
        return self._read(lambda c: manifest_reads.get(c, path))

    def list_dir(self, path: str) -> Deferred[tuple[DirectoryEntry, ...]]:
        """
        The entries of directory ``path`` with their attributes, by name.
        """
        return self._read(lambda c: manifest_reads.list_directory(c, path))

    def readlink(self, path: str) -> Deferred[str]:
        """
        The target of symlink ``path``.
        """
        return self._read(lambda c: manifest_reads.readlink(c, path))

    def subtree_usage(self, top: str) -> Deferred[int]:
        """
        Unique chunk bytes referenced by the live files under ``/<top>``
        (a chunk shared by several files, or hard links, counts once).
        """
        return self._read(lambda c: subtree_usage(c, top))

    def usage_by_top(self) -> Deferred[dict[str, int]]:
        """
        L{subtree_usage} for every top-level directory holding chunks.
        """
        return self._read(manifest_reads.usage_by_top)

    def referenced_hashes(self, top: str, hashes: Sequence[str]) -> Deferred[frozenset[str]]:
        """
        Those of ``hashes`` a live file under ``/<top>`` references (through
        the queue, so every change submitted before is reflected).
        """
        wanted = list(hashes)
        return self._read(lambda c: frozenset(manifest_reads.referenced_under(c, top, wanted)))

    def live_hashes(self) -> Deferred[frozenset[str]]:
        """
        The hashes referenced by any live file.
        """
        return self._read(manifest_reads.live_hashes)

    # Mutations

    def put(
        self,
        path: str,
        *,
        expected_version: int,
        chunks: Sequence[ChunkRef | tuple[str, int]],
        size: int,
        mode: int,
        mtime_ns: int,
        uid: int,
        gid: int,
        writer: Writer,
        quota_bytes: int | None = None,
        atime_ns: int | None = None,
    ) -> Deferred[PutResult]:
        """
        Compare-and-swap the content of file ``path`` (see
        L{svc.store.manifest_writes.put}): ``expected_version`` 0 creates; a mismatch
        fails with L{svc.store.errors.StaleVersion} (ESTALE).
        """
        return self._write(
            writer,
            lambda c, s: manifest_writes.put(
                c,
                s,
                path,
                expected_version=expected_version,
                chunks=chunks,
                size=size,
                mode=mode,
                mtime_ns=mtime_ns,
                uid=uid,
                gid=gid,
                quota_bytes=quota_bytes,
                atime_ns=atime_ns,
            ),
        )

    def delete(self, path: str, *, writer: Writer) -> Deferred[RemoveResult]:
        """
        Unlink the non-directory ``path``.
        """
        return self._write(writer, lambda c, s: manifest_names.delete(c, s, path))

    def mkdir(
        self, path: str, *, mode: int, uid: int, gid: int, writer: Writer
    ) -> Deferred[CreateResult]:
        """
        Create directory ``path``.
        """
        return self._write(
            writer, lambda c, s: manifest_names.mkdir(c, s, path, mode=mode, uid=uid, gid=gid)
        )

    def rmdir(self, path: str, *, writer: Writer) -> Deferred[RemoveResult]:
        """
        Remove the empty directory ``path``.
        """
        return self._write(writer, lambda c, s: manifest_names.rmdir(c, s, path))

    def rename(
        self,
        source: str,
        destination: str,
        *,
        writer: Writer,
        subtree_check: manifest_names.SubtreeMoveCheck | None = None,
    ) -> Deferred[RenameResult]:
        """
        Move ``source`` (with its subtree) to ``destination`` atomically;
        ``subtree_check`` (run on the worker) may refuse a directory's move
        (L{manifest_names.rename}).
        """
        return self._write(
            writer,
            lambda c, s: manifest_names.rename(c, s, source, destination, subtree_check),
        )

    def link(self, existing: str, new: str, *, writer: Writer) -> Deferred[CreateResult]:
        """
        Hard-link ``new`` to the non-directory ``existing``.
        """
        return self._write(writer, lambda c, s: manifest_names.link(c, s, existing, new))

    def symlink(
        self, path: str, target: str, *, uid: int, gid: int, writer: Writer
    ) -> Deferred[CreateResult]:
        """
        Create symlink ``path`` to ``target``.
        """
        return self._write(
            writer,
            lambda c, s: manifest_names.symlink(c, s, path, target=target, uid=uid, gid=gid),
        )

    def mknod(
        self,
        path: str,
        *,
        kind: FileKind,
        mode: int,
        rdev: int,
        uid: int,
        gid: int,
        writer: Writer,
    ) -> Deferred[CreateResult]:
        """
        Create a fifo, socket, device or empty regular file ``path``.
        """
        return self._write(
            writer,
            lambda c, s: manifest_names.mknod(
                c, s, path, kind=kind, mode=mode, rdev=rdev, uid=uid, gid=gid
            ),
        )

    def setattr(
        self,
        path: str,
        *,
        writer: Writer,
        mode: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
        size: int | None = None,
        mtime_ns: int | None = None,
        atime_ns: int | None = None,
    ) -> Deferred[SetattrResult]:
        """
        Change attributes of ``path``; ``size`` only to 0 (or unchanged).
        """
        return self._write(
            writer,
            lambda c, s: manifest_writes.set_attributes(
                c,
                s,
                path,
                mode=mode,
                uid=uid,
                gid=gid,
                size=size,
                mtime_ns=mtime_ns,
                atime_ns=atime_ns,
            ),
        )

    def purge_subtree(self, top: str) -> Deferred[PurgeResult]:
        """
        Erase the agent disk ``/<top>`` with its journal rows (see
        L{manifest_names.purge_subtree}); the result lists the chunks it
        referenced, for the caller to collect.
        """
        return self._write(
            Writer("svc-purge"), lambda c, s: manifest_names.purge_subtree(c, s, top)
        )

    # Journal

    def journal_entry(self, seq: int) -> Deferred[JournalEntry | None]:
        """
        The journal row ``seq``, or L{None}.
        """
        return self._read(lambda c: journal.entry(c, seq))

    def journal_query(self, journal_query: JournalQuery) -> Deferred[JournalPage]:
        """
        One page of journal rows.
        """
        return self._read(lambda c: journal.query(c, journal_query))

    def journal_revert(
        self, path: str, seq: int, *, writer: Writer, missing_chunks: MissingChunks
    ) -> Deferred[RevertResult]:
        """
        Restore ``path`` to its state just before entry ``seq`` as a new
        journaled change. ``missing_chunks`` runs on the worker thread and
        returns the hashes (of those given) the chunk store lacks.
        """
        return self._write(writer, lambda c, s: journal.revert(c, s, path, seq, missing_chunks))

    def journal_hashes_since(self, cutoff_ms: int) -> Deferred[frozenset[str]]:
        """
        Chunk hashes named by journal rows at or after ``cutoff_ms``.
        """
        return self._read(lambda c: journal.hashes_since(c, cutoff_ms))

    def journal_prune(self, before_ms: int) -> Deferred[int]:
        """
        Delete journal rows older than ``before_ms``; the count deleted.
        """
        return self._queue.submit(lambda c: journal.prune(c, before_ms), writes=True)

    def journal_row_count(self) -> Deferred[int]:
        """
        The number of journal rows.
        """
        return self._read(journal.row_count)
