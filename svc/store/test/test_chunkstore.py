"""
Tests for L{svc.store.chunkstore_fs} and L{svc.testing.chunks}: the shared
contract against both, then what only the filesystem layout can show.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from svc.store.chunks import (
    MAX_CHUNK_SIZE,
    ChunkPutResult,
    CorruptStoredChunk,
    IChunkStore,
    chunk_hash,
)
from svc.store.chunkstore_fs import (
    QUARANTINE_DIR_NAME,
    TEMP_PREFIX,
    FilesystemChunkStore,
    OpenReport,
    open_filesystem_chunk_store,
)
from svc.store.errors import NotFound, StorageIOError
from svc.store.layout import chunk_path
from svc.store.test.chunkstore_contract import NOW_NS, ChunkStoreContractMixin, chunk
from svc.testing.chunks import MemoryChunkStore
from svc.testing.worker import ImmediateWorker
from svc.wire.errno import WireErrno

T = TypeVar("T")


class MemoryChunkStoreTests(ChunkStoreContractMixin, SynchronousTestCase):
    """
    The contract, run against L{MemoryChunkStore}.
    """

    def make_store(self) -> IChunkStore:
        clock = Clock()
        clock.advance(NOW_NS / 1e9)
        return MemoryChunkStore(clock)

    def corrupt_chunk(self, store: IChunkStore, name: str, data: bytes) -> None:
        cast(MemoryChunkStore, store).corrupt(name, data)

    def set_mtime(self, store: IChunkStore, name: str, mtime_ns: int) -> None:
        cast(Any, store)._mtimes[name] = mtime_ns

    def test_mtime_follows_clock(self) -> None:
        """Chunk mtimes come from the injected clock."""
        clock = Clock()
        store = MemoryChunkStore(clock)
        clock.advance(12.5)
        name, data = chunk(1)
        self.successResultOf(store.put(name, data))
        self.assertEqual(self.successResultOf(store.stat(name)).mtime_ns, 12_500_000_000)


class FilesystemChunkStoreContractTests(ChunkStoreContractMixin, SynchronousTestCase):
    """
    The contract, run against L{FilesystemChunkStore} with an inline worker.
    """

    def make_store(self) -> IChunkStore:
        return self.successResultOf(
            open_filesystem_chunk_store(Path(self.mktemp()) / "objects", ImmediateWorker())
        )

    def corrupt_chunk(self, store: IChunkStore, name: str, data: bytes) -> None:
        path = chunk_path(cast(FilesystemChunkStore, store).objects_dir, name)
        path.chmod(0o600)
        path.write_bytes(data)

    def set_mtime(self, store: IChunkStore, name: str, mtime_ns: int) -> None:
        path = chunk_path(cast(FilesystemChunkStore, store).objects_dir, name)
        os.utime(path, ns=(mtime_ns, mtime_ns))


def _tree(root: Path) -> set[str]:
    """
    Every file and directory below C{root}, as relative POSIX paths.
    """
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


class FilesystemChunkStoreTests(SynchronousTestCase):
    """
    What only the on-disk implementation can show: layout, temporary files,
    modes, recovery at open.
    """

    def setUp(self) -> None:
        self.objects = Path(self.mktemp()) / "owner" / "store" / "objects"
        self.worker = ImmediateWorker()

    def open_store(self) -> tuple[FilesystemChunkStore, OpenReport]:
        store = FilesystemChunkStore(self.objects, self.worker)
        report = self.successResultOf(store.open())
        return store, report

    def test_layout(self) -> None:
        """A chunk is stored exactly at objects/<first 2 hex>/<hash>, nothing else."""
        store, _ = self.open_store()
        names = [chunk(seed)[0] for seed in range(3)]
        for seed in range(3):
            self.successResultOf(store.put(*chunk(seed)))
        expected = {n[:2] for n in names} | {f"{n[:2]}/{n}" for n in names}
        self.assertEqual(_tree(self.objects), expected)
        for seed, name in enumerate(names):
            self.assertEqual((self.objects / name[:2] / name).read_bytes(), chunk(seed)[1])

    def test_no_temp_files_left(self) -> None:
        """Fresh puts, deduped puts and rejected puts leave no temporary file."""
        store, _ = self.open_store()
        name, data = chunk(1)
        self.successResultOf(store.put(name, data))
        self.successResultOf(store.put(name, data))
        self.failureResultOf(store.put(name, data + b"!"))
        self.assertEqual(_tree(self.objects), {name[:2], f"{name[:2]}/{name}"})

    def test_open_removes_temp_files(self) -> None:
        """Temporary files left by an interrupted put are removed at open and not counted."""
        store, _ = self.open_store()
        name, data = chunk(2, 600)
        self.successResultOf(store.put(name, data))
        shard = self.objects / name[:2]
        (shard / f"{TEMP_PREFIX}{name}.0123456789abcdef").write_bytes(b"half")
        (self.objects / "7f").mkdir()
        (self.objects / "7f" / f"{TEMP_PREFIX}{'7f' * 32}.feedfacefeedface").write_bytes(b"")
        _, report = self.open_store()
        self.assertEqual(
            report,
            OpenReport(chunk_count=1, total_bytes=600, removed_temp_files=2, ignored_entries=0),
        )
        self.assertEqual(_tree(self.objects), {name[:2], f"{name[:2]}/{name}", "7f"})

    def test_reopen_recomputes_total(self) -> None:
        """A reopened store counts every chunk on disk once and agrees with list_chunks."""
        store, _ = self.open_store()
        sizes = {}
        for seed in range(8):
            name, data = chunk(seed, 100 * seed + 1)
            self.successResultOf(store.put(name, data))
            sizes[name] = len(data)
        self.successResultOf(store.delete([chunk(3, 301)[0]]))
        del sizes[chunk(3, 301)[0]]
        reopened, report = self.open_store()
        self.assertEqual((report.chunk_count, report.total_bytes), (7, sum(sizes.values())))
        self.assertEqual(self.successResultOf(reopened.total_bytes()), sum(sizes.values()))
        listed = self.successResultOf(reopened.list_chunks())
        self.assertEqual({i.hash: i.size for i in listed}, sizes)

    def test_open_ignores_foreign_entries(self) -> None:
        """Unrecognised names are left alone, not counted, and never listed."""
        self.objects.mkdir(parents=True)
        name = chunk(1)[0]
        (self.objects / "README").write_text("x")
        (self.objects / "zz").mkdir()
        wrong_shard = self.objects / ("00" if name[:2] != "00" else "01")
        wrong_shard.mkdir()
        (wrong_shard / name).write_bytes(b"wrong shard")
        (wrong_shard / "notes.txt").write_bytes(b"x")
        store, report = self.open_store()
        self.assertEqual(
            report,
            OpenReport(chunk_count=0, total_bytes=0, removed_temp_files=0, ignored_entries=4),
        )
        self.assertEqual(self.successResultOf(store.list_chunks()), [])
        self.assertTrue((self.objects / "README").exists())

    def test_modes(self) -> None:
        """Created directories are 0700 and chunk files 0600."""
        store, _ = self.open_store()
        name, data = chunk(4)
        self.successResultOf(store.put(name, data))
        for directory in (self.objects.parent.parent, self.objects, self.objects / name[:2]):
            self.assertEqual(stat.S_IMODE(directory.stat().st_mode), 0o700, directory)
        self.assertEqual(stat.S_IMODE((self.objects / name[:2] / name).stat().st_mode), 0o600)

    def test_corrupt_file_quarantined(self) -> None:
        """A chunk file that fails verification is moved to quarantine, never returned."""
        store, _ = self.open_store()
        name, data = chunk(5, 900)
        self.successResultOf(store.put(name, data))
        path = self.objects / name[:2] / name
        path.write_bytes(data[:-1] + b"\x00")
        self.failureResultOf(store.get(name), CorruptStoredChunk)
        self.assertFalse(path.exists())
        quarantined = list((self.objects / QUARANTINE_DIR_NAME).iterdir())
        self.assertEqual(len(quarantined), 1)
        self.assertTrue(quarantined[0].name.startswith(name + "."))
        self.assertEqual(quarantined[0].read_bytes(), data[:-1] + b"\x00")
        self.assertEqual(self.open_store()[1].ignored_entries, 0)

    def test_truncated_file_never_served(self) -> None:
        """A truncated chunk file fails verification and leaves the total."""
        store, _ = self.open_store()
        name, data = chunk(6, 900)
        self.successResultOf(store.put(name, data))
        (self.objects / name[:2] / name).write_bytes(data[:100])
        store, report = self.open_store()
        self.assertEqual(report.total_bytes, 100)
        self.failureResultOf(store.get(name), CorruptStoredChunk)
        self.assertEqual(self.successResultOf(store.total_bytes()), 0)

    def test_wrong_size_file_replaced_by_put(self) -> None:
        """A put over a file of the wrong size stores the good bytes and fixes the total."""
        store, _ = self.open_store()
        name, data = chunk(7, 900)
        self.successResultOf(store.put(name, data))
        (self.objects / name[:2] / name).write_bytes(data[:100])
        store, _ = self.open_store()
        result = self.successResultOf(store.put(name, data))
        self.assertFalse(result.deduped)
        self.assertEqual(self.successResultOf(store.get(name)), data)
        self.assertEqual(self.successResultOf(store.total_bytes()), 900)

    def test_reads_reuse_one_buffer(self) -> None:
        """
        Reads released one after another all use one buffer, with the
        filesystem's O_DIRECT choice the same as the writer's.
        """
        store, _ = self.open_store()
        stored = [chunk(seed, 3000 * seed) for seed in (1, 2, 3)]
        for name, data in stored:
            self.successResultOf(store.put(name, data))
        for _ in range(4):
            for name, data in stored:
                lent = self.successResultOf(store.read(name))
                self.assertEqual(bytes(lent.data), data)
                lent.release()
        internals = cast(Any, store)
        self.assertEqual(internals._read_buffers.created, 1)
        self.assertEqual(internals._reader.direct, internals._writer.direct)

    def test_held_bytes_survive_later_reads(self) -> None:
        """
        A slice somebody kept of a released read keeps its buffer out of
        reuse, so a later read cannot change it; the released view itself
        refuses use instead of showing other bytes.
        """
        store, _ = self.open_store()
        (first, first_data), (second, second_data) = chunk(11, 5000), chunk(12, 5000)
        self.successResultOf(store.put(first, first_data))
        self.successResultOf(store.put(second, second_data))
        lent = self.successResultOf(store.read(first))
        kept = lent.data[100:200]
        lent.release()
        with self.assertRaises(ValueError):
            bytes(lent.data)
        later = self.successResultOf(store.read(second))
        self.assertEqual(bytes(later.data), second_data)
        later.release()
        self.assertEqual(bytes(kept), first_data[100:200])
        self.assertEqual(cast(Any, store)._read_buffers.created, 2)

    def test_largest_chunk_read_back(self) -> None:
        """A chunk of MAX_CHUNK_SIZE bytes (the buffer's limit) reads back whole."""
        store, _ = self.open_store()
        data = bytes(range(256)) * (MAX_CHUNK_SIZE // 256)
        name = chunk_hash(data)
        self.successResultOf(store.put(name, data))
        self.assertEqual(self.successResultOf(store.get(name)), data)

    def test_oversized_file_never_served(self) -> None:
        """A chunk file longer than any chunk (grown on disk) is quarantined, not read in part."""
        store, _ = self.open_store()
        name, data = chunk(13, 900)
        self.successResultOf(store.put(name, data))
        path = self.objects / name[:2] / name
        path.chmod(0o600)
        with path.open("ab") as grown:
            grown.truncate(MAX_CHUNK_SIZE + 1)
        self.failureResultOf(store.read(name), CorruptStoredChunk)
        self.assertFalse(path.exists())

    def test_symlink_not_a_chunk(self) -> None:
        """A symlink at a chunk's name is never a chunk: not present, listed, counted or read."""
        store, _ = self.open_store()
        name, data = chunk(8)
        outside = Path(self.mktemp())
        outside.write_bytes(data)
        (self.objects / name[:2]).mkdir()
        (self.objects / name[:2] / name).symlink_to(outside.resolve())
        self.assertEqual(self.successResultOf(store.has([name])).absent, (name,))
        self.failureResultOf(store.stat(name), NotFound)
        self.failureResultOf(store.get(name), StorageIOError)
        self.assertEqual(self.successResultOf(store.list_chunks()), [])
        self.assertEqual(self.open_store()[1].chunk_count, 0)

    def test_io_error_translated(self) -> None:
        """An OSError while writing becomes a StorageIOError (EIO) and nothing is counted."""
        name, data = chunk(9)
        self.objects.mkdir(parents=True)
        (self.objects / name[:2]).write_bytes(b"a file where a shard should be")
        store, _ = self.open_store()
        failure = self.failureResultOf(store.put(name, data), StorageIOError)
        self.assertEqual(failure.value.errno, WireErrno.EIO)
        self.assertEqual(self.successResultOf(store.total_bytes()), 0)

    def test_used_before_open(self) -> None:
        """Operations before open() has fired fail with RuntimeError."""
        store = FilesystemChunkStore(self.objects, self.worker)
        self.failureResultOf(store.put(*chunk(1)), RuntimeError)
        self.failureResultOf(store.total_bytes(), RuntimeError)
        self.failureResultOf(store.list_chunks(), RuntimeError)
        self.assertFalse(self.objects.exists())

    def test_blocking_work_goes_through_worker(self) -> None:
        """Open, put, get, has, stat, delete and list each submit to the worker."""
        store, _ = self.open_store()
        name, data = chunk(10)
        before = self.worker.calls
        self.successResultOf(store.put(name, data))
        self.successResultOf(store.get(name))
        self.successResultOf(store.has([name]))
        self.successResultOf(store.stat(name))
        self.successResultOf(store.list_chunks())
        self.successResultOf(store.delete([name]))
        self.assertEqual(self.worker.calls - before, 6)

    def test_concurrent_puts_of_one_chunk(self) -> None:
        """Racing puts of one chunk on real threads store it once; one reports fresh."""
        worker = _ThreadPerCallWorker()
        store = FilesystemChunkStore(self.objects, worker)
        opened = store.open()
        worker.run_all()
        self.successResultOf(opened)
        name, data = chunk(11, 1 << 20)
        puts = [store.put(name, data) for _ in range(8)]
        worker.run_all()
        results: list[ChunkPutResult] = [self.successResultOf(d) for d in puts]
        self.assertEqual(sorted(r.deduped for r in results), [False] + [True] * 7)
        self.assertEqual(self.successResultOf(store.total_bytes()), 1 << 20)
        self.assertEqual(_tree(self.objects), {name[:2], f"{name[:2]}/{name}"})


class _ThreadPerCallWorker:
    """
    An IWorker that runs every submitted call on its own thread, all started
    together by L{run_all}, which joins them and fires the results on the
    calling thread: real concurrency without a reactor.
    """

    def __init__(self) -> None:
        self._pending: list[tuple[Callable[[], Any], Deferred[Any]]] = []

    def submit(self, fn: Callable[[], T]) -> Deferred[T]:
        d: Deferred[T] = Deferred()
        self._pending.append((fn, d))
        return d

    def run_all(self) -> None:
        pending, self._pending = self._pending, []
        start = threading.Barrier(len(pending))
        outcomes: list[Deferred[Any]] = [succeed(None)] * len(pending)

        def run(index: int, fn: Callable[[], Any]) -> None:
            start.wait()
            try:
                outcomes[index] = succeed(fn())
            except Exception:
                outcomes[index] = fail()

        threads = [threading.Thread(target=run, args=(i, fn)) for i, (fn, _) in enumerate(pending)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for (_, d), outcome in zip(pending, outcomes, strict=True):
            outcome.chainDeferred(d)
