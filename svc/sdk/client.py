"""
L{Client}: the host's calls to the control plane's service-token routes.

Each method is one blocking HTTP request (standard library only) that
returns a frozen value of L{svc.sdk.models} or raises an L{SvcError}. The
client keeps no connection and no state between calls, so one instance may
be shared between threads. It never retries: see L{svc.sdk.retry}.

Reference: C{docs/specifications/sdk.md}.
"""

from __future__ import annotations

import math
import os
import platform
import re
import ssl
from collections.abc import Callable
from typing import Any, TypeVar

from svc.sdk.models import (
    DEFAULT_MOUNT_ROOT,
    AccountBudget,
    AccountEntity,
    AgentEntity,
    EnrollToken,
    MalformedAnswer,
    OwnerUsage,
    parse_account_budget,
    parse_agent_entity,
    parse_enroll_token,
    parse_entity,
    parse_owner_usage,
)
from svc.sdk.transport import API_MAJOR, Answer, Endpoint, Transport, encode_segment

DEFAULT_TIMEOUT = 30.0
"""Seconds allowed for connecting and for each wait for data."""

SDK_VERSION = "1.0"
DEFAULT_USER_AGENT = (
    f"svc-sdk-python/{SDK_VERSION} (api {API_MAJOR}; python {platform.python_version()})"
)

T = TypeVar("T")

AGENT = "agent"
ACCOUNT = "account"

_TOKEN68 = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
_HEADER_TEXT = re.compile(r"[\x20-\x7e]+")


def _parse(answer: Answer, parse: Callable[[dict[str, Any]], T]) -> T:
    """C{parse} applied to the answer's JSON object; L{InvalidResponse} if it does not fit."""
    try:
        return parse(answer.json_object())
    except MalformedAnswer as e:
        raise answer.invalid(str(e)) from None


def _byte_count(name: str, value: object, *, nullable: bool = False) -> int | None:
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return value


def _id(name: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    return value


class Client:
    """
    A control-plane client holding the service token.

    @param base_url: C{http[s]://host[:port][/prefix]}, e.g.
        C{https://control.example.com} or C{https://example.com/api}.
    @param service_token: the control plane's C{SVC_CONTROL_PLANE_TOKEN};
        sent as C{Authorization: Bearer ...}, never shown in C{repr}.
    @param timeout: seconds for connecting and for each wait for data.
    @param ca_file: a PEM bundle of the certificate authorities to trust for
        an C{https} base URL instead of the system's; certificate and host
        name verification are always on.
    @param mount_root: the control plane's mount prefix, used to compute
        C{virtual_path} when an older server does not send it.
    @param user_agent: the C{User-Agent} header.
    """

    def __init__(
        self,
        base_url: str,
        service_token: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        ca_file: str | os.PathLike[str] | None = None,
        mount_root: str = DEFAULT_MOUNT_ROOT,
        user_agent: str = DEFAULT_USER_AGENT,
    ) -> None:
        endpoint = Endpoint.from_url(base_url)
        if not isinstance(service_token, str) or not _TOKEN68.fullmatch(service_token):
            raise ValueError("service_token must be a non-empty RFC 7235 token68")
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            raise TypeError("timeout must be a number of seconds")
        if not (math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"timeout must be positive and finite, got {timeout!r}")
        if not isinstance(mount_root, str) or not mount_root.startswith("/"):
            raise ValueError(f"mount_root must be an absolute path, got {mount_root!r}")
        if not isinstance(user_agent, str) or not _HEADER_TEXT.fullmatch(user_agent):
            raise ValueError("user_agent must be printable ASCII")
        context = None
        if endpoint.scheme == "https":
            context = ssl.create_default_context(cafile=ca_file)
        elif ca_file is not None:
            raise ValueError("ca_file needs an https:// base_url")
        self.base_url = base_url
        self.mount_root = mount_root
        self._transport = Transport(
            endpoint,
            service_token,
            timeout=float(timeout),
            ssl_context=context,
            user_agent=user_agent,
        )

    def __repr__(self) -> str:
        return f"Client({self.base_url!r})"

    def _agent(self, answer: Answer) -> AgentEntity:
        return _parse(answer, lambda body: parse_agent_entity(body, self.mount_root))

    # Entities

    def allocate_disk(
        self, agent_id: str, owner_id: str, grant_bytes: int, *, tenant_id: str | None = None
    ) -> AgentEntity:
        """
        Provision agent C{agent_id} of owner C{owner_id} with a disk of
        C{grant_bytes} (C{POST /v1/entities}). Idempotent: repeating the
        same call returns the same allocation with C{created} false.

        @param tenant_id: the tenant; the server's default is the owner.
        """
        body: dict[str, object] = {
            "type": AGENT,
            "id": _id("agent_id", agent_id),
            "owner": _id("owner_id", owner_id),
            "grant_bytes": _byte_count("grant_bytes", grant_bytes),
        }
        if tenant_id is not None:
            body["tenant"] = _id("tenant_id", tenant_id)
        answer = self._transport.request("allocate_disk", "POST", "/v1/entities", body)
        return self._agent(answer)

    def resolve(self, entity_type: str, entity_id: str) -> AgentEntity | AccountEntity:
        """
        The entity C{entity_type} (C{"agent"} or C{"account"}) C{entity_id}
        (C{GET /v1/entities/{type}/{id}}).
        """
        path = f"/v1/entities/{encode_segment(entity_type)}/{encode_segment(entity_id)}"
        answer = self._transport.request("resolve", "GET", path)
        return _parse(answer, lambda body: parse_entity(body, self.mount_root))

    def delete_entity(self, entity_type: str, entity_id: str) -> None:
        """
        Revoke an agent, or suspend an account and revoke all its
        allocations (C{DELETE /v1/entities/{type}/{id}}, 204). Idempotent.
        """
        path = f"/v1/entities/{encode_segment(entity_type)}/{encode_segment(entity_id)}"
        self._transport.request("delete_entity", "DELETE", path)

    def set_disk_quota(self, agent_id: str, quota_bytes: int) -> AgentEntity:
        """
        Set agent C{agent_id}'s quota (C{PATCH /v1/entities/agent/{id}} with
        C{grant_bytes}).
        """
        path = f"/v1/entities/{AGENT}/{encode_segment(agent_id)}"
        body = {"grant_bytes": _byte_count("quota_bytes", quota_bytes)}
        answer = self._transport.request("set_disk_quota", "PATCH", path, body)
        return self._agent(answer)

    def reassign(
        self, agent_id: str, owner_id: str, *, tenant_id: str | None = None
    ) -> AgentEntity:
        """
        Move agent C{agent_id} to owner C{owner_id} (and tenant C{tenant_id},
        default the owner) (C{POST /v1/entities/agent/{id}/reassign}). The
        agent's data is not moved and it must enroll again.
        """
        path = f"/v1/entities/{AGENT}/{encode_segment(agent_id)}/reassign"
        body = {"owner": _id("owner_id", owner_id)}
        if tenant_id is not None:
            body["tenant"] = _id("tenant_id", tenant_id)
        answer = self._transport.request("reassign", "POST", path, body)
        return self._agent(answer)

    def set_account_budget(self, owner_id: str, budget_bytes: int | None) -> AccountBudget:
        """
        Set (or with L{None} clear) owner C{owner_id}'s shared budget
        (C{POST /v1/entities/account/{owner}/budget}); creates the account
        when missing.
        """
        path = f"/v1/entities/{ACCOUNT}/{encode_segment(owner_id)}/budget"
        body = {"budget_bytes": _byte_count("budget_bytes", budget_bytes, nullable=True)}
        answer = self._transport.request("set_account_budget", "POST", path, body)
        return _parse(answer, parse_account_budget)

    # Agents and owners

    def mint_enroll_token(self, agent_id: str) -> EnrollToken:
        """
        A new single-use enroll token for agent C{agent_id}
        (C{POST /v1/agents/{id}/enroll-token}).
        """
        path = f"/v1/agents/{encode_segment(agent_id)}/enroll-token"
        answer = self._transport.request("mint_enroll_token", "POST", path, {})
        return _parse(answer, parse_enroll_token)

    def usage(self, owner_id: str) -> OwnerUsage:
        """Owner C{owner_id}'s disk usage (C{GET /v1/tenants/{owner}/usage})."""
        path = f"/v1/tenants/{encode_segment(owner_id)}/usage"
        answer = self._transport.request("usage", "GET", path)
        return _parse(answer, parse_owner_usage)


__all__ = ["DEFAULT_TIMEOUT", "DEFAULT_USER_AGENT", "SDK_VERSION", "Client"]
