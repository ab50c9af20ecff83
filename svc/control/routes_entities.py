"""
The service-token routes: provisioning and entities, account budgets,
enroll-token minting, the purge sweep and per-owner usage.

All take the service token, are mounted with the database and (except
C{/v1/agents/...}) also served under C{/api} (mounting rule 6). Usage and the
purge sweep need the data-plane servers, so they answer 503 until an agent
CA (and so the control certificate) is ready. Request and response bodies:
C{docs/specifications/control-routes.md}.

Entity types: C{agent} (an agent-scoped allocation: an agent I{is} its
allocation) and C{account} (an owner: a user, its budget, and owner-scoped
allocations).
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import attrs
from twisted.internet.defer import Deferred, DeferredList
from twisted.logger import Logger

from svc.control.dataplane_client import (
    AccountBudget,
    AgentGrant,
    DataPlaneCallFailed,
    DataPlaneClient,
    DataPlaneTarget,
    OwnerUsage,
    rfc3339,
    target_for,
)
from svc.control.http import Call
from svc.control.purging import purge_allocation
from svc.control.revocation_push import PushNotices
from svc.control.routing import AuthKind, Feature, HandlerResult, Reply, Route
from svc.control.settings import ControlSettings
from svc.control.store import errors as store_errors
from svc.control.store.interface import ControlStore
from svc.control.store.values import Allocation, AllocationState, EnrollToken, Server, User
from svc.pki import names
from svc.pki.errors import InvalidName
from svc.web import errors as api
from svc.web.errors import JsonValue

T = TypeVar("T")

AGENT = "agent"
ACCOUNT = "account"
ENTITY_TYPES = (AGENT, ACCOUNT)
ENROLL_TOKEN_BYTES = 32
"""256 random bits per enroll token (the spec asks for at least 128)."""
MAX_BYTE_COUNT = 2**63 - 1
MAX_EXACT_FLOAT = 2**53

_log = Logger()


async def from_store(deferred: Deferred[T]) -> T:
    """
    Await a store operation, translating its refusals to the HTTP errors:
    L{store_errors.NotFound} 404, L{store_errors.Revoked} 410 C{revoked},
    L{store_errors.LeaseLost} 410 C{lease_lost}, L{store_errors.Conflict}
    409 with its code, L{store_errors.InvalidValue} 400.
    """
    try:
        return await deferred
    except store_errors.NotFound as e:
        raise api.NotFound(e.message) from None
    except store_errors.Revoked:
        raise api.Gone(api.REVOKED) from None
    except store_errors.LeaseLost:
        raise api.Gone(api.LEASE_LOST) from None
    except store_errors.Conflict as e:
        raise api.Conflict(e.code) from None
    except store_errors.InvalidValue:
        raise api.InvalidRequest("invalid_value") from None


def utc_now(clock: Any) -> datetime:
    """The clock's current time as an aware UTC L{datetime}."""
    return datetime.fromtimestamp(clock.seconds(), UTC)


def check_path_id(value: str, what: str) -> str:
    """A path or body id in the certificate alphabet, else 400 C{invalid_<what>}."""
    try:
        return names.check_id(value, what)
    except InvalidName:
        raise api.InvalidRequest(f"invalid_{what}") from None


def body_id(body: dict[str, JsonValue], field: str, default: str | None = None) -> str:
    """A required (or defaulted) id field of a body."""
    value = body.get(field, default)
    if value is None:
        raise api.InvalidRequest(f"missing_field:{field}")
    if not isinstance(value, str):
        raise api.InvalidRequest(f"invalid_{field}")
    return check_path_id(value, field)


def body_bytes(body: dict[str, JsonValue], field: str, *, nullable: bool = False) -> int | None:
    """
    A byte count field: a JSON integer 0 .. 2**63-1 (or C{null} when
    allowed); a whole number written with a fraction or exponent (C{5.0},
    C{1e9}) counts as that integer up to 2**53, where floats stop being
    exact.
    """
    if field not in body:
        raise api.InvalidRequest(f"missing_field:{field}")
    value = body[field]
    if value is None and nullable:
        return None
    if isinstance(value, float) and value.is_integer() and abs(value) <= MAX_EXACT_FLOAT:
        value = int(value)  # JSON has one number type: 5.0 is the integer 5
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_BYTE_COUNT:
        raise api.InvalidRequest(f"invalid_{field}")
    return value


def _optional_time(moment: datetime | None) -> str | None:
    return None if moment is None else rfc3339(moment)


def new_enroll_token(random_bytes: Callable[[int], bytes]) -> tuple[str, str]:
    """
    A fresh enroll token (256 bits, unpadded base64url) and the SHA-256 hex
    digest the store keeps instead.
    """
    token = base64.urlsafe_b64encode(random_bytes(ENROLL_TOKEN_BYTES)).rstrip(b"=").decode()
    return token, hashlib.sha256(token.encode("ascii")).hexdigest()


def minted_token_body(
    token: str, stored: EnrollToken, allocation: Allocation
) -> dict[str, JsonValue]:
    """The JSON of an enroll token just minted for C{allocation}: the secret shown once."""
    return {
        "token": token,
        "token_id": stored.token_id,
        "agent_id": allocation.agent_id,
        "allocation_id": allocation.allocation_id,
        "expires_at": rfc3339(stored.expires_at),
    }


@attrs.frozen
class EntityDeps:
    """
    What the entity routes work with.

    @ivar clock: the reactor's time.
    @ivar client: the data-plane calls (usage, purge).
    @ivar pushes: told about revocations and quota changes once committed.
    @ivar random_bytes: the source of enroll tokens.
    @ivar target_of: where a server's HTTPS surface is.
    """

    store: ControlStore
    settings: ControlSettings
    clock: Any
    client: DataPlaneClient
    pushes: PushNotices
    random_bytes: Callable[[int], bytes] = os.urandom
    target_of: Callable[[Server], DataPlaneTarget] = target_for


class EntityRoutes:
    """The handlers; L{routes} declares them."""

    def __init__(self, deps: EntityDeps) -> None:
        self._deps = deps
        self._store = deps.store

    def _now(self) -> datetime:
        return utc_now(self._deps.clock)

    def routes(self) -> list[Route]:
        """Every route of this module, as declared for L{svc.control.http.ControlApp}."""
        database = {Feature.DATABASE}
        service = AuthKind.SERVICE_TOKEN

        def entities(method: str, path: str, handler: Any, **extra: Any) -> Route:
            return Route(method, path, service, handler, mounted_with=database, **extra)

        return [
            entities("POST", "/v1/entities", self.provision, api_alias=True),
            entities("GET", "/v1/entities/<type>/<id>", self.resolve, api_alias=True),
            entities("PATCH", "/v1/entities/<type>/<id>", self.set_quota, api_alias=True),
            entities("DELETE", "/v1/entities/<type>/<id>", self.revoke, api_alias=True),
            entities("POST", "/v1/entities/<type>/<id>/reassign", self.reassign, api_alias=True),
            entities("POST", "/v1/entities/account/<owner>/budget", self.budget, api_alias=True),
            entities("POST", "/v1/agents/<id>/enroll-token", self.enroll_token),
            entities(
                "POST",
                "/v1/admin/purge-sweep",
                self.purge_sweep,
                serves_with={Feature.AGENT_CA},
                api_alias=True,
            ),
            entities(
                "GET",
                "/v1/tenants/<owner>/usage",
                self.usage,
                serves_with={Feature.AGENT_CA},
                api_alias=True,
            ),
        ]

    # Rendering

    def agent_entity(self, allocation: Allocation) -> dict[str, JsonValue]:
        """The JSON of an agent entity (or of an owner-scoped allocation)."""
        rendered: dict[str, JsonValue] = {
            "type": AGENT if allocation.agent_id is not None else ACCOUNT,
            "id": allocation.agent_id if allocation.agent_id is not None else allocation.owner_id,
            "allocation_id": allocation.allocation_id,
            "owner": allocation.owner_id,
            "tenant": allocation.tenant_id,
            "grant_bytes": allocation.grant_bytes,
            "state": allocation.state.value,
            "created_at": rfc3339(allocation.created_at),
        }
        if allocation.agent_id is not None:
            rendered["virtual_path"] = self._deps.settings.virtual_path(allocation.agent_id)
        return rendered

    @staticmethod
    def account_entity(user: User, allocations: Iterable[Allocation]) -> dict[str, JsonValue]:
        """The JSON of an account entity."""
        return {
            "type": ACCOUNT,
            "id": user.user_id,
            "display_name": user.display_name,
            "budget_bytes": user.budget_bytes,
            "suspended": user.suspended,
            "created_at": rfc3339(user.created_at),
            "allocations": [
                {
                    "allocation_id": a.allocation_id,
                    "agent_id": a.agent_id,
                    "tenant": a.tenant_id,
                    "grant_bytes": a.grant_bytes,
                    "state": a.state.value,
                    "revoked_at": _optional_time(a.revoked_at),
                }
                for a in allocations
            ],
        }

    # Handlers

    async def provision(self, call: Call) -> HandlerResult:
        """C{POST /v1/entities}: provision an agent (or owner-scoped) allocation."""
        body = call.json_body()
        kind = body.get("type")
        if kind not in ENTITY_TYPES:
            raise api.InvalidRequest("unknown_entity_type")
        entity_id = body_id(body, "id")
        owner = entity_id if kind == ACCOUNT else body_id(body, "owner")
        if kind == ACCOUNT and body.get("owner", owner) != owner:
            raise api.InvalidRequest("invalid_owner")
        tenant = body_id(body, "tenant", default=owner)
        grant = body_bytes(body, "grant_bytes")
        assert grant is not None
        provisioned = await from_store(
            self._store.provision(
                agent_id=entity_id if kind == AGENT else None,
                owner_id=owner,
                tenant_id=tenant,
                grant_bytes=grant,
                now=self._now(),
            )
        )
        allocation = provisioned.allocation
        if provisioned.created:
            _log.info(
                "provisioned {kind} {entity_id} owner={owner} tenant={tenant}",
                kind=kind,
                entity_id=entity_id,
                owner=owner,
                tenant=tenant,
            )
            self._grant_changed(allocation)
        return {**self.agent_entity(allocation), "created": provisioned.created}

    async def resolve(self, call: Call) -> HandlerResult:
        """C{GET /v1/entities/{type}/{id}}."""
        kind, entity_id = self._entity(call)
        if kind == ACCOUNT:
            user = await from_store(self._store.get_user(entity_id))
            allocations = await from_store(self._store.list_allocations(entity_id))
            return self.account_entity(user, allocations)
        allocation = await self._live_agent(entity_id)
        return self.agent_entity(allocation)

    async def set_quota(self, call: Call) -> HandlerResult:
        """C{PATCH /v1/entities/agent/{id}} with C{grant_bytes}."""
        kind, entity_id = self._entity(call)
        if kind != AGENT:
            raise api.InvalidRequest("not_supported_for_type")
        grant = body_bytes(call.json_body(), "grant_bytes")
        assert grant is not None
        allocation = await from_store(self._store.set_agent_quota(entity_id, grant))
        self._grant_changed(allocation)
        return self.agent_entity(allocation)

    async def revoke(self, call: Call) -> HandlerResult:
        """C{DELETE /v1/entities/{type}/{id}}: revoke (idempotent), 204."""
        kind, entity_id = self._entity(call)
        now = self._now()
        if kind == ACCOUNT:
            await from_store(self._store.revoke_owner(entity_id, now))
        else:
            try:
                await from_store(self._store.revoke_agent(entity_id, now))
            except api.Gone:
                pass  # already revoked: still 204
        _log.info("revoked {kind} {entity_id}", kind=kind, entity_id=entity_id)
        self._deps.pushes.revocations_changed()
        return Reply.no_content()

    async def reassign(self, call: Call) -> HandlerResult:
        """C{POST /v1/entities/agent/{id}/reassign} with C{owner} and optional C{tenant}."""
        kind, entity_id = self._entity(call)
        if kind != AGENT:
            raise api.InvalidRequest("not_supported_for_type")
        body = call.json_body()
        owner = body_id(body, "owner")
        tenant = body_id(body, "tenant", default=owner)
        allocation = await from_store(
            self._store.reassign_agent(entity_id, owner_id=owner, tenant_id=tenant, now=self._now())
        )
        self._deps.pushes.revocations_changed()
        self._grant_changed(allocation)
        return self.agent_entity(allocation)

    async def budget(self, call: Call) -> HandlerResult:
        """C{POST /v1/entities/account/{owner}/budget} with C{budget_bytes} (or C{null})."""
        owner = check_path_id(call.params["owner"], "owner")
        budget = body_bytes(call.json_body(), "budget_bytes", nullable=True)
        user = await from_store(self._store.set_account_budget(owner, budget, self._now()))
        allocations = await from_store(self._store.list_allocations(owner))
        for tenant in sorted({a.tenant_id for a in allocations}):
            self._deps.pushes.quota_changed(AccountBudget(owner, tenant, user.budget_bytes))
        return {"type": ACCOUNT, "id": owner, "budget_bytes": user.budget_bytes}

    async def enroll_token(self, call: Call) -> HandlerResult:
        """C{POST /v1/agents/{id}/enroll-token}: a single-use token bound to the agent."""
        agent_id = check_path_id(call.params["id"], "agent_id")
        allocation = await self._live_agent(agent_id)
        token, token_hash = new_enroll_token(self._deps.random_bytes)
        now = self._now()
        expires_at = now + timedelta(seconds=self._deps.settings.enroll_token_ttl_seconds)
        stored = await from_store(
            self._store.create_enroll_token(allocation.allocation_id, token_hash, now, expires_at)
        )
        _log.info(
            "enroll token {token_id} minted for agent {agent_id}",
            token_id=stored.token_id,
            agent_id=agent_id,
        )
        return minted_token_body(token, stored, allocation)

    async def purge_sweep(self, call: Call) -> HandlerResult:
        """C{POST /v1/admin/purge-sweep}: erase revoked allocations' data."""
        call.json_body(optional=True)
        work = await from_store(self._store.list_revoked_allocations())
        purged: list[JsonValue] = []
        failed: list[JsonValue] = []
        for allocation in work:
            try:
                result = await self._purge(allocation)
            except DataPlaneCallFailed as e:
                _log.warn(
                    "purge of {allocation_id} failed: {reason}",
                    allocation_id=allocation.allocation_id,
                    reason=str(e),
                )
                failed.append(
                    {
                        "allocation_id": allocation.allocation_id,
                        "agent_id": allocation.agent_id,
                        "error": "dataplane_unreachable",
                    }
                )
                continue
            purged.append(result)
        return {"purged": purged, "failed": failed}

    async def usage(self, call: Call) -> HandlerResult:
        """C{GET /v1/tenants/{owner}/usage}: the owner's usage on every server."""
        owner = check_path_id(call.params["owner"], "owner")
        user = await from_store(self._store.get_user(owner))
        allocations = await from_store(self._store.list_allocations(owner))
        servers: dict[str, Server] = {}
        for tenant in sorted({a.tenant_id for a in allocations}):
            placement = await from_store(self._store.get_placement(tenant))
            if placement is not None:
                servers[placement.server.server_id] = placement.server
        targets = [self._deps.target_of(s) for s in servers.values()]
        answers = await DeferredList(
            [self._deps.client.usage(t, owner) for t in targets], consumeErrors=True
        )
        reports: list[OwnerUsage] = []
        for target, (ok, answer) in zip(targets, answers, strict=True):
            if not ok or not isinstance(answer, OwnerUsage):
                _log.warn("usage query to {fqdn} failed: {answer}", fqdn=target.fqdn, answer=answer)
                raise api.ServiceUnavailable("dataplane_unreachable")
            reports.append(answer)
        agents: dict[str, dict[str, JsonValue]] = {}
        for a in allocations:
            if a.agent_id is not None and a.state is not AllocationState.PURGED:
                agents[a.agent_id] = {
                    "used_bytes": 0,
                    "grant_bytes": a.grant_bytes,
                    "state": a.state.value,
                }
        for report in reports:
            for agent_id, used in report.agents.items():
                entry = agents.setdefault(
                    agent_id, {"used_bytes": 0, "grant_bytes": None, "state": None}
                )
                previous = entry["used_bytes"]
                entry["used_bytes"] = (previous if isinstance(previous, int) else 0) + used
        return {
            "owner": owner,
            "used_bytes": sum(r.used_bytes for r in reports),
            "budget_bytes": user.budget_bytes,
            "agents": dict(sorted(agents.items())),
        }

    # Helpers

    def _entity(self, call: Call) -> tuple[str, str]:
        kind = call.params["type"]
        if kind not in ENTITY_TYPES:
            raise api.NotFound("unknown_entity_type")
        what = "agent_id" if kind == AGENT else "owner"
        return kind, check_path_id(call.params["id"], what)

    async def _live_agent(self, agent_id: str) -> Allocation:
        allocation = await from_store(self._store.get_agent_allocation(agent_id))
        if not allocation.live:
            raise api.Gone(api.REVOKED)
        return allocation

    def _grant_changed(self, allocation: Allocation) -> None:
        if allocation.agent_id is None or not allocation.live:
            return
        self._deps.pushes.quota_changed(
            AgentGrant(
                allocation.owner_id,
                allocation.tenant_id,
                allocation.agent_id,
                allocation.grant_bytes,
            )
        )

    async def _purge(self, allocation: Allocation) -> dict[str, JsonValue]:
        deps = self._deps
        return await from_store(
            Deferred.fromCoroutine(
                purge_allocation(self._store, deps.client, deps.target_of, allocation, self._now())
            )
        )


def entity_routes(deps: EntityDeps) -> list[Route]:
    """The service-token entity, token, admin and usage routes."""
    return EntityRoutes(deps).routes()


__all__ = [
    "EntityDeps",
    "EntityRoutes",
    "body_bytes",
    "body_id",
    "check_path_id",
    "entity_routes",
    "from_store",
    "new_enroll_token",
    "utc_now",
]
