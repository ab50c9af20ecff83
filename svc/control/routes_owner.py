"""
The owner routes: signing in with an admin session link, logging out, the
current user, its allocations (usage, revoke, owner-forced unmount) and its
API tokens. Bodies: C{docs/specifications/owner-routes.md}.

Every route but C{GET /admin/session} takes the admin-session credential
(L{svc.control.owner_auth.OwnerAuthenticator}: the cookie, or an API token
where allowed). An allocation or token of another user is a plain 404.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import datetime
from typing import Any

import attrs
from twisted.logger import Logger

from svc.control.dataplane_client import (
    DataPlaneCallFailed,
    DataPlaneClient,
    DataPlaneTarget,
    rfc3339,
    target_for,
)
from svc.control.enrollment import new_secret_token
from svc.control.http import Call
from svc.control.owner_auth import (
    API_TOKEN_PREFIX,
    OwnerPrincipal,
    cleared_cookie,
    hash_link_secret,
    hash_secret,
    session_cookie,
)
from svc.control.revocation_push import PushNotices
from svc.control.routes_entities import from_store, utc_now
from svc.control.routing import AuthKind, Feature, HandlerResult, Reply, Route
from svc.control.settings import ControlSettings
from svc.control.store.interface import ControlStore
from svc.control.store.values import Allocation, AllocationState, ApiToken, Server
from svc.web import errors as api
from svc.web.errors import JsonValue

DASHBOARD_LOCATION = "../dashboard"
"""
Where a successful sign-in link redirects: relative to the link's own path,
so C{/admin/session} goes to C{/dashboard} and C{/api/admin/session} to
C{/api/dashboard}, also behind an edge that strips a prefix.
"""

MAX_LIVE_TOKENS = 100
"""Most unrevoked API tokens one user may hold."""

MAX_TOKEN_NAME = 64

_log = Logger()


@attrs.frozen
class OwnerDeps:
    """
    What the owner routes work with.

    @ivar clock: the reactor's time.
    @ivar client: the data-plane calls (usage).
    @ivar pushes: told when a revoke or unmount revoked a leaf.
    @ivar random_bytes: the source of session secrets and API tokens.
    @ivar target_of: where a server's HTTPS surface is.
    """

    store: ControlStore
    settings: ControlSettings
    clock: Any
    client: DataPlaneClient
    pushes: PushNotices
    random_bytes: Callable[[int], bytes] = os.urandom
    target_of: Callable[[Server], DataPlaneTarget] = target_for


def _optional_time(moment: datetime | None) -> str | None:
    return None if moment is None else rfc3339(moment)


def token_body(token: ApiToken) -> dict[str, JsonValue]:
    """The JSON of a listed API token (never its secret)."""
    return {
        "id": token.token_id,
        "name": token.name,
        "created_at": rfc3339(token.created_at),
        "last_used_at": _optional_time(token.last_used_at),
        "revoked_at": _optional_time(token.revoked_at),
    }


def token_name(body: dict[str, JsonValue]) -> str:
    """The C{name} of a new token: 1-64 printable characters."""
    name = body.get("name")
    if name is None:
        raise api.InvalidRequest("missing_field:name")
    if (
        not isinstance(name, str)
        or not 1 <= len(name) <= MAX_TOKEN_NAME
        or not name.isprintable()
        or name != name.strip()
    ):
        raise api.InvalidRequest("invalid_name")
    return name


class OwnerRoutes:
    """The handlers; L{routes} declares them."""

    def __init__(self, deps: OwnerDeps) -> None:
        self._deps = deps
        self._store = deps.store

    def _now(self) -> datetime:
        return utc_now(self._deps.clock)

    @property
    def _secure_cookie(self) -> bool:
        return not self._deps.settings.dev_mode

    def routes(self) -> list[Route]:
        """Every route of this module."""
        database = {Feature.DATABASE}
        owner = AuthKind.ADMIN_SESSION

        def route(method: str, path: str, handler: Any, **extra: Any) -> Route:
            return Route(method, path, owner, handler, mounted_with=database, **extra)

        return [
            Route(
                "GET",
                "/admin/session",
                AuthKind.PUBLIC,
                self.sign_in,
                mounted_with=database,
                api_alias=True,
            ),
            route("POST", "/auth/logout", self.logout, api_alias=True),
            route("GET", "/me", self.me, api_alias=True),
            route("GET", "/allocations", self.allocations, api_alias=True),
            route(
                "GET",
                "/allocations/<id>/usage",
                self.usage,
                serves_with={Feature.AGENT_CA},
                api_alias=True,
            ),
            route("POST", "/allocations/<id>/revoke", self.revoke, api_alias=True),
            route("POST", "/allocations/<id>/unmount", self.unmount, api_alias=True),
            route("POST", "/v1/tokens", self.create_token, api_alias=True),
            route("GET", "/v1/tokens", self.list_tokens, api_alias=True),
            route("DELETE", "/v1/tokens/<id>", self.revoke_token, api_alias=True),
        ]

    # Sessions

    async def sign_in(self, call: Call) -> HandlerResult:
        """
        C{GET /admin/session?token=}: spend the link's session, start a new
        one for the browser with the rest of its lifetime, set the cookie
        and redirect to the dashboard.
        """
        token = call.query_arg("token")
        if not token:
            raise api.InvalidCredential()
        now = self._now()
        link_hash = hash_link_secret(token)
        found = await self._store.authenticate_admin_session(link_hash, now)
        if found is None:
            raise api.InvalidCredential()
        link, user = found
        if not await self._store.revoke_admin_session(link_hash, now):
            raise api.InvalidCredential()  # spent by a concurrent sign-in
        secret = new_secret_token(self._deps.random_bytes)
        session = await from_store(
            self._store.create_admin_session(
                user.user_id, hash_secret(secret), now, link.expires_at
            )
        )
        _log.info(
            "admin session {session_id} started for user {user_id}",
            session_id=session.session_id,
            user_id=user.user_id,
        )
        max_age = int((session.expires_at - now).total_seconds())
        return Reply.redirect(
            DASHBOARD_LOCATION,
            {
                "Set-Cookie": session_cookie(secret, max_age, self._secure_cookie),
                "Cache-Control": "no-store",
                "Referrer-Policy": "no-referrer",
            },
        )

    async def logout(self, call: Call) -> HandlerResult:
        """C{POST /auth/logout}: end the session server-side and clear the cookie."""
        principal = call.principal_as(OwnerPrincipal).require_session()
        if principal.secret is not None:
            await self._store.revoke_admin_session(hash_secret(principal.secret), self._now())
        _log.info("admin session of user {user_id} ended", user_id=principal.user_id)
        return Reply(status=204, headers={"Set-Cookie": cleared_cookie(self._secure_cookie)})

    async def me(self, call: Call) -> HandlerResult:
        """C{GET /me}: the signed-in user."""
        principal = call.principal_as(OwnerPrincipal)
        body: dict[str, JsonValue] = {
            "user_id": principal.user.user_id,
            "display_name": principal.user.display_name,
            "auth": principal.credential.value,
        }
        if principal.session is not None:
            body["csrf_token"] = principal.csrf_token
            body["session_expires_at"] = rfc3339(principal.session.expires_at)
        return body

    # Allocations

    async def _owned(self, call: Call) -> tuple[OwnerPrincipal, Allocation]:
        principal = call.principal_as(OwnerPrincipal)
        allocation_id = call.params["id"]
        try:
            allocation = await from_store(self._store.get_allocation(allocation_id))
        except (api.NotFound, api.InvalidRequest):
            raise api.NotFound("allocation") from None
        if allocation.owner_id != principal.user_id:
            raise api.NotFound("allocation")
        return principal, allocation

    async def allocation_body(self, allocation: Allocation) -> dict[str, JsonValue]:
        """The JSON of one allocation, with its mount lease row if any."""
        agent_id = allocation.agent_id
        mount: JsonValue = None
        if agent_id is not None and allocation.state is AllocationState.PROVISIONED:
            lease = await from_store(self._store.get_mount_lease(allocation.allocation_id))
            if lease is not None:
                mount = {
                    "agent_id": lease.holder.agent_id,
                    "bound_at": rfc3339(lease.bound_at),
                    "lease_expires_at": rfc3339(lease.expires_at),
                    "live": self._now() < lease.expires_at,
                }
        return {
            "allocation_id": allocation.allocation_id,
            "agent_id": agent_id,
            "tenant_id": allocation.tenant_id,
            "owner_id": allocation.owner_id,
            "grant_bytes": allocation.grant_bytes,
            "state": allocation.state.value,
            "created_at": rfc3339(allocation.created_at),
            "revoked_at": _optional_time(allocation.revoked_at),
            "virtual_path": (
                None if agent_id is None else self._deps.settings.virtual_path(agent_id)
            ),
            "mount": mount,
        }

    async def allocations(self, call: Call) -> HandlerResult:
        """C{GET /allocations}: the user's allocations, newest first."""
        principal = call.principal_as(OwnerPrincipal)
        found = await from_store(self._store.list_allocations(principal.user_id))
        ordered = sorted(found, key=lambda a: (a.created_at, a.allocation_id), reverse=True)
        return {"allocations": [await self.allocation_body(a) for a in ordered]}

    async def usage(self, call: Call) -> HandlerResult:
        """C{GET /allocations/{id}/usage}: the agent's bytes on its server."""
        _, allocation = await self._owned(call)
        used = 0
        placement = await from_store(self._store.get_placement(allocation.tenant_id))
        if placement is not None and allocation.agent_id is not None:
            target = self._deps.target_of(placement.server)
            try:
                report = await self._deps.client.usage(target, allocation.owner_id)
            except DataPlaneCallFailed as e:
                _log.warn("usage query to {fqdn} failed: {reason}", fqdn=target.fqdn, reason=e)
                raise api.ServiceUnavailable("dataplane_unreachable") from None
            used = report.agents.get(allocation.agent_id, 0)
        return {
            "allocation_id": allocation.allocation_id,
            "agent_id": allocation.agent_id,
            "tenant_id": allocation.tenant_id,
            "grant_bytes": allocation.grant_bytes,
            "used_bytes": used,
        }

    async def revoke(self, call: Call) -> HandlerResult:
        """C{POST /allocations/{id}/revoke}: revoke it (idempotent)."""
        principal, allocation = await self._owned(call)
        if allocation.state is AllocationState.PROVISIONED:
            allocation = await from_store(
                self._store.revoke_allocation(allocation.allocation_id, self._now())
            )
            self._deps.pushes.revocations_changed()
            _log.info(
                "allocation {allocation_id} revoked by its owner {user_id}",
                allocation_id=allocation.allocation_id,
                user_id=principal.user_id,
            )
        return await self.allocation_body(allocation)

    async def unmount(self, call: Call) -> HandlerResult:
        """C{POST /allocations/{id}/unmount}: end the mount lease now."""
        principal, allocation = await self._owned(call)
        if allocation.state is not AllocationState.PROVISIONED:
            raise api.Gone(api.REVOKED)
        ended = await from_store(
            self._store.force_unmount(allocation.allocation_id, principal.user_id, self._now())
        )
        if ended is not None:
            self._deps.pushes.revocations_changed()
            _log.info(
                "mount lease of {allocation_id} ended by its owner {user_id}",
                allocation_id=allocation.allocation_id,
                user_id=principal.user_id,
            )
        return {"allocation_id": allocation.allocation_id, "released": ended is not None}

    # API tokens

    async def create_token(self, call: Call) -> HandlerResult:
        """C{POST /v1/tokens}: a new API token, shown once (201)."""
        principal = call.principal_as(OwnerPrincipal).require_session()
        name = token_name(call.json_body())
        existing = await from_store(self._store.list_api_tokens(principal.user_id))
        if sum(1 for t in existing if t.revoked_at is None) >= MAX_LIVE_TOKENS:
            raise api.Conflict("too_many_tokens")
        secret = API_TOKEN_PREFIX + new_secret_token(self._deps.random_bytes)
        token = await from_store(
            self._store.create_api_token(principal.user_id, name, hash_secret(secret), self._now())
        )
        _log.info(
            "API token {token_id} minted for user {user_id}",
            token_id=token.token_id,
            user_id=principal.user_id,
        )
        return Reply.created(
            {
                "id": token.token_id,
                "name": token.name,
                "token": secret,
                "created_at": rfc3339(token.created_at),
            }
        )

    async def list_tokens(self, call: Call) -> HandlerResult:
        """C{GET /v1/tokens}: the user's tokens, newest first, never a secret."""
        principal = call.principal_as(OwnerPrincipal).require_session()
        tokens = await from_store(self._store.list_api_tokens(principal.user_id))
        ordered = sorted(tokens, key=lambda t: (t.created_at, t.token_id), reverse=True)
        return {"tokens": [token_body(t) for t in ordered]}

    async def revoke_token(self, call: Call) -> HandlerResult:
        """C{DELETE /v1/tokens/{id}}: the token stops working now (204)."""
        principal = call.principal_as(OwnerPrincipal).require_session()
        try:
            await from_store(
                self._store.revoke_api_token(principal.user_id, call.params["id"], self._now())
            )
        except api.InvalidRequest:
            raise api.NotFound("token") from None
        _log.info(
            "API token {token_id} revoked by user {user_id}",
            token_id=call.params["id"],
            user_id=principal.user_id,
        )
        return Reply.no_content()


def owner_routes(deps: OwnerDeps) -> list[Route]:
    """The owner routes for C{deps}."""
    return OwnerRoutes(deps).routes()
