"""
Values of the manifest store: chunk references, inode attributes, manifests,
directory entries and the results of each namespace operation, plus the
compact encoding of a chunk list.

Everything here is pure: no SQLite, no I/O.
"""

from __future__ import annotations

import enum
import re
import struct
from collections.abc import Sequence

import attrs

from svc.store.errors import InvalidArgument, LastWriter
from svc.store.outbox_answers import OutboxPosition

#: Largest chunk the chunker produces (the spec's maximum, 16 MiB).
MAX_CHUNK_SIZE = 16 * 1024 * 1024

#: One record of an encoded chunk list: 32-byte digest, u64 big-endian size.
_CHUNK_RECORD = struct.Struct(">32sQ")

CHUNK_RECORD_BYTES = _CHUNK_RECORD.size
"""The bytes one chunk-list entry takes in an encoded chunk list (40)."""

_HEX_HASH = re.compile(r"[0-9a-f]{64}")

_MAX_ID = 2**32 - 1
_MAX_I64 = 2**63 - 1


class FileKind(enum.Enum):
    """
    What an inode is; the value is what C{inodes.kind} stores.
    """

    FILE = "file"
    DIRECTORY = "dir"
    SYMLINK = "symlink"
    FIFO = "fifo"
    CHAR_DEVICE = "chardev"
    BLOCK_DEVICE = "blockdev"
    SOCKET = "socket"


def _check_hash(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str) or _HEX_HASH.fullmatch(value) is None:
        raise InvalidArgument("chunk hash must be 64 lowercase hex digits")


def _check_chunk_size(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not isinstance(value, int) or not 0 < value <= MAX_CHUNK_SIZE:
        raise InvalidArgument(f"chunk size must be between 1 and {MAX_CHUNK_SIZE}")


def check_mode(mode: int) -> int:
    """
    Return ``mode`` if it holds permission bits only (0 to 0o7777).
    """
    if not isinstance(mode, int) or not 0 <= mode <= 0o7777:
        raise InvalidArgument("mode must be between 0 and 0o7777")
    return mode


def check_id(value: int, what: str) -> int:
    """
    Return ``value`` if it is a valid uid or gid (0 to 2**32-1).
    """
    if not isinstance(value, int) or not 0 <= value <= _MAX_ID:
        raise InvalidArgument(f"{what} out of range")
    return value


def check_time(value: int, what: str) -> int:
    """
    Return ``value`` if it fits a signed 64-bit nanosecond timestamp.
    """
    if not isinstance(value, int) or not -_MAX_I64 <= value <= _MAX_I64:
        raise InvalidArgument(f"{what} out of range")
    return value


@attrs.frozen
class ChunkRef:
    """
    One chunk of a file, in file order: its BLAKE3 hex digest and byte count.
    """

    hash: str = attrs.field(validator=_check_hash)
    size: int = attrs.field(validator=_check_chunk_size)


def encode_chunks(chunks: Sequence[ChunkRef]) -> bytes:
    """
    The chunk-list BLOB: one 40-byte record per chunk (digest, u64 size).
    """
    pack = _CHUNK_RECORD.pack
    return b"".join(pack(bytes.fromhex(c.hash), c.size) for c in chunks)


def decode_chunks(blob: bytes) -> tuple[ChunkRef, ...]:
    """
    The chunks of a chunk-list BLOB written by L{encode_chunks}.
    """
    if len(blob) % _CHUNK_RECORD.size:
        raise ValueError("chunk list length is not a multiple of 40")
    return tuple(ChunkRef(digest.hex(), size) for digest, size in _CHUNK_RECORD.iter_unpack(blob))


def chunk_name(chunk: ChunkRef | tuple[str, int]) -> str:
    """The hash of a chunk ref or of a C{(hash, size)} pair."""
    return chunk[0] if isinstance(chunk, tuple) else chunk.hash


def chunks_of(pairs: Sequence[ChunkRef | tuple[str, int]]) -> tuple[ChunkRef, ...]:
    """
    Validated L{ChunkRef}s from chunk refs or ``(hash, size)`` pairs.
    """
    return tuple(p if isinstance(p, ChunkRef) else ChunkRef(p[0], p[1]) for p in pairs)


@attrs.frozen
class Writer:
    """
    Who makes a change: the agent from the verified certificate and the
    optional ``mount:<hex>`` session id, recorded on the inode and in the
    journal; and, for a change a mount's outbox sends, which entry it is
    (applied at most once: L{svc.store.outbox_answers}).
    """

    agent_id: str = attrs.field(validator=attrs.validators.instance_of(str))
    session_id: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(str))
    )
    outbox: OutboxPosition | None = None


@attrs.frozen
class Attributes:
    """
    What C{stat} reports about an inode. ``size`` is the byte length for
    files, the target's UTF-8 length for symlinks and 0 otherwise;
    ``version`` is the content version for files (the CAS token) and the
    entry-change counter for directories.
    """

    inode: int
    kind: FileKind
    mode: int
    uid: int
    gid: int
    size: int
    mtime_ns: int
    atime_ns: int
    ctime_ns: int
    version: int
    nlink: int
    rdev: int
    symlink_target: str | None


@attrs.frozen
class Manifest:
    """
    Everything stored for one name: its attributes, the ordered chunk list
    (files only; empty otherwise) and who wrote it last.
    """

    path: str
    attributes: Attributes
    chunks: tuple[ChunkRef, ...]
    last_writer: LastWriter

    @property
    def version(self) -> int:
        """The inode's version."""
        return self.attributes.version

    @property
    def size(self) -> int:
        """The inode's size."""
        return self.attributes.size

    @property
    def kind(self) -> FileKind:
        """The inode's kind."""
        return self.attributes.kind


@attrs.frozen
class DirectoryEntry:
    """
    One child of a listed directory: its last path component and attributes.
    """

    name: str
    attributes: Attributes


@attrs.frozen
class FileChunks:
    """
    A regular file's chunk list as one read found it, with the inode and
    version it is the content of (so a reader can tell whether it belongs
    to attributes it read before).
    """

    inode: int
    version: int
    chunks: tuple[ChunkRef, ...]


@attrs.frozen
class PutResult:
    """
    A committed C{manifest_put}. ``version`` and ``size`` are post-write;
    ``old_chunks`` is the list it replaced (empty on create);
    ``usage_bytes`` is the unique chunk bytes of the path's top-level
    directory after the write; ``ctime_ns`` the file's new ctime (on create
    also its parent directory's new mtime and ctime).
    """

    path: str
    inode: int
    version: int
    size: int
    created: bool
    old_chunks: tuple[ChunkRef, ...]
    new_chunks: tuple[ChunkRef, ...]
    usage_bytes: int
    journal_seq: int
    ctime_ns: int


@attrs.frozen
class RemoveResult:
    """
    A committed unlink or rmdir. ``nlink`` is what the inode has left (0:
    the inode is gone); ``released_hashes`` are the chunks no longer
    referenced anywhere in the top-level directory (candidates for GC);
    ``changed_ns`` is the parent directory's new mtime and ctime.
    """

    path: str
    kind: FileKind
    inode: int
    nlink: int
    size: int
    released_hashes: frozenset[str]
    journal_seq: int
    changed_ns: int


@attrs.frozen
class CreateResult:
    """
    A committed mkdir, symlink, mknod or link: the attributes of the new
    name.
    """

    path: str
    attributes: Attributes
    journal_seq: int


@attrs.frozen
class RenameResult:
    """
    A committed rename. ``moved_names`` counts the names rewritten (1 plus
    the descendants of a directory; 0 for a no-op); ``replaced`` is what was
    at the destination, if anything. ``journal_seq`` is L{None} for a no-op,
    and so is ``changed_ns``, otherwise the new mtime and ctime of both
    parent directories and the moved inode's new ctime.
    """

    source: str
    destination: str
    moved_names: int
    replaced: RemoveResult | None
    journal_seq: int | None
    changed_ns: int | None = None


@attrs.frozen
class SetattrResult:
    """
    A committed setattr: the attributes afterwards and, for a truncation to
    0, the chunks no longer referenced in the top-level directory.
    ``journal_seq`` is L{None} when no attribute was given (nothing changed).
    """

    path: str
    attributes: Attributes
    released_hashes: frozenset[str]
    journal_seq: int | None


@attrs.frozen
class PurgeResult:
    """
    An erased agent disk: ``count`` names removed (the top-level directory
    and everything below it), ``hashes`` every chunk the disk referenced,
    ``journal_rows`` the journal rows about it that were deleted.
    """

    top: str
    count: int
    hashes: frozenset[str]
    journal_rows: int
