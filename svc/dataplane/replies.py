"""
The response maps (and the C{lease_revoke} push map) of the data-plane
operations, built from the store's result values. Pure. The keys are
specified in ``docs/specifications/dataplane-ops.md``; optional keys are
left out when they do not apply (never sent as nil), except where the
document says nil.
"""

from __future__ import annotations

from collections.abc import Iterable

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

Reply = dict[str, object]


def _unix_ms(seconds: float) -> int:
    return round(seconds * 1000)


def attributes_map(attributes: Attributes, *, with_target: bool = True) -> Reply:
    """
    The attribute keys shared by C{head_file}, C{manifest_get}, C{list}
    entries and the creating operations: C{inode}, C{kind}, C{mode}, C{uid},
    C{gid}, C{size}, C{mtime_ns}, C{atime_ns}, C{ctime_ns}, C{version},
    C{nlink}, C{rdev}, and C{symlink_target} for a symlink (unless
    C{with_target} is false, as in listings).
    """
    reply: Reply = {
        "inode": attributes.inode,
        "kind": attributes.kind.value,
        "mode": attributes.mode,
        "uid": attributes.uid,
        "gid": attributes.gid,
        "size": attributes.size,
        "mtime_ns": attributes.mtime_ns,
        "atime_ns": attributes.atime_ns,
        "ctime_ns": attributes.ctime_ns,
        "version": attributes.version,
        "nlink": attributes.nlink,
        "rdev": attributes.rdev,
    }
    if with_target and attributes.symlink_target is not None:
        reply["symlink_target"] = attributes.symlink_target
    return reply


def chunks_list(chunks: Iterable[ChunkRef]) -> list[list[object]]:
    """A chunk list as C{[[hash, size], ...]} in file order."""
    return [[chunk.hash, chunk.size] for chunk in chunks]


def manifest_map(manifest: Manifest) -> Reply:
    """
    C{manifest_get}: the attributes, C{chunks}, and the last writer
    (C{last_writer_agent_id}, C{last_writer_session_id} when there was one,
    C{last_writer_at_unix_ms}).
    """
    reply = attributes_map(manifest.attributes)
    reply["chunks"] = chunks_list(manifest.chunks)
    writer = manifest.last_writer
    reply["last_writer_agent_id"] = writer.agent_id
    if writer.session_id is not None:
        reply["last_writer_session_id"] = writer.session_id
    reply["last_writer_at_unix_ms"] = writer.at_unix_ms
    return reply


def list_map(entries: Iterable[DirectoryEntry], next_after: str | None) -> Reply:
    """
    C{list}: C{entries} (each C{name} plus the attributes without
    C{symlink_target}) and C{next_after} (the name to continue after, nil
    when this page ends the directory).
    """
    rows = []
    for entry in entries:
        row: Reply = {"name": entry.name}
        row.update(attributes_map(entry.attributes, with_target=False))
        rows.append(row)
    return {"entries": rows, "next_after": next_after}


def put_map(result: PutResult) -> Reply:
    """
    C{manifest_put}: C{version} and C{size} after the write, C{created},
    C{journal_seq}, the file's C{inode}, and its new C{ctime_ns} (on
    create also the parent directory's new mtime and ctime).
    """
    return {
        "inode": result.inode,
        "version": result.version,
        "size": result.size,
        "created": result.created,
        "journal_seq": result.journal_seq,
        "ctime_ns": result.ctime_ns,
    }


def rename_map(result: RenameResult) -> Reply:
    """
    C{manifest_rename}: C{moved} names, whether a destination was
    C{replaced}, and (unless nothing changed) C{dir_ctime_ns}, the parents'
    new mtime and ctime.
    """
    reply: Reply = {"moved": result.moved_names, "replaced": result.replaced is not None}
    if result.changed_ns is not None:
        reply["dir_ctime_ns"] = result.changed_ns
    return reply


def statfs_map(usage: QuotaUsage) -> Reply:
    """
    C{statfs}: C{used_bytes}, C{grant_bytes} (nil: no grant),
    C{budget_bytes} (nil: no account budget), C{account_used_bytes} (nil
    without a budget) and
    C{available_bytes} (nil when neither limit exists). Every key is always
    sent.
    """
    return {
        "used_bytes": usage.used_bytes,
        "grant_bytes": usage.grant_bytes,
        "budget_bytes": usage.budget_bytes,
        "account_used_bytes": usage.account_used_bytes,
        "available_bytes": usage.available_bytes,
    }


def _snapshot_fields(prefix: str, snapshot: Snapshot | None, reply: Reply) -> None:
    if snapshot is not None:
        reply[f"{prefix}_kind"] = snapshot.kind.value
        reply[f"{prefix}_size"] = snapshot.size


def journal_entry_map(entry: JournalEntry) -> Reply:
    """
    One journal row: C{seq}, C{at_ms}, C{agent_id}, C{op}, C{path},
    C{old_version}, C{new_version}; C{session_id}, C{to_path},
    C{reverts_seq}, C{old_kind}/C{old_size}, C{new_kind}/C{new_size} when
    they apply. Snapshot chunk lists are never sent.
    """
    reply: Reply = {
        "seq": entry.seq,
        "at_ms": entry.at_ms,
        "agent_id": entry.agent_id,
        "op": entry.op,
        "path": entry.path,
        "old_version": entry.old_version,
        "new_version": entry.new_version,
    }
    if entry.session_id is not None:
        reply["session_id"] = entry.session_id
    if entry.to_path is not None:
        reply["to_path"] = entry.to_path
    if entry.reverts_seq is not None:
        reply["reverts_seq"] = entry.reverts_seq
    _snapshot_fields("old", entry.old, reply)
    _snapshot_fields("new", entry.new, reply)
    return reply


def journal_page_map(entries: Iterable[JournalEntry], next_cursor: int | None) -> Reply:
    """C{journal_query}: C{entries} and C{next_cursor} (nil at the end)."""
    return {"entries": [journal_entry_map(e) for e in entries], "next_cursor": next_cursor}


def revert_map(result: RevertResult) -> Reply:
    """
    C{journal_revert_path}: C{reverted_seq}, C{journal_seq} (nil when
    nothing changed), C{exists}, and when the path exists afterwards its
    C{kind}, C{version} and C{size}.
    """
    reply: Reply = {
        "reverted_seq": result.reverted_seq,
        "journal_seq": result.journal_seq,
        "exists": result.restored is not None,
    }
    if result.restored is not None:
        reply["kind"] = result.restored.kind.value
        reply["version"] = result.restored.version
        reply["size"] = result.restored.size
    return reply


def lease_grant_map(grant: LeaseGrant, now: float) -> Reply:
    """
    C{lease_grant} granted, and C{lease_refresh}: C{granted} true,
    C{lease_id}, C{mode}, C{epoch}, C{expires_at_unix_ms} and C{ttl_ms}
    (from now; a client should rely on this rather than on clock agreement).
    """
    return {
        "granted": True,
        "lease_id": grant.lease_id,
        "mode": grant.mode.value,
        "epoch": grant.epoch,
        "expires_at_unix_ms": _unix_ms(grant.expires_at),
        "ttl_ms": max(0, _unix_ms(grant.expires_at - now)),
    }


def lease_denied_map(denied: LeaseDenied) -> Reply:
    """C{lease_grant} refused: C{granted} false, C{mode}, C{reason}."""
    return {"granted": False, "mode": denied.mode.value, "reason": denied.reason.value}


def lease_revoke_push(revoke: LeaseRevoke, now: float) -> Reply:
    """
    The C{lease_revoke} PUSH payload: C{lease_id}, C{path}, C{mode},
    C{reason}, C{deadline_unix_ms} and C{deadline_ms} (from now).
    """
    return {
        "lease_id": revoke.lease_id,
        "path": revoke.path,
        "mode": revoke.mode.value,
        "reason": revoke.reason.value,
        "deadline_unix_ms": _unix_ms(revoke.deadline),
        "deadline_ms": max(0, _unix_ms(revoke.deadline - now)),
    }
