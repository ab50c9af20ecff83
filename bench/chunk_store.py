"""
Chunk-store throughput next to plain file I/O of the same bytes, in one run.

    .venv/bin/python bench/chunk_store.py [--dir DIR] [--total-mib 256]
        [--chunk-mib 4] [--threads 4] [--depth 4]

Measures, on the same disk and in the same process:

- reference write: per chunk, write a temp file, fsync it, rename it (no
  hashing; once without and once with the directory fsync a durable put
  needs); reference read: open and read each file;
- C{FilesystemChunkStore.put} / C{read} through a real L{ThreadWorker} on
  the real reactor, one request in flight ("seq") and C{--depth} in flight
  ("pipelined"). A put also re-hashes the bytes and fsyncs the shard
  directory; a read (reported as "get") re-hashes what it read, and its
  lent buffer is released once the length is taken, as the data plane
  releases it once the reply is written.

Page-cache copies are dropped (C{posix_fadvise(DONTNEED)} on the synced
files) before every read phase, so reads come from the device for both.
The contenders take turns for C{--rounds} rounds; the median is reported,
with every sample. Prints one JSON object; MB is 10**6 bytes.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.task import react

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from svc.store.chunks import ChunkData, chunk_hash
from svc.store.chunkstore_fs import FilesystemChunkStore
from svc.worker import ThreadWorker

MIB = 1024 * 1024


def _drop_cache(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _reference_write(
    root: Path, chunks: Sequence[tuple[str, bytes]], *, sync_dir: bool = False
) -> float:
    root.mkdir(parents=True)
    start = time.perf_counter()
    for name, data in chunks:
        temp = root / f".tmp.{name}"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            view = memoryview(data)
            written = 0
            while written < len(data):
                written += os.write(fd, view[written:])
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temp, root / name)
        if sync_dir:
            dir_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
    return time.perf_counter() - start


def _reference_read(root: Path, chunks: Sequence[tuple[str, bytes]]) -> float:
    start = time.perf_counter()
    for name, data in chunks:
        with open(root / name, "rb", buffering=0) as f:
            if len(f.read()) != len(data):
                raise RuntimeError("short read")
    return time.perf_counter() - start


async def _timed(
    operations: Sequence[Callable[[], Deferred[Any]]], depth: int
) -> tuple[float, list[Any]]:
    """
    Run C{operations} keeping at most C{depth} in flight; seconds taken.
    """
    results: list[Any] = [None] * len(operations)
    queue = iter(enumerate(operations))

    async def lane() -> None:
        for index, operation in queue:
            results[index] = await operation()

    start = time.perf_counter()
    lanes: list[Awaitable[None]] = [Deferred.fromCoroutine(lane()) for _ in range(depth)]
    await gatherResults(lanes)  # type: ignore[arg-type]
    return time.perf_counter() - start, results


def _mb_per_s(total: int, seconds: float) -> float:
    return round(total / seconds / 1e6, 1)


async def _put_all(
    store: FilesystemChunkStore, chunks: Sequence[tuple[str, bytes]], depth: int
) -> float:
    await store.open()
    seconds, results = await _timed([functools.partial(store.put, n, d) for n, d in chunks], depth)
    if any(r.deduped for r in results):
        raise RuntimeError("unexpected dedup")
    return seconds


async def _get_all(
    store: FilesystemChunkStore, chunks: Sequence[tuple[str, bytes]], depth: int
) -> float:
    def get_length(name: str) -> Deferred[int]:
        # Serve the way the data plane does: a lent buffer, released once
        # used (here: measured). Keep only the length.
        def used(chunk: ChunkData) -> int:
            size = len(chunk.data)
            chunk.release()
            return size

        return store.read(name).addCallback(used)

    _drop_cache(store.objects_dir)
    seconds, lengths = await _timed([functools.partial(get_length, n) for n, _ in chunks], depth)
    if lengths != [len(d) for _, d in chunks]:
        raise RuntimeError("short get")
    return seconds


async def _run(reactor: Any, options: argparse.Namespace) -> None:
    chunk_bytes = options.chunk_mib * MIB
    count = max(1, options.total_mib // options.chunk_mib)
    total = count * chunk_bytes
    chunks = []
    for _ in range(count):
        data = os.urandom(chunk_bytes)
        chunks.append((chunk_hash(data), data))

    base = Path(tempfile.mkdtemp(prefix="svc-bench-chunks-", dir=options.dir))
    worker = ThreadWorker(reactor, "bench-chunk-store", threads=options.threads)
    seconds: dict[str, list[float]] = {}

    def record(label: str, value: float) -> None:
        seconds.setdefault(label, []).append(value)

    try:
        # Writes: each round writes the same bytes to fresh directories, the
        # three contenders taking turns so that drift hits them alike.
        for round_number in range(options.rounds):
            here = base / f"round{round_number}"
            record("write", _reference_write(here / "reference", chunks))
            durable = _reference_write(here / "reference-dirsync", chunks, sync_dir=True)
            record("write_dirsync", durable)
            store = FilesystemChunkStore(here / "seq" / "objects", worker)
            record("put_seq", await _put_all(store, chunks, 1))
            other = FilesystemChunkStore(here / "pipelined" / "objects", worker)
            record("put_pipelined", await _put_all(other, chunks, options.depth))
        # Reads of the last round's files, from the device each time.
        reference = base / f"round{options.rounds - 1}" / "reference"
        for _ in range(options.rounds):
            _drop_cache(reference)
            record("read", _reference_read(reference, chunks))
            record("get_seq", await _get_all(store, chunks, 1))
            record("get_pipelined", await _get_all(store, chunks, options.depth))
    finally:
        worker.stop()
        if not options.keep:
            shutil.rmtree(base, ignore_errors=True)

    rate = {label: _mb_per_s(total, statistics.median(v)) for label, v in seconds.items()}
    print(
        json.dumps(
            {
                "benchmark": "chunk_store",
                "unit": "MB/s (10**6 bytes), median of rounds",
                "chunk_bytes": chunk_bytes,
                "chunks": count,
                "total_bytes": total,
                "rounds": options.rounds,
                "worker_threads": options.threads,
                "pipeline_depth": options.depth,
                "directory": str(options.dir or tempfile.gettempdir()),
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
                "ours": {
                    "put_seq": rate["put_seq"],
                    "put_pipelined": rate["put_pipelined"],
                    "get_seq": rate["get_seq"],
                    "get_pipelined": rate["get_pipelined"],
                },
                "reference": {
                    "write_fsync_rename": rate["write"],
                    "write_fsync_rename_fsync_dir": rate["write_dirsync"],
                    "read": rate["read"],
                },
                "ratios": {
                    "put_seq_vs_write": round(rate["put_seq"] / rate["write"], 2),
                    "put_pipelined_vs_write": round(rate["put_pipelined"] / rate["write"], 2),
                    "put_seq_vs_write_fsync_dir": round(rate["put_seq"] / rate["write_dirsync"], 2),
                    "get_seq_vs_read": round(rate["get_seq"] / rate["read"], 2),
                    "get_pipelined_vs_read": round(rate["get_pipelined"] / rate["read"], 2),
                },
                "samples_mb_per_s": {
                    label: [_mb_per_s(total, v) for v in values]
                    for label, values in seconds.items()
                },
            },
            indent=2,
        )
    )


def main(argv: Sequence[str] | None = None) -> None:
    """
    Parse the options and run the benchmark on the real reactor.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1] if __doc__ else None)
    parser.add_argument("--dir", default=None, help="where to write (default: $TMPDIR)")
    parser.add_argument("--total-mib", type=int, default=256)
    parser.add_argument("--chunk-mib", type=int, default=4)
    parser.add_argument("--threads", type=int, default=4, help="ThreadWorker threads")
    parser.add_argument("--depth", type=int, default=4, help="requests in flight (pipelined)")
    parser.add_argument("--rounds", type=int, default=3, help="repetitions (median kept)")
    parser.add_argument("--keep", action="store_true", help="leave the files behind")
    options = parser.parse_args(argv)
    react(lambda reactor: Deferred.fromCoroutine(_run(reactor, options)))


if __name__ == "__main__":
    main()
