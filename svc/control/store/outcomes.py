"""
Typed answers of the store's operations whose refusals the route layer must
tell apart (rather than exceptions): enrollment, mount leases, placement.
"""

from __future__ import annotations

import enum

import attrs

from svc.control.store.values import (
    Allocation,
    MountLease,
    Placement,
    Tenant,
    User,
)


class EnrollRefusalReason(enum.Enum):
    """
    Why an enroll token was refused. The first four are about the token
    itself (HTTP 401 ``invalid_token``); the rest are about what it is bound
    to (HTTP 403 ``access_denied``; C{ALLOCATION_REVOKED} may be shown as 410
    ``revoked``).
    """

    UNKNOWN = "unknown"
    CONSUMED = "consumed"
    REVOKED = "revoked"
    EXPIRED = "expired"
    ALLOCATION_REVOKED = "allocation_revoked"
    USER_SUSPENDED = "user_suspended"
    TENANT_SUSPENDED = "tenant_suspended"
    AGENT_SCOPE_REQUIRED = "agent_scope_required"

    @property
    def credential_invalid(self) -> bool:
        """Whether the token itself is unusable (401) rather than forbidden (403)."""
        return self in _CREDENTIAL_REASONS


_CREDENTIAL_REASONS = frozenset(
    {
        EnrollRefusalReason.UNKNOWN,
        EnrollRefusalReason.CONSUMED,
        EnrollRefusalReason.REVOKED,
        EnrollRefusalReason.EXPIRED,
    }
)


@attrs.frozen
class EnrollGrant:
    """
    An enroll token that is (or, from a peek, would be) accepted, with
    everything a leaf is minted from. ``agent_id`` is the allocation's agent.
    """

    token_id: str
    allocation: Allocation
    user: User
    tenant: Tenant

    @property
    def agent_id(self) -> str:
        """The agent the leaf is for."""
        agent = self.allocation.agent_id
        assert agent is not None, "a grant is only made for agent-scoped allocations"
        return agent


@attrs.frozen
class EnrollRefusal:
    """An enroll token that was refused; nothing changed."""

    reason: EnrollRefusalReason


class MountConflictCode(enum.Enum):
    """Why a mount lease was not granted (HTTP 409 codes of the spec)."""

    WRONG_AGENT = "wrong_agent"
    ALREADY_MOUNTED = "already_mounted"
    LEASE_LIVE = "lease_live"


@attrs.frozen
class MountGranted:
    """
    The caller now holds ``lease``. ``displaced`` is the live lease of another
    enrollment that a forced acquisition took over, if any.
    """

    lease: MountLease
    displaced: MountLease | None = None


@attrs.frozen
class MountConflict:
    """
    The lease was not granted. ``incumbent`` is the live lease in the way
    (its C{bound_at} and C{expires_at} go into the 409 body); L{None} for
    C{WRONG_AGENT}.
    """

    code: MountConflictCode
    incumbent: MountLease | None = None


@attrs.frozen
class InsufficientCapacity:
    """No registered data-plane server has room for a new tenant (HTTP 409)."""

    tenant_id: str


@attrs.frozen
class Provisioned:
    """
    The allocation of a provisioning request; ``created`` is false when an
    identical earlier request had already made it.
    """

    allocation: Allocation
    created: bool


PlacementOutcome = Placement | InsufficientCapacity
MountOutcome = MountGranted | MountConflict
EnrollOutcome = EnrollGrant | EnrollRefusal
