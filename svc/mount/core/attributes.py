"""
Values the filesystem core hands to the FUSE bridge: file kinds, attributes,
entries, requested attribute changes, open results and file-system
statistics. Pure: no I/O, no Twisted.

Attributes come from the data plane's attribute map
(``docs/specifications/dataplane-ops.md`` section 2); the bridge turns an
L{Entry} into C{llfuse.EntryAttributes} (C{st_ino} is L{Entry.ino}, never the
server's inode number).
"""

from __future__ import annotations

import enum
import stat

import attrs

BLOCK_SIZE = 4096
"""The block size reported by C{getattr} (C{st_blksize}) and C{statfs}."""

NAME_MAX = 255
"""Longest name component, in UTF-8 bytes (the data plane's limit)."""


class FileKind(enum.StrEnum):
    """The C{kind} of a data-plane inode."""

    FILE = "file"
    DIR = "dir"
    SYMLINK = "symlink"
    FIFO = "fifo"
    CHARDEV = "chardev"
    BLOCKDEV = "blockdev"
    SOCKET = "socket"


_TYPE_BITS: dict[FileKind, int] = {
    FileKind.FILE: stat.S_IFREG,
    FileKind.DIR: stat.S_IFDIR,
    FileKind.SYMLINK: stat.S_IFLNK,
    FileKind.FIFO: stat.S_IFIFO,
    FileKind.CHARDEV: stat.S_IFCHR,
    FileKind.BLOCKDEV: stat.S_IFBLK,
    FileKind.SOCKET: stat.S_IFSOCK,
}


def type_bits(kind: FileKind) -> int:
    """The C{S_IFMT} bits of C{kind}."""
    return _TYPE_BITS[kind]


def kind_of_mode(mode: int) -> FileKind | None:
    """The kind whose C{S_IFMT} bits C{mode} carries (L{None}: unknown)."""
    bits = stat.S_IFMT(mode)
    for kind, value in _TYPE_BITS.items():
        if value == bits:
            return kind
    return None


@attrs.frozen
class Attributes:
    """
    One inode's attributes as the data plane reports them.

    @ivar server_inode: the data plane's inode number (shared by hard links);
        the FUSE inode number is assigned by L{svc.mount.core.inodes.InodeTable}.
    @ivar mode: permission bits only (see L{st_mode} for the full mode).
    @ivar version: file content version (the compare-and-swap token);
        directories: an entry-change counter.
    @ivar symlink_target: symlinks only, when known (listings omit it).
    """

    server_inode: int
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
    rdev: int = 0
    symlink_target: str | None = None

    @property
    def st_mode(self) -> int:
        """The full C{st_mode}: type bits and permission bits."""
        return _TYPE_BITS[self.kind] | self.mode

    @property
    def st_blocks(self) -> int:
        """512-byte blocks, as if every byte were stored (C{du} estimate)."""
        return (self.size + 511) // 512


@attrs.frozen
class Entry:
    """
    A name's answer to the kernel (C{lookup}, C{mkdir}, C{create}...): the
    FUSE inode number and its attributes. Each L{Entry} returned counts as
    one kernel lookup until L{svc.mount.fs.MountFS.forget}.
    """

    ino: int
    attributes: Attributes


@attrs.frozen
class DirEntry:
    """One child returned by C{readdir}; C{next_offset} resumes after it."""

    name: bytes
    entry: Entry
    next_offset: int


@attrs.frozen
class AttributeChanges:
    """
    What a C{setattr} asks to change; L{None} leaves a field alone.
    C{size} truncates or extends (regular files only).
    """

    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    size: int | None = None
    mtime_ns: int | None = None
    atime_ns: int | None = None


@attrs.frozen
class OpenResult:
    """
    An open file handle: C{fh} for later calls, and C{keep_cache} when the
    kernel's page cache of this inode is still valid (the content version is
    the one the cache was filled from).
    """

    fh: int
    keep_cache: bool


@attrs.frozen
class QuotaReport:
    """
    What L{svc.mount.fs.MountFS.statfs} reports: the disk's grant in bytes
    (L{None}: no quota known) and the bytes in use.
    """

    quota_bytes: int | None
    used_bytes: int


UNKNOWN_CAPACITY = 1 << 50
"""Bytes reported as the capacity when no quota is known (1 PiB)."""


@attrs.frozen
class FsStats:
    """C{statfs} values, in L{BLOCK_SIZE} blocks."""

    block_size: int
    blocks: int
    blocks_free: int
    blocks_available: int
    files: int
    files_free: int
    name_max: int

    @classmethod
    def from_quota(cls, report: QuotaReport) -> FsStats:
        """Blocks from a quota: capacity = grant (or L{UNKNOWN_CAPACITY})."""
        capacity = report.quota_bytes if report.quota_bytes is not None else UNKNOWN_CAPACITY
        total = max(0, capacity) // BLOCK_SIZE
        used = (max(0, report.used_bytes) + BLOCK_SIZE - 1) // BLOCK_SIZE
        free = max(0, total - used)
        return cls(
            block_size=BLOCK_SIZE,
            blocks=total,
            blocks_free=free,
            blocks_available=free,
            files=1 << 32,
            files_free=1 << 32,
            name_max=NAME_MAX,
        )
