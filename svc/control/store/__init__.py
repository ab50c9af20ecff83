"""
The control plane's persistence: one interface
(L{svc.control.store.interface.ControlStore}), two implementations (SQLite,
the embedded default; PostgreSQL for production), numbered migrations per
backend, and L{open_store} to open the one C{DATABASE_URL} names.

``docs/specifications/control-db.md`` describes the schema and what each
operation guarantees.
"""

from __future__ import annotations

from svc.control.store.errors import (
    Conflict,
    ControlStoreError,
    InvalidValue,
    LeaseLost,
    NotFound,
    Revoked,
    SchemaTooNew,
)
from svc.control.store.interface import ControlStore
from svc.control.store.opening import open_store
from svc.control.store.outcomes import (
    EnrollGrant,
    EnrollOutcome,
    EnrollRefusal,
    EnrollRefusalReason,
    InsufficientCapacity,
    MountConflict,
    MountConflictCode,
    MountGranted,
    MountOutcome,
    PlacementOutcome,
    Provisioned,
)
from svc.control.store.url import PostgresUrl, SQLiteUrl, parse_database_url
from svc.control.store.values import (
    AdminSession,
    Allocation,
    AllocationState,
    ApiToken,
    CaKind,
    CaMaterial,
    CertificateKind,
    EnrollToken,
    IssuedCertificate,
    MountHolder,
    MountLease,
    Placement,
    Revocation,
    Server,
    Tenant,
    User,
)

__all__ = [
    "AdminSession",
    "Allocation",
    "AllocationState",
    "ApiToken",
    "CaKind",
    "CaMaterial",
    "CertificateKind",
    "Conflict",
    "ControlStore",
    "ControlStoreError",
    "EnrollGrant",
    "EnrollOutcome",
    "EnrollRefusal",
    "EnrollRefusalReason",
    "EnrollToken",
    "InsufficientCapacity",
    "InvalidValue",
    "IssuedCertificate",
    "LeaseLost",
    "MountConflict",
    "MountConflictCode",
    "MountGranted",
    "MountHolder",
    "MountLease",
    "MountOutcome",
    "NotFound",
    "Placement",
    "PlacementOutcome",
    "PostgresUrl",
    "Provisioned",
    "Revocation",
    "Revoked",
    "SQLiteUrl",
    "SchemaTooNew",
    "Server",
    "Tenant",
    "User",
    "open_store",
    "parse_database_url",
]
