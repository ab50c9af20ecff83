"""
The content-addressed chunk store: its interface, values and errors.

A chunk is a run of at most L{MAX_CHUNK_SIZE} bytes named by the BLAKE3-256
hash of its bytes, written as 64 lowercase hex digits. Identical bytes are
stored once. Implementations: L{svc.store.chunkstore_fs.FilesystemChunkStore}
(the spec's on-disk layout) and L{svc.testing.chunks.MemoryChunkStore}; both
pass C{svc.store.test.chunkstore_contract.ChunkStoreContractMixin}. Nothing
in this interface is filesystem-specific, so an object-store backend can
implement it too. Semantics are written down in
C{docs/specifications/chunk-store.md}.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

import attrs
from blake3 import blake3
from twisted.internet.defer import Deferred

from svc.store.errors import CorruptChunk, InvalidArgument
from svc.store.layout import is_chunk_hash
from svc.wire.errno import WireErrno

MAX_CHUNK_SIZE = 16 * 1024 * 1024
"""The largest chunk the store accepts (the chunker's maximum)."""


def chunk_hash(data: bytes | memoryview) -> str:
    """
    The name of a chunk: BLAKE3-256 of its bytes as 64 lowercase hex digits.
    """
    return blake3(data).hexdigest()


def check_chunk_hash(value: str) -> str:
    """
    Return C{value} if it is a chunk hash, else raise L{InvalidArgument}.
    """
    if not isinstance(value, str) or not is_chunk_hash(value):
        raise InvalidArgument(f"not a chunk hash: {value!r:.80}")
    return value


def check_chunk_hashes(values: Iterable[str]) -> tuple[str, ...]:
    """
    The distinct hashes of C{values} in first-seen order; L{InvalidArgument}
    if any of them is malformed (the whole batch is refused).
    """
    seen: dict[str, None] = {}
    for value in values:
        seen[check_chunk_hash(value)] = None
    return tuple(seen)


def chunk_bytes_view(data: bytes | memoryview) -> memoryview:
    """
    A flat byte view of C{data}; L{InvalidArgument} when it exceeds
    L{MAX_CHUNK_SIZE}.
    """
    view = memoryview(data)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    if view.nbytes > MAX_CHUNK_SIZE:
        raise InvalidArgument(f"chunk of {view.nbytes} bytes exceeds {MAX_CHUNK_SIZE}")
    return view


class ChunkHashMismatch(CorruptChunk):
    """
    Bytes offered to L{IChunkStore.put} do not hash to the name they were
    offered under (EINVAL: the client's fault). Nothing was stored.
    """

    errno = WireErrno.EINVAL

    def __init__(self, expected: str, actual: str) -> None:
        super().__init__(f"chunk offered as {expected} hashes to {actual}")
        self.expected = expected
        self.actual = actual


class CorruptStoredChunk(CorruptChunk):
    """
    A stored chunk no longer hashes to its name (EIO). The bytes were not
    returned; the store has withdrawn the chunk, so it now reads as absent
    and a later put of the right bytes stores it again.
    """

    errno = WireErrno.EIO

    def __init__(self, chunk_hash: str) -> None:
        super().__init__(f"stored chunk {chunk_hash} failed verification")
        self.chunk_hash = chunk_hash


def _nothing_to_release() -> None:
    pass


@attrs.frozen
class ChunkData:
    """
    A chunk's verified bytes as L{IChunkStore.read} returns them.

    C{data} is a read-only view, possibly of a reused buffer. Call
    C{release} once nothing needs the bytes any more (for the data plane:
    once the reply frame was handed to TLS); after it, C{data} must not be
    used (a view of a pooled buffer then raises C{ValueError}). Not calling
    it is safe: the buffer is then freed, not reused.
    """

    data: memoryview
    release: Callable[[], None] = _nothing_to_release


@attrs.frozen
class ChunkPutResult:
    """
    The outcome of a put: what audit (C{chunk_put}: hash, size) and metrics
    (C{svc_chunks_total} state C{cached} or C{deduped}) need.

    C{deduped} is true when the content was already stored and nothing was
    written.
    """

    hash: str
    size: int
    deduped: bool


@attrs.frozen
class ChunkInfo:
    """
    One stored chunk: its size in bytes and the time it was last stored or
    re-offered (nanoseconds since the epoch), which a garbage collector
    compares with its grace period.
    """

    hash: str
    size: int
    mtime_ns: int


@attrs.frozen
class ChunkHasResult:
    """
    The answer to a batched presence probe: the distinct hashes asked about,
    split into C{present} and C{absent}, each in request order.
    """

    present: tuple[str, ...]
    absent: tuple[str, ...]

    def as_dict(self) -> dict[str, bool]:
        """
        C{{hash: present?}} for every distinct hash asked about.
        """
        answer = dict.fromkeys(self.absent, False)
        answer.update(dict.fromkeys(self.present, True))
        return answer


@attrs.frozen
class ChunkDeleteFailure:
    """
    A chunk a batched delete could not remove, and why (for the log only).
    """

    hash: str
    reason: str


@attrs.frozen
class ChunkDeleteResult:
    """
    The outcome of a batched delete, for GC and the
    C{svc_chunk_batch_items_total} results C{deleted}, C{missing}, C{error}.

    C{kept} lists chunks left in place because they were stored or
    re-offered at or after the C{modified_before_ns} cut-off the caller gave.
    C{bytes_freed} sums the sizes of the C{deleted} chunks.
    """

    deleted: tuple[str, ...]
    missing: tuple[str, ...]
    kept: tuple[str, ...]
    errors: tuple[ChunkDeleteFailure, ...]
    bytes_freed: int


class IChunkStore(Protocol):
    """
    A content-addressed store of chunks. Every method returns a L{Deferred};
    malformed hashes fail with L{InvalidArgument} before anything is done.
    """

    def put(self, chunk_hash: str, data: bytes | memoryview) -> Deferred[ChunkPutResult]:
        """
        Store C{data} under C{chunk_hash}, durably, before firing.

        Fails with L{InvalidArgument} when C{data} exceeds
        L{MAX_CHUNK_SIZE} and with L{ChunkHashMismatch} (EINVAL) when
        C{data} does not hash to C{chunk_hash}; nothing is stored then. When
        the chunk is already present it is not rewritten: the result says
        C{deduped=True} and the chunk's mtime is refreshed, restarting its GC
        grace period. The caller must not change a mutable buffer before the
        L{Deferred} fires.
        """

    def get(self, chunk_hash: str) -> Deferred[bytes]:
        """
        The bytes of a chunk, verified against its name.

        Fails with L{svc.store.errors.NotFound} when absent and with
        L{CorruptStoredChunk} (EIO) when the stored bytes do not verify;
        corrupt bytes are never returned.
        """

    def read(self, chunk_hash: str) -> Deferred[ChunkData]:
        """
        The bytes of a chunk, verified against its name, lent rather than
        copied (see L{ChunkData}): the way to serve a chunk. Fails like
        L{get}.
        """

    def has(self, hashes: Sequence[str]) -> Deferred[ChunkHasResult]:
        """
        Which of C{hashes} are stored.
        """

    def stat(self, chunk_hash: str) -> Deferred[ChunkInfo]:
        """
        Size and mtime of one chunk; L{svc.store.errors.NotFound} when absent.
        """

    def delete(
        self, hashes: Sequence[str], *, modified_before_ns: int | None = None
    ) -> Deferred[ChunkDeleteResult]:
        """
        Remove C{hashes}. With C{modified_before_ns}, a chunk whose mtime is
        at or after that instant is kept instead (checked atomically with the
        removal, so a put that re-offered it meanwhile wins over the GC).
        A failure on one chunk is reported in the result, not raised.
        """

    def list_chunks(self) -> Deferred[list[ChunkInfo]]:
        """
        Every stored chunk, sorted by hash, for the GC sweep.
        """

    def total_bytes(self) -> Deferred[int]:
        """
        The sum of the sizes of the stored chunks, each counted once; kept
        as a running total, so this never scans.
        """
