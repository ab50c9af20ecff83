"""
The C{changed} push (``docs/specifications/dataplane-ops.md`` section 4.2):
once a write has committed, the agent's other live connections are told
which paths changed, so that a client caching the disk (the mount) can drop
what it holds about them.

  - L{changed_paths}: which paths a successful request changed;
  - L{ChangeNotice}: one committed change, whoever made it (a connection of
    the agent, or the owner reverting through the HTTP control route,
    L{owner_revert_notice});
  - L{AgentConnections}: the live connections of every agent, and the one
    decision of who is told of a notice (L{AgentConnections.audience});
  - L{readable_paths}: the paths of a notice the agent's path policy lets it
    see (a name the policy hides is never pushed).

No I/O here: the service (L{svc.dataplane.service}) wires these to the
connections' sinks. Pushes are best effort and neither audited nor timed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from typing import Generic, Protocol, TypeVar

import attrs

from svc.dataplane.confinement import disk_root, relative_to_disk
from svc.policy import PathPolicy
from svc.store.layout import TenantLocation
from svc.wire.answers import ChangedPush
from svc.wire.commands import COMMANDS
from svc.wire.contract import answer_map
from svc.wire.messages import TwoPathRequest
from svc.wire.ops import Op

CHANGING_OPS = frozenset(op for op, command in COMMANDS.items() if command.writes) - {Op.CHUNK_PUT}
"""
The operations whose success is announced: every write that names a path
(C{chunk_put}, the other write, changes none).
"""

MANY_CONNECTIONS = 64
"""
Connections of one agent above which a notice is logged as unusual. They
are all told anyway: the work is one push per connection of that agent,
never a walk over the server's connections.
"""


def _non_empty(instance: object, attribute: attrs.Attribute[object], value: object) -> None:
    if not isinstance(value, tuple) or not value:
        raise ValueError(f"{attribute.name} must be a non-empty tuple")


@attrs.frozen
class ChangeNotice:
    """
    What one committed write changed, and who made it.

    @ivar location: the tenant whose storage changed.
    @ivar agent_id: the agent whose disk (C{/<agent_id>}) holds the paths.
    @ivar paths: the canonical server paths whose entry or content changed,
        each once, in request order.
    @ivar session_id: the verified C{session_id} the write carried (L{None}:
        none, and always for an owner's revert).
    @ivar source: the id of the connection that made the write, which is not
        told; L{None} for a change made outside the agent's connections.
    """

    location: TenantLocation
    agent_id: str
    paths: tuple[str, ...] = attrs.field(validator=_non_empty)
    session_id: str | None = None
    source: str | None = None

    def push(self, paths: Iterable[str] | None = None) -> Mapping[str, object]:
        """
        The C{changed} PUSH payload (without C{op}): C{paths} (default: the
        notice's) and C{session_id} (nil when absent).
        """
        return answer_map(
            ChangedPush(tuple(self.paths if paths is None else paths), self.session_id)
        )


def changed_paths(op: Op, request: object) -> tuple[str, ...]:
    """
    The paths a successful C{op} with C{request} changed: both names of a
    rename or a link (the existing name of a link changed too: its link
    count and ctime; once if they are equal), the one path of any other
    write in L{CHANGING_OPS}; nothing for any other op.
    """
    if op not in CHANGING_OPS:
        return ()
    if isinstance(request, TwoPathRequest):
        return tuple(dict.fromkeys((request.path, request.to_path)))
    path = getattr(request, "path", None)
    return (path,) if isinstance(path, str) else ()


def owner_revert_notice(location: TenantLocation, path: str) -> ChangeNotice:
    """
    The notice of the owner's revert of C{path} (canonical, below a
    top-level directory): for the agent whose disk is C{path}'s top-level
    directory, with no session and no source connection.
    """
    parts = path.split("/")
    if len(parts) < 3 or parts[0] or not parts[1]:
        raise ValueError(f"{path!r} is not below an agent's disk")
    return ChangeNotice(location, parts[1], (path,))


def readable_paths(notice: ChangeNotice, policy: PathPolicy | None) -> tuple[str, ...]:
    """
    Those of C{notice.paths} the agent may read under C{policy} (the disk
    root always), so a push never names what the policy hides from
    C{list} and C{journal_query}.
    """
    if policy is None:
        return notice.paths
    root = disk_root(notice.agent_id)
    return tuple(
        path
        for path in notice.paths
        if path == root
        or policy.check(relative_to_disk(path, notice.agent_id), write=False).allowed
    )


class Listener(Protocol):
    """What L{AgentConnections} needs of a connection."""

    @property
    def connection_id(self) -> str:
        """Unique for the life of the server."""

    @property
    def closing(self) -> bool:
        """Whether the connection is closing (it is told nothing more)."""


L = TypeVar("L", bound=Listener)

_AgentKey = tuple[TenantLocation, str]


class AgentConnections(Generic[L]):
    """
    The live connections of each agent, by tenant location and agent id: a
    notice finds its audience with one dictionary lookup, whatever the
    number of connections the server holds.
    """

    def __init__(self) -> None:
        self._by_agent: dict[_AgentKey, dict[str, L]] = {}
        self._keys: dict[str, _AgentKey] = {}

    def add(self, location: TenantLocation, agent_id: str, connection: L) -> None:
        """Track C{connection}, a connection of C{agent_id} in C{location}."""
        key = (location, agent_id)
        self.discard(connection.connection_id)
        self._by_agent.setdefault(key, {})[connection.connection_id] = connection
        self._keys[connection.connection_id] = key

    def discard(self, connection_id: str) -> None:
        """Stop tracking the connection C{connection_id}, if tracked."""
        key = self._keys.pop(connection_id, None)
        if key is None:
            return
        connections = self._by_agent[key]
        connections.pop(connection_id, None)
        if not connections:
            del self._by_agent[key]

    def of(self, location: TenantLocation, agent_id: str) -> list[L]:
        """Every tracked connection of C{agent_id} in C{location}."""
        return list(self._by_agent.get((location, agent_id), {}).values())

    def count(self, location: TenantLocation, agent_id: str) -> int:
        """How many connections of C{agent_id} in C{location} are tracked."""
        return len(self._by_agent.get((location, agent_id), ()))

    def __len__(self) -> int:
        return len(self._keys)

    def audience(self, notice: ChangeNotice, dismissed: Set[str] = frozenset()) -> list[L]:
        """
        Who is told of C{notice}: every tracked connection of the notice's
        agent in the notice's tenant location, except the connection that
        made the change (C{notice.source}), connections that are closing and
        those in C{dismissed} (being disconnected). Another agent's
        connections, or another tenant's, are never in it.
        """
        connections = self._by_agent.get((notice.location, notice.agent_id))
        if not connections:
            return []
        return [
            connection
            for connection_id, connection in connections.items()
            if connection_id != notice.source
            and connection_id not in dismissed
            and not connection.closing
        ]
