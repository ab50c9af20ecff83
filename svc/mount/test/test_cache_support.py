"""
Helpers shared by the chunk cache tests (no tests here): chunk values, a
serial worker that runs submitted calls only when told, and a cache opened
in a temporary directory with its audit lines collected.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any, TypeVar

import attrs
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from svc.audit.events import AuditEvent
from svc.chunking import chunk_hash
from svc.mount.chunks.cache import ChunkCache
from svc.mount.chunks.cache_index import CHUNKS_DIR_NAME, INDEX_NAME, chunk_path
from svc.testing.worker import ImmediateWorker, ManualWorker
from svc.worker import IWorker

T = TypeVar("T")


def chunk(seed: int, size: int = 100) -> tuple[str, bytes]:
    """A chunk of C{size} bytes distinct for each C{seed}, and its name."""
    data = (seed.to_bytes(4, "big") * (size // 4 + 1))[:size]
    return chunk_hash(data), data


@attrs.define
class Opened:
    """A cache under test and the world it was given."""

    cache: ChunkCache
    root: Path
    clock: Clock
    events: list[AuditEvent]

    def file_of(self, name: str) -> Path:
        """Where chunk C{name} is stored."""
        return chunk_path(self.root / CHUNKS_DIR_NAME, name)

    def index_rows(self) -> dict[str, tuple[int, int]]:
        """The index's C{hash -> (size, last_used_ms)}, read by a second connection."""
        connection = sqlite3.connect(self.root / INDEX_NAME)
        try:
            rows = connection.execute("SELECT hash, size, last_used_ms FROM chunks").fetchall()
        finally:
            connection.close()
        return {str(h): (int(size), int(used)) for h, size, used in rows}

    def event_names(self) -> list[str]:
        """The audit event names emitted so far."""
        return [event.event for event in self.events]


def open_cache(
    case: SynchronousTestCase,
    root: Path | None = None,
    *,
    clock: Clock | None = None,
    worker: IWorker | None = None,
    **options: Any,
) -> Opened:
    """
    Open a cache (in a new temporary directory unless C{root} is given)
    with an L{ImmediateWorker}, closing it when the test ends.
    """
    root = Path(case.mktemp()) if root is None else root
    clock = Clock() if clock is None else clock
    events: list[AuditEvent] = []
    opening = ChunkCache.open(
        root, worker or ImmediateWorker(), clock, emit=events.append, **options
    )
    if isinstance(worker, ManualWorker):
        worker.run()
    cache = case.successResultOf(opening)
    opened = Opened(cache, root, clock, events)

    def close() -> None:
        closing = cache.close()
        if isinstance(worker, ManualWorker):
            worker.run()
        case.successResultOf(closing)

    case.addCleanup(close)
    return opened
