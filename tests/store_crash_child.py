"""
Child process for the storage crash test: writes chunks and manifests into a
real storage engine (real threads, real fsync) as fast as it can, appending
one line to a commit log after each manifest commit is acknowledged, until it
is killed. Usage: python store_crash_child.py ROOT LOG SEED
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path
from typing import Any

from blake3 import blake3
from twisted.internet.defer import gatherResults
from twisted.internet.task import react

from svc.store.engine import StorageEngine, StorageRoots
from svc.store.errors import AlreadyExists, NotFound
from svc.store.layout import TenantLocation
from svc.store.manifest_values import ChunkRef, Writer
from svc.worker import ThreadWorker

FILES = 8
WRITER = Writer("a1", None)


async def run(reactor: Any, root: str, log_path: str, seed: int) -> None:
    engine = StorageEngine(
        StorageRoots.single(Path(root)),
        reactor,
        lambda name: ThreadWorker(reactor, name),
        ThreadWorker(reactor, "io", threads=3),
        lambda loc, revoke: None,
        lambda loc, event: None,
    )
    storage = await engine.tenant(TenantLocation.for_owner("acme"))
    try:
        await storage.dir_create("/a1", mode=0o755, uid=0, gid=0, writer=WRITER)
    except AlreadyExists:
        pass
    rng = random.Random(seed)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    print("READY", flush=True)
    counter = 0
    while True:
        path = f"/a1/f{rng.randrange(FILES)}"
        parts = []
        for _ in range(rng.randint(1, 3)):
            counter += 1
            data = blake3(f"{seed}:{counter}".encode()).digest(length=rng.randint(1, 256 * 1024))
            parts.append((blake3(data).hexdigest(), data))
        await gatherResults([storage.chunk_put("a1", h, d) for h, d in parts])
        try:
            version = (await storage.manifest_get(path)).attributes.version
        except NotFound:
            version = 0
        result = await storage.manifest_put(
            path,
            expected_version=version,
            chunks=[ChunkRef(h, len(d)) for h, d in parts],
            size=sum(len(d) for _, d in parts),
            mode=0o644,
            mtime_ns=0,
            uid=0,
            gid=0,
            writer=WRITER,
        )
        line = {"path": path, "version": result.version, "hashes": [h for h, _ in parts]}
        os.write(log_fd, json.dumps(line).encode() + b"\n")
        os.fsync(log_fd)


if __name__ == "__main__":
    root, log_path, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    react(lambda reactor: run(reactor, root, log_path, seed))
