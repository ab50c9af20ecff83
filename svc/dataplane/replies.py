"""
The answer maps (and push maps) of the data-plane operations, built from the
store's result values: each store value becomes the answer message
L{svc.wire.messages} declares, which L{svc.wire.contract.answer_map} turns
into its map. The keys, their types and which are left out live in the
declarations only; this module only says which store value fills which
field. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from svc.store.journal import RevertResult
from svc.store.journal_rows import JournalEntry, Snapshot
from svc.store.lease_values import LeaseDenied, LeaseGrant, LeaseRevoke
from svc.store.manifest_values import (
    Attributes,
    ChunkRef,
    DirectoryEntry,
    Manifest,
    PutResult,
    RenameResult,
)
from svc.store.quota import QuotaUsage
from svc.wire.answers import (
    CredentialsRevokedPush,
    FileAttributes,
    JournalEntryReply,
    JournalPageReply,
    LeaseReply,
    LeaseRevokePush,
    ListEntry,
    ListReply,
    ManifestReply,
    PutReply,
    RenameReply,
    RevertReply,
    SessionFencedPush,
    StatfsReply,
)
from svc.wire.contract import answer_map
from svc.wire.kinds import ChunkEntry

Reply = dict[str, object]


def _unix_ms(seconds: float) -> int:
    return round(seconds * 1000)


def file_attributes(attributes: Attributes, *, with_target: bool = True) -> FileAttributes:
    """The attribute message of C{attributes} (no C{symlink_target} in listings)."""
    return FileAttributes(
        inode=attributes.inode,
        kind=attributes.kind.value,
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
        symlink_target=attributes.symlink_target if with_target else None,
    )


def attributes_map(attributes: Attributes) -> Reply:
    """C{head_file} and the creating operations: the attribute map."""
    return answer_map(file_attributes(attributes))


def chunk_entries(chunks: Iterable[ChunkRef]) -> tuple[ChunkEntry, ...]:
    """A chunk list in file order."""
    return tuple(ChunkEntry(chunk.hash, chunk.size) for chunk in chunks)


def manifest_map(manifest: Manifest) -> Reply:
    """C{manifest_get}: the attributes, C{chunks} and the last writer."""
    writer = manifest.last_writer
    return answer_map(
        ManifestReply(
            attributes=file_attributes(manifest.attributes),
            chunks=chunk_entries(manifest.chunks),
            last_writer_agent_id=writer.agent_id,
            last_writer_session_id=writer.session_id,
            last_writer_at_unix_ms=writer.at_unix_ms,
        )
    )


def list_map(
    entries: Sequence[DirectoryEntry],
    next_after: str | None,
    chunks: Sequence[tuple[ChunkRef, ...] | None] = (),
) -> Reply:
    """
    C{list}: the entries and C{next_after} (nil when this page ends the
    directory); C{chunks}, when given, the chunk list each entry carries,
    in entry order (L{None}: none).
    """
    carried = chunks or (None,) * len(entries)
    return answer_map(
        ListReply(
            tuple(
                ListEntry(
                    entry.name,
                    file_attributes(entry.attributes, with_target=False),
                    chunks=None if listed is None else chunk_entries(listed),
                )
                for entry, listed in zip(entries, carried, strict=True)
            ),
            next_after,
        )
    )


def put_map(result: PutResult) -> Reply:
    """C{manifest_put}: version, size, created, journal row, inode, new ctime."""
    return answer_map(
        PutReply(
            version=result.version,
            size=result.size,
            created=result.created,
            journal_seq=result.journal_seq,
            inode=result.inode,
            ctime_ns=result.ctime_ns,
        )
    )


def rename_map(result: RenameResult) -> Reply:
    """C{manifest_rename}: names moved, replaced, and the parents' new times."""
    return answer_map(
        RenameReply(result.moved_names, result.replaced is not None, result.changed_ns)
    )


def statfs_map(usage: QuotaUsage) -> Reply:
    """C{statfs}: usage and limits (every key sent)."""
    return answer_map(
        StatfsReply(
            used_bytes=usage.used_bytes,
            grant_bytes=usage.grant_bytes,
            budget_bytes=usage.budget_bytes,
            account_used_bytes=usage.account_used_bytes,
            available_bytes=usage.available_bytes,
            uncommitted_bytes=usage.uncommitted_bytes,
            retained_bytes=usage.retained_bytes,
            collectable_bytes=usage.collectable_bytes,
            retained_cap_bytes=usage.retained_cap_bytes,
            footprint_bound_bytes=usage.footprint_bound_bytes,
        )
    )


def _snapshot(snapshot: Snapshot | None) -> tuple[str | None, int | None]:
    return (None, None) if snapshot is None else (snapshot.kind.value, snapshot.size)


def journal_entry(entry: JournalEntry) -> JournalEntryReply:
    """One journal row (chunk lists are never sent)."""
    old_kind, old_size = _snapshot(entry.old)
    new_kind, new_size = _snapshot(entry.new)
    return JournalEntryReply(
        seq=entry.seq,
        at_ms=entry.at_ms,
        agent_id=entry.agent_id,
        op=entry.op,
        path=entry.path,
        old_version=entry.old_version,
        new_version=entry.new_version,
        session_id=entry.session_id,
        to_path=entry.to_path,
        reverts_seq=entry.reverts_seq,
        old_kind=old_kind,
        old_size=old_size,
        new_kind=new_kind,
        new_size=new_size,
    )


def journal_entry_map(entry: JournalEntry) -> Reply:
    """One journal row's map (the owner routes render rows alike)."""
    return answer_map(journal_entry(entry))


def journal_page_map(entries: Iterable[JournalEntry], next_cursor: int | None) -> Reply:
    """C{journal_query}: rows and C{next_cursor} (nil at the end)."""
    return answer_map(JournalPageReply(tuple(journal_entry(e) for e in entries), next_cursor))


def revert_map(result: RevertResult) -> Reply:
    """C{journal_revert_path}: the row reverted, the new row, and the path's state."""
    restored = result.restored
    return answer_map(
        RevertReply(
            reverted_seq=result.reverted_seq,
            exists=restored is not None,
            journal_seq=result.journal_seq,
            kind=None if restored is None else restored.kind.value,
            version=None if restored is None else restored.version,
            size=None if restored is None else restored.size,
        )
    )


def lease_grant_map(grant: LeaseGrant, now: float) -> Reply:
    """C{lease_grant} granted, and C{lease_refresh} (C{ttl_ms} from now)."""
    return answer_map(
        LeaseReply(
            mode=grant.mode.value,
            granted=True,
            lease_id=grant.lease_id,
            epoch=grant.epoch,
            expires_at_unix_ms=_unix_ms(grant.expires_at),
            ttl_ms=max(0, _unix_ms(grant.expires_at - now)),
        )
    )


def lease_denied_map(denied: LeaseDenied) -> Reply:
    """C{lease_grant} refused: C{granted} false, C{mode}, C{reason}."""
    return answer_map(LeaseReply(mode=denied.mode.value, granted=False, reason=denied.reason.value))


def session_fenced_push(epoch: int) -> Reply:
    """The C{session_fenced} push map: sessions older than C{epoch} are fenced."""
    return answer_map(SessionFencedPush(epoch))


def credentials_revoked_push(serial: str) -> Reply:
    """The C{credentials_revoked} push map for the deny-listed C{serial}."""
    return answer_map(CredentialsRevokedPush(serial))


def lease_revoke_push(revoke: LeaseRevoke, now: float) -> Reply:
    """The C{lease_revoke} push map (C{deadline_ms} from now)."""
    return answer_map(
        LeaseRevokePush(
            lease_id=revoke.lease_id,
            path=revoke.path,
            mode=revoke.mode.value,
            reason=revoke.reason.value,
            deadline_unix_ms=_unix_ms(revoke.deadline),
            deadline_ms=max(0, _unix_ms(revoke.deadline - now)),
        )
    )
