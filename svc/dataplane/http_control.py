"""
The C{/control/*} requests the control plane pushes to a data-plane server
(C{docs/specifications/control-dataplane.md}): parsing their bodies into
values, and the two that read the storage engine (usage, purge).

Parsing is pure and raises L{InvalidRequest} with a description naming the
field. Unknown body fields are ignored (a newer control plane may send
more), but every field these requests act on is checked strictly.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime

import attrs

from svc.dataplane.http_audit import parse_timestamp
from svc.pki import names
from svc.pki.errors import InvalidName
from svc.pki.identity import DeniedSerial, DenyList
from svc.store.engine import StorageEngine, scan_owner_tenants
from svc.store.gc import PurgeReport, SweepReport
from svc.store.layout import TenantLocation, is_valid_id
from svc.web.errors import InvalidRequest, JsonValue
from svc.worker import IWorker

MAX_QUOTA_BYTES = 2**63 - 1
"""The largest grant or budget accepted (a signed 64-bit byte count)."""

_SERIAL = re.compile(r"[0-9a-fA-F]{1,41}")


@attrs.frozen
class RevocationPush:
    """
    A C{PUT /control/cert-revocations}: the deny-list to install (entries
    already expired at receipt dropped) and when the control plane built it.
    """

    deny_list: DenyList
    generated_at: datetime


@attrs.frozen
class PurgeRequest:
    """A C{POST /control/purge-agent}: erase C{agent_id}'s subtree in C{location}."""

    location: TenantLocation
    agent_id: str


@attrs.frozen
class GrantChange:
    """Set (or, with L{None}, lift) C{agent_id}'s grant in C{location}."""

    location: TenantLocation
    agent_id: str
    grant_bytes: int | None


@attrs.frozen
class BudgetChange:
    """Set (or, with L{None}, lift) C{owner}'s account budget."""

    owner: str
    budget_bytes: int | None


@attrs.frozen
class QuotaChange:
    """A C{PUT /control/quotas}: at least one of the two changes."""

    grant: GrantChange | None
    budget: BudgetChange | None


def _field(body: Mapping[str, JsonValue], name: str) -> JsonValue:
    if name not in body:
        raise InvalidRequest(f"missing_{name}")
    return body[name]


def _string(body: Mapping[str, JsonValue], name: str) -> str:
    value = _field(body, name)
    if not isinstance(value, str):
        raise InvalidRequest(f"bad_{name}")
    return value


def _owner(body: Mapping[str, JsonValue]) -> str:
    owner = _string(body, "owner")
    if not is_valid_id(owner):
        raise InvalidRequest("bad_owner")
    return owner


def _location(body: Mapping[str, JsonValue]) -> TenantLocation:
    owner = _owner(body)
    tenant = _string(body, "tenant")
    try:
        return TenantLocation(owner, tenant)
    except ValueError:
        raise InvalidRequest("bad_tenant") from None


def _agent_id(body: Mapping[str, JsonValue]) -> str:
    try:
        return names.check_id(_string(body, "agent_id"), "agent id")
    except InvalidName:
        raise InvalidRequest("bad_agent_id") from None


def _byte_limit(body: Mapping[str, JsonValue], name: str) -> int | None:
    value = body[name]
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_QUOTA_BYTES:
        raise InvalidRequest(f"bad_{name}")
    return value


def canonical_serial(value: object) -> str:
    """
    A serial from a revocation entry in the canonical form of
    L{names.format_serial}; upper-case digits and leading zeros are
    accepted and normalised.

    @raise InvalidRequest: C{bad_serial}.
    """
    if not isinstance(value, str) or _SERIAL.fullmatch(value) is None:
        raise InvalidRequest("bad_serial")
    return names.format_serial(int(value, 16))


def parse_revocations(body: Mapping[str, JsonValue], now: datetime) -> RevocationPush:
    """
    C{{"revocations": [{"serial", "not_after"}...], "generated_at"}}. Entries
    whose C{not_after} is at or before C{now} are dropped. One malformed
    entry refuses the whole push (the deny-list in force stays).
    """
    entries = _field(body, "revocations")
    if not isinstance(entries, Sequence) or isinstance(entries, str):
        raise InvalidRequest("bad_revocations")
    generated = _field(body, "generated_at")
    if not isinstance(generated, str):
        raise InvalidRequest("bad_generated_at")
    generated_at = parse_timestamp(generated, "generated_at")
    denied: list[DeniedSerial] = []
    for entry in entries:
        if not isinstance(entry, Mapping):
            raise InvalidRequest("bad_revocation_entry")
        serial = canonical_serial(_field(entry, "serial"))
        not_after = _field(entry, "not_after")
        if not isinstance(not_after, str):
            raise InvalidRequest("bad_not_after")
        denied.append(DeniedSerial(serial, parse_timestamp(not_after, "not_after")))
    return RevocationPush(DenyList(denied).active(now), generated_at)


def parse_purge(body: Mapping[str, JsonValue]) -> PurgeRequest:
    """C{{"owner", "tenant", "agent_id"}}."""
    return PurgeRequest(_location(body), _agent_id(body))


def parse_quotas(body: Mapping[str, JsonValue]) -> QuotaChange:
    """
    C{{"owner", "tenant", "agent_id", "grant_bytes", "account_budget_bytes"}}.
    C{owner} is always required; C{tenant} and C{agent_id} only with
    C{grant_bytes}. An omitted limit is left unchanged, C{null} lifts it;
    omitting both is C{nothing_to_change}.
    """
    owner = _owner(body)
    grant = None
    if "grant_bytes" in body:
        grant = GrantChange(_location(body), _agent_id(body), _byte_limit(body, "grant_bytes"))
    budget = None
    if "account_budget_bytes" in body:
        budget = BudgetChange(owner, _byte_limit(body, "account_budget_bytes"))
    if grant is None and budget is None:
        raise InvalidRequest("nothing_to_change")
    return QuotaChange(grant, budget)


@attrs.frozen
class SessionFence:
    """A C{PUT /control/session-epochs}: C{agent_id}'s mount lease was granted at C{epoch}."""

    location: TenantLocation
    agent_id: str
    epoch: int


MAX_EPOCH = 2**64 - 1
"""The largest mount-lease epoch (16 hex digits in a session id)."""


def parse_session_fence(body: Mapping[str, JsonValue]) -> SessionFence:
    """C{{"owner", "tenant", "agent_id", "epoch"}}; C{epoch} an integer 0 to 2^64 - 1."""
    location = _location(body)
    agent_id = _agent_id(body)
    epoch = _field(body, "epoch")
    if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch <= MAX_EPOCH:
        raise InvalidRequest("bad_epoch")
    return SessionFence(location, agent_id, epoch)


def parse_usage_owner(args: Mapping[bytes, Sequence[bytes]]) -> str:
    """The C{owner} of C{GET /control/usage?owner=<owner>} (exactly once)."""
    values = args.get(b"owner", [])
    if len(values) != 1:
        raise InvalidRequest("missing_owner" if not values else "repeated_owner")
    try:
        owner = values[0].decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRequest("bad_owner") from None
    if not is_valid_id(owner):
        raise InvalidRequest("bad_owner")
    return owner


#: The parts of an agent's footprint in C{GET /control/usage}, in order.
FOOTPRINT_KEYS = ("used_bytes", "uncommitted_bytes", "retained_bytes", "collectable_bytes")


async def owner_usage(engine: StorageEngine, io: IWorker, owner: str) -> dict[str, JsonValue]:
    """
    C{{"owner", "used_bytes", "agents", "footprint"}}: the account usage
    and, for every tenant of C{owner} with a chunk store on this server, the
    usage of each agent directory holding chunks (C{agents}) and each
    agent's footprint by part (C{footprint}: C{used_bytes},
    C{uncommitted_bytes}, C{retained_bytes}, C{collectable_bytes}). An
    agent id found in several tenants of the owner is reported once with
    the sums (their chunk stores are separate).
    """
    used = await engine.account_usage(owner)
    root = engine.roots.tenants_root
    locations = await io.submit(lambda: scan_owner_tenants(root, owner))
    agents: dict[str, int] = {}
    parts: dict[str, list[int]] = {}
    for location in locations:
        storage = await engine.tenant(location)
        for agent_id, size in (await storage.manifests.usage_by_top()).items():
            agents[agent_id] = agents.get(agent_id, 0) + size
        for agent_id, footprint in (await storage.manifests.footprints()).items():
            sums = parts.setdefault(agent_id, [0, 0, 0, 0])
            for index, value in enumerate(
                (
                    footprint.live_bytes,
                    footprint.uncommitted_bytes,
                    footprint.retained_bytes,
                    footprint.collectable_bytes,
                )
            ):
                sums[index] += value
    footprints: dict[str, JsonValue] = {
        agent_id: dict(zip(FOOTPRINT_KEYS, sums, strict=True))
        for agent_id, sums in sorted(parts.items())
    }
    return {
        "owner": owner,
        "used_bytes": used,
        "agents": dict(agents),
        "footprint": footprints,
    }


async def purge_agent(engine: StorageEngine, io: IWorker, request: PurgeRequest) -> PurgeReport:
    """
    Purge C{request.agent_id}'s subtree. A tenant without storage on this
    server is not created: the purge reports nothing deleted.
    """
    location = request.location
    root = engine.roots.tenants_root
    present = await io.submit(lambda: scan_owner_tenants(root, location.owner))
    if location not in present:
        return PurgeReport(location.tenant, request.agent_id, 0, 0)
    storage = await engine.tenant(location)
    return await storage.purge_agent(request.agent_id)


def sweep_answer(reports: Sequence[SweepReport]) -> JsonValue:
    """The C{POST /control/gc} answer: totals, then one entry per tenant swept."""
    return {
        "tenants": len(reports),
        "count": sum(r.count for r in reports),
        "bytes_freed": sum(r.bytes_freed for r in reports),
        "kept_young": sum(r.kept_young for r in reports),
        "dry_run": any(r.dry_run for r in reports),
        "swept": [
            {"tenant_id": r.tenant_id, "count": r.count, "bytes_freed": r.bytes_freed}
            for r in reports
        ],
    }
