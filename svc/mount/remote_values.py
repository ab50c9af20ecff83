"""
The replies of the data-plane operations as frozen values, and their
parsers (``docs/specifications/dataplane-ops.md`` sections 2 and 3). A reply
without the documented shape raises L{BadReply} (or L{ValueError}, from a
value's own checks). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import attrs

from svc.mount.attributes import Attributes, FileKind

T = TypeVar("T")


@attrs.frozen
class ChunkEntry:
    """One element of a manifest's chunk list."""

    hash: str
    size: int


@attrs.frozen
class LastWriter:
    """Who last changed a path (the C{recovery_last_writer_*} fields)."""

    agent_id: str | None = None
    session_id: str | None = None
    at_unix_ms: int | None = None


@attrs.frozen
class Manifest:
    """
    C{manifest_get}: attributes, chunk list, last writer, and the bytes of
    the chunks the reply carried (C{inline}: name and bytes, not verified).
    """

    attributes: Attributes
    chunks: tuple[ChunkEntry, ...]
    last_writer: LastWriter
    inline: tuple[tuple[str, bytes], ...] = ()


@attrs.frozen
class ListedEntry:
    """One C{list} entry (no C{symlink_target})."""

    name: str
    attributes: Attributes


@attrs.frozen
class ListPage:
    """One C{list} page; C{next_after} is L{None} at the end."""

    entries: tuple[ListedEntry, ...]
    next_after: str | None


@attrs.frozen
class PutResult:
    """
    C{manifest_put}: the version and size after the write, the file's
    data-plane inode number and its new ctime (each L{None} from a server
    that does not send it; on create the ctime is also the parent
    directory's new mtime and ctime).
    """

    version: int
    size: int
    created: bool
    inode: int | None = None
    ctime_ns: int | None = None


@attrs.frozen
class RenameResult:
    """
    C{manifest_rename}: names rewritten, whether a target was replaced, and
    the parents' new mtime and ctime (L{None}: nothing changed, or a server
    that does not say).
    """

    moved: int
    replaced: bool
    changed_ns: int | None = None


@attrs.frozen
class LeaseAnswer:
    """C{lease_grant} / C{lease_refresh}: granted, or refused with C{reason}."""

    granted: bool
    mode: str
    lease_id: str | None = None
    epoch: int | None = None
    ttl_ms: int | None = None
    expires_at_unix_ms: int | None = None
    reason: str | None = None


def _count(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if type(value) is not int or value < 0:
        raise ValueError(f"{attribute.name} is {value!r}, not a byte count")


def _optional_count(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None:
        _count(instance, attribute, value)


def _room(instance: DiskUsage, attribute: attrs.Attribute[Any], value: object) -> None:
    _optional_count(instance, attribute, value)
    limited = instance.grant_bytes is not None or instance.budget_bytes is not None
    if limited != (value is not None):
        raise ValueError("available_bytes must be nil exactly when there is no grant and no budget")


@attrs.frozen
class DiskUsage:
    """
    C{statfs}: the agent's disk usage and the limits on it, in bytes; a
    limit of L{None} does not exist, and C{available_bytes} is L{None}
    exactly when neither does. Building one with other values raises
    L{ValueError}.
    """

    used_bytes: int = attrs.field(validator=_count)
    grant_bytes: int | None = attrs.field(validator=_optional_count)
    budget_bytes: int | None = attrs.field(validator=_optional_count)
    account_used_bytes: int | None = attrs.field(validator=_optional_count)
    available_bytes: int | None = attrs.field(validator=_room)


class BadReply(Exception):
    """A reply that does not have the documented shape."""


def get_field(payload: Mapping[str, object], key: str, kind: type[T]) -> T:
    """The value of C{key}, which must be a C{kind} (never a bool for int)."""
    value = payload.get(key)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise BadReply(f"reply key {key!r} is {value!r}, not {kind.__name__}")
    return value


def optional_field(payload: Mapping[str, object], key: str, kind: type[T]) -> T | None:
    """L{get_field}, or L{None} when the key is absent or nil."""
    return None if payload.get(key) is None else get_field(payload, key, kind)


def parse_attributes(payload: Mapping[str, object]) -> Attributes:
    """The L{Attributes} of an attribute map (section 2)."""
    try:
        kind = FileKind(get_field(payload, "kind", str))
    except ValueError:
        raise BadReply(f"unknown kind {payload.get('kind')!r}") from None
    return Attributes(
        server_inode=get_field(payload, "inode", int),
        kind=kind,
        mode=get_field(payload, "mode", int),
        uid=get_field(payload, "uid", int),
        gid=get_field(payload, "gid", int),
        size=get_field(payload, "size", int),
        mtime_ns=get_field(payload, "mtime_ns", int),
        atime_ns=get_field(payload, "atime_ns", int),
        ctime_ns=get_field(payload, "ctime_ns", int),
        version=get_field(payload, "version", int),
        nlink=get_field(payload, "nlink", int),
        rdev=optional_field(payload, "rdev", int) or 0,
        symlink_target=optional_field(payload, "symlink_target", str),
    )


def chunk_entries(value: object) -> tuple[ChunkEntry, ...]:
    """A chunk list (C{[[hash, size], ...]})."""
    if not isinstance(value, list | tuple):
        raise BadReply("chunk list is not an array")
    entries = []
    for item in value:
        if (
            not isinstance(item, list | tuple)
            or len(item) != 2
            or not isinstance(item[0], str)
            or not isinstance(item[1], int)
        ):
            raise BadReply(f"bad chunk list entry {item!r}")
        entries.append(ChunkEntry(item[0], item[1]))
    return tuple(entries)


def inline_chunks(
    value: object, chunks: tuple[ChunkEntry, ...], raw: bytes
) -> tuple[tuple[str, bytes], ...]:
    """
    The chunks a C{manifest_get} carried (C{inline}, absent: none): each a
    distinct chunk of C{chunks} with its bytes, cut from C{raw} in order.
    Whether the bytes hash to the name is the caller's to check.
    """
    if value is None:
        if raw:
            raise BadReply("raw bytes without inline")
        return ()
    if not isinstance(value, list | tuple):
        raise BadReply("inline is not an array")
    sizes = {chunk.hash: chunk.size for chunk in chunks}
    carried: list[tuple[str, bytes]] = []
    offset = 0
    for name in value:
        if not isinstance(name, str) or name not in sizes:
            raise BadReply(f"inline names {name!r}, not one of the chunks")
        if any(name == seen for seen, _ in carried):
            raise BadReply(f"inline repeats {name!r}")
        end = offset + sizes[name]
        carried.append((name, raw[offset:end]))
        offset = end
    if offset != len(raw):
        raise BadReply(f"inline chunks hold {offset} bytes, the raw segment {len(raw)}")
    return tuple(carried)


def parse_disk_usage(payload: Mapping[str, object]) -> DiskUsage:
    """A C{statfs} answer (every key present, limits nil when absent)."""
    return DiskUsage(
        used_bytes=get_field(payload, "used_bytes", int),
        grant_bytes=optional_field(payload, "grant_bytes", int),
        budget_bytes=optional_field(payload, "budget_bytes", int),
        account_used_bytes=optional_field(payload, "account_used_bytes", int),
        available_bytes=optional_field(payload, "available_bytes", int),
    )


def parse_lease(payload: Mapping[str, object]) -> LeaseAnswer:
    """A C{lease_grant} or C{lease_refresh} answer."""
    return LeaseAnswer(
        granted=get_field(payload, "granted", bool) if "granted" in payload else True,
        mode=get_field(payload, "mode", str),
        lease_id=optional_field(payload, "lease_id", str),
        epoch=optional_field(payload, "epoch", int),
        ttl_ms=optional_field(payload, "ttl_ms", int),
        expires_at_unix_ms=optional_field(payload, "expires_at_unix_ms", int),
        reason=optional_field(payload, "reason", str),
    )


MAX_CHANGED_PATHS = 4096
"""The most paths one C{changed} push may name (more: malformed)."""


def parse_changed(payload: Mapping[str, object]) -> tuple[tuple[str, ...], str | None]:
    """
    A C{changed} push: its C{paths} (1 or more strings) and C{session_id}
    (a string or nil).

    @raise BadReply: any other shape.
    """
    paths = payload.get("paths")
    if not isinstance(paths, list | tuple) or not 1 <= len(paths) <= MAX_CHANGED_PATHS:
        raise BadReply("paths is not an array of 1 to 4096 paths")
    if not all(isinstance(path, str) for path in paths):
        raise BadReply("a path is not a string")
    return tuple(paths), optional_field(payload, "session_id", str)
