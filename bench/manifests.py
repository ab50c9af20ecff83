"""
Benchmark of the manifest store (one tenant's routes.db).

    .venv/bin/python bench/manifests.py [--paths 10000] [--ops 2000] [--concurrency 16]

Fills a fresh routes.db in a temp directory with ``--paths`` files (two
chunks each, 100 per directory), then measures, through the real
L{ManifestStore} on a single-thread L{ThreadWorker} under the real reactor:
manifest_put updates and manifest_get, each awaited one at a time and with
``--concurrency`` in flight. As the reference measured in the same run, it
times raw C{sqlite3} on another file with the same settings (WAL,
synchronous=FULL): a single-row INSERT + COMMIT, UPDATE + COMMIT and a
primary-key SELECT. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import blake3
from twisted.internet import task
from twisted.internet.defer import Deferred, gatherResults

from svc.store.manifest_values import ChunkRef, Writer
from svc.store.manifests import ManifestStore
from svc.worker import ThreadWorker

WRITER = Writer("bench-agent", "mount:00")
PER_DIRECTORY = 100


def _chunks(index: int, version: int) -> list[ChunkRef]:
    return [
        ChunkRef(blake3.blake3(f"{index}/{version}/{part}".encode()).hexdigest(), 4 << 20)
        for part in range(2)
    ]


def _path(index: int) -> str:
    return f"/bench/d{index // PER_DIRECTORY:04d}/f{index % PER_DIRECTORY:03d}"


async def _in_flight(
    count: int, concurrency: int, operation: Callable[[int], Awaitable[object]]
) -> float:
    """Run ``operation(0..count-1)`` with ``concurrency`` in flight; ops per second."""
    next_index = iter(range(count))

    async def lane() -> None:
        for index in next_index:
            await operation(index)

    started = time.perf_counter()
    await gatherResults([Deferred.fromCoroutine(lane()) for _ in range(concurrency)])
    return count / (time.perf_counter() - started)


async def _measure_store(
    reactor: Any, directory: str, options: argparse.Namespace
) -> dict[str, Any]:
    worker = ThreadWorker(reactor, "routes-bench", threads=1)
    store = await ManifestStore.open(os.path.join(directory, "routes.db"), worker, reactor)
    versions = [0] * options.paths
    results: dict[str, Any] = {}
    try:
        await store.mkdir("/bench", mode=0o755, uid=0, gid=0, writer=WRITER)
        for start in range(0, options.paths, PER_DIRECTORY):
            await store.mkdir(
                _path(start).rsplit("/", 1)[0], mode=0o755, uid=0, gid=0, writer=WRITER
            )

        async def put(index: int) -> None:
            chunks = _chunks(index, versions[index])
            result = await store.put(
                _path(index),
                expected_version=versions[index],
                chunks=chunks,
                size=sum(c.size for c in chunks),
                mode=0o644,
                mtime_ns=0,
                uid=0,
                gid=0,
                writer=WRITER,
            )
            versions[index] = result.version

        async def get(index: int) -> None:
            await store.get(_path(index * 7919 % options.paths))

        results["put_create_ops_per_s"] = await _in_flight(options.paths, options.concurrency, put)
        stride = options.paths // options.ops or 1
        results["put_update_sequential_ops_per_s"] = await _in_flight(
            options.ops, 1, lambda i: put(i * stride % options.paths)
        )
        results[f"put_update_{options.concurrency}_in_flight_ops_per_s"] = await _in_flight(
            options.ops, options.concurrency, lambda i: put((i * stride + 1) % options.paths)
        )
        gets = options.ops * 4
        results["get_sequential_ops_per_s"] = await _in_flight(gets, 1, get)
        results[f"get_{options.concurrency}_in_flight_ops_per_s"] = await _in_flight(
            gets, options.concurrency, get
        )
        results["journal_rows"] = await store.journal_row_count()
    finally:
        await store.close()
        worker.stop()
    results["routes_db_bytes"] = sum(
        os.path.getsize(os.path.join(directory, name))
        for name in os.listdir(directory)
        if name.startswith("routes.db")
    )
    return results


def _measure_raw(directory: str, options: argparse.Namespace) -> dict[str, float]:
    """The same-run reference: plain sqlite3 with the store's settings."""
    connection = sqlite3.connect(os.path.join(directory, "raw.db"), isolation_level=None)
    try:
        connection.execute("PRAGMA journal_mode = WAL")
        connection.execute("PRAGMA synchronous = FULL")
        connection.execute(
            "CREATE TABLE manifests (path TEXT PRIMARY KEY, version INTEGER, chunks BLOB)"
        )
        blob = os.urandom(80)
        connection.execute("BEGIN")
        connection.executemany(
            "INSERT INTO manifests VALUES (?, 1, ?)",
            ((_path(i), blob) for i in range(options.paths)),
        )
        connection.execute("COMMIT")

        def timed(
            count: int, statement: str, args: Callable[[int], tuple[object, ...]], commit: bool
        ) -> float:
            started = time.perf_counter()
            for index in range(count):
                if commit:
                    connection.execute("BEGIN IMMEDIATE")
                connection.execute(statement, args(index)).fetchall()
                if commit:
                    connection.execute("COMMIT")
            return count / (time.perf_counter() - started)

        return {
            "raw_insert_commit_ops_per_s": timed(
                options.ops,
                "INSERT INTO manifests VALUES (?, 1, ?)",
                lambda i: (f"/new/{i}", blob),
                True,
            ),
            "raw_update_commit_ops_per_s": timed(
                options.ops,
                "UPDATE manifests SET version = version + 1, chunks = ? WHERE path = ?",
                lambda i: (blob, _path(i * 7 % options.paths)),
                True,
            ),
            "raw_select_ops_per_s": timed(
                options.ops * 4,
                "SELECT version, chunks FROM manifests WHERE path = ?",
                lambda i: (_path(i * 7919 % options.paths),),
                False,
            ),
        }
    finally:
        connection.close()


async def _main(reactor: Any, options: argparse.Namespace) -> None:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="routes-bench-") as directory:
        results: dict[str, Any] = {
            "paths": options.paths,
            "ops": options.ops,
            "concurrency": options.concurrency,
        }
        results.update(await _measure_store(reactor, directory, options))
        results.update(_measure_raw(directory, options))
    results["put_vs_raw_update"] = round(
        results["put_update_sequential_ops_per_s"] / results["raw_update_commit_ops_per_s"], 3
    )
    results["get_vs_raw_select"] = round(
        results["get_sequential_ops_per_s"] / results["raw_select_ops_per_s"], 3
    )
    results["wall_seconds"] = time.perf_counter() - started
    print(
        json.dumps(
            {k: round(v, 1) if k.endswith(("_per_s", "seconds")) else v for k, v in results.items()}
        )
    )


def main() -> None:
    """Parse the options and run the benchmark under the reactor."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--paths", type=int, default=10_000)
    parser.add_argument("--ops", type=int, default=2_000)
    parser.add_argument("--concurrency", type=int, default=16)
    options = parser.parse_args()
    task.react(lambda reactor: Deferred.fromCoroutine(_main(reactor, options)))


if __name__ == "__main__":
    main()
