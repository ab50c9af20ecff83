"""
L{ControlStore}: everything the control plane keeps, as atomic business
operations returning L{Deferred}s.

Each method is one database transaction. Refusals come back as typed results
(L{svc.control.store.outcomes}) or fail with the exceptions of
L{svc.control.store.errors}; bad arguments fail with
L{svc.control.store.errors.InvalidValue}. Callers pass the current time
(C{now}, an aware L{datetime}) so the store itself reads no clock. Secrets
are never given to the store: callers pass the SHA-256 of a token as 64
lowercase hex characters and compare nothing themselves.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Protocol

from twisted.internet.defer import Deferred

from svc.control.store.outcomes import (
    EnrollOutcome,
    MountOutcome,
    PlacementOutcome,
    Provisioned,
)
from svc.control.store.values import (
    AdminSession,
    Allocation,
    AllocationState,
    ApiToken,
    CaKind,
    CaMaterial,
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


class ControlStore(Protocol):
    """
    The control plane's database. Implementations:
    L{svc.control.store.sqlite.SQLiteControlStore},
    L{svc.control.store.postgres.PostgresControlStore}; open one with
    L{svc.control.store.opening.open_store}.
    """

    # Users, tenants, allocations.

    def put_user(self, user_id: str, display_name: str, now: datetime) -> Deferred[User]:
        """Create a user (the operator's user-seed), or rename an existing one."""

    def get_user(self, user_id: str) -> Deferred[User]:
        """A user; L{NotFound}."""

    def set_user_suspended(self, user_id: str, suspended: bool) -> Deferred[User]:
        """Suspend or reinstate a user; L{NotFound}."""

    def set_account_budget(
        self, owner_id: str, budget_bytes: int | None, now: datetime
    ) -> Deferred[User]:
        """Set (L{None}: clear) an account's shared budget, creating the account."""

    def get_tenant(self, tenant_id: str) -> Deferred[Tenant]:
        """A tenant; L{NotFound}."""

    def set_tenant_suspended(self, tenant_id: str, suspended: bool) -> Deferred[Tenant]:
        """Suspend or reinstate a tenant; L{NotFound}."""

    def provision(
        self,
        *,
        agent_id: str | None,
        owner_id: str,
        tenant_id: str,
        grant_bytes: int,
        now: datetime,
    ) -> Deferred[Provisioned]:
        """
        Provision an allocation (agent-scoped unless C{agent_id} is L{None}),
        creating the owner and tenant if missing. Repeating an identical
        request returns the same allocation (C{created} false). Fails with
        L{Conflict} (C{agent_owner_mismatch}, C{grant_mismatch},
        C{tenant_owner_mismatch}) or L{Revoked} (agent ids are never reused).
        """

    def get_allocation(self, allocation_id: str) -> Deferred[Allocation]:
        """An allocation in any state; L{NotFound}."""

    def get_agent_allocation(self, agent_id: str) -> Deferred[Allocation]:
        """An agent's allocation in any state; L{NotFound}."""

    def list_allocations(self, owner_id: str) -> Deferred[tuple[Allocation, ...]]:
        """A user's allocations in every state, oldest first."""

    def list_revoked_allocations(self) -> Deferred[tuple[Allocation, ...]]:
        """Revoked, not yet purged allocations (the purge sweep's work list)."""

    def list_allocations_page(
        self, after: str | None, limit: int, state: AllocationState | None = None
    ) -> Deferred[tuple[Allocation, ...]]:
        """
        At most C{limit} (1-1000) allocations of every owner (in C{state}
        when given), by allocation id, those after C{after} only: one page
        of the operator's listing, the last id being the next C{after}.
        """

    def set_agent_quota(self, agent_id: str, grant_bytes: int) -> Deferred[Allocation]:
        """Set an agent's grant; L{NotFound}, L{Revoked}."""

    def revoke_allocation(self, allocation_id: str, now: datetime) -> Deferred[Allocation]:
        """
        Revoke an allocation (idempotent): its mount lease ends, every
        unexpired leaf of its agent (of any enrollment) is revoked, unspent
        enroll tokens are revoked; L{NotFound}.
        """

    def revoke_agent(self, agent_id: str, now: datetime) -> Deferred[Allocation]:
        """L{revoke_allocation} by agent id; L{NotFound}."""

    def revoke_owner(self, owner_id: str, now: datetime) -> Deferred[tuple[Allocation, ...]]:
        """Suspend a user and revoke all its allocations at once; L{NotFound}."""

    def reassign_agent(
        self, agent_id: str, *, owner_id: str, tenant_id: str, now: datetime
    ) -> Deferred[Allocation]:
        """
        Move an agent's allocation to another owner/tenant (created if
        missing); a mount lease ends and every unexpired leaf of the agent
        (of any enrollment) is revoked. L{NotFound}, L{Revoked}, L{Conflict}
        C{tenant_owner_mismatch}.
        """

    def mark_purged(self, allocation_id: str, now: datetime) -> Deferred[Allocation]:
        """
        Record a revoked allocation's data as erased; L{NotFound},
        L{Conflict} C{not_revoked}.
        """

    # Enroll tokens.

    def create_enroll_token(
        self, allocation_id: str, token_hash: str, now: datetime, expires_at: datetime
    ) -> Deferred[EnrollToken]:
        """
        Store an enroll token for a live allocation; L{NotFound}, L{Revoked},
        L{Conflict} C{duplicate_token}.
        """

    def get_enroll_token(self, token_id: str) -> Deferred[EnrollToken]:
        """An enroll token by id; L{NotFound}."""

    def peek_enroll_token(self, token_hash: str, now: datetime) -> Deferred[EnrollOutcome]:
        """What L{consume_enroll_token} would answer, spending nothing."""

    def consume_enroll_token(self, token_hash: str, now: datetime) -> Deferred[EnrollOutcome]:
        """
        Spend a token atomically: of concurrent consumers at most one gets an
        L{EnrollGrant}; refusals say why (L{EnrollRefusalReason}).
        """

    def record_enrollment(self, token_id: str, leaf: IssuedCertificate) -> Deferred[None]:
        """Record the leaf minted with a spent token; L{NotFound}."""

    def revoke_enroll_token(self, token_id: str, now: datetime) -> Deferred[EnrollToken]:
        """Revoke an unspent token (idempotent); L{NotFound}."""

    # API tokens and admin sessions.

    def create_api_token(
        self, user_id: str, name: str, token_hash: str, now: datetime
    ) -> Deferred[ApiToken]:
        """Store a user's API token; L{NotFound}, L{Conflict} C{duplicate_token}."""

    def list_api_tokens(self, user_id: str) -> Deferred[tuple[ApiToken, ...]]:
        """A user's API tokens, revoked ones included, oldest first."""

    def revoke_api_token(self, user_id: str, token_id: str, now: datetime) -> Deferred[ApiToken]:
        """Revoke one of the user's API tokens (idempotent); L{NotFound}."""

    def authenticate_api_token(self, token_hash: str, now: datetime) -> Deferred[ApiToken | None]:
        """The live token of an unsuspended user with that hash (last use noted)."""

    def create_admin_session(
        self, user_id: str, session_hash: str, now: datetime, expires_at: datetime
    ) -> Deferred[AdminSession]:
        """Store a dashboard session; L{NotFound}, L{Conflict} C{duplicate_token}."""

    def authenticate_admin_session(
        self, session_hash: str, now: datetime
    ) -> Deferred[tuple[AdminSession, User] | None]:
        """The live, unexpired session with that hash and its unsuspended user."""

    def revoke_admin_session(self, session_hash: str, now: datetime) -> Deferred[bool]:
        """End a session (logout); whether one was live."""

    def prune_admin_sessions(self, now: datetime) -> Deferred[int]:
        """Delete expired and revoked sessions; how many."""

    # Mount leases.

    def acquire_mount(
        self,
        allocation_id: str,
        holder: MountHolder,
        now: datetime,
        ttl: timedelta,
        force: bool = False,
    ) -> Deferred[MountOutcome]:
        """
        Acquire an allocation's exclusive mount lease: L{MountGranted} or
        L{MountConflict} (C{wrong_agent}, C{already_mounted}, C{lease_live});
        L{NotFound}, L{Revoked}. Every grant increments the allocation's
        mount-lease epoch (kept across releases and restarts) and mints a
        L{svc.sessions} session id at that epoch for the allocation's tenant
        and agent.
        """

    def refresh_mount(
        self, allocation_id: str, holder: MountHolder, now: datetime, ttl: timedelta
    ) -> Deferred[MountLease]:
        """Extend the holder's lease to C{now + ttl}; L{LeaseLost}, L{NotFound}."""

    def release_mount(
        self, allocation_id: str, holder: MountHolder, now: datetime
    ) -> Deferred[MountLease]:
        """
        End the holder's lease and revoke its leaf; L{LeaseLost},
        L{NotFound}.
        """

    def force_unmount(
        self, allocation_id: str, owner_id: str, now: datetime
    ) -> Deferred[MountLease | None]:
        """
        The owner ends any lease (the holder's leaf is revoked); L{NotFound}
        unless C{owner_id} owns the allocation.
        """

    def get_mount_lease(self, allocation_id: str) -> Deferred[MountLease | None]:
        """The allocation's lease row, live or expired."""

    def record_renewal(
        self, previous_serial: str, leaf: IssuedCertificate
    ) -> Deferred[MountLease | None]:
        """
        Record agent leaf C{leaf}, minted by renewing leaf C{previous_serial},
        and in the same transaction move the mount lease C{previous_serial}
        holds (live, or expired and not taken over) to C{leaf}, keeping its
        session id, epoch, C{bound_at} and expiry: the moved lease, or
        L{None}. L{NotFound} if the agent has no allocation; L{InvalidValue}
        unless C{leaf} is an agent leaf naming its agent.
        """

    # Revocations and issued certificates.

    def add_revocation(self, serial: str, not_after: datetime, now: datetime) -> Deferred[None]:
        """Revoke a certificate serial until C{not_after}."""

    def active_revocations(self, now: datetime) -> Deferred[tuple[Revocation, ...]]:
        """Revocations of certificates not yet expired (the set to push)."""

    def prune_revocations(self, now: datetime) -> Deferred[int]:
        """Delete revocations of expired certificates; how many."""

    def record_certificate(self, certificate: IssuedCertificate) -> Deferred[None]:
        """Record a signing event."""

    def find_certificate(self, serial: str) -> Deferred[IssuedCertificate]:
        """An issued certificate by serial; L{NotFound}."""

    def find_certificate_by_fingerprint(self, fingerprint: str) -> Deferred[IssuedCertificate]:
        """The latest issued certificate with that fingerprint; L{NotFound}."""

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
        """
        Register a data-plane server by FQDN, or update it. A certificate,
        C{http_address} (where the control plane reaches it over HTTPS) or
        C{identity_key} left out keeps the stored one. A known FQDN stored
        under another identity key fails with
        L{svc.control.store.errors.ServerKeyConflict} (nothing changed)
        unless C{replacing} names that key; a stored key of L{None} is
        claimed by the first registration naming one.
        """

    def touch_server(self, fqdn: str, now: datetime) -> Deferred[Server]:
        """Note that a server was seen; L{NotFound}."""

    def list_servers(self) -> Deferred[tuple[Server, ...]]:
        """Every registered server, by FQDN."""

    def place_tenant(self, tenant_id: str, now: datetime) -> Deferred[PlacementOutcome]:
        """
        The tenant's sticky placement, made on first call on the least-loaded
        server with room: L{Placement} or L{InsufficientCapacity};
        L{NotFound}.
        """

    def get_placement(self, tenant_id: str) -> Deferred[Placement | None]:
        """The tenant's placement, if made."""

    def list_placements(self) -> Deferred[tuple[Placement, ...]]:
        """Every placement made, by tenant id (read at start by the quota push loop)."""

    def get_ca_material(
        self, kind: CaKind, tenant_id: str | None = None
    ) -> Deferred[CaMaterial | None]:
        """Stored root or tenant CA material."""

    def put_ca_material(self, material: CaMaterial, replace: bool = False) -> Deferred[CaMaterial]:
        """Store CA material (first writer wins unless C{replace}); the stored record."""

    def close(self) -> Deferred[None]:
        """Close the database connections (and a worker the store owns)."""
