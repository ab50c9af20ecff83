"""
Where a tenant's data lives on disk: pure path arithmetic, no I/O.

The spec fixes the shape::

    <tenants_root>/<owner>/[<tenant>/]store/objects/<2 hex>/<hash>
    <metadata_root>/<owner>/[<tenant>/]routes.db
    <metadata_root>/<owner>/[<tenant>/]leases.db

The C{<tenant>} level exists only when the tenant differs from the owner; the
owner directory carries the account quota. C{metadata_root} defaults to
C{tenants_root}, so an owner directory may hold its own C{store/},
C{routes.db} and C{leases.db} next to the directories of its other tenants.
A nested tenant may therefore not be named like one of those entries (see
L{is_reserved_tenant_name}). The full description is
C{docs/specifications/chunk-store.md}.
"""

from __future__ import annotations

import re
from pathlib import Path

import attrs

HASH_HEX_LENGTH = 64
"""A chunk hash is BLAKE3-256 written as 64 lowercase hex digits."""

SHARD_HEX_LENGTH = 2
"""Chunks are sharded by the first hash byte: two hex digits, 256 shards."""

STORE_DIR_NAME = "store"
OBJECTS_DIR_NAME = "objects"
ROUTES_DB_NAME = "routes.db"
LEASES_DB_NAME = "leases.db"

_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_HASH_PATTERN = re.compile(r"[0-9a-f]{64}")
_SHARD_PATTERN = re.compile(r"[0-9a-f]{2}")

_RESERVED_NAMES = frozenset({STORE_DIR_NAME})
_RESERVED_PREFIXES = (ROUTES_DB_NAME, LEASES_DB_NAME)


def is_valid_id(value: str) -> bool:
    """
    Whether C{value} may be used as an owner or tenant id, which become path
    components: 1 to 128 characters from C{[A-Za-z0-9._-]}, starting with a
    letter or digit (so never C{.}, C{..}, a hidden name or anything with a
    slash).
    """
    return _ID_PATTERN.fullmatch(value) is not None


def is_reserved_tenant_name(value: str) -> bool:
    """
    Whether C{value} would collide with an entry the owner directory holds
    for the owner's own tenant: C{store}, or any name beginning with
    C{routes.db} or C{leases.db} (the databases and their SQLite C{-wal},
    C{-shm} and C{-journal} companions). Such a name is refused for a tenant
    that differs from its owner.
    """
    return value in _RESERVED_NAMES or value.startswith(_RESERVED_PREFIXES)


def is_chunk_hash(value: str) -> bool:
    """
    Whether C{value} is a chunk name: exactly 64 lowercase hex digits.
    """
    return _HASH_PATTERN.fullmatch(value) is not None


def is_shard_name(value: str) -> bool:
    """
    Whether C{value} is a shard directory name: two lowercase hex digits.
    """
    return _SHARD_PATTERN.fullmatch(value) is not None


def _check_owner(instance: TenantLocation, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str) or not is_valid_id(value):
        raise ValueError(f"invalid owner id {value!r}")


def _check_tenant(instance: TenantLocation, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str) or not is_valid_id(value):
        raise ValueError(f"invalid tenant id {value!r}")
    if value != instance.owner and is_reserved_tenant_name(value):
        raise ValueError(f"tenant id {value!r} is reserved inside an owner directory")


@attrs.frozen
class TenantLocation:
    """
    The owner account and tenant whose data a path belongs to.

    Both ids are validated on construction (L{is_valid_id}); a tenant that
    differs from its owner must also not be a reserved name
    (L{is_reserved_tenant_name}). Raises L{ValueError} otherwise.
    """

    owner: str = attrs.field(validator=_check_owner)
    tenant: str = attrs.field(validator=_check_tenant)

    @classmethod
    def for_owner(cls, owner: str) -> TenantLocation:
        """
        The owner's own tenant (no separate tenant level on disk).
        """
        return cls(owner=owner, tenant=owner)

    @property
    def components(self) -> tuple[str, ...]:
        """
        The path components below a root: C{(owner,)} or C{(owner, tenant)}.
        """
        if self.tenant == self.owner:
            return (self.owner,)
        return (self.owner, self.tenant)


def owner_dir(root: Path, owner: str) -> Path:
    """
    C{<root>/<owner>}: the directory that carries the account quota.
    """
    if not is_valid_id(owner):
        raise ValueError(f"invalid owner id {owner!r}")
    return root / owner


def tenant_dir(root: Path, location: TenantLocation) -> Path:
    """
    C{<root>/<owner>} or C{<root>/<owner>/<tenant>}.
    """
    return root.joinpath(*location.components)


def chunk_objects_dir(tenants_root: Path, location: TenantLocation) -> Path:
    """
    C{<tenants_root>/<owner>/[<tenant>/]store/objects}: the directory a
    chunk store owns.
    """
    return tenant_dir(tenants_root, location) / STORE_DIR_NAME / OBJECTS_DIR_NAME


def shard_name(chunk_hash: str) -> str:
    """
    The shard directory name of a chunk: its first two hex digits.
    """
    if not is_chunk_hash(chunk_hash):
        raise ValueError(f"not a chunk hash: {chunk_hash!r}")
    return chunk_hash[:SHARD_HEX_LENGTH]


def chunk_path(objects_dir: Path, chunk_hash: str) -> Path:
    """
    C{<objects_dir>/<2 hex>/<hash>}.
    """
    return objects_dir / shard_name(chunk_hash) / chunk_hash


def metadata_dir(metadata_root: Path, location: TenantLocation) -> Path:
    """
    C{<metadata_root>/<owner>/[<tenant>/]}, which holds C{routes.db} and
    C{leases.db}.
    """
    return tenant_dir(metadata_root, location)


def routes_db_path(metadata_root: Path, location: TenantLocation) -> Path:
    """
    The tenant's C{routes.db} (manifests, journal, sessions).
    """
    return metadata_dir(metadata_root, location) / ROUTES_DB_NAME


def leases_db_path(metadata_root: Path, location: TenantLocation) -> Path:
    """
    The tenant's C{leases.db}.
    """
    return metadata_dir(metadata_root, location) / LEASES_DB_NAME
