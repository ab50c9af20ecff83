"""
The outbox's entries: one frozen value per mutation the mount sends the
data plane, and their map form in the outbox log. Pure: no I/O.

An entry names server paths (C{/<agent_id>/...}) as they are at the moment
it was appended: entries are sent and applied in append order, so each
names the paths as the data plane will have them when it runs. Every entry
carries C{seq}, its place in the log (strictly increasing, never reused).

The map form (``docs/specifications/mount-outbox.md`` section 3) is a
msgpack map with short text keys; L{entry_to_map} and L{entry_from_map}
convert, and L{entry_from_map} checks every field (L{BadEntry}), since a
log can be damaged or written by another version.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import Any

import attrs

from svc.chunking import ChunkRef


class Op(enum.Enum):
    """The kinds of entry, by their C{op} value in the log."""

    COMMIT = "commit"
    MKDIR = "mkdir"
    MKNOD = "mknod"
    SYMLINK = "symlink"
    LINK = "link"
    UNLINK = "unlink"
    RMDIR = "rmdir"
    RENAME = "rename"
    SETATTR = "setattr"


class BadEntry(ValueError):
    """A map that is not a well-formed entry (a damaged or foreign log)."""


@attrs.frozen
class Owner:
    """Who a new node belongs to, with its permission bits."""

    mode: int
    uid: int
    gid: int


@attrs.frozen
class Commit:
    """
    A file's content: C{chunks} (its bytes, in order) at C{path}, replacing
    the version C{expected} (0: a new file), or, with C{chained}, the
    version the previous unsettled commit of the same path makes (known
    only when that one is answered). C{base} is the chunk list the edit
    was made on (for the compatible-retry rule of
    ``mount-consistency.md``).
    """

    seq: int
    path: str
    expected: int
    chained: bool
    base: tuple[ChunkRef, ...]
    chunks: tuple[ChunkRef, ...]
    size: int
    owner: Owner
    mtime_ns: int
    atime_ns: int | None = None
    op = Op.COMMIT


@attrs.frozen
class Mkdir:
    """A new directory at C{path}."""

    seq: int
    path: str
    owner: Owner
    op = Op.MKDIR


@attrs.frozen
class Mknod:
    """A new device node, FIFO or socket at C{path} (C{owner.mode} has the type bits)."""

    seq: int
    path: str
    owner: Owner
    rdev: int
    op = Op.MKNOD


@attrs.frozen
class Symlink:
    """A new symbolic link at C{path} pointing at C{target}."""

    seq: int
    path: str
    target: str
    uid: int
    gid: int
    op = Op.SYMLINK


@attrs.frozen
class Link:
    """A new name C{path} for the file at C{existing}."""

    seq: int
    path: str
    existing: str
    op = Op.LINK


@attrs.frozen
class Unlink:
    """The name C{path} (not a directory) removed."""

    seq: int
    path: str
    op = Op.UNLINK


@attrs.frozen
class Rmdir:
    """The empty directory C{path} removed."""

    seq: int
    path: str
    op = Op.RMDIR


@attrs.frozen
class Rename:
    """C{path} moved to C{to}, replacing what C{to} named (POSIX C{rename})."""

    seq: int
    path: str
    to: str
    op = Op.RENAME


@attrs.frozen
class SetAttributes:
    """
    Attribute changes at C{path}; L{None} leaves a field as it is. C{size}
    is only ever 0 or the file's current size (the truncation of a file no
    handle has open); any other content change is a L{Commit}.
    """

    seq: int
    path: str
    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    atime_ns: int | None = None
    mtime_ns: int | None = None
    size: int | None = None
    op = Op.SETATTR


Entry = Commit | Mkdir | Mknod | Symlink | Link | Unlink | Rmdir | Rename | SetAttributes
"""Any outbox entry."""


def paths_of(entry: Entry) -> tuple[str, ...]:
    """The server paths C{entry} changes (a rename: both; a link: the new name)."""
    if isinstance(entry, Rename):
        return (entry.path, entry.to)
    return (entry.path,)


# The map form.


def superseded(entries: Sequence[Entry]) -> frozenset[int]:
    """
    The seqs of the commits in C{entries} (unsettled, in order) that the
    next entry replaces whole: a commit of the same path over the same
    C{expected} version, neither chained. The later one carries the file's
    newer content; sending both would make the second lose its
    compare-and-swap to the first. (An empty close's record is followed
    by its file's commit this way, if the mount died between recording the
    commit and settling the record: ``mount-outbox.md`` section 8.)
    """
    return frozenset(
        first.seq
        for first, then in pairwise(entries)
        if isinstance(first, Commit)
        and isinstance(then, Commit)
        and first.path == then.path
        and first.expected == then.expected
        and not (first.chained or then.chained)
    )


def entry_to_map(entry: Entry) -> dict[str, Any]:
    """The log's map of C{entry}."""
    out: dict[str, Any] = {"op": entry.op.value, "seq": entry.seq, "path": entry.path}
    if isinstance(entry, Commit):
        out.update(
            expected=entry.expected,
            chained=entry.chained,
            base=_chunks_to_list(entry.base),
            chunks=_chunks_to_list(entry.chunks),
            size=entry.size,
            mtime_ns=entry.mtime_ns,
            atime_ns=entry.atime_ns,
        )
        out.update(_owner_to_map(entry.owner))
    elif isinstance(entry, Mkdir):
        out.update(_owner_to_map(entry.owner))
    elif isinstance(entry, Mknod):
        out.update(_owner_to_map(entry.owner), rdev=entry.rdev)
    elif isinstance(entry, Symlink):
        out.update(target=entry.target, uid=entry.uid, gid=entry.gid)
    elif isinstance(entry, Link):
        out.update(existing=entry.existing)
    elif isinstance(entry, Rename):
        out.update(to=entry.to)
    elif isinstance(entry, SetAttributes):
        for name in ("mode", "uid", "gid", "atime_ns", "mtime_ns", "size"):
            value = getattr(entry, name)
            if value is not None:
                out[name] = value
    return out


def entry_from_map(raw: object) -> Entry:
    """
    The entry a log map holds.

    @raise BadEntry: not a map of a known C{op} with every field of the
        right type (unknown keys are ignored: a later version may add some).
    """
    if not isinstance(raw, Mapping):
        raise BadEntry(f"an entry is a map, not {type(raw).__name__}")
    fields = _Fields(raw)
    op_name = fields.text("op")
    try:
        op = Op(op_name)
    except ValueError:
        raise BadEntry(f"unknown op {op_name!r}") from None
    seq = fields.natural("seq")
    path = fields.text("path")
    if op is Op.COMMIT:
        return Commit(
            seq,
            path,
            expected=fields.natural("expected"),
            chained=fields.flag("chained"),
            base=fields.chunks("base"),
            chunks=fields.chunks("chunks"),
            size=fields.natural("size"),
            owner=fields.owner(),
            mtime_ns=fields.integer("mtime_ns"),
            atime_ns=fields.optional_integer("atime_ns"),
        )
    if op is Op.MKDIR:
        return Mkdir(seq, path, fields.owner())
    if op is Op.MKNOD:
        return Mknod(seq, path, fields.owner(), fields.natural("rdev"))
    if op is Op.SYMLINK:
        return Symlink(
            seq, path, fields.text("target"), fields.natural("uid"), fields.natural("gid")
        )
    if op is Op.LINK:
        return Link(seq, path, fields.text("existing"))
    if op is Op.UNLINK:
        return Unlink(seq, path)
    if op is Op.RMDIR:
        return Rmdir(seq, path)
    if op is Op.RENAME:
        return Rename(seq, path, fields.text("to"))
    return SetAttributes(
        seq,
        path,
        mode=fields.optional_natural("mode"),
        uid=fields.optional_natural("uid"),
        gid=fields.optional_natural("gid"),
        atime_ns=fields.optional_integer("atime_ns"),
        mtime_ns=fields.optional_integer("mtime_ns"),
        size=fields.optional_natural("size"),
    )


def _owner_to_map(owner: Owner) -> dict[str, int]:
    return {"mode": owner.mode, "uid": owner.uid, "gid": owner.gid}


def _chunks_to_list(chunks: tuple[ChunkRef, ...]) -> list[list[Any]]:
    return [[bytes.fromhex(chunk.hash), chunk.length] for chunk in chunks]


class _Fields:
    """Typed reads of one entry map's fields, each failing L{BadEntry}."""

    def __init__(self, raw: Mapping[Any, Any]) -> None:
        self._raw = raw

    def _get(self, name: str) -> object:
        if name not in self._raw:
            raise BadEntry(f"entry has no {name!r}")
        return self._raw[name]

    def text(self, name: str) -> str:
        value = self._get(name)
        if not isinstance(value, str):
            raise BadEntry(f"{name!r} is not text")
        return value

    def integer(self, name: str) -> int:
        value = self._get(name)
        if not isinstance(value, int) or isinstance(value, bool):
            raise BadEntry(f"{name!r} is not an integer")
        return value

    def natural(self, name: str) -> int:
        value = self.integer(name)
        if value < 0:
            raise BadEntry(f"{name!r} is negative")
        return value

    def optional_integer(self, name: str) -> int | None:
        return None if self._raw.get(name) is None else self.integer(name)

    def optional_natural(self, name: str) -> int | None:
        return None if self._raw.get(name) is None else self.natural(name)

    def flag(self, name: str) -> bool:
        value = self._get(name)
        if not isinstance(value, bool):
            raise BadEntry(f"{name!r} is not a boolean")
        return value

    def owner(self) -> Owner:
        return Owner(self.natural("mode"), self.natural("uid"), self.natural("gid"))

    def chunks(self, name: str) -> tuple[ChunkRef, ...]:
        value = self._get(name)
        if not isinstance(value, list | tuple):
            raise BadEntry(f"{name!r} is not a list")
        out: list[ChunkRef] = []
        offset = 0
        for item in value:
            if (
                not isinstance(item, list | tuple)
                or len(item) != 2
                or not isinstance(item[0], bytes)
                or len(item[0]) != 32
                or not isinstance(item[1], int)
                or isinstance(item[1], bool)
            ):
                raise BadEntry(f"{name!r} holds something that is not [hash, length]")
            try:
                out.append(ChunkRef(offset, item[1], item[0].hex()))
            except (TypeError, ValueError) as error:
                raise BadEntry(f"{name!r}: {error}") from None
            offset += item[1]
        return tuple(out)
