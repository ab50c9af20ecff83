"""
The storage engine's exception tree.

Every failure a store operation can report to a client is a L{StoreError}
carrying the L{WireErrno} the data-plane server will put on the wire; the
server translates these once, at its boundary. Anything else escaping a store
is a bug.
"""

from __future__ import annotations

import attrs

from svc.wire.errno import WireErrno


class StoreError(Exception):
    """
    A store operation failed for a reason the client should hear about.
    """

    errno: WireErrno = WireErrno.EIO

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message


class NotFound(StoreError):
    """The path, chunk or lease does not exist (ENOENT)."""

    errno = WireErrno.ENOENT


class AlreadyExists(StoreError):
    """The target name is taken (EEXIST)."""

    errno = WireErrno.EEXIST


class NotEmpty(StoreError):
    """A directory to remove or replace still has entries (ENOTEMPTY)."""

    errno = WireErrno.ENOTEMPTY


class NotADirectory(StoreError):
    """A path component or target is not a directory (ENOTDIR)."""

    errno = WireErrno.ENOTDIR


class IsADirectory(StoreError):
    """A file operation was aimed at a directory (EISDIR)."""

    errno = WireErrno.EISDIR


class InvalidArgument(StoreError):
    """A malformed request: bad hash, bad mode, chunk list that does not add up (EINVAL)."""

    errno = WireErrno.EINVAL


class MissingChunks(StoreError):
    """
    A manifest names chunks the store does not hold (EINVAL); ``hashes``
    lists them so the client can upload and retry.
    """

    errno = WireErrno.EINVAL

    def __init__(self, hashes: tuple[str, ...]) -> None:
        super().__init__(f"{len(hashes)} chunk(s) not present")
        self.hashes = hashes


class QuotaExceeded(StoreError):
    """The write would exceed an allocation grant or account budget (EDQUOT)."""

    errno = WireErrno.EDQUOT


class PermissionDenied(StoreError):
    """Path confinement or policy refused the operation (EACCES)."""

    errno = WireErrno.EACCES


class SubtreeMoveRefused(PermissionDenied):
    """
    A caller's check refused to move a directory with its subtree (EACCES);
    ``reason`` is the check's word for why (the data plane's path policy:
    ``deny`` or ``not_allowed``).
    """

    def __init__(self, source: str, destination: str, reason: str) -> None:
        super().__init__(f"moving {source} to {destination} refused: {reason}")
        self.reason = reason


class StorageFull(StoreError):
    """The device holding the store has no space left (ENOSPC)."""

    errno = WireErrno.ENOSPC


class StorageIOError(StoreError):
    """The store's backing storage failed (EIO); the cause is logged."""

    errno = WireErrno.EIO


@attrs.frozen
class LastWriter:
    """
    Who last changed a manifest, for the client's ``recovery_*`` audit fields.
    """

    agent_id: str
    session_id: str | None
    at_unix_ms: int


class StaleVersion(StoreError):
    """
    A manifest compare-and-swap lost (ESTALE, errno 116).

    ``current_version`` is the version now stored (0 when the path does not
    exist); ``last_writer`` is known when the path exists.
    """

    errno = WireErrno.ESTALE

    def __init__(
        self, expected_version: int, current_version: int, last_writer: LastWriter | None
    ) -> None:
        super().__init__(f"expected version {expected_version}, current version {current_version}")
        self.expected_version = expected_version
        self.current_version = current_version
        self.last_writer = last_writer


class ChunksCollected(StoreError):
    """A journal revert needs chunks that garbage collection already removed (ENODATA)."""

    errno = WireErrno.ENODATA

    def __init__(self, hashes: tuple[str, ...]) -> None:
        super().__init__(f"{len(hashes)} chunk(s) needed for the revert were collected")
        self.hashes = hashes


class CorruptChunk(StoreError):
    """Bytes offered or found do not hash to their name (EIO on read, EINVAL on put)."""

    errno = WireErrno.EIO


class WriteLeaseHeld(StoreError):
    """
    A manifest change came from a writer that does not hold the path's write
    lease while another holder does, or from a fenced writer (ESTALE): the
    writer must refetch, take the lease and retry.
    """

    errno = WireErrno.ESTALE


class NotPermitted(StoreError):
    """
    The operation is not allowed on this kind of inode, e.g. a hard link to a
    directory (EPERM).
    """

    errno = WireErrno.EPERM


class CrossSubtree(StoreError):
    """
    A rename or hard link would cross from one agent disk (top-level
    directory) to another (EXDEV).
    """

    errno = WireErrno.EXDEV
