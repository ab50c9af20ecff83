"""
The failures a data-plane operation reports to its client.

Every exception the service raises out of
L{svc.dataplane.interfaces.IConnectionHandler.handle} for a client's mistake
or a refused operation has C{errno} (a L{WireErrno}), C{message} and
C{details} (a map, possibly empty): the protocol adapter puts them into the
ERROR frame as they are. Store errors (L{svc.store.errors.StoreError}) are
translated here, once, so that the C{details} keys the operation schemas
promise (``docs/specifications/dataplane-ops.md``) are filled in.
"""

from __future__ import annotations

from collections.abc import Mapping

from svc.sessions import SessionRejection
from svc.store.chunks import CorruptStoredChunk
from svc.store.errors import (
    ChunksCollected,
    MissingChunks,
    StaleVersion,
    StoreError,
    SubtreeMoveRefused,
    WriteLeaseHeld,
)
from svc.wire.errno import WireErrno


class OpFailed(Exception):
    """
    An operation failed with C{errno}; C{message} is safe to send (no
    secrets, no other tenant's paths); C{details} holds the machine-readable
    extras its schema names.
    """

    def __init__(
        self,
        errno: WireErrno,
        message: str,
        details: Mapping[str, object] | None = None,
    ) -> None:
        super().__init__(message)
        self.errno = errno
        self.message = message
        self.details: Mapping[str, object] = dict(details or {})


class UnknownOp(OpFailed):
    """The C{op} is not one a client may send (ENOSYS)."""

    def __init__(self, op: str) -> None:
        super().__init__(WireErrno.ENOSYS, f"unknown operation {op[:64]!r}")


class SchemaMismatch(OpFailed):
    """
    The payload does not fit the operation's schema: a required key is
    missing, a key has the wrong type, or an array is longer than allowed
    (EPROTO).
    """

    def __init__(self, message: str) -> None:
        super().__init__(WireErrno.EPROTO, message)


class BadValue(OpFailed):
    """A value of the right type outside its range or set (EINVAL)."""

    def __init__(self, message: str) -> None:
        super().__init__(WireErrno.EINVAL, message)


class PolicyDenied(OpFailed):
    """
    The agent's path policy refuses the access (EACCES); with C{subtree},
    the move of a directory (C{details.subtree}: true), not either path
    itself (``path-policy.md`` section 5).
    """

    def __init__(self, reason: str, *, subtree: bool = False) -> None:
        details: dict[str, object] = {"reason": reason}
        if subtree:
            details["subtree"] = True
        super().__init__(WireErrno.EACCES, "denied by path policy", details)


class SessionRefused(OpFailed):
    """
    A presented C{session_id} failed verification (EPERM); C{details.reason}
    is the C{svc_session_forgery_rejected_total} reason.
    """

    def __init__(self, reason: SessionRejection) -> None:
        super().__init__(WireErrno.EPERM, "session refused", {"reason": reason.value})
        self.reason = reason


class NotPlaced(OpFailed):
    """
    The identity the leaf names is not placed on this server (EACCES,
    C{details.reason} C{not_placed}); its connections are closed.
    """

    def __init__(self) -> None:
        super().__init__(
            WireErrno.EACCES,
            "this identity (owner, tenant, agent) is not placed on this server",
            {"reason": "not_placed"},
        )


class PlacementUnconfirmed(OpFailed):
    """
    The identity is not on this server's placement record and the control
    plane could not be asked (EAGAIN, C{details.reason}
    C{placement_unconfirmed}); a later request asks again.
    """

    def __init__(self) -> None:
        super().__init__(
            WireErrno.EAGAIN,
            "cannot confirm this identity's placement now (control plane unreachable)",
            {"reason": "placement_unconfirmed"},
        )


class DiskRootProtected(OpFailed):
    """The agent's disk root cannot be removed, renamed or reverted (EPERM)."""

    def __init__(self) -> None:
        super().__init__(WireErrno.EPERM, "the disk root cannot be removed or replaced")


def missing_chunks(hashes: tuple[str, ...] | list[str]) -> OpFailed:
    """
    The C{manifest_put} failure for chunks the agent must upload first
    (EINVAL, C{details.missing}).
    """
    ordered = list(dict.fromkeys(hashes))
    return OpFailed(WireErrno.EINVAL, f"{len(ordered)} chunk(s) not present", {"missing": ordered})


def chunk_not_present(chunk_hash: str) -> OpFailed:
    """
    The one C{chunk_get} answer for a chunk that is absent I{or} not visible
    to the agent: the two must be indistinguishable.
    """
    return OpFailed(WireErrno.ENOENT, f"chunk {chunk_hash} not present")


def from_store_error(error: StoreError) -> OpFailed:
    """
    The client-facing failure for a store error, with the C{details} of the
    operation schemas.
    """
    details: dict[str, object] = {}
    if isinstance(error, StaleVersion):
        details["reason"] = "version_changed"
        details["expected_version"] = error.expected_version
        details["current_version"] = error.current_version
        writer = error.last_writer
        if writer is not None:
            details["last_writer_agent_id"] = writer.agent_id
            if writer.session_id is not None:
                details["last_writer_session_id"] = writer.session_id
            details["last_writer_at_unix_ms"] = writer.at_unix_ms
    elif isinstance(error, WriteLeaseHeld):
        details["reason"] = "lease_conflict"
    elif isinstance(error, MissingChunks):
        return missing_chunks(error.hashes)
    elif isinstance(error, ChunksCollected):
        details["missing"] = list(error.hashes)
    elif isinstance(error, SubtreeMoveRefused):
        return PolicyDenied(error.reason, subtree=True)
    elif isinstance(error, CorruptStoredChunk):
        return OpFailed(WireErrno.EIO, "stored chunk failed verification")
    return OpFailed(error.errno, error.message or str(error), details)
