"""
The service-token routes that stop (and restore) access without revoking
anything: suspending and reinstating a user (an account) or a tenant, and
revoking one enroll token. Bodies: C{docs/specifications/control-routes.md}
("Suspension and enroll-token revocation").

  - C{POST /v1/entities/account/{owner}/suspend}, C{.../reinstate}: the
    account entity, C{suspended} set;
  - C{POST /v1/tenants/{tenant}/suspend}, C{.../reinstate}: the tenant;
  - C{POST /v1/enroll-tokens/{token_id}/revoke}: the token's state.

A suspended user's or tenant's enroll tokens and leaf renewals are refused
(403 C{user_suspended} / C{tenant_suspended}), and a suspended user's admin
sessions and API tokens are refused (401); allocations, mount leases and
leaves already issued are untouched (a leaf lives at most an hour and cannot
be renewed). Each change is idempotent and logged.
"""

from __future__ import annotations

import re
from typing import Any

import attrs
from twisted.logger import Logger

from svc.control.dataplane_client import rfc3339
from svc.control.http import Call
from svc.control.routes_entities import EntityRoutes, check_path_id, from_store, utc_now
from svc.control.routing import AuthKind, Feature, HandlerResult, Route
from svc.control.store.interface import ControlStore
from svc.control.store.values import EnrollToken, Tenant
from svc.web import errors as api
from svc.web.errors import JsonValue

_TOKEN_ID = re.compile(r"[0-9a-f]{32}")

_log = Logger()


@attrs.frozen
class AccessDeps:
    """
    What these routes work with.

    @ivar clock: the reactor's time.
    """

    store: ControlStore
    clock: Any


def tenant_body(tenant: Tenant) -> dict[str, JsonValue]:
    """The JSON of a tenant."""
    return {
        "tenant": tenant.tenant_id,
        "owner": tenant.owner_id,
        "suspended": tenant.suspended,
        "created_at": rfc3339(tenant.created_at),
    }


def enroll_token_state(token: EnrollToken) -> str:
    """
    What a token is once revoked: C{consumed} if it had been spent before
    (a spent token is not revoked), else C{revoked}.
    """
    return "consumed" if token.consumed_at is not None else "revoked"


def revoked_token_body(token: EnrollToken, agent_id: str | None) -> dict[str, JsonValue]:
    """The JSON of an enroll token once revoked (C{agent_id}: its allocation's agent)."""
    return {
        "token_id": token.token_id,
        "agent_id": agent_id,
        "allocation_id": token.allocation_id,
        "state": enroll_token_state(token),
        "created_at": rfc3339(token.created_at),
        "expires_at": rfc3339(token.expires_at),
        "consumed_at": None if token.consumed_at is None else rfc3339(token.consumed_at),
        "revoked_at": None if token.revoked_at is None else rfc3339(token.revoked_at),
    }


class AccessRoutes:
    """The handlers; L{routes} declares them."""

    def __init__(self, deps: AccessDeps) -> None:
        self._store = deps.store
        self._clock = deps.clock

    def routes(self) -> list[Route]:
        """Every route of this module."""

        def route(path: str, handler: Any, api_alias: bool = True) -> Route:
            return Route(
                "POST",
                path,
                AuthKind.SERVICE_TOKEN,
                handler,
                mounted_with={Feature.DATABASE},
                api_alias=api_alias,
            )

        return [
            route("/v1/entities/account/<owner>/suspend", self.suspend_account),
            route("/v1/entities/account/<owner>/reinstate", self.reinstate_account),
            route("/v1/tenants/<tenant>/suspend", self.suspend_tenant),
            route("/v1/tenants/<tenant>/reinstate", self.reinstate_tenant),
            route("/v1/enroll-tokens/<token_id>/revoke", self.revoke_enroll_token, False),
        ]

    async def suspend_account(self, call: Call) -> HandlerResult:
        """C{POST /v1/entities/account/{owner}/suspend}."""
        return await self._set_account(call, suspended=True)

    async def reinstate_account(self, call: Call) -> HandlerResult:
        """C{POST /v1/entities/account/{owner}/reinstate}."""
        return await self._set_account(call, suspended=False)

    async def suspend_tenant(self, call: Call) -> HandlerResult:
        """C{POST /v1/tenants/{tenant}/suspend}."""
        return await self._set_tenant(call, suspended=True)

    async def reinstate_tenant(self, call: Call) -> HandlerResult:
        """C{POST /v1/tenants/{tenant}/reinstate}."""
        return await self._set_tenant(call, suspended=False)

    async def revoke_enroll_token(self, call: Call) -> HandlerResult:
        """
        C{POST /v1/enroll-tokens/{token_id}/revoke}: a token not spent yet
        (expired or not) can no longer enroll; a spent one is answered as it
        is.
        """
        token_id = call.params["token_id"]
        if _TOKEN_ID.fullmatch(token_id) is None:
            raise api.NotFound("enroll_token")
        now = utc_now(self._clock)
        token = await from_store(self._store.revoke_enroll_token(token_id, now))
        allocation = await from_store(self._store.get_allocation(token.allocation_id))
        state = enroll_token_state(token)
        _log.info(
            "enroll token {token_id} of agent {agent_id} revoked (now {state})",
            token_id=token_id,
            agent_id=allocation.agent_id,
            state=state,
        )
        return revoked_token_body(token, allocation.agent_id)

    async def _set_account(self, call: Call, *, suspended: bool) -> HandlerResult:
        owner = check_path_id(call.params["owner"], "owner")
        user = await from_store(self._store.set_user_suspended(owner, suspended))
        allocations = await from_store(self._store.list_allocations(owner))
        _log.info(
            "account {owner} {change}",
            owner=owner,
            change="suspended" if suspended else "reinstated",
        )
        return EntityRoutes.account_entity(user, allocations)

    async def _set_tenant(self, call: Call, *, suspended: bool) -> HandlerResult:
        tenant_id = check_path_id(call.params["tenant"], "tenant")
        tenant = await from_store(self._store.set_tenant_suspended(tenant_id, suspended))
        _log.info(
            "tenant {tenant} {change}",
            tenant=tenant_id,
            change="suspended" if suspended else "reinstated",
        )
        return tenant_body(tenant)


def access_routes(deps: AccessDeps) -> list[Route]:
    """The suspension and enroll-token revocation routes for C{deps}."""
    return AccessRoutes(deps).routes()
