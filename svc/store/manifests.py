"""
The manifest store: one tenant's ``routes.db`` (namespace, compare-and-swap
manifests, chunk references, write journal) behind an asynchronous API.

Every call runs on the one injected L{IWorker} (a single-thread
L{svc.worker.ThreadWorker} in production: the database's only writer
thread), in submission order, through a L{svc.store.routes_queue.TransactionQueue}
(L{svc.store.routes_database}): each mutation is atomic on its own (a
savepoint) and durable when its L{Deferred} fires; the calls queued
meanwhile share one commit. The format is specified in
C{docs/specifications/routes-db.md}.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Collection, Mapping, Sequence

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from svc.store import (
    footprint_rows,
    journal,
    manifest_names,
    manifest_reads,
    manifest_writes,
    outbox_answers,
)
from svc.store.footprint import Footprint, FootprintPolicy
from svc.store.journal import JournalPage, JournalQuery, MissingChunks, RevertResult
from svc.store.journal_rows import JournalEntry
from svc.store.manifest_paths import top_of
from svc.store.manifest_rows import Stamp, subtree_usage
from svc.store.manifest_values import (
    ChunkRef,
    CreateResult,
    DirectoryEntry,
    FileChunks,
    FileKind,
    Manifest,
    PurgeResult,
    PutResult,
    RemoveResult,
    RenameResult,
    SetattrResult,
    Writer,
)
from svc.store.routes_database import RoutesDatabase, WallClock, connect
from svc.store.routes_queue import StoreClosed
from svc.worker import IWorker

__all__ = ["ManifestStore", "StoreClosed"]


class ManifestStore:
    """
    One open ``routes.db``. Build it with L{ManifestStore.open}.
    """

    _log = Logger()

    def __init__(self, connection: sqlite3.Connection, worker: IWorker, clock: WallClock):
        self._db = RoutesDatabase(connection, worker, clock)

    def notify_collectable(self, listener: Callable[[], object]) -> None:
        """
        Call ``listener`` (on the reactor, after the commit) whenever a
        change or a pruning leaves chunks collectable.
        """
        self._db.notify_collectable(listener)

    @classmethod
    def open(
        cls, path: str | os.PathLike[str], worker: IWorker, clock: WallClock
    ) -> Deferred[ManifestStore]:
        """
        Open (creating if needed) the database at ``path`` and bring its
        schema up to date; ``clock`` stamps every change.
        """

        def opened(result: tuple[sqlite3.Connection, int]) -> ManifestStore:
            connection, version = result
            cls._log.info(
                "opened {path} (schema version {version})", path=os.fspath(path), version=version
            )
            return cls(connection, worker, clock)

        return worker.submit(lambda: connect(path)).addCallback(opened)

    def close(self) -> Deferred[None]:
        """
        Finish the work already submitted, then close the database; later
        calls fail with L{StoreClosed}.
        """
        return self._db.close()

    # Reads

    def get(self, path: str) -> Deferred[Manifest]:
        """
        The manifest of ``path`` (attributes, chunk list, version, last
        writer); fails with L{svc.store.errors.NotFound}.
        """
        return self._db.read(lambda c: manifest_reads.get(c, path))

    def list_dir(
        self, path: str, *, after: str | None = None, limit: int | None = None
    ) -> Deferred[tuple[DirectoryEntry, ...]]:
        """
        The entries of directory ``path`` with their attributes, by name:
        those after the name ``after``, at most ``limit`` (else all).
        """
        return self._db.read(lambda c: manifest_reads.list_directory(c, path, after, limit))

    def chunk_lists(
        self, directory: str, names: Sequence[str], *, max_chunks: int | None = None
    ) -> Deferred[dict[str, FileChunks]]:
        """
        The chunk lists of the regular files among the entries ``names`` of
        ``directory`` (of at most ``max_chunks`` entries each, if given),
        by name, each with the inode and version it is the content of: in
        one read, so a caller holding a listing keeps the lists whose inode
        and version match the entries it listed.
        """
        wanted = list(names)
        return self._db.read(lambda c: manifest_reads.chunk_lists(c, directory, wanted, max_chunks))

    def readlink(self, path: str) -> Deferred[str]:
        """
        The target of symlink ``path``.
        """
        return self._db.read(lambda c: manifest_reads.readlink(c, path))

    def subtree_usage(self, top: str) -> Deferred[int]:
        """
        Unique chunk bytes referenced by the live files under ``/<top>``
        (a chunk shared by several files, or hard links, counts once).
        """
        return self._db.read(lambda c: subtree_usage(c, top))

    def usage_by_top(self) -> Deferred[dict[str, int]]:
        """
        L{subtree_usage} for every top-level directory holding chunks.
        """
        return self._db.read(manifest_reads.usage_by_top)

    def referenced_hashes(self, top: str, hashes: Sequence[str]) -> Deferred[frozenset[str]]:
        """
        Those of ``hashes`` a live file under ``/<top>`` references (through
        the queue, so every change submitted before is reflected).
        """
        wanted = list(hashes)
        return self._db.read(lambda c: frozenset(manifest_reads.referenced_under(c, top, wanted)))

    def live_hashes(self) -> Deferred[frozenset[str]]:
        """
        The hashes referenced by any live file.
        """
        return self._db.read(manifest_reads.live_hashes)

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
        retained_cap: int | None = None,
    ) -> Deferred[PutResult]:
        """
        Compare-and-swap the content of file ``path`` (see
        L{svc.store.manifest_writes.put}): ``expected_version`` 0 creates; a mismatch
        fails with L{svc.store.errors.StaleVersion} (ESTALE). With
        ``retained_cap``, the bytes the path's top keeps only for its
        journal are then brought within it (L{footprint_rows.prune_to_cap}).
        """
        return self._db.write(
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
            (top_of(path), retained_cap),
        )

    def delete(
        self, path: str, *, writer: Writer, retained_cap: int | None = None
    ) -> Deferred[RemoveResult]:
        """
        Unlink the non-directory ``path`` (``retained_cap`` as for L{put}).
        """
        return self._db.write(
            writer, lambda c, s: manifest_names.delete(c, s, path), (top_of(path), retained_cap)
        )

    def mkdir(
        self, path: str, *, mode: int, uid: int, gid: int, writer: Writer
    ) -> Deferred[CreateResult]:
        """
        Create directory ``path``.
        """
        return self._db.write(
            writer, lambda c, s: manifest_names.mkdir(c, s, path, mode=mode, uid=uid, gid=gid)
        )

    def rmdir(self, path: str, *, writer: Writer) -> Deferred[RemoveResult]:
        """
        Remove the empty directory ``path``.
        """
        return self._db.write(writer, lambda c, s: manifest_names.rmdir(c, s, path))

    def rename(
        self,
        source: str,
        destination: str,
        *,
        writer: Writer,
        subtree_check: manifest_names.SubtreeMoveCheck | None = None,
        retained_cap: int | None = None,
    ) -> Deferred[RenameResult]:
        """
        Move ``source`` (with its subtree) to ``destination`` atomically;
        ``subtree_check`` (run on the worker) may refuse a directory's move
        (L{manifest_names.rename}); ``retained_cap`` as for L{put}.
        """
        return self._db.write(
            writer,
            lambda c, s: manifest_names.rename(c, s, source, destination, subtree_check),
            (top_of(source), retained_cap),
        )

    def link(self, existing: str, new: str, *, writer: Writer) -> Deferred[CreateResult]:
        """
        Hard-link ``new`` to the non-directory ``existing``.
        """
        return self._db.write(writer, lambda c, s: manifest_names.link(c, s, existing, new))

    def symlink(
        self, path: str, target: str, *, uid: int, gid: int, writer: Writer
    ) -> Deferred[CreateResult]:
        """
        Create symlink ``path`` to ``target``.
        """
        return self._db.write(
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
        return self._db.write(
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
        retained_cap: int | None = None,
    ) -> Deferred[SetattrResult]:
        """
        Change attributes of ``path``; ``size`` only to 0 (or unchanged)
        (``retained_cap`` as for L{put}).
        """
        return self._db.write(
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
            (top_of(path), retained_cap),
        )

    def purge_subtree(self, top: str) -> Deferred[PurgeResult]:
        """
        Erase the agent disk ``/<top>`` with its journal rows (see
        L{manifest_names.purge_subtree}); the result lists the chunks it
        referenced, for the caller to collect. The answers kept for the
        agent's outbox entries go with it.
        """

        def purge(connection: sqlite3.Connection, stamp: Stamp) -> PurgeResult:
            outbox_answers.forget_agent(connection, top)
            return manifest_names.purge_subtree(connection, stamp, top)

        return self._db.write(Writer("svc-purge"), purge)

    # Journal

    def journal_entry(self, seq: int) -> Deferred[JournalEntry | None]:
        """
        The journal row ``seq``, or L{None}.
        """
        return self._db.read(lambda c: journal.entry(c, seq))

    def journal_query(self, journal_query: JournalQuery) -> Deferred[JournalPage]:
        """
        One page of journal rows.
        """
        return self._db.read(lambda c: journal.query(c, journal_query))

    def journal_revert(
        self,
        path: str,
        seq: int,
        *,
        writer: Writer,
        missing_chunks: MissingChunks,
        retained_cap: int | None = None,
    ) -> Deferred[RevertResult]:
        """
        Restore ``path`` to its state just before entry ``seq`` as a new
        journaled change. ``missing_chunks`` runs on the worker thread and
        returns the hashes (of those given) the chunk store lacks
        (``retained_cap`` as for L{put}).
        """
        return self._db.write(
            writer,
            lambda c, s: journal.revert(c, s, path, seq, missing_chunks),
            (top_of(path), retained_cap),
        )

    def journal_hashes_since(self, cutoff_ms: int) -> Deferred[frozenset[str]]:
        """
        Chunk hashes named by journal rows at or after ``cutoff_ms``.
        """
        return self._db.read(lambda c: journal.hashes_since(c, cutoff_ms))

    def journal_prune(self, before_ms: int) -> Deferred[int]:
        """
        Delete journal rows older than ``before_ms`` (see L{journal.prune});
        the count deleted.
        """
        at_ms = self._db.now_ms()
        return self._db.submit(lambda c: journal.prune(c, before_ms, at_ms), writes=True)

    # Footprint

    def footprint(self, top: str) -> Deferred[Footprint]:
        """
        The bytes charged to ``/<top>`` (L{svc.store.footprint}): two
        primary-key reads, queued behind the writes already submitted.
        """
        return self._db.read(lambda c: footprint_rows.read(c, top))

    def footprints(self) -> Deferred[dict[str, Footprint]]:
        """
        L{footprint} of every top with charged bytes.
        """
        return self._db.read(footprint_rows.read_all)

    def charge_upload(
        self,
        top: str,
        chunk: ChunkRef,
        *,
        grant_bytes: int | None,
        backlog_bytes: int | None,
    ) -> Deferred[bool]:
        """
        Charge an upload of ``chunk`` to ``/<top>`` (see
        L{footprint_rows.charge_upload}); fires with whether this call
        recorded it as soon as that is decided, before its transaction
        commits (the upload's bytes are written meanwhile: a crash that
        loses the charge leaves a chunk no row names, which a GC sweep
        deletes once the chunk grace has passed).
        """
        at_ms = self._db.now_ms()
        return self._db.submit(
            lambda c: footprint_rows.charge_upload(
                c, top, chunk, at_ms, grant_bytes=grant_bytes, backlog_bytes=backlog_bytes
            ),
            writes=True,
            early=True,
        )

    def uncharge_upload(self, top: str, chunk_hash: str) -> Deferred[None]:
        """
        Forget an upload L{charge_upload} recorded that stored nothing.
        """
        return self._db.submit(
            lambda c: footprint_rows.uncharge_upload(c, top, chunk_hash), writes=True
        )

    def upload_hashes(self, since_ms: int | None = None) -> Deferred[frozenset[str]]:
        """
        Every chunk uploaded and not committed, still charged (only those
        renewed at or after ``since_ms``, when given).
        """
        return self._db.read(lambda c: footprint_rows.upload_hashes(c, since_ms))

    def enforce_retained_cap(self, top: str, cap: int) -> Deferred[int]:
        """
        Bring ``/<top>``'s retained bytes within ``cap`` now (after its grant
        was lowered); the bytes that became collectable.
        """
        return self._db.maintain(lambda c, at_ms: footprint_rows.prune_to_cap(c, top, cap, at_ms))

    def expire(
        self,
        uploads_before_ms: int,
        journal_before_ms: int,
        grants: Mapping[str, int],
        policy: FootprintPolicy,
    ) -> Deferred[None]:
        """
        The collection's upkeep, in one transaction: stop charging uploads
        renewed before ``uploads_before_ms``, prune journal rows older than
        ``journal_before_ms``, and bring every top's retained bytes within
        its cap under ``grants`` and ``policy``. What they release becomes
        collectable; the caller (a GC sweep) collects it next, so the
        listener is not told.
        """
        at_ms = self._db.now_ms()
        caps = dict(grants)

        def expiring(connection: sqlite3.Connection) -> None:
            footprint_rows.expire_uploads(connection, uploads_before_ms, at_ms)
            journal.prune(connection, journal_before_ms, at_ms)
            footprint_rows.prune_all_to_caps(connection, caps, policy, at_ms)

        return self._db.submit(expiring, writes=True)

    def collectable_chunks(self, limit: int) -> Deferred[list[tuple[str, int]]]:
        """
        Up to ``limit`` collectable chunks, oldest first: C{(hash, size)}.
        """
        return self._db.read(lambda c: footprint_rows.collectable_chunks(c, limit))

    def forget_collectable(self, hashes: Sequence[str]) -> Deferred[None]:
        """
        The chunks ``hashes`` left the chunk store: stop charging them.
        """
        wanted = list(hashes)
        return self._db.submit(lambda c: footprint_rows.forget_collectable(c, wanted), writes=True)

    def journal_row_count(self) -> Deferred[int]:
        """
        The number of journal rows.
        """
        return self._db.read(journal.row_count)

    def journal_rows_by_top(self, tops: Collection[str] | None) -> Deferred[dict[str, int]]:
        """
        The journal rows of each of C{tops} (L{None}: of every top with
        rows): L{svc.store.journal.rows_by_top}.
        """
        wanted = None if tops is None else sorted(tops)
        return self._db.read(lambda c: journal.rows_by_top(c, wanted))
