"""
A commit the write-back sends itself, recorded in the outbox first
(``mount-outbox.md`` section 8): what a close that returns before its
commit is answered appends, so the next mount on the cache can send it
if this one dies first.

L{commit_entry} is the entry of a L{CommitRequest}; L{new_chunk_bytes}
reads the bytes the entry must hold (its chunks not in its base);
L{take_record} and L{settle_record} keep L{FileState.recorded}, the record
of a file's content that its next commit replaces.
"""

from __future__ import annotations

import errno
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from svc.chunking import ChunkRef
from svc.mount.core.errors import FSError
from svc.mount.outbox.entries import Commit, Owner
from svc.mount.writeback.commit import CommitRequest
from svc.mount.writeback.uploads import Reader

if TYPE_CHECKING:
    from svc.mount.core.file_state import FileState
    from svc.mount.outbox.outbox import Outbox


def commit_entry(request: CommitRequest, seq: int) -> Commit:
    """The outbox entry that records C{request} as entry C{seq}."""
    return Commit(
        seq=seq,
        path=request.path,
        expected=request.expected_version,
        chained=False,
        base=request.base,
        chunks=request.chunks,
        size=request.size,
        owner=Owner(request.mode, request.uid, request.gid),
        mtime_ns=request.mtime_ns,
        atime_ns=request.atime_ns,
    )


async def new_chunk_bytes(
    read: Reader,
    chunks: Sequence[ChunkRef],
    base: Sequence[ChunkRef],
    known: Mapping[str, bytes | memoryview],
) -> dict[str, bytes]:
    """
    The bytes of each chunk of C{chunks} not in C{base}: from C{known} (the
    chunks the write-back cut), else read with C{read(offset, length)} (the
    content just cut, under the file's lock; chunks the write-behind cut
    earlier). The held chunks are checked against their names when read
    back.

    @raise FSError: (EIO) a chunk read back short.
    """
    old = {ref.hash for ref in base}
    found: dict[str, bytes] = {}
    for ref in chunks:
        if ref.hash in old or ref.hash in found:
            continue
        data = known.get(ref.hash)
        if data is None:
            data = await read(ref.offset, ref.length)
        if len(data) != ref.length:
            raise FSError(errno.EIO, f"chunk {ref.hash} read back short while being recorded")
        found[ref.hash] = bytes(data)
    return found


def settle_record(outbox: Outbox | None, state: FileState, entry: Commit | None) -> None:
    """
    Reactor: C{entry}, the record of C{state}'s content
    (L{FileState.recorded}), is no longer needed: a later commit of the file
    was recorded or ended, or the file will never reach the data plane.
    Nothing when C{entry} is not the state's record (already settled).
    """
    if entry is None or state.recorded is not entry:
        return
    state.recorded = None
    state.recorded_at = None
    if outbox is not None:
        outbox.done(entry)


def take_record(
    outbox: Outbox | None, state: FileState, entry: Commit, at: tuple[int, int]
) -> None:
    """
    Reactor: C{entry}, recorded when C{state} stood at C{at}
    (L{FileState.changes_now}), is the file's record now; the one before
    it, if any, is settled (C{entry} replaces it).
    """
    settle_record(outbox, state, state.recorded)
    state.recorded = entry
    state.recorded_at = at
