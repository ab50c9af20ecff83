"""
Column lists and row-to-record conversions shared by the transactions.

Each C{*_COLUMNS} string is the select list whose row the matching function
turns into a record of L{svc.control.store.values}.
"""

from __future__ import annotations

from datetime import datetime

from svc.control.store.sql import (
    as_bool,
    as_bytes,
    as_int,
    as_opt_int,
    as_opt_str,
    as_str,
)
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
    Revocation,
    Server,
    Tenant,
    User,
    from_micros,
    optional_from_micros,
)

Row = tuple[object, ...]

USER_COLUMNS = "user_id, display_name, budget_bytes, suspended, created_us"


def user(row: Row) -> User:
    """A L{User} from L{USER_COLUMNS}."""
    return User(as_str(row[0]), as_str(row[1]), as_opt_int(row[2]), as_bool(row[3]), at(row[4]))


TENANT_COLUMNS = "tenant_id, owner_id, suspended, created_us"


def tenant(row: Row) -> Tenant:
    """A L{Tenant} from L{TENANT_COLUMNS}."""
    return Tenant(as_str(row[0]), as_str(row[1]), as_bool(row[2]), at(row[3]))


ALLOCATION_COLUMNS = (
    "allocation_id, agent_id, owner_id, tenant_id, grant_bytes, state,"
    " created_us, revoked_us, purged_us"
)


def allocation(row: Row) -> Allocation:
    """An L{Allocation} from L{ALLOCATION_COLUMNS}."""
    return Allocation(
        allocation_id=as_str(row[0]),
        agent_id=as_opt_str(row[1]),
        owner_id=as_str(row[2]),
        tenant_id=as_str(row[3]),
        grant_bytes=as_int(row[4]),
        state=AllocationState(as_str(row[5])),
        created_at=at(row[6]),
        revoked_at=opt_at(row[7]),
        purged_at=opt_at(row[8]),
    )


ENROLL_TOKEN_COLUMNS = (
    "token_id, token_hash, allocation_id, created_us, expires_us, consumed_us,"  # noqa: S105
    " revoked_us, leaf_serial"
)


def enroll_token(row: Row) -> EnrollToken:
    """An L{EnrollToken} from L{ENROLL_TOKEN_COLUMNS}."""
    return EnrollToken(
        token_id=as_str(row[0]),
        token_hash=as_str(row[1]),
        allocation_id=as_str(row[2]),
        created_at=at(row[3]),
        expires_at=at(row[4]),
        consumed_at=opt_at(row[5]),
        revoked_at=opt_at(row[6]),
        leaf_serial=as_opt_str(row[7]),
    )


API_TOKEN_COLUMNS = "token_id, user_id, name, token_hash, created_us, last_used_us, revoked_us"  # noqa: S105


def api_token(row: Row) -> ApiToken:
    """An L{ApiToken} from L{API_TOKEN_COLUMNS}."""
    return ApiToken(
        token_id=as_str(row[0]),
        user_id=as_str(row[1]),
        name=as_str(row[2]),
        token_hash=as_str(row[3]),
        created_at=at(row[4]),
        last_used_at=opt_at(row[5]),
        revoked_at=opt_at(row[6]),
    )


ADMIN_SESSION_COLUMNS = "session_id, user_id, session_hash, created_us, expires_us, revoked_us"


def admin_session(row: Row) -> AdminSession:
    """An L{AdminSession} from L{ADMIN_SESSION_COLUMNS}."""
    return AdminSession(
        session_id=as_str(row[0]),
        user_id=as_str(row[1]),
        session_hash=as_str(row[2]),
        created_at=at(row[3]),
        expires_at=at(row[4]),
        revoked_at=opt_at(row[5]),
    )


MOUNT_LEASE_COLUMNS = (
    "allocation_id, agent_id, leaf_serial, leaf_not_after_us, fingerprint,"
    " session_id, session_epoch, bound_us, expires_us"
)


def mount_lease(row: Row) -> MountLease:
    """A L{MountLease} from L{MOUNT_LEASE_COLUMNS}."""
    holder = MountHolder(as_str(row[1]), as_str(row[2]), at(row[3]), as_opt_str(row[4]))
    return MountLease(
        as_str(row[0]), holder, as_str(row[5]), as_int(row[6]), at(row[7]), at(row[8])
    )


CERTIFICATE_COLUMNS = (
    "serial, kind, subject, not_after_us, issued_us, tenant_id, agent_id, fingerprint"
)


def certificate(row: Row) -> IssuedCertificate:
    """An L{IssuedCertificate} from L{CERTIFICATE_COLUMNS}."""
    return IssuedCertificate(
        serial=as_str(row[0]),
        kind=CertificateKind(as_str(row[1])),
        subject=as_str(row[2]),
        not_after=at(row[3]),
        issued_at=at(row[4]),
        tenant_id=as_opt_str(row[5]),
        agent_id=as_opt_str(row[6]),
        fingerprint=as_opt_str(row[7]),
    )


REVOCATION_COLUMNS = "serial, not_after_us, revoked_us"


def revocation(row: Row) -> Revocation:
    """A L{Revocation} from L{REVOCATION_COLUMNS}."""
    return Revocation(as_str(row[0]), at(row[1]), at(row[2]))


SERVER_COLUMNS = (
    "server_id, fqdn, address, capacity, registered_us, last_seen_us, cert_serial,"
    " cert_not_after_us, http_address, identity_key"
)


def server(row: Row) -> Server:
    """A L{Server} from L{SERVER_COLUMNS}."""
    return Server(
        server_id=as_str(row[0]),
        fqdn=as_str(row[1]),
        address=as_str(row[2]),
        capacity=as_int(row[3]),
        registered_at=at(row[4]),
        last_seen_at=at(row[5]),
        cert_serial=as_opt_str(row[6]),
        cert_not_after=opt_at(row[7]),
        http_address=as_opt_str(row[8]),
        identity_key=as_opt_str(row[9]),
    )


CA_COLUMNS = "kind, tenant_id, cert_pem, encrypted_key_pem, created_us"


def ca_material(row: Row) -> CaMaterial:
    """A L{CaMaterial} from L{CA_COLUMNS}."""
    return CaMaterial(
        CaKind(as_str(row[0])),
        as_opt_str(row[1]),
        as_bytes(row[2]),
        as_bytes(row[3]),
        at(row[4]),
    )


def at(value: object) -> datetime:
    """A timestamp column as a UTC datetime."""
    return from_micros(as_int(value))


def opt_at(value: object) -> datetime | None:
    """A nullable timestamp column as a UTC datetime."""
    return optional_from_micros(as_opt_int(value))
