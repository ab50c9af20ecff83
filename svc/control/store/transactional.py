"""
L{TransactionalStore}: the L{ControlStore} methods, each validating its
arguments and handing one transaction of L{svc.control.store.transactions}
to the backend's L{TransactionalStore._run}.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TypeVar

from twisted.internet.defer import Deferred, fail

from svc.control.store.errors import InvalidValue
from svc.control.store.outcomes import (
    EnrollOutcome,
    MountOutcome,
    PlacementOutcome,
    Provisioned,
)
from svc.control.store.sql import Transaction
from svc.control.store.transactions import accounts, credentials, fleet, mounts
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
    check_bytes,
    check_hash,
    check_id,
    check_serial,
    to_micros,
)
from svc.pki import server_identity
from svc.pki.errors import InvalidName

T = TypeVar("T")

RandomBytes = Callable[[int], bytes]
"""Where the store's random ids come from (C{os.urandom} unless injected)."""

#: The shortest key accepted for minting mount session ids.
MIN_SESSION_KEY_BYTES = 16


def _micros(ttl: timedelta) -> int:
    if not isinstance(ttl, timedelta) or ttl <= timedelta(0):
        raise InvalidValue(f"a lease TTL must be a positive timedelta: {ttl!r}")
    return ttl // timedelta(microseconds=1)


def _holder(holder: MountHolder) -> MountHolder:
    check_id(holder.agent_id, "agent id")
    check_serial(holder.leaf_serial)
    return holder


def _http_address(address: str) -> str:
    if not isinstance(address, str) or not address or address != address.strip():
        raise InvalidValue(f"an HTTPS address must be non-empty text: {address!r}")
    return address


def _identity_key(key: str) -> str:
    try:
        return server_identity.check_key_text(key)
    except InvalidName:
        raise InvalidValue(
            f"a server identity key must be 64 lowercase hex digits: {key!r}"
        ) from None


def _certificate(certificate: IssuedCertificate) -> IssuedCertificate:
    check_serial(certificate.serial)
    return certificate


def _leaf_agent(leaf: IssuedCertificate) -> str:
    if leaf.kind is not CertificateKind.AGENT_LEAF or leaf.agent_id is None:
        raise InvalidValue(f"not an agent leaf naming its agent: {leaf.serial!r}")
    return check_id(leaf.agent_id, "agent id")


def check_session_key(key: bytes) -> bytes:
    """
    Return C{key} if it can key mount session ids (L{svc.sessions.session_key}
    of the service token: 32 bytes), else raise L{ValueError}.
    """
    if not isinstance(key, bytes) or len(key) < MIN_SESSION_KEY_BYTES:
        raise ValueError(f"session_key must be at least {MIN_SESSION_KEY_BYTES} bytes")
    return key


class TransactionalStore:
    """
    A L{ControlStore} over any backend that can run a
    L{svc.control.store.sql.Transaction}: subclasses implement L{_run} and
    L{close}. C{session_key} (L{svc.sessions.session_key} of the service
    token) keys the mount session ids the store mints; it has no default.
    """

    def __init__(self, *, session_key: bytes, random_bytes: RandomBytes = os.urandom) -> None:
        self._session_key = check_session_key(session_key)
        self._random_bytes = random_bytes

    def _run(self, transaction: Transaction[T], write: bool) -> Deferred[T]:
        """
        Run C{transaction} in one database transaction (a write transaction
        if C{write}) and fire with its result; roll back if it raises.
        """
        raise NotImplementedError()

    def close(self) -> Deferred[None]:
        """Close the database."""
        raise NotImplementedError()

    def _new_id(self) -> str:
        return self._random_bytes(16).hex()

    def _write(self, build: Callable[[], Transaction[T]]) -> Deferred[T]:
        try:
            transaction = build()
        except Exception:
            return fail()
        return self._run(transaction, write=True)

    def _read(self, build: Callable[[], Transaction[T]]) -> Deferred[T]:
        try:
            transaction = build()
        except Exception:
            return fail()
        return self._run(transaction, write=False)

    # Users, tenants, allocations.

    def put_user(self, user_id: str, display_name: str, now: datetime) -> Deferred[User]:
        return self._write(
            lambda: accounts.put_user(check_id(user_id, "user id"), display_name, to_micros(now))
        )

    def get_user(self, user_id: str) -> Deferred[User]:
        return self._read(lambda: accounts.get_user(user_id))

    def set_user_suspended(self, user_id: str, suspended: bool) -> Deferred[User]:
        return self._write(lambda: accounts.set_user_suspended(user_id, bool(suspended)))

    def set_account_budget(
        self, owner_id: str, budget_bytes: int | None, now: datetime
    ) -> Deferred[User]:
        return self._write(
            lambda: accounts.set_account_budget(
                check_id(owner_id, "owner id"),
                None if budget_bytes is None else check_bytes(budget_bytes, "budget"),
                to_micros(now),
            )
        )

    def get_tenant(self, tenant_id: str) -> Deferred[Tenant]:
        return self._read(lambda: accounts.get_tenant(tenant_id))

    def set_tenant_suspended(self, tenant_id: str, suspended: bool) -> Deferred[Tenant]:
        return self._write(lambda: accounts.set_tenant_suspended(tenant_id, bool(suspended)))

    def provision(
        self,
        *,
        agent_id: str | None,
        owner_id: str,
        tenant_id: str,
        grant_bytes: int,
        now: datetime,
    ) -> Deferred[Provisioned]:
        return self._write(
            lambda: accounts.provision(
                self._new_id(),
                None if agent_id is None else check_id(agent_id, "agent id"),
                check_id(owner_id, "owner id"),
                check_id(tenant_id, "tenant id"),
                check_bytes(grant_bytes, "grant"),
                to_micros(now),
            )
        )

    def get_allocation(self, allocation_id: str) -> Deferred[Allocation]:
        return self._read(lambda: accounts.get_allocation(allocation_id))

    def get_agent_allocation(self, agent_id: str) -> Deferred[Allocation]:
        return self._read(lambda: accounts.get_agent_allocation(agent_id))

    def list_allocations(self, owner_id: str) -> Deferred[tuple[Allocation, ...]]:
        return self._read(lambda: accounts.list_allocations(owner_id))

    def list_revoked_allocations(self) -> Deferred[tuple[Allocation, ...]]:
        return self._read(accounts.list_revoked_allocations)

    def list_allocations_page(
        self, after: str | None, limit: int, state: AllocationState | None = None
    ) -> Deferred[tuple[Allocation, ...]]:
        def build() -> Transaction[tuple[Allocation, ...]]:
            if not isinstance(limit, int) or not 1 <= limit <= accounts.MAX_PAGE:
                raise InvalidValue(f"a page holds 1-{accounts.MAX_PAGE} allocations: {limit!r}")
            return accounts.list_allocations_page(after, limit, state)

        return self._read(build)

    def set_agent_quota(self, agent_id: str, grant_bytes: int) -> Deferred[Allocation]:
        return self._write(
            lambda: accounts.set_agent_quota(agent_id, check_bytes(grant_bytes, "grant"))
        )

    def revoke_allocation(self, allocation_id: str, now: datetime) -> Deferred[Allocation]:
        return self._write(lambda: accounts.revoke_allocation(allocation_id, to_micros(now)))

    def revoke_agent(self, agent_id: str, now: datetime) -> Deferred[Allocation]:
        return self._write(lambda: accounts.revoke_agent(agent_id, to_micros(now)))

    def revoke_owner(self, owner_id: str, now: datetime) -> Deferred[tuple[Allocation, ...]]:
        return self._write(lambda: accounts.revoke_owner(owner_id, to_micros(now)))

    def reassign_agent(
        self, agent_id: str, *, owner_id: str, tenant_id: str, now: datetime
    ) -> Deferred[Allocation]:
        return self._write(
            lambda: accounts.reassign_agent(
                agent_id,
                check_id(owner_id, "owner id"),
                check_id(tenant_id, "tenant id"),
                to_micros(now),
            )
        )

    def mark_purged(self, allocation_id: str, now: datetime) -> Deferred[Allocation]:
        return self._write(lambda: accounts.mark_purged(allocation_id, to_micros(now)))

    # Enroll tokens.

    def create_enroll_token(
        self, allocation_id: str, token_hash: str, now: datetime, expires_at: datetime
    ) -> Deferred[EnrollToken]:
        return self._write(
            lambda: credentials.create_enroll_token(
                self._new_id(),
                check_hash(token_hash),
                allocation_id,
                to_micros(now),
                to_micros(expires_at),
            )
        )

    def get_enroll_token(self, token_id: str) -> Deferred[EnrollToken]:
        return self._read(lambda: credentials.get_enroll_token(token_id))

    def peek_enroll_token(self, token_hash: str, now: datetime) -> Deferred[EnrollOutcome]:
        return self._read(lambda: credentials.peek_enroll_token(token_hash, to_micros(now)))

    def consume_enroll_token(self, token_hash: str, now: datetime) -> Deferred[EnrollOutcome]:
        return self._write(lambda: credentials.consume_enroll_token(token_hash, to_micros(now)))

    def record_enrollment(self, token_id: str, leaf: IssuedCertificate) -> Deferred[None]:
        return self._write(lambda: credentials.record_enrollment(token_id, _certificate(leaf)))

    def revoke_enroll_token(self, token_id: str, now: datetime) -> Deferred[EnrollToken]:
        return self._write(lambda: credentials.revoke_enroll_token(token_id, to_micros(now)))

    # API tokens and admin sessions.

    def create_api_token(
        self, user_id: str, name: str, token_hash: str, now: datetime
    ) -> Deferred[ApiToken]:
        return self._write(
            lambda: credentials.create_api_token(
                self._new_id(), user_id, name, check_hash(token_hash), to_micros(now)
            )
        )

    def list_api_tokens(self, user_id: str) -> Deferred[tuple[ApiToken, ...]]:
        return self._read(lambda: credentials.list_api_tokens(user_id))

    def revoke_api_token(self, user_id: str, token_id: str, now: datetime) -> Deferred[ApiToken]:
        return self._write(lambda: credentials.revoke_api_token(user_id, token_id, to_micros(now)))

    def authenticate_api_token(self, token_hash: str, now: datetime) -> Deferred[ApiToken | None]:
        return self._write(lambda: credentials.authenticate_api_token(token_hash, to_micros(now)))

    def create_admin_session(
        self, user_id: str, session_hash: str, now: datetime, expires_at: datetime
    ) -> Deferred[AdminSession]:
        return self._write(
            lambda: credentials.create_admin_session(
                self._new_id(),
                user_id,
                check_hash(session_hash),
                to_micros(now),
                to_micros(expires_at),
            )
        )

    def authenticate_admin_session(
        self, session_hash: str, now: datetime
    ) -> Deferred[tuple[AdminSession, User] | None]:
        return self._read(
            lambda: credentials.authenticate_admin_session(session_hash, to_micros(now))
        )

    def revoke_admin_session(self, session_hash: str, now: datetime) -> Deferred[bool]:
        return self._write(lambda: credentials.revoke_admin_session(session_hash, to_micros(now)))

    def prune_admin_sessions(self, now: datetime) -> Deferred[int]:
        return self._write(lambda: credentials.prune_admin_sessions(to_micros(now)))

    # Mount leases.

    def acquire_mount(
        self,
        allocation_id: str,
        holder: MountHolder,
        now: datetime,
        ttl: timedelta,
        force: bool = False,
    ) -> Deferred[MountOutcome]:
        return self._write(
            lambda: mounts.acquire_mount(
                allocation_id,
                _holder(holder),
                to_micros(now),
                _micros(ttl),
                bool(force),
                self._session_key,
                self._random_bytes(8),
            )
        )

    def refresh_mount(
        self, allocation_id: str, holder: MountHolder, now: datetime, ttl: timedelta
    ) -> Deferred[MountLease]:
        return self._write(
            lambda: mounts.refresh_mount(allocation_id, holder, to_micros(now), _micros(ttl))
        )

    def release_mount(
        self, allocation_id: str, holder: MountHolder, now: datetime
    ) -> Deferred[MountLease]:
        return self._write(lambda: mounts.release_mount(allocation_id, holder, to_micros(now)))

    def force_unmount(
        self, allocation_id: str, owner_id: str, now: datetime
    ) -> Deferred[MountLease | None]:
        return self._write(lambda: mounts.force_unmount(allocation_id, owner_id, to_micros(now)))

    def get_mount_lease(self, allocation_id: str) -> Deferred[MountLease | None]:
        return self._read(lambda: mounts.get_mount_lease(allocation_id))

    def record_renewal(
        self, previous_serial: str, leaf: IssuedCertificate
    ) -> Deferred[MountLease | None]:
        return self._write(
            lambda: mounts.record_renewal(
                _leaf_agent(leaf), check_serial(previous_serial), _certificate(leaf)
            )
        )

    # Revocations and issued certificates.

    def add_revocation(self, serial: str, not_after: datetime, now: datetime) -> Deferred[None]:
        return self._write(
            lambda: mounts.add_revocation(
                check_serial(serial), to_micros(not_after), to_micros(now)
            )
        )

    def active_revocations(self, now: datetime) -> Deferred[tuple[Revocation, ...]]:
        return self._read(lambda: mounts.active_revocations(to_micros(now)))

    def prune_revocations(self, now: datetime) -> Deferred[int]:
        return self._write(lambda: mounts.prune_revocations(to_micros(now)))

    def record_certificate(self, certificate: IssuedCertificate) -> Deferred[None]:
        return self._write(lambda: mounts.record_certificate(_certificate(certificate)))

    def find_certificate(self, serial: str) -> Deferred[IssuedCertificate]:
        return self._read(lambda: mounts.find_certificate(serial=serial))

    def find_certificate_by_fingerprint(self, fingerprint: str) -> Deferred[IssuedCertificate]:
        return self._read(lambda: mounts.find_certificate(fingerprint=fingerprint))

    # Servers, placement, CA material.

    def register_server(
        self,
        fqdn: str,
        address: str,
        capacity: int,
        now: datetime,
        cert_serial: str | None = None,
        cert_not_after: datetime | None = None,
        http_address: str | None = None,
        identity_key: str | None = None,
        replacing: str | None = None,
    ) -> Deferred[Server]:
        return self._write(
            lambda: fleet.register_server(
                self._new_id(),
                fqdn,
                address,
                check_bytes(capacity, "capacity"),
                to_micros(now),
                None if cert_serial is None else check_serial(cert_serial),
                None if cert_not_after is None else to_micros(cert_not_after),
                None if http_address is None else _http_address(http_address),
                None if identity_key is None else _identity_key(identity_key),
                None if replacing is None else _identity_key(replacing),
            )
        )

    def touch_server(self, fqdn: str, now: datetime) -> Deferred[Server]:
        return self._write(lambda: fleet.touch_server(fqdn, to_micros(now)))

    def list_servers(self) -> Deferred[tuple[Server, ...]]:
        return self._read(fleet.list_servers)

    def place_tenant(self, tenant_id: str, now: datetime) -> Deferred[PlacementOutcome]:
        return self._write(lambda: fleet.place_tenant(tenant_id, to_micros(now)))

    def get_placement(self, tenant_id: str) -> Deferred[Placement | None]:
        return self._read(lambda: fleet.get_placement(tenant_id))

    def list_placements(self) -> Deferred[tuple[Placement, ...]]:
        return self._read(fleet.list_placements)

    def get_ca_material(
        self, kind: CaKind, tenant_id: str | None = None
    ) -> Deferred[CaMaterial | None]:
        return self._read(lambda: fleet.get_ca_material(kind, tenant_id))

    def put_ca_material(self, material: CaMaterial, replace: bool = False) -> Deferred[CaMaterial]:
        return self._write(lambda: fleet.put_ca_material(material, bool(replace)))
