"""
The values the SDK returns, and their parsing from the control plane's JSON.

Each is a frozen dataclass. Parsing takes the fields the API documents
(C{docs/specifications/control-routes.md}), checks their JSON types and
ignores every other field (within a major the server only adds fields).
A missing or mistyped documented field is L{MalformedAnswer}.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

DEFAULT_MOUNT_ROOT = "/mnt/svc"
"""
The control plane's default C{SVC_MOUNT_PREFIX}, for answers without
C{virtual_path} (older servers). Kept equal to
C{svc.control.settings.DEFAULT_MOUNT_PREFIX} by a test; the SDK does not
import the control plane.
"""

T = TypeVar("T")


class MalformedAnswer(ValueError):
    """A 2xx body lacks a documented field or has one of the wrong type."""


def virtual_path_for(mount_root: str, agent_id: str) -> str:
    """The agent-visible mount path the SDK computes: C{<mount_root>/agents/<agent_id>}."""
    return posixpath.join(mount_root, "agents", agent_id)


@dataclass(frozen=True)
class AgentEntity:
    """
    An agent: its agent-scoped disk allocation.

    @ivar type: C{"agent"}.
    @ivar id: the agent id.
    @ivar allocation_id: 32 hex; the C{/allocations/{id}} id.
    @ivar owner: the owner (user) id.
    @ivar tenant: the tenant id.
    @ivar grant_bytes: the agent's quota.
    @ivar state: C{provisioned}, C{revoked} or C{purged} (new states may come).
    @ivar created_at: when the allocation was made.
    @ivar virtual_path: the agent-visible mount path (C{SVC_MOUNT_POINT} of
        the mount client); computed from the client's mount root when the
        server does not send it.
    @ivar created: for L{svc.sdk.Client.allocate_disk}, whether this call
        made the allocation (C{False}: an identical earlier call had);
        L{None} for other calls.
    """

    type: str
    id: str
    allocation_id: str
    owner: str
    tenant: str
    grant_bytes: int
    state: str
    created_at: datetime
    virtual_path: str
    created: bool | None = None


@dataclass(frozen=True)
class AllocationSummary:
    """
    One allocation of an account.

    @ivar agent_id: L{None} for an owner-scoped allocation.
    @ivar revoked_at: L{None} while not revoked.
    """

    allocation_id: str
    agent_id: str | None
    tenant: str
    grant_bytes: int
    state: str
    revoked_at: datetime | None


@dataclass(frozen=True)
class AccountEntity:
    """
    An owner account.

    @ivar type: C{"account"}.
    @ivar id: the owner id.
    @ivar budget_bytes: the account's shared budget; L{None} for none.
    @ivar suspended: true once the account was deleted.
    @ivar allocations: every allocation of the owner, oldest first.
    """

    type: str
    id: str
    display_name: str
    budget_bytes: int | None
    suspended: bool
    created_at: datetime
    allocations: tuple[AllocationSummary, ...]


@dataclass(frozen=True)
class AccountBudget:
    """
    The answer to L{svc.sdk.Client.set_account_budget}.

    @ivar id: the owner id.
    @ivar budget_bytes: the budget now set; L{None} for none.
    """

    id: str
    budget_bytes: int | None


@dataclass(frozen=True)
class EnrollToken:
    """
    A freshly minted single-use enroll token (kept out of C{repr}).

    @ivar token: the secret; pass it to the mount client as its enroll token.
    @ivar token_id: the stored record's id.
    @ivar expires_at: when the token stops being accepted.
    """

    token: str = field(repr=False)
    token_id: str
    agent_id: str
    allocation_id: str
    expires_at: datetime


@dataclass(frozen=True)
class AgentUsage:
    """
    One agent's line in an owner's usage.

    @ivar grant_bytes: L{None} (as C{state}) for an agent a data-plane
        server reports but the control plane does not know.
    """

    used_bytes: int
    grant_bytes: int | None
    state: str | None


@dataclass(frozen=True)
class OwnerUsage:
    """
    An owner's disk usage for a storage meter.

    @ivar used_bytes: the account's bytes over every data-plane server.
    @ivar budget_bytes: the account's shared budget; L{None} for none.
    @ivar agents: per agent id (a plain C{dict}, so that C{dataclasses.asdict}
        works; treat it as read-only).
    """

    owner: str
    used_bytes: int
    budget_bytes: int | None
    agents: Mapping[str, AgentUsage]


# Field readers


def _checked(name: str, value: object, kind: type[T]) -> T:
    if kind is int and isinstance(value, bool):
        raise MalformedAnswer(f"field {name!r} is not an integer")
    if not isinstance(value, kind):
        raise MalformedAnswer(f"field {name!r} is not a {kind.__name__}")
    return value


def _get(document: Mapping[str, Any], name: str, kind: type[T]) -> T:
    if name not in document:
        raise MalformedAnswer(f"missing field {name!r}")
    return _checked(name, document[name], kind)


def _optional(document: Mapping[str, Any], name: str, kind: type[T]) -> T | None:
    """A documented field whose value may be C{null}."""
    if name not in document:
        raise MalformedAnswer(f"missing field {name!r}")
    value = document[name]
    return None if value is None else _checked(name, value, kind)


def _to_datetime(name: str, text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise MalformedAnswer(f"field {name!r} is not a timestamp") from None
    if moment.tzinfo is None:
        raise MalformedAnswer(f"field {name!r} has no time zone")
    return moment


def _timestamp(document: Mapping[str, Any], name: str) -> datetime:
    return _to_datetime(name, _get(document, name, str))


def _optional_timestamp(document: Mapping[str, Any], name: str) -> datetime | None:
    text = _optional(document, name, str)
    return None if text is None else _to_datetime(name, text)


def _object(value: object, what: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise MalformedAnswer(f"{what} is not a JSON object")
    return value


# Parsers


def parse_agent_entity(document: object, mount_root: str) -> AgentEntity:
    """An agent entity (provision, resolve, quota, reassign answers)."""
    body = _object(document, "the agent entity")
    entity_type = _get(body, "type", str)
    if entity_type != "agent":
        raise MalformedAnswer(f"expected an agent entity, got type {entity_type!r}")
    agent_id = _get(body, "id", str)
    virtual_path = body.get("virtual_path")
    if not isinstance(virtual_path, str):
        virtual_path = virtual_path_for(mount_root, agent_id)
    created = body.get("created")
    return AgentEntity(
        type=entity_type,
        id=agent_id,
        allocation_id=_get(body, "allocation_id", str),
        owner=_get(body, "owner", str),
        tenant=_get(body, "tenant", str),
        grant_bytes=_get(body, "grant_bytes", int),
        state=_get(body, "state", str),
        created_at=_timestamp(body, "created_at"),
        virtual_path=virtual_path,
        created=created if isinstance(created, bool) else None,
    )


def parse_account_entity(document: object) -> AccountEntity:
    """An account entity (resolve answer)."""
    body = _object(document, "the account entity")
    entity_type = _get(body, "type", str)
    if entity_type != "account":
        raise MalformedAnswer(f"expected an account entity, got type {entity_type!r}")
    allocations = []
    for item in _get(body, "allocations", list):
        entry = _object(item, "an allocation")
        allocations.append(
            AllocationSummary(
                allocation_id=_get(entry, "allocation_id", str),
                agent_id=_optional(entry, "agent_id", str),
                tenant=_get(entry, "tenant", str),
                grant_bytes=_get(entry, "grant_bytes", int),
                state=_get(entry, "state", str),
                revoked_at=_optional_timestamp(entry, "revoked_at"),
            )
        )
    return AccountEntity(
        type=entity_type,
        id=_get(body, "id", str),
        display_name=_get(body, "display_name", str),
        budget_bytes=_optional(body, "budget_bytes", int),
        suspended=_get(body, "suspended", bool),
        created_at=_timestamp(body, "created_at"),
        allocations=tuple(allocations),
    )


def parse_entity(document: object, mount_root: str) -> AgentEntity | AccountEntity:
    """An agent or account entity, by its C{type} field."""
    body = _object(document, "the entity")
    if body.get("type") == "account":
        return parse_account_entity(body)
    return parse_agent_entity(body, mount_root)


def parse_account_budget(document: object) -> AccountBudget:
    """The budget answer."""
    body = _object(document, "the budget answer")
    return AccountBudget(
        id=_get(body, "id", str), budget_bytes=_optional(body, "budget_bytes", int)
    )


def parse_enroll_token(document: object) -> EnrollToken:
    """The enroll-token answer."""
    body = _object(document, "the enroll-token answer")
    return EnrollToken(
        token=_get(body, "token", str),
        token_id=_get(body, "token_id", str),
        agent_id=_get(body, "agent_id", str),
        allocation_id=_get(body, "allocation_id", str),
        expires_at=_timestamp(body, "expires_at"),
    )


def parse_owner_usage(document: object) -> OwnerUsage:
    """The usage answer."""
    body = _object(document, "the usage answer")
    agents = {}
    for agent_id, item in _get(body, "agents", dict).items():
        entry = _object(item, f"agent {agent_id!r}")
        agents[agent_id] = AgentUsage(
            used_bytes=_get(entry, "used_bytes", int),
            grant_bytes=_optional(entry, "grant_bytes", int),
            state=_optional(entry, "state", str),
        )
    return OwnerUsage(
        owner=_get(body, "owner", str),
        used_bytes=_get(body, "used_bytes", int),
        budget_bytes=_optional(body, "budget_bytes", int),
        agents=agents,
    )


__all__ = [
    "DEFAULT_MOUNT_ROOT",
    "AccountBudget",
    "AccountEntity",
    "AgentEntity",
    "AgentUsage",
    "AllocationSummary",
    "EnrollToken",
    "MalformedAnswer",
    "OwnerUsage",
    "parse_account_budget",
    "parse_account_entity",
    "parse_agent_entity",
    "parse_enroll_token",
    "parse_entity",
    "parse_owner_usage",
    "virtual_path_for",
]
