"""
The operation names carried in the C{op} key of REQUEST and PUSH payloads.

Server and client both take the names from here. The payload schema of each
operation is defined separately; this module only fixes the names.
"""

from __future__ import annotations

import enum


class Op(enum.StrEnum):
    """
    Every operation name of protocol version 1.
    """

    # Namespace and metadata.
    LIST = "list"
    HEAD_FILE = "head_file"
    MANIFEST_GET = "manifest_get"
    MANIFEST_PUT = "manifest_put"
    MANIFEST_DELETE = "manifest_delete"
    MANIFEST_RENAME = "manifest_rename"
    DIR_CREATE = "dir_create"
    DIR_REMOVE = "dir_remove"
    SETATTR = "setattr"
    SYMLINK = "symlink"
    READLINK = "readlink"
    MKNOD = "mknod"
    LINK = "link"
    # The disk: usage and limits (statfs).
    STATFS = "statfs"
    # Chunks (raw segment carries the bytes of chunk_put and chunk_get).
    CHUNK_GET = "chunk_get"
    CHUNK_PUT = "chunk_put"
    CHUNK_HAS = "chunk_has"
    # Journal.
    JOURNAL_QUERY = "journal_query"
    JOURNAL_REVERT_PATH = "journal_revert_path"
    # Leases.
    LEASE_GRANT = "lease_grant"
    LEASE_REFRESH = "lease_refresh"
    LEASE_RELEASE = "lease_release"
    LEASE_REVOKE = "lease_revoke"
    # What another writer changed (server push).
    CHANGED = "changed"
    # The connection's certificate was revoked (server push, before GOAWAY).
    CREDENTIALS_REVOKED = "credentials_revoked"
    # Mount sessions older than an epoch are fenced (server push).
    SESSION_FENCED = "session_fenced"
    # Connection.
    PING = "ping"
    CLOSE = "close"


PUSH_OPS = frozenset({Op.LEASE_REVOKE, Op.CHANGED, Op.CREDENTIALS_REVOKED, Op.SESSION_FENCED})
"""Operations the server sends in PUSH frames."""

REQUEST_OPS = frozenset(Op) - PUSH_OPS
"""Operations a client sends in REQUEST frames."""
