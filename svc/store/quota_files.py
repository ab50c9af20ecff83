"""
Where quota limits are kept on the data plane's disk.

- The owner directory carries the account budget (spec: "the owner directory
  carries the account quota"): C{<tenants_root>/<owner>/account.json}, a JSON
  object C{{"budget_bytes": N}} (C{null} or absent for unlimited).
- Agent grants sit beside the tenant's C{routes.db}:
  C{<metadata_root>/<owner>/[<tenant>/]grants.json}, a JSON object
  C{{"agents": {"<agent_id>": N, ...}}}; an agent not listed is unlimited.

Both are replaced atomically (L{svc.durable.write_file_atomically}) and are
blocking: call through a worker. Format: ``docs/specifications/storage-engine.md``, "Quota files".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from svc.durable import make_directories, write_file_atomically
from svc.store.errors import InvalidArgument

ACCOUNT_FILE = "account.json"
GRANTS_FILE = "grants.json"


def _load(path: Path) -> dict[str, Any]:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    value = json.loads(raw)
    if not isinstance(value, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return value


def _check_bytes(value: object) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidArgument(f"byte limit must be a non-negative integer, got {value!r}")
    return value


def read_account_budget(owner_dir: Path) -> int | None:
    """
    The account budget in bytes for the owner whose directory is ``owner_dir``.
    """
    return _check_bytes(_load(owner_dir / ACCOUNT_FILE).get("budget_bytes"))


def write_account_budget(owner_dir: Path, budget_bytes: int | None) -> None:
    """
    Set (or, with C{None}, lift) the owner's account budget.
    """
    make_directories(owner_dir)
    body = {"budget_bytes": _check_bytes(budget_bytes)}
    write_file_atomically(owner_dir / ACCOUNT_FILE, json.dumps(body).encode() + b"\n")


def read_grants(metadata_dir: Path) -> dict[str, int]:
    """
    Every agent grant recorded for one tenant, by agent id.
    """
    agents = _load(metadata_dir / GRANTS_FILE).get("agents", {})
    if not isinstance(agents, dict):
        raise ValueError(f"{metadata_dir / GRANTS_FILE}: 'agents' must be an object")
    grants: dict[str, int] = {}
    for agent, value in agents.items():
        checked = _check_bytes(value)
        if checked is not None:
            grants[str(agent)] = checked
    return grants


def write_grant(metadata_dir: Path, agent_id: str, grant_bytes: int | None) -> None:
    """
    Set (or, with C{None}, lift) one agent's grant, keeping the others.
    """
    make_directories(metadata_dir)
    grants = read_grants(metadata_dir)
    checked = _check_bytes(grant_bytes)
    if checked is None:
        grants.pop(agent_id, None)
    else:
        grants[agent_id] = checked
    body = {"agents": dict(sorted(grants.items()))}
    write_file_atomically(metadata_dir / GRANTS_FILE, json.dumps(body).encode() + b"\n")
