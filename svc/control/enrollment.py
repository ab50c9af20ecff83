"""
Enrollment and renewal of agent leaves: the decisions between the enroll
token, the store, the agent CA and data-plane placement.

C{POST /agent/enroll} (spec "Endpoint detail") runs, in this order:

  1. the per-token rate limit (429 C{rate_limited} with C{Retry-After});
  2. C{peek_enroll_token}: unknown, consumed, revoked or expired tokens are
     401 C{invalid_token}; a revoked allocation 410 C{revoked}; a suspended
     user or tenant 403 C{user_suspended} / C{tenant_suspended}; an
     allocation without an agent 403 C{agent_scope_required};
  3. the operator allowlist (C{SVC_TENANT_ALLOWLIST}): 403
     C{tenant_not_allowed};
  4. readiness: an open agent CA and a data-plane placement for the tenant,
     else 503 with C{Retry-After: 60}; then the tenant intermediate (created
     and audited on first use). Nothing is spent so far;
  5. C{consume_enroll_token}: the atomic single use (a concurrent loser gets
     401 as in 2);
  6. mint the leaf (fresh ed25519 key, never stored) and record it against
     the token.

After an enrollment the agent's grant is queued for its data-plane server
(L{PushNotices.quota_changed}) and the push loop is told the tenant is
placed (L{PushNotices.tenant_placed}): the tenant may have been placed only
now, after provisioning queued the grant, or the owner's budget was set, and
the update found no server to send it to; the loop then sends the tenant's
account budget and every live grant. A renewal tells it too, so a control
plane that restarted learns which tenants to keep reconciled.

Renewal (C{POST /agent/renew}) re-checks the same conditions for a caller
holding a live leaf (L{svc.control.agent_auth.AgentPrincipal}) and mints a
new leaf; recording it moves the mount lease the old leaf held to the new
one (same session id and epoch), so the agent keeps its mount across
renewals. Tenant, user and agent always come from the token's allocation or
the verified leaf, never from a request body.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Callable
from datetime import UTC, datetime

import attrs
from twisted.logger import Logger
from twisted.web.server import Request

from svc.control.agent_auth import AgentPrincipal
from svc.control.auth import bearer_credential
from svc.control.ca import AgentCA, AgentCAProvider, MintedLeaf
from svc.control.dataplane_client import AgentGrant
from svc.control.rate_limit import SlidingWindowLimiter
from svc.control.revocation_push import NoPushes, PushNotices
from svc.control.settings import ControlSettings
from svc.control.store.errors import NotFound
from svc.control.store.interface import ControlStore
from svc.control.store.outcomes import (
    EnrollGrant,
    EnrollOutcome,
    EnrollRefusalReason,
    InsufficientCapacity,
)
from svc.control.store.values import CertificateKind, IssuedCertificate, Placement
from svc.web.errors import (
    AGENT_SCOPE_REQUIRED,
    INVALID_CLIENT,
    REVOKED,
    TENANT_NOT_ALLOWED,
    TENANT_SUSPENDED,
    USER_SUSPENDED,
    AccessDenied,
    ApiError,
    Gone,
    InvalidCredential,
    JsonValue,
    RateLimited,
    ServiceUnavailable,
)

ENROLL_RETRY_AFTER = 60
"""C{Retry-After} on a 503 while CA material or placement is not ready."""
TOKEN_BYTES = 32
"""Random bytes in a minted secret token (256 bits; the spec asks >= 128)."""
DEFAULT_SERVER_CAPACITY = 100
"""Tenants a data-plane server takes when its registration names no capacity."""

CA_NOT_READY = "agent_ca_not_ready"
PLACEMENT_NOT_READY = "placement_not_ready"
ALLOCATION_REASSIGNED = "allocation_reassigned"
PROOF_OF_POSSESSION_REQUIRED = "proof_of_possession_required"

_log = Logger()


def new_secret_token(random_bytes: Callable[[int], bytes] = os.urandom) -> str:
    """
    A new secret token: L{TOKEN_BYTES} random bytes as unpadded base64url
    (43 characters, a valid Bearer C{token68}). Shown once; store only
    L{hash_token}.
    """
    return base64.urlsafe_b64encode(random_bytes(TOKEN_BYTES)).rstrip(b"=").decode("ascii")


def hash_token(token: str) -> str:
    """The SHA-256 of a token as the store keeps it: 64 lowercase hex digits."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def format_timestamp(moment: datetime) -> str:
    """RFC 3339 in UTC with a C{Z} and whole seconds: C{2026-11-22T19:00:00Z}."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@attrs.frozen
class EnrollTokenCredential:
    """The principal of an enrollment request: the SHA-256 of its Bearer token."""

    token_hash: str = attrs.field(repr=False)


class EnrollTokenAuthenticator:
    """
    The C{ENROLL_TOKEN} authenticator: only parses the Bearer token (401
    C{invalid_token} without one); the token is judged by L{Enrollment}, in
    the order that leaves it unspent on a 503.
    """

    async def authenticate(self, request: Request) -> EnrollTokenCredential:
        """The hash of the presented token."""
        token = bearer_credential(request)
        if token is None:
            raise InvalidCredential()
        return EnrollTokenCredential(hash_token(token))


def refusal_error(reason: EnrollRefusalReason) -> ApiError:
    """The HTTP error for a refused enroll token."""
    if reason.credential_invalid:
        return InvalidCredential()
    if reason is EnrollRefusalReason.ALLOCATION_REVOKED:
        return Gone(REVOKED)
    if reason is EnrollRefusalReason.USER_SUSPENDED:
        return AccessDenied(USER_SUSPENDED)
    if reason is EnrollRefusalReason.TENANT_SUSPENDED:
        return AccessDenied(TENANT_SUSPENDED)
    return AccessDenied(AGENT_SCOPE_REQUIRED)


@attrs.frozen
class EnrollmentDeps:
    """
    What the enrollment, renewal and server-signing routes need.

    @ivar now: the clock (e.g. C{reactor.seconds}), Unix seconds.
    @ivar limiter: the per-token (and per-leaf, for renewals) rate limit;
        one instance for the process.
    @ivar default_server_capacity: tenants a server takes when its
        registration names no capacity.
    @ivar pushes: told the agent's grant and its placed tenant after each
        enrollment, the tenant after each renewal, and every server
        registration (the push loop sends quotas to the data-plane servers).
    """

    store: ControlStore
    ca: AgentCAProvider
    settings: ControlSettings
    now: Callable[[], float]
    limiter: SlidingWindowLimiter
    default_server_capacity: int = DEFAULT_SERVER_CAPACITY
    pushes: PushNotices = attrs.field(factory=NoPushes)

    @classmethod
    def build(
        cls,
        store: ControlStore,
        ca: AgentCAProvider,
        settings: ControlSettings,
        now: Callable[[], float],
        pushes: PushNotices | None = None,
    ) -> EnrollmentDeps:
        """The dependencies with a limiter from C{SVC_ENROLL_RATE_LIMIT}."""
        return cls(
            store=store,
            ca=ca,
            settings=settings,
            now=now,
            limiter=SlidingWindowLimiter.from_setting(settings.enroll_rate_limit),
            pushes=NoPushes() if pushes is None else pushes,
        )

    def utc_now(self) -> datetime:
        """The clock's time as an aware UTC datetime."""
        return datetime.fromtimestamp(self.now(), UTC)


class Enrollment:
    """Enrollment and renewal over L{EnrollmentDeps}."""

    def __init__(self, deps: EnrollmentDeps) -> None:
        self._deps = deps
        self._store = deps.store

    async def enroll(self, token_hash: str) -> dict[str, JsonValue]:
        """
        Spend the enroll token with hash C{token_hash} for a new leaf; the
        enrollment response body.
        """
        now = self._deps.utc_now()
        self._limit(token_hash, now)
        peeked = _granted(await self._store.peek_enroll_token(token_hash, now))
        tenant_id = peeked.allocation.tenant_id
        ca, placement = await self._ready(tenant_id, now)
        await ca.prepare_tenant(tenant_id, now)
        grant = _granted(await self._store.consume_enroll_token(token_hash, now))
        if grant.allocation.tenant_id != tenant_id:
            tenant_id = grant.allocation.tenant_id
            placement = await self._placement(tenant_id, now)
        leaf = await ca.issue_agent_leaf(
            tenant_id=tenant_id, agent_id=grant.agent_id, user_id=grant.user.user_id, now=now
        )
        await self._store.record_enrollment(
            grant.token_id, _leaf_record(leaf, grant.user.user_id, tenant_id, grant.agent_id, now)
        )
        self._deps.pushes.quota_changed(
            AgentGrant(
                grant.allocation.owner_id, tenant_id, grant.agent_id, grant.allocation.grant_bytes
            )
        )
        self._deps.pushes.tenant_placed(tenant_id)
        _log.info(
            "agent_enrolled tenant={tenant} agent={agent} serial={serial}",
            tenant=tenant_id,
            agent=grant.agent_id,
            serial=leaf.serial,
            allocation=grant.allocation.allocation_id,
            token_id=grant.token_id,
        )
        return _response(leaf, placement, grant.allocation.allocation_id)

    async def renew(self, agent: AgentPrincipal) -> dict[str, JsonValue]:
        """
        A new leaf for the agent holding a live leaf; the enrollment
        response body. The caller must have proved possession of the key.
        """
        if not agent.possession_proven:
            raise InvalidCredential(INVALID_CLIENT, PROOF_OF_POSSESSION_REQUIRED)
        now = self._deps.utc_now()
        self._limit("renew:" + agent.serial, now)
        try:
            allocation = await self._store.get_agent_allocation(agent.agent_id)
        except NotFound:
            raise InvalidCredential(INVALID_CLIENT) from None
        if not allocation.live:
            raise Gone(REVOKED)
        if allocation.tenant_id != agent.tenant_id or allocation.owner_id != agent.user_id:
            raise AccessDenied(ALLOCATION_REASSIGNED)
        if (await self._store.get_user(allocation.owner_id)).suspended:
            raise AccessDenied(USER_SUSPENDED)
        if (await self._store.get_tenant(allocation.tenant_id)).suspended:
            raise AccessDenied(TENANT_SUSPENDED)
        ca, placement = await self._ready(allocation.tenant_id, now)
        leaf = await ca.issue_agent_leaf(
            tenant_id=allocation.tenant_id,
            agent_id=agent.agent_id,
            user_id=allocation.owner_id,
            now=now,
        )
        record = _leaf_record(leaf, allocation.owner_id, allocation.tenant_id, agent.agent_id, now)
        lease = await self._store.record_renewal(agent.serial, record)
        self._deps.pushes.tenant_placed(allocation.tenant_id)
        _log.info(
            "agent_renewed tenant={tenant} agent={agent} serial={serial} previous={previous}"
            " lease_moved={lease_moved}",
            tenant=allocation.tenant_id,
            agent=agent.agent_id,
            serial=leaf.serial,
            previous=agent.serial,
            proof=agent.proof.value,
            lease_moved=lease is not None,
        )
        return _response(leaf, placement, allocation.allocation_id)

    def _limit(self, key: str, now: datetime) -> None:
        decision = self._deps.limiter.attempt(key, now.timestamp())
        if not decision.allowed:
            raise RateLimited(decision.retry_after)

    async def _ready(self, tenant_id: str, now: datetime) -> tuple[AgentCA, Placement]:
        if not self._deps.settings.tenant_may_have_intermediate(tenant_id):
            raise AccessDenied(TENANT_NOT_ALLOWED)
        ca = await self._deps.ca.get()
        if ca is None:
            raise ServiceUnavailable(CA_NOT_READY, retry_after=ENROLL_RETRY_AFTER)
        return ca, await self._placement(tenant_id, now)

    async def _placement(self, tenant_id: str, now: datetime) -> Placement:
        placed = await self._store.place_tenant(tenant_id, now)
        if isinstance(placed, InsufficientCapacity):
            _log.warn("no data-plane server has room for tenant {tenant}", tenant=tenant_id)
            raise ServiceUnavailable(PLACEMENT_NOT_READY, retry_after=ENROLL_RETRY_AFTER)
        return placed


def _granted(outcome: EnrollOutcome) -> EnrollGrant:
    if isinstance(outcome, EnrollGrant):
        return outcome
    _log.info("enroll_refused reason={reason}", enroll_refused=True, reason=outcome.reason.value)
    raise refusal_error(outcome.reason)


def _leaf_record(
    leaf: MintedLeaf, user_id: str, tenant_id: str, agent_id: str, now: datetime
) -> IssuedCertificate:
    return IssuedCertificate(
        serial=leaf.serial,
        kind=CertificateKind.AGENT_LEAF,
        subject=user_id,
        not_after=leaf.not_after,
        issued_at=now,
        tenant_id=tenant_id,
        agent_id=agent_id,
        fingerprint=leaf.fingerprint,
    )


def _response(leaf: MintedLeaf, placement: Placement, allocation_id: str) -> dict[str, JsonValue]:
    return {
        "client_cert_pem": leaf.cert_pem.decode("ascii"),
        "client_key_pem": leaf.key_pem.decode("ascii"),
        "ca_chain_pem": leaf.ca_chain_pem.decode("ascii"),
        "server_addr": placement.server.address,
        "server_name": placement.server.fqdn,
        "expires_at": format_timestamp(leaf.not_after),
        "allocation_id": allocation_id,
        "serial": leaf.serial,
        "agent_fingerprint": leaf.fingerprint,
    }
