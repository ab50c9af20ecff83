"""
The checks of the paths a request names, before it runs
(``dataplane-ops.md`` sections 1.3 and 1.5): every path confined to the
agent's disk C{/<agent_id>} (L{svc.dataplane.confinement}: EACCES, with a
denial line and C{svc_agent_path_denied_total} through the connection's
audit), then within the path lengths (ENAMETOOLONG), then allowed by the
agent's path policy (``path-policy.md``: EACCES, L{PolicyDenied} with the
policy's reason).
"""

from __future__ import annotations

from svc.dataplane.calls import Call
from svc.dataplane.confinement import (
    PathOutsideSubtree,
    confine,
    is_confined,
    relative_to_disk,
)
from svc.dataplane.connection_audit import ConnectionAudit
from svc.dataplane.errors import PolicyDenied
from svc.dataplane.request_paths import path_uses
from svc.policy import PathPolicy
from svc.wire.commands import COMMANDS
from svc.wire.ops import Op


def confine_paths(call: Call, agent_id: str, audit: ConnectionAudit) -> None:
    """
    Refuse C{call} unless every path it names is confined to the disk of
    C{agent_id} (a path outside it is audited as denied) and within the
    path lengths.

    @raise PathOutsideSubtree: a path is outside the disk.
    @raise svc.dataplane.confinement.NameTooLong: a path is too long.
    """
    uses = path_uses(call.op, call.request, writes=COMMANDS[call.op].writes)
    for use in uses:
        if not is_confined(use.path, agent_id):
            audit.path_denied(call.op, use.path)
            raise PathOutsideSubtree()
    for use in uses:
        confine(use.path, agent_id)


def apply_policy(call: Call, policy: PathPolicy, agent_id: str) -> None:
    """
    Refuse C{call} when the agent's path C{policy} denies one of its
    paths (a lease grants no access by itself, so it is not checked).

    @raise PolicyDenied: denied, with the policy's reason.
    """
    if call.op in (Op.LEASE_GRANT,):
        return  # a lease grants no access by itself
    if call.op is Op.CHUNK_PUT and policy.readonly:
        raise PolicyDenied("readonly")
    for use in path_uses(call.op, call.request, writes=COMMANDS[call.op].writes):
        relative = relative_to_disk(use.path, agent_id)
        if use.traverse:
            decision = policy.check_traverse(relative)
        else:
            decision = policy.check(relative, use.write)
        if not decision.allowed:
            assert decision.reason is not None
            raise PolicyDenied(decision.reason.value)
