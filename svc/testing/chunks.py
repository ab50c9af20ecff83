"""
An in-memory L{svc.store.chunks.IChunkStore} for unit tests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.task import Clock

from svc.store.chunks import (
    ChunkData,
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
from svc.store.errors import NotFound

T = TypeVar("T")


class _Clock(Protocol):
    def seconds(self) -> float: ...


def _fired(fn: Callable[[], T]) -> Deferred[T]:
    try:
        return succeed(fn())
    except Exception:
        return fail()


class MemoryChunkStore:
    """
    Chunks in a dict, with the same contract as the filesystem store.

    Every L{Deferred} it returns has already fired. Modification times come
    from C{clock} (a L{Clock} by default, so they start at zero and move only
    when a test advances it), which is what GC grace-period tests need.
    """

    def __init__(self, clock: _Clock | None = None) -> None:
        self._clock: _Clock = clock if clock is not None else Clock()
        self._chunks: dict[str, bytes] = {}
        self._mtimes: dict[str, int] = {}
        self._total = 0

    def _now_ns(self) -> int:
        return int(self._clock.seconds() * 1_000_000_000)

    def put(self, chunk_hash: str, data: bytes | memoryview) -> Deferred[ChunkPutResult]:
        """
        See L{svc.store.chunks.IChunkStore.put}.
        """
        return _fired(lambda: self._put(chunk_hash, data))

    def _put(self, name: str, data: bytes | memoryview) -> ChunkPutResult:
        check_chunk_hash(name)
        view = chunk_bytes_view(data)
        actual = chunk_hash(view)
        if actual != name:
            raise ChunkHashMismatch(name, actual)
        self._mtimes[name] = self._now_ns()
        if name in self._chunks:
            return ChunkPutResult(hash=name, size=view.nbytes, deduped=True)
        self._chunks[name] = view.tobytes()
        self._total += view.nbytes
        return ChunkPutResult(hash=name, size=view.nbytes, deduped=False)

    def get(self, chunk_hash: str) -> Deferred[bytes]:
        """
        See L{svc.store.chunks.IChunkStore.get}.
        """
        return _fired(lambda: self._get(chunk_hash))

    def _get(self, name: str) -> bytes:
        check_chunk_hash(name)
        try:
            data = self._chunks[name]
        except KeyError:
            raise NotFound(f"chunk {name} not present") from None
        if chunk_hash(data) != name:
            self._remove(name)
            raise CorruptStoredChunk(name)
        return data

    def read(self, chunk_hash: str) -> Deferred[ChunkData]:
        """
        See L{svc.store.chunks.IChunkStore.read}: a view of the stored bytes.
        """
        return _fired(lambda: ChunkData(memoryview(self._get(chunk_hash))))

    def has(self, hashes: Sequence[str]) -> Deferred[ChunkHasResult]:
        """
        See L{svc.store.chunks.IChunkStore.has}.
        """
        return _fired(lambda: self._has(hashes))

    def _has(self, hashes: Sequence[str]) -> ChunkHasResult:
        names = check_chunk_hashes(hashes)
        return ChunkHasResult(
            present=tuple(h for h in names if h in self._chunks),
            absent=tuple(h for h in names if h not in self._chunks),
        )

    def stat(self, chunk_hash: str) -> Deferred[ChunkInfo]:
        """
        See L{svc.store.chunks.IChunkStore.stat}.
        """
        return _fired(lambda: self._stat(chunk_hash))

    def _stat(self, name: str) -> ChunkInfo:
        check_chunk_hash(name)
        if name not in self._chunks:
            raise NotFound(f"chunk {name} not present")
        return ChunkInfo(hash=name, size=len(self._chunks[name]), mtime_ns=self._mtimes[name])

    def delete(
        self, hashes: Sequence[str], *, modified_before_ns: int | None = None
    ) -> Deferred[ChunkDeleteResult]:
        """
        See L{svc.store.chunks.IChunkStore.delete}.
        """
        return _fired(lambda: self._delete(hashes, modified_before_ns))

    def _delete(self, hashes: Sequence[str], modified_before_ns: int | None) -> ChunkDeleteResult:
        names = check_chunk_hashes(hashes)
        deleted: list[str] = []
        missing: list[str] = []
        kept: list[str] = []
        freed = 0
        for name in names:
            if name not in self._chunks:
                missing.append(name)
            elif modified_before_ns is not None and self._mtimes[name] >= modified_before_ns:
                kept.append(name)
            else:
                freed += self._remove(name)
                deleted.append(name)
        return ChunkDeleteResult(
            deleted=tuple(deleted),
            missing=tuple(missing),
            kept=tuple(kept),
            errors=(),
            bytes_freed=freed,
        )

    def _remove(self, name: str) -> int:
        size = len(self._chunks.pop(name))
        del self._mtimes[name]
        self._total -= size
        return size

    def list_chunks(self) -> Deferred[list[ChunkInfo]]:
        """
        See L{svc.store.chunks.IChunkStore.list_chunks}.
        """
        return succeed([self._stat(name) for name in sorted(self._chunks)])

    def total_bytes(self) -> Deferred[int]:
        """
        See L{svc.store.chunks.IChunkStore.total_bytes}.
        """
        return succeed(self._total)

    def corrupt(self, chunk_hash: str, data: bytes) -> None:
        """
        Test hook: replace a stored chunk's bytes without verification, the
        way a failing disk would. The running total follows the new size.
        """
        old = self._chunks[chunk_hash]
        self._chunks[chunk_hash] = data
        self._total += len(data) - len(old)
