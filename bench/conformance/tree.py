"""
What a directory tree shows through C{lstat}, to compare the tree one mount
showed with what a fresh mount of the same disk shows: every entry's kind,
permission bits, owner, size, link count, mtime, and its content (a regular
file's SHA-256, a symlink's target, a device's numbers; a directory's
names are the entries themselves), plus which names are hard links of one
another. Nothing but regular files is ever opened.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Any

import attrs

_FIELDS = ("kind", "mode", "uid", "gid", "size", "nlink", "mtime_ns", "content")
MAX_LISTED = 50
"""At most this many differences are listed (all are counted)."""


@attrs.frozen
class Entry:
    """One path's C{lstat} and content, as compared."""

    kind: str
    mode: int
    uid: int
    gid: int
    size: int
    nlink: int
    mtime_ns: int
    content: str


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISREG, "file"),
        (stat.S_ISDIR, "dir"),
        (stat.S_ISLNK, "symlink"),
        (stat.S_ISCHR, "char"),
        (stat.S_ISBLK, "block"),
        (stat.S_ISFIFO, "fifo"),
        (stat.S_ISSOCK, "socket"),
    ):
        if test(mode):
            return name
    return "unknown"


def _content(path: str, st: os.stat_result) -> str:
    if stat.S_ISREG(st.st_mode):
        with open(path, "rb") as handle:
            return "sha256:" + hashlib.file_digest(handle, "sha256").hexdigest()
    if stat.S_ISLNK(st.st_mode):
        return "target:" + os.fsdecode(os.readlink(path))
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
        return f"rdev:{os.major(st.st_rdev)},{os.minor(st.st_rdev)}"
    return ""


@attrs.frozen
class Snapshot:
    """Every entry under a root by relative path, and the hard-link groups."""

    entries: dict[str, Entry]
    links: frozenset[tuple[str, ...]]

    def to_json(self) -> dict[str, Any]:
        return {
            "entries": {path: attrs.asdict(entry) for path, entry in sorted(self.entries.items())},
            "links": sorted(list(group) for group in self.links),
        }


def snapshot(root: Path) -> Snapshot:
    """Walk C{root} (not following symlinks) and record every entry under it."""
    entries: dict[str, Entry] = {}
    by_inode: dict[int, list[str]] = {}
    for directory, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            path = os.path.join(directory, name)
            rel = os.path.relpath(path, root)
            st = os.lstat(path)
            entries[rel] = Entry(
                kind=_kind(st.st_mode),
                mode=stat.S_IMODE(st.st_mode),
                uid=st.st_uid,
                gid=st.st_gid,
                size=st.st_size,
                nlink=st.st_nlink,
                mtime_ns=st.st_mtime_ns,
                content=_content(path, st),
            )
            if not stat.S_ISDIR(st.st_mode):
                by_inode.setdefault(st.st_ino, []).append(rel)
    links = frozenset(tuple(sorted(paths)) for paths in by_inode.values() if len(paths) > 1)
    return Snapshot(entries, links)


def compare(before: Snapshot, after: Snapshot) -> dict[str, Any]:
    """
    How C{after} differs from C{before}: counts of paths only in one, of
    paths that changed (per field), of hard-link groups that differ, and the
    first L{MAX_LISTED} differences. C{identical} when there are none.
    """
    only_before = sorted(before.entries.keys() - after.entries.keys())
    only_after = sorted(after.entries.keys() - before.entries.keys())
    changed: list[dict[str, Any]] = []
    by_field: dict[str, int] = {}
    for path in sorted(before.entries.keys() & after.entries.keys()):
        old, new = before.entries[path], after.entries[path]
        if old == new:
            continue
        fields = {
            field: {"before": getattr(old, field), "after": getattr(new, field)}
            for field in _FIELDS
            if getattr(old, field) != getattr(new, field)
        }
        for field in fields:
            by_field[field] = by_field.get(field, 0) + 1
        changed.append({"path": path, "kind": old.kind, **fields})
    links_differ = sorted(before.links ^ after.links)
    identical = not (only_before or only_after or changed or links_differ)
    return {
        "identical": identical,
        "entries_before": len(before.entries),
        "entries_after": len(after.entries),
        "only_before": len(only_before),
        "only_after": len(only_after),
        "changed": len(changed),
        "changed_by_field": dict(sorted(by_field.items())),
        "link_groups_differ": len(links_differ),
        "first_differences": {
            "only_before": only_before[:MAX_LISTED],
            "only_after": only_after[:MAX_LISTED],
            "changed": changed[:MAX_LISTED],
            "link_groups": [list(group) for group in links_differ[:MAX_LISTED]],
        },
    }
