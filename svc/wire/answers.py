"""
The answers of the data-plane operations, their pushes and the C{details} of
their errors, each declared once (the requests and the limits they share are
L{svc.wire.messages}'); L{svc.wire.commands} ties them to operations.
"""

from __future__ import annotations

import attrs

from svc.wire.kinds import Bool, Choice, ChunkEntry, ChunkList, ListOf
from svc.wire.messages import (
    ANY_INT,
    CHUNK_LIST,
    COUNT,
    FILE_KINDS,
    HASH,
    MAX_CHANGED_PATHS,
    MAX_CHUNK_HAS,
    MAX_INLINE_CHUNKS,
    MAX_JOURNAL_LIMIT,
    MAX_LIST_ENTRY_CHUNKS,
    MAX_LIST_LIMIT,
    MAX_MANIFEST_CHUNKS,
    TEXT,
    optional_int,
)
from svc.wire.schema import Flat, Nested, arg


@attrs.frozen
class FileAttributes:
    """
    The attribute keys of C{head_file}, C{manifest_get}, C{list} entries and
    the creating operations (C{dataplane-ops.md} section 2);
    C{symlink_target} only for a symlink, and never in a listing.
    """

    inode: int = arg(ANY_INT)
    kind: str = arg(Choice(FILE_KINDS))
    mode: int = arg(ANY_INT)
    uid: int = arg(ANY_INT)
    gid: int = arg(ANY_INT)
    size: int = arg(ANY_INT)
    mtime_ns: int = arg(ANY_INT)
    atime_ns: int = arg(ANY_INT)
    ctime_ns: int = arg(ANY_INT)
    version: int = arg(ANY_INT)
    nlink: int = arg(ANY_INT)
    rdev: int = arg(ANY_INT, default=0)
    symlink_target: str | None = arg(TEXT, default=None)


@attrs.frozen
class ListEntry:
    """
    One C{list} entry: C{name} and the attributes (no C{symlink_target});
    for a regular file of a listing asked with C{chunks}, perhaps C{chunks}
    (its chunk list, of the version listed) and, asked with C{inline_max}
    too, C{inline}: the distinct chunks whose bytes the answer's raw segment
    carries for it, in their order there (each key absent when not carried).
    """

    name: str = arg(TEXT)
    attributes: FileAttributes = arg(Flat(FileAttributes))
    chunks: tuple[ChunkEntry, ...] | None = arg(ChunkList(MAX_LIST_ENTRY_CHUNKS), default=None)
    inline: tuple[str, ...] | None = arg(ListOf(HASH, MAX_INLINE_CHUNKS), default=None)


@attrs.frozen
class ListReply:
    """
    C{list}: a page of entries; C{next_after} nil when the page ends the
    directory. The raw segment holds the bytes of every entry's C{inline}
    chunks, entry after entry, each entry's in its C{inline} order.
    """

    entries: tuple[ListEntry, ...] = arg(ListOf(Nested(ListEntry), MAX_LIST_LIMIT))
    next_after: str | None = arg(TEXT, default=None, nil=True)


@attrs.frozen
class ManifestReply:
    """
    C{manifest_get}: the attributes, the chunk list, the last writer, and
    C{inline}: the chunks whose bytes the raw segment carries, in its order.
    """

    attributes: FileAttributes = arg(Flat(FileAttributes))
    chunks: tuple[ChunkEntry, ...] = arg(CHUNK_LIST, default=())
    last_writer_agent_id: str | None = arg(TEXT, default=None)
    last_writer_session_id: str | None = arg(TEXT, default=None)
    last_writer_at_unix_ms: int | None = optional_int()
    inline: tuple[str, ...] | None = arg(ListOf(HASH, MAX_INLINE_CHUNKS), default=None)


@attrs.frozen
class PutReply:
    """
    C{manifest_put}: C{version} and C{size} after the write, C{created},
    C{journal_seq}, the file's C{inode} and new C{ctime_ns}.
    """

    version: int = arg(ANY_INT)
    size: int = arg(ANY_INT)
    created: bool = arg(Bool(), default=False)
    journal_seq: int | None = optional_int()
    inode: int | None = optional_int()
    ctime_ns: int | None = optional_int()


@attrs.frozen
class RemoveReply:
    """C{manifest_delete}, C{dir_remove}: the parent's new mtime and ctime."""

    dir_ctime_ns: int | None = optional_int()


@attrs.frozen
class RenameReply:
    """
    C{manifest_rename}: names rewritten, whether a destination was replaced,
    and (unless nothing changed) the parents' new mtime and ctime.
    """

    moved: int = arg(ANY_INT)
    replaced: bool = arg(Bool(), default=False)
    dir_ctime_ns: int | None = optional_int()


@attrs.frozen
class ReadlinkReply:
    """C{readlink}: the target."""

    target: str = arg(TEXT)


@attrs.frozen
class StatfsReply:
    """
    C{statfs}: usage and limits in bytes; every key sent, nil where no
    limit; then the rest of the agent's footprint (uploads not yet named by
    its files, bytes kept for its journal and their cap, bytes released and
    waiting for deletion, and the most all of it may reach).
    """

    used_bytes: int = arg(COUNT)
    grant_bytes: int | None = arg(COUNT, default=None, nil=True)
    budget_bytes: int | None = arg(COUNT, default=None, nil=True)
    account_used_bytes: int | None = arg(COUNT, default=None, nil=True)
    available_bytes: int | None = arg(COUNT, default=None, nil=True)
    uncommitted_bytes: int = arg(COUNT, default=0)
    retained_bytes: int = arg(COUNT, default=0)
    collectable_bytes: int = arg(COUNT, default=0)
    retained_cap_bytes: int | None = arg(COUNT, default=None)
    footprint_bound_bytes: int | None = arg(COUNT, default=None, nil=True)


@attrs.frozen
class ChunkReply:
    """C{chunk_get} (raw segment: the bytes) and C{chunk_put}: the chunk's name and size."""

    hash: str = arg(HASH)
    size: int = arg(COUNT)


@attrs.frozen
class ChunkHasReply:
    """C{chunk_has}: one boolean per hash asked, in order."""

    present: tuple[bool, ...] = arg(ListOf(Bool(), MAX_CHUNK_HAS))


@attrs.frozen
class JournalEntryReply:
    """One journal row (chunk lists are never sent)."""

    seq: int = arg(ANY_INT)
    at_ms: int = arg(ANY_INT)
    agent_id: str = arg(TEXT)
    op: str = arg(TEXT)
    path: str = arg(TEXT)
    old_version: int | None = arg(ANY_INT, default=None, nil=True)
    new_version: int | None = arg(ANY_INT, default=None, nil=True)
    session_id: str | None = arg(TEXT, default=None)
    to_path: str | None = arg(TEXT, default=None)
    reverts_seq: int | None = optional_int()
    old_kind: str | None = arg(TEXT, default=None)
    old_size: int | None = optional_int()
    new_kind: str | None = arg(TEXT, default=None)
    new_size: int | None = optional_int()


@attrs.frozen
class JournalPageReply:
    """C{journal_query}: rows, and C{next_cursor} (nil at the end)."""

    entries: tuple[JournalEntryReply, ...] = arg(
        ListOf(Nested(JournalEntryReply), MAX_JOURNAL_LIMIT)
    )
    next_cursor: int | None = arg(ANY_INT, default=None, nil=True)


@attrs.frozen
class RevertReply:
    """
    C{journal_revert_path}: the row reverted, the new row (nil: nothing
    changed), whether the path exists, and then its kind, version and size.
    """

    reverted_seq: int = arg(ANY_INT)
    exists: bool = arg(Bool())
    journal_seq: int | None = arg(ANY_INT, default=None, nil=True)
    kind: str | None = arg(TEXT, default=None)
    version: int | None = optional_int()
    size: int | None = optional_int()


@attrs.frozen
class LeaseReply:
    """
    C{lease_grant} and C{lease_refresh}: granted (with the lease's id,
    epoch and expiry), or refused with C{reason}.
    """

    mode: str = arg(TEXT)
    granted: bool = arg(Bool(), default=True)
    lease_id: str | None = arg(TEXT, default=None)
    epoch: int | None = optional_int()
    expires_at_unix_ms: int | None = optional_int()
    ttl_ms: int | None = optional_int()
    reason: str | None = arg(TEXT, default=None)


@attrs.frozen
class EmptyReply:
    """The answer of C{ping}, C{close}, C{lease_release}: an empty map."""


# Pushes.


@attrs.frozen
class LeaseRevokePush:
    """C{lease_revoke}: give the lease up before the deadline."""

    lease_id: str = arg(TEXT)
    path: str = arg(TEXT)
    mode: str = arg(TEXT)
    reason: str = arg(TEXT)
    deadline_unix_ms: int = arg(ANY_INT)
    deadline_ms: int = arg(ANY_INT)


@attrs.frozen
class ChangedPush:
    """C{changed}: paths another connection of the agent changed."""

    paths: tuple[str, ...] = arg(ListOf(TEXT, MAX_CHANGED_PATHS, min_items=1))
    session_id: str | None = arg(TEXT, default=None, nil=True)


@attrs.frozen
class CredentialsRevokedPush:
    """
    C{credentials_revoked}: the certificate this connection was admitted
    with (its leaf, or its tenant intermediate: C{serial}) is deny-listed;
    GOAWAY C{credentials_expired} follows, and no connection with it will
    be admitted again. Nothing the client sends from now on is executed.
    """

    serial: str = arg(TEXT)


@attrs.frozen
class SessionFencedPush:
    """
    C{session_fenced}: the agent's mount lease was granted again, at
    C{epoch}; every write presenting a session of an older epoch is refused
    (EPERM C{fenced}) from now on. The connection stays open for reads.
    """

    epoch: int = arg(ANY_INT)


# Error details.


@attrs.frozen
class StaleDetails:
    """
    C{ESTALE}: C{reason} C{version_changed} (with the versions and, when the
    path exists, its last writer) or C{lease_conflict}.
    """

    reason: str = arg(TEXT)
    expected_version: int | None = optional_int()
    current_version: int | None = optional_int()
    last_writer_agent_id: str | None = arg(TEXT, default=None)
    last_writer_session_id: str | None = arg(TEXT, default=None)
    last_writer_at_unix_ms: int | None = optional_int()


@attrs.frozen
class MissingDetails:
    """C{EINVAL} of C{manifest_put}, C{ENODATA} of a revert: the chunks missing."""

    missing: tuple[str, ...] = arg(ListOf(HASH, MAX_MANIFEST_CHUNKS), default=())


@attrs.frozen
class ReasonDetails:
    """
    C{EACCES} of the path policy, C{EPERM} of a refused session: why; and for
    the policy, C{subtree} when a directory's move is refused for what lies
    below it (``path-policy.md`` section 5).
    """

    reason: str | None = arg(TEXT, default=None)
    subtree: bool | None = arg(Bool(), default=None)
