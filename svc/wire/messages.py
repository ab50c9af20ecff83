"""
The requests of the data-plane operations, declared once, and the limits
and field kinds the messages share (the answers, pushes and error details are
L{svc.wire.answers}). Each is a frozen C{attrs} class whose fields
carry their wire kind (L{svc.wire.schema.arg}); L{svc.wire.commands} ties
them to operations. The meaning of every key is
``docs/specifications/dataplane-ops.md``.
"""

from __future__ import annotations

import attrs

from svc.wire.errno import WireErrno
from svc.wire.kinds import (
    I64,
    U32,
    Bool,
    Choice,
    ChunkEntry,
    ChunkList,
    FieldRefused,
    Hash,
    Int,
    ListOf,
    OutboxTag,
    OutboxTagKind,
    Str,
)
from svc.wire.schema import arg

MAX_PATH_BYTES = 16384
"""Longest path the data plane accepts, C{/<agent_id>/...} in UTF-8 bytes
(longer: C{ENAMETOOLONG}). A local file system limits only what one system
call names (4,095 bytes), not how deep a tree goes: four times that lets a
program work at a 4,095-byte path below a directory of the disk, as
pjdfstest does (``mount-fs.md`` section 2)."""

MAX_PATH_FIELD_BYTES = MAX_PATH_BYTES
"""Longest path string a request map may carry at all (longer: C{ENAMETOOLONG}
without reading further)."""

MAX_NAME_BYTES = 255
"""Longest path component, in UTF-8 bytes."""

MAX_SESSION_ID_BYTES = 256
"""Longest C{session_id} (a real one is 70 characters)."""

MAX_LEASE_ID_BYTES = 64
"""Longest C{lease_id} (a real one is 32)."""

MAX_SYMLINK_TARGET_BYTES = 4096
"""Longest symlink target in UTF-8 bytes."""

MAX_CHUNK_HAS = 4096
"""The most hashes one C{chunk_has} may probe."""

MAX_MANIFEST_CHUNKS = 12000
"""The most chunks one C{manifest_put} may name (12000 entries of 76 bytes
fit the 1 MiB payload with room to spare)."""

MAX_INLINE_CHUNKS = 64
"""The most chunks one C{manifest_put} carries in its raw segment (C{inline}),
and the most one C{manifest_get} answer carries."""

MAX_INLINE_BYTES = 1 << 20
"""The most bytes of chunks a C{manifest_put} carries in its raw segment, the
most a C{list} answer carries in its, and the largest C{inline_max} of a
C{manifest_get} or C{list}."""

MAX_LIST_LIMIT = 1000
"""The most entries one C{list} answer holds (also the default)."""

MAX_LIST_ENTRY_CHUNKS = 64
"""The longest chunk list a C{list} entry carries (C{chunks}): a file with
more entries carries none, and the client asks C{manifest_get}."""

MAX_LIST_CHUNKS = 4096
"""The most chunk-list entries one C{list} answer carries in all."""

MAX_JOURNAL_LIMIT = 100
"""The most rows one C{journal_query} answer holds (also the default)."""

MAX_CHANGED_PATHS = 4096
"""The most paths one C{changed} push names."""

MKNOD_KINDS = frozenset({"file", "fifo", "chardev", "blockdev", "socket"})
"""The C{kind} values C{mknod} accepts."""

FILE_KINDS = MKNOD_KINDS | {"dir", "symlink"}
"""Every C{kind} an attribute map may carry."""

LEASE_MODES = frozenset({"read", "write"})

PATH = Str(MAX_PATH_FIELD_BYTES, too_long=WireErrno.ENAMETOOLONG)
SESSION = Str(MAX_SESSION_ID_BYTES)
MODE = Int(0, 0o7777)
OWNER_ID = Int(0, U32)
VERSION = Int(0, I64)
TIME = Int(-I64, I64)
COUNT = Int(0, I64)
HASH = Hash()
CHUNK_LIST = ChunkList(MAX_MANIFEST_CHUNKS)
OUTBOX = OutboxTagKind()
"""Which mount outbox entry a change is (exactly once: ``mount-outbox.md`` section 6)."""
ANY_INT = Int()
TEXT = Str(64 * 1024)
"""A string in an answer (names, paths, ids): generous, the server is trusted."""


def optional_int() -> int | None:
    """An optional integer field of an answer (left out when L{None})."""
    result: int | None = arg(ANY_INT, default=None)
    return result


# Requests.


@attrs.frozen
class ListRequest:
    """
    C{list}: one page of a directory's entries, by name after C{after}.
    With C{chunks}, regular files' entries also carry their chunk lists;
    with C{inline_max} too (0: none; more than 0 needs C{chunks}), files of
    at most that many bytes carry their chunks' bytes in the raw segment
    (``dataplane-ops.md`` section 3, C{list}).
    """

    path: str = arg(PATH)
    after: str | None = arg(Str(MAX_PATH_FIELD_BYTES), default=None)
    limit: int = arg(Int(1, MAX_LIST_LIMIT), default=MAX_LIST_LIMIT)
    chunks: bool = arg(Bool(), default=False)
    inline_max: int = arg(Int(0, MAX_INLINE_BYTES), default=0)

    def __attrs_post_init__(self) -> None:
        if self.inline_max and not self.chunks:
            raise FieldRefused(WireErrno.EINVAL, "'inline_max' above 0 needs 'chunks'")


@attrs.frozen
class PathRequest:
    """C{head_file}, C{readlink}: one path, read."""

    path: str = arg(PATH)


@attrs.frozen
class ManifestGetRequest:
    """
    C{manifest_get}: attributes and chunk list of one path; C{inline_max}
    (0: none) is the largest file whose chunks the answer carries.
    """

    path: str = arg(PATH)
    inline_max: int = arg(Int(0, MAX_INLINE_BYTES), default=0)


@attrs.frozen
class ManifestPutRequest:
    """
    C{manifest_put}: compare-and-swap a regular file's content. C{inline}
    names chunks of C{chunks} whose bytes the raw segment carries, in its
    order: each once, at most L{MAX_INLINE_BYTES} in all.
    """

    path: str = arg(PATH)
    expected_version: int = arg(VERSION)
    chunks: tuple[ChunkEntry, ...] = arg(CHUNK_LIST)
    size: int = arg(COUNT)
    mode: int = arg(MODE)
    mtime_ns: int = arg(TIME)
    uid: int = arg(OWNER_ID, default=0)
    gid: int = arg(OWNER_ID, default=0)
    session_id: str | None = arg(SESSION, default=None)
    outbox: OutboxTag | None = arg(OUTBOX, default=None)
    atime_ns: int | None = arg(TIME, default=None)
    inline: tuple[str, ...] = arg(ListOf(HASH, MAX_INLINE_CHUNKS), default=())

    def __attrs_post_init__(self) -> None:
        if not self.inline:
            return
        sizes = {chunk.hash: chunk.size for chunk in self.chunks}
        if len(set(self.inline)) != len(self.inline):
            raise FieldRefused(WireErrno.EINVAL, "'inline' repeats a chunk")
        total = 0
        for chunk_hash in self.inline:
            if chunk_hash not in sizes:
                raise FieldRefused(WireErrno.EINVAL, "'inline' names a chunk not in 'chunks'")
            total += sizes[chunk_hash]
        if total > MAX_INLINE_BYTES:
            raise FieldRefused(WireErrno.EINVAL, f"inline chunks exceed {MAX_INLINE_BYTES} bytes")

    def inline_entries(self) -> tuple[ChunkEntry, ...]:
        """The inline chunks with their sizes, in raw-segment order."""
        sizes = {chunk.hash: chunk.size for chunk in self.chunks}
        return tuple(ChunkEntry(chunk_hash, sizes[chunk_hash]) for chunk_hash in self.inline)


@attrs.frozen
class PathWriteRequest:
    """C{manifest_delete}, C{dir_remove}: a change naming one path only."""

    path: str = arg(PATH)
    session_id: str | None = arg(SESSION, default=None)
    outbox: OutboxTag | None = arg(OUTBOX, default=None)


@attrs.frozen
class TwoPathRequest:
    """
    C{manifest_rename} (C{path} moved to C{to_path}) and C{link} (new name
    C{to_path} for the existing C{path}).
    """

    path: str = arg(PATH)
    to_path: str = arg(PATH)
    session_id: str | None = arg(SESSION, default=None)
    outbox: OutboxTag | None = arg(OUTBOX, default=None)


@attrs.frozen
class DirCreateRequest:
    """C{dir_create}: a new directory."""

    path: str = arg(PATH)
    mode: int = arg(MODE)
    uid: int = arg(OWNER_ID, default=0)
    gid: int = arg(OWNER_ID, default=0)
    session_id: str | None = arg(SESSION, default=None)
    outbox: OutboxTag | None = arg(OUTBOX, default=None)


@attrs.frozen
class SetattrRequest:
    """C{setattr}: change some attributes; absent ones stay."""

    path: str = arg(PATH)
    mode: int | None = arg(MODE, default=None)
    uid: int | None = arg(OWNER_ID, default=None)
    gid: int | None = arg(OWNER_ID, default=None)
    size: int | None = arg(COUNT, default=None)
    mtime_ns: int | None = arg(TIME, default=None)
    atime_ns: int | None = arg(TIME, default=None)
    session_id: str | None = arg(SESSION, default=None)
    outbox: OutboxTag | None = arg(OUTBOX, default=None)

    def changes(self) -> dict[str, int | None]:
        """The attribute changes, by name (L{None}: unchanged)."""
        return {
            "mode": self.mode,
            "uid": self.uid,
            "gid": self.gid,
            "size": self.size,
            "mtime_ns": self.mtime_ns,
            "atime_ns": self.atime_ns,
        }


@attrs.frozen
class SymlinkRequest:
    """C{symlink}: a new symbolic link C{path} whose target is C{target}."""

    path: str = arg(PATH)
    target: str = arg(Str(MAX_SYMLINK_TARGET_BYTES, min_bytes=1))
    uid: int = arg(OWNER_ID, default=0)
    gid: int = arg(OWNER_ID, default=0)
    session_id: str | None = arg(SESSION, default=None)
    outbox: OutboxTag | None = arg(OUTBOX, default=None)


@attrs.frozen
class MknodRequest:
    """C{mknod}: a new special file (or empty regular file)."""

    path: str = arg(PATH)
    kind: str = arg(Choice(MKNOD_KINDS))
    mode: int = arg(MODE)
    rdev: int = arg(COUNT, default=0)
    uid: int = arg(OWNER_ID, default=0)
    gid: int = arg(OWNER_ID, default=0)
    session_id: str | None = arg(SESSION, default=None)
    outbox: OutboxTag | None = arg(OUTBOX, default=None)


@attrs.frozen
class ChunkGetRequest:
    """C{chunk_get}: one chunk's bytes."""

    hash: str = arg(HASH)


@attrs.frozen
class ChunkPutRequest:
    """C{chunk_put}: store the raw segment under C{hash}."""

    hash: str = arg(HASH)
    session_id: str | None = arg(SESSION, default=None)


@attrs.frozen
class ChunkHasRequest:
    """C{chunk_has}: which of C{hashes} the agent may reference without upload."""

    hashes: tuple[str, ...] = arg(ListOf(HASH, MAX_CHUNK_HAS))


@attrs.frozen
class JournalQueryRequest:
    """C{journal_query}: one page of the agent's own journal rows."""

    path: str | None = arg(PATH, default=None)
    below: bool = arg(Bool(), default=True)
    since_ms: int | None = arg(COUNT, default=None)
    until_ms: int | None = arg(COUNT, default=None)
    cursor: int | None = arg(COUNT, default=None)
    limit: int = arg(Int(1, MAX_JOURNAL_LIMIT), default=MAX_JOURNAL_LIMIT)
    newest_first: bool = arg(Bool(), default=False)


@attrs.frozen
class JournalRevertRequest:
    """C{journal_revert_path}: restore C{path} to its state before row C{seq}."""

    path: str = arg(PATH)
    seq: int = arg(Int(1, I64))
    session_id: str | None = arg(SESSION, default=None)


@attrs.frozen
class LeaseGrantRequest:
    """C{lease_grant}: a C{read} or C{write} lease on C{path}."""

    path: str = arg(PATH)
    mode: str = arg(Choice(LEASE_MODES))
    wait: bool = arg(Bool(), default=False)
    session_id: str | None = arg(SESSION, default=None)


@attrs.frozen
class LeaseIdRequest:
    """C{lease_refresh}, C{lease_release}: one of the connection's leases."""

    lease_id: str = arg(Str(MAX_LEASE_ID_BYTES))


@attrs.frozen
class EmptyRequest:
    """C{statfs}, C{ping}, C{close}: no arguments."""
