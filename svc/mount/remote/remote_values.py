"""
The answers of the data-plane operations as the mount uses them: frozen
values made from the answer messages the wire declares
(L{svc.wire.messages}, which checked their shape), plus what only the mount
adds (its L{Attributes}, the inline chunks cut from a raw segment). A value
that does not hold together raises L{BadReply} (or L{ValueError}, from a
value's own checks). Pure.
"""

from __future__ import annotations

from typing import Any

import attrs

from svc.mount.core.attributes import Attributes, FileKind
from svc.wire.answers import FileAttributes, LeaseReply, ListEntry, StatfsReply
from svc.wire.kinds import ChunkEntry

__all__ = ["ChunkEntry"]


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
    """
    One C{list} entry (no C{symlink_target}); a file's chunk list when the
    answer carried it (L{None}: not carried), and the bytes of the chunks it
    carried inline (name and bytes, not verified).
    """

    name: str
    attributes: Attributes
    chunks: tuple[ChunkEntry, ...] | None = None
    inline: tuple[tuple[str, bytes], ...] = ()


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
    """An answer that does not hold together (its shape was checked by the wire)."""


def attributes_of(attributes: FileAttributes) -> Attributes:
    """The mount's L{Attributes} of an attribute map."""
    return Attributes(
        server_inode=attributes.inode,
        kind=FileKind(attributes.kind),
        mode=attributes.mode,
        uid=attributes.uid,
        gid=attributes.gid,
        size=attributes.size,
        mtime_ns=attributes.mtime_ns,
        atime_ns=attributes.atime_ns,
        ctime_ns=attributes.ctime_ns,
        version=attributes.version,
        nlink=attributes.nlink,
        rdev=attributes.rdev,
        symlink_target=attributes.symlink_target,
    )


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


def listed_entries(entries: tuple[ListEntry, ...], raw: bytes) -> tuple[ListedEntry, ...]:
    """
    A C{list} page's entries, each with the chunk list it carried and its
    inline chunks: the raw segment holds each distinct chunk the entries'
    C{inline} name once, in order of first naming, entry after entry
    (``dataplane-ops.md``, C{list}).
    """
    listed: list[ListedEntry] = []
    cut: dict[str, bytes] = {}
    offset = 0
    for entry in entries:
        if entry.inline is not None and entry.chunks is None:
            raise BadReply(f"{entry.name!r} carries inline chunks without its chunk list")
        sizes = {chunk.hash: chunk.size for chunk in entry.chunks or ()}
        carried: list[tuple[str, bytes]] = []
        for name in entry.inline or ():
            if name not in sizes:
                raise BadReply(f"{entry.name!r}: inline names {name!r}, not one of its chunks")
            if any(name == seen for seen, _ in carried):
                raise BadReply(f"{entry.name!r}: inline repeats {name!r}")
            data = cut.get(name)
            if data is None:
                end = offset + sizes[name]
                if end > len(raw):
                    raise BadReply(f"the raw segment ends inside chunk {name!r}")
                data = cut[name] = raw[offset:end]
                offset = end
            carried.append((name, data))
        attributes = attributes_of(entry.attributes)
        listed.append(ListedEntry(entry.name, attributes, entry.chunks, tuple(carried)))
    if offset != len(raw):
        raise BadReply(
            f"the entries' inline chunks hold {offset} bytes, the raw segment {len(raw)}"
        )
    return tuple(listed)


def disk_usage_of(reply: StatfsReply) -> DiskUsage:
    """A C{statfs} answer (limits nil when absent)."""
    return DiskUsage(
        used_bytes=reply.used_bytes,
        grant_bytes=reply.grant_bytes,
        budget_bytes=reply.budget_bytes,
        account_used_bytes=reply.account_used_bytes,
        available_bytes=reply.available_bytes,
    )


def lease_answer_of(reply: LeaseReply) -> LeaseAnswer:
    """A C{lease_grant} or C{lease_refresh} answer."""
    return LeaseAnswer(
        granted=reply.granted,
        mode=reply.mode,
        lease_id=reply.lease_id,
        epoch=reply.epoch,
        ttl_ms=reply.ttl_ms,
        expires_at_unix_ms=reply.expires_at_unix_ms,
        reason=reply.reason,
    )
