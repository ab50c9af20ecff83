"""
The records the control-plane store hands out: frozen, validated values.

Timestamps are timezone-aware L{datetime}s in UTC with microsecond precision
(the databases keep integer microseconds since the Unix epoch). Hashes of
secrets are kept out of every C{repr}. Everything here is pure.
"""

from __future__ import annotations

import enum
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs

from svc.control.store.errors import InvalidValue

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_HASH = re.compile(r"[0-9a-f]{64}")
_SERIAL = re.compile(r"[0-9a-f]{1,40}")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def check_id(value: str, what: str) -> str:
    """
    Return C{value} if it is an acceptable user, tenant or agent id (the
    alphabet of L{svc.pki.names.ID_PATTERN}), else raise L{InvalidValue}.
    """
    if not isinstance(value, str) or not _ID.fullmatch(value) or ".." in value:
        raise InvalidValue(f"{what} must match {_ID.pattern} without '..': {value!r}")
    return value


def check_hash(value: str, what: str = "hash") -> str:
    """
    Return C{value} if it is a SHA-256 digest as 64 lowercase hex characters.
    """
    if not isinstance(value, str) or not _HASH.fullmatch(value):
        raise InvalidValue(f"{what} must be 64 lowercase hex characters")
    return value


def check_serial(value: str) -> str:
    """
    Return C{value} if it is a certificate serial in its text form
    (lowercase hex, no leading C{0x}, at most 160 bits).
    """
    if not isinstance(value, str) or not _SERIAL.fullmatch(value):
        raise InvalidValue(f"serial must be lowercase hex: {value!r}")
    return value


def check_bytes(value: int, what: str) -> int:
    """
    Return C{value} if it is a non-negative integer byte count below 2**63.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise InvalidValue(f"{what} must be a non-negative integer: {value!r}")
    return value


def to_micros(moment: datetime) -> int:
    """
    The integer microseconds since the Unix epoch of an aware L{datetime}.
    """
    if not isinstance(moment, datetime) or moment.utcoffset() is None:
        raise InvalidValue(f"timestamps must be timezone-aware datetimes: {moment!r}")
    return (moment - _EPOCH) // timedelta(microseconds=1)


def from_micros(micros: int) -> datetime:
    """
    The UTC L{datetime} of integer microseconds since the Unix epoch.
    """
    return _EPOCH + timedelta(microseconds=micros)


def optional_from_micros(micros: int | None) -> datetime | None:
    """L{from_micros}, passing L{None} through."""
    return None if micros is None else from_micros(micros)


def _aware(_: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and (not isinstance(value, datetime) or value.utcoffset() is None):
        raise InvalidValue(f"{attribute.name} must be a timezone-aware datetime")


def _epoch(_: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise InvalidValue(f"{attribute.name} must be a non-negative integer: {value!r}")


class AllocationState(enum.Enum):
    """Where an allocation is in its life."""

    PROVISIONED = "provisioned"
    REVOKED = "revoked"
    PURGED = "purged"


class CertificateKind(enum.Enum):
    """What an issued certificate is for."""

    AGENT_LEAF = "agent_leaf"
    SERVER_LEAF = "server_leaf"
    CONTROL = "control"
    TENANT_INTERMEDIATE = "tenant_intermediate"
    ORG_ROOT = "org_root"


class CaKind(enum.Enum):
    """Which CA a stored key pair belongs to."""

    ROOT = "root"
    TENANT = "tenant"


@attrs.frozen
class User:
    """
    A person or account that owns tenants and allocations. The owner id of an
    allocation is a user id, and an agent leaf's CN is its owner's user id.
    ``budget_bytes`` is the account's shared budget (L{None}: no budget).
    """

    user_id: str
    display_name: str
    budget_bytes: int | None
    suspended: bool
    created_at: datetime = attrs.field(validator=_aware)


@attrs.frozen
class Tenant:
    """
    An isolation domain (one tenant intermediate, one data-plane placement),
    owned by exactly one user.
    """

    tenant_id: str
    owner_id: str
    suspended: bool
    created_at: datetime = attrs.field(validator=_aware)


@attrs.frozen
class Allocation:
    """
    A disk allocation. Agent-scoped allocations (the only kind that can be
    enrolled and mounted) carry the agent id; an agent has at most one
    allocation, ever.
    """

    allocation_id: str
    agent_id: str | None
    owner_id: str
    tenant_id: str
    grant_bytes: int
    state: AllocationState
    created_at: datetime = attrs.field(validator=_aware)
    revoked_at: datetime | None = attrs.field(default=None, validator=_aware)
    purged_at: datetime | None = attrs.field(default=None, validator=_aware)

    @property
    def agent_scoped(self) -> bool:
        """Whether the allocation belongs to one agent."""
        return self.agent_id is not None

    @property
    def live(self) -> bool:
        """Whether the allocation is still provisioned."""
        return self.state is AllocationState.PROVISIONED


@attrs.frozen
class EnrollToken:
    """
    A single-use enroll token, bound to an allocation. Only the SHA-256 of
    the token is stored; it stays out of C{repr}.
    """

    token_id: str
    token_hash: str = attrs.field(repr=False)
    allocation_id: str
    created_at: datetime = attrs.field(validator=_aware)
    expires_at: datetime = attrs.field(validator=_aware)
    consumed_at: datetime | None = attrs.field(default=None, validator=_aware)
    revoked_at: datetime | None = attrs.field(default=None, validator=_aware)
    leaf_serial: str | None = None


@attrs.frozen
class ApiToken:
    """
    A long-lived API token of a user (the token itself is shown once, by the
    caller; only its SHA-256 is stored, and kept out of C{repr}).
    """

    token_id: str
    user_id: str
    name: str
    token_hash: str = attrs.field(repr=False)
    created_at: datetime = attrs.field(validator=_aware)
    last_used_at: datetime | None = attrs.field(default=None, validator=_aware)
    revoked_at: datetime | None = attrs.field(default=None, validator=_aware)


@attrs.frozen
class AdminSession:
    """
    A dashboard session of a user; only the SHA-256 of the session token is
    stored, and kept out of C{repr}.
    """

    session_id: str
    user_id: str
    session_hash: str = attrs.field(repr=False)
    created_at: datetime = attrs.field(validator=_aware)
    expires_at: datetime = attrs.field(validator=_aware)
    revoked_at: datetime | None = attrs.field(default=None, validator=_aware)


@attrs.frozen
class MountHolder:
    """
    The enrollment that holds (or asks for) a mount lease: the agent and the
    leaf minted at enrollment. The leaf serial identifies the enrollment.
    """

    agent_id: str
    leaf_serial: str
    leaf_not_after: datetime = attrs.field(validator=_aware)
    fingerprint: str | None = None


@attrs.frozen
class MountLease:
    """
    The exclusive mount lease of one allocation. ``session_id`` is a
    L{svc.sessions} id (C{mount:<epoch><nonce><tag>}) minted for the
    allocation's tenant and agent at ``epoch``, the allocation's mount-lease
    epoch: both are new for every grant and kept across refreshes. A lease
    granted before migration 2 has epoch 0 and an older, unverifiable id.
    """

    allocation_id: str
    holder: MountHolder
    session_id: str
    epoch: int = attrs.field(validator=_epoch)
    bound_at: datetime = attrs.field(validator=_aware)
    expires_at: datetime = attrs.field(validator=_aware)

    def live(self, now: datetime) -> bool:
        """Whether the lease has not expired at C{now}."""
        return self.expires_at > now


@attrs.frozen
class IssuedCertificate:
    """
    The durable record of one signing event (the audit of certificates
    issued): which certificate, for whom, until when.
    """

    serial: str
    kind: CertificateKind
    subject: str
    not_after: datetime = attrs.field(validator=_aware)
    issued_at: datetime = attrs.field(validator=_aware)
    tenant_id: str | None = None
    agent_id: str | None = None
    fingerprint: str | None = None


@attrs.frozen
class RevocableLeaf:
    """
    A certificate a lease's end may revoke: its serial and its own
    not-after (a revocation is kept until then).
    """

    serial: str
    not_after: datetime = attrs.field(validator=_aware)


@attrs.frozen
class Revocation:
    """
    A revoked certificate serial, kept until the certificate would have
    expired anyway.
    """

    serial: str
    not_after: datetime = attrs.field(validator=_aware)
    revoked_at: datetime = attrs.field(validator=_aware)


@attrs.frozen
class Server:
    """
    A registered data-plane server. ``capacity`` is the most tenants it may
    be given; C{0} takes it out of new placements. ``address`` is what mount
    clients dial; ``http_address`` is where the control plane reaches the
    server over HTTPS (L{None} for a server registered without one, as every
    server registered before migration 2 was). ``identity_key`` is the
    server identity key the FQDN is registered under
    (L{svc.pki.server_identity}; L{None} until a registration names one).
    """

    server_id: str
    fqdn: str
    address: str
    capacity: int
    registered_at: datetime = attrs.field(validator=_aware)
    last_seen_at: datetime = attrs.field(validator=_aware)
    cert_serial: str | None = None
    cert_not_after: datetime | None = attrs.field(default=None, validator=_aware)
    http_address: str | None = None
    identity_key: str | None = None


@attrs.frozen
class Placement:
    """The data-plane server a tenant lives on (sticky once chosen)."""

    tenant_id: str
    server: Server
    placed_at: datetime = attrs.field(validator=_aware)


@attrs.frozen
class CaMaterial:
    """
    A CA certificate and its private key as stored by the in-database
    secrets backend. The key is encrypted by the caller before it gets here;
    the store only keeps bytes, and keeps them out of C{repr}.
    """

    kind: CaKind
    tenant_id: str | None
    cert_pem: bytes
    encrypted_key_pem: bytes = attrs.field(repr=False)
    created_at: datetime = attrs.field(validator=_aware)

    def __attrs_post_init__(self) -> None:
        if (self.kind is CaKind.TENANT) != (self.tenant_id is not None):
            raise InvalidValue("tenant CA material needs a tenant id; root material has none")
