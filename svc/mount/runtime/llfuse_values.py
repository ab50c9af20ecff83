"""
The core's values as llfuse's, and llfuse's as the core's: what the bridge
(L{svc.mount.runtime.bridge.Bridge}) answers the kernel with, and the attribute
changes a C{setattr} asks for. No I/O; called on FUSE threads.
"""

from __future__ import annotations

from typing import Any

import llfuse

from svc.mount.core.attributes import BLOCK_SIZE, AttributeChanges, Entry, FsStats
from svc.mount.runtime.settings import BridgeTimeouts


def entry_attributes(entry: Entry, timeouts: BridgeTimeouts) -> llfuse.EntryAttributes:
    """C{entry}'s attributes, which the kernel caches for the C{timeouts}."""
    attributes = entry.attributes
    out = llfuse.EntryAttributes()
    out.st_ino = entry.ino
    out.generation = 0
    out.entry_timeout = timeouts.entry_seconds
    out.attr_timeout = timeouts.attr_seconds
    out.st_mode = attributes.st_mode
    out.st_nlink = attributes.nlink  # 0 for a file unlinked while open
    out.st_uid = attributes.uid
    out.st_gid = attributes.gid
    out.st_rdev = attributes.rdev
    out.st_size = attributes.size
    out.st_blksize = BLOCK_SIZE
    out.st_blocks = attributes.st_blocks
    out.st_atime_ns = attributes.atime_ns
    out.st_mtime_ns = attributes.mtime_ns
    out.st_ctime_ns = attributes.ctime_ns
    return out


def negative_entry(timeouts: BridgeTimeouts) -> llfuse.EntryAttributes:
    """The answer to a C{lookup} of a name that does not exist."""
    out = llfuse.EntryAttributes()
    out.st_ino = 0  # llfuse: a negative entry, cached for entry_timeout
    out.entry_timeout = timeouts.entry_seconds
    out.attr_timeout = 0
    return out


def statvfs_data(stats: FsStats) -> llfuse.StatvfsData:
    """The answer to a C{statfs}."""
    out = llfuse.StatvfsData()
    out.f_bsize = stats.block_size
    out.f_frsize = stats.block_size
    out.f_blocks = stats.blocks
    out.f_bfree = stats.blocks_free
    out.f_bavail = stats.blocks_available
    out.f_files = stats.files
    out.f_ffree = stats.files_free
    out.f_favail = stats.files_free
    out.f_namemax = stats.name_max
    return out


def attribute_changes(attr: Any, fields: Any) -> AttributeChanges:
    """
    What a C{setattr} changes: of C{attr} (C{llfuse.EntryAttributes}), the
    values C{fields} (C{llfuse.SetattrFields}) marks.
    """
    return AttributeChanges(
        mode=attr.st_mode & 0o7777 if fields.update_mode else None,
        uid=attr.st_uid if fields.update_uid else None,
        gid=attr.st_gid if fields.update_gid else None,
        size=attr.st_size if fields.update_size else None,
        mtime_ns=attr.st_mtime_ns if fields.update_mtime else None,
        atime_ns=attr.st_atime_ns if fields.update_atime else None,
    )
