"""
Which agent identities the control plane placed on this data-plane server,
and the check that refuses storage to any other.

A tenant intermediate signs leaves for its own tenant, but the owner (the
leaf's CN, where the data lives and whose budget pays) and the agent are
only what the leaf says. So the server serves an identity
C{(owner, tenant, agent_id)} only once the control plane has placed it here:

  - the control plane names the placed identities in its grant pushes
    (C{PUT /control/quotas} with C{grant_bytes}, any value including
    C{null}): each one is recorded (L{Placements.place});
  - an identity not on record is asked about (C{GET /control/placement},
    L{svc.dataplane.control_queries}), so an agent that connects before the
    push of its enrollment has arrived is not refused; a yes is recorded, a
    no (or no answer) is remembered for C{miss_ttl} seconds;
  - without a control plane (static certificates) only the record counts;
  - purging an agent's data (C{POST /control/purge-agent}) removes it.

The record is one file per tenant, beside its C{routes.db}:
C{<metadata_root>/<owner>/[<tenant>/]placed.json}, C{{"version": 1,
"agents": ["<agent_id>", ...]}} (sorted, each once), mode 0600, replaced
atomically; a tenant without the file has no agent placed. Format and rules:
C{docs/specifications/storage-engine.md}, "Placement file".
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

import attrs
from twisted.internet.defer import Deferred, DeferredLock
from twisted.logger import Logger

from svc.durable import make_directories, write_file_atomically
from svc.pki import names
from svc.pki.errors import InvalidName
from svc.store.layout import TenantLocation, metadata_dir
from svc.worker import IWorker

PLACED_FILE = "placed.json"
"""The file name, beside the tenant's C{routes.db}."""

FORMAT_VERSION = 1
DEFAULT_MISS_TTL = 10.0
"""Seconds a "not placed" (or unanswered) look-up is remembered."""
DEFAULT_MAX_MISSES = 10_000
"""Identities remembered as not placed at most; the oldest are forgotten first."""

AskControlPlane = Callable[[TenantLocation, str], Deferred[bool]]
"""Whether an agent of a tenant location is placed on this server (may fail)."""

_log = Logger()


class Seconds(Protocol):
    """The part of a reactor (or C{Clock}) used here."""

    def seconds(self) -> float:
        """Now, in seconds since the epoch."""


class PlacementFileError(ValueError):
    """A C{placed.json} exists but cannot be understood."""


class Verdict(enum.Enum):
    """The outcome of L{Placements.check}."""

    PLACED = "placed"
    NOT_PLACED = "not_placed"
    UNCONFIRMED = "placement_unconfirmed"
    """Not on record, and the control plane could not be asked."""


def render_placed(agents: Iterable[str]) -> bytes:
    """The C{placed.json} document for C{agents}."""
    document = {"version": FORMAT_VERSION, "agents": sorted(set(agents))}
    return json.dumps(document, separators=(",", ":")).encode() + b"\n"


def parse_placed(raw: bytes, source: str) -> frozenset[str]:
    """
    The agents of a C{placed.json} document.

    @raise PlacementFileError: not the documented format, naming C{source}.
    """
    try:
        document = json.loads(raw)
    except ValueError as e:
        raise PlacementFileError(f"{source}: not JSON: {e}") from None
    if not isinstance(document, dict) or document.get("version") != FORMAT_VERSION:
        raise PlacementFileError(f"{source}: not a version {FORMAT_VERSION} placement file")
    agents = document.get("agents")
    if not isinstance(agents, list):
        raise PlacementFileError(f"{source}: 'agents' must be an array")
    try:
        return frozenset(names.check_id(agent, "agent id") for agent in agents)
    except InvalidName as e:
        raise PlacementFileError(f"{source}: {e}") from None


class PlacementRecord:
    """
    The placement files under C{metadata_root}, read through C{io} and
    cached per tenant once a file has been seen (a tenant without one is
    read again on each look-up; L{Placements} remembers misses).
    """

    def __init__(self, metadata_root: Path, io: IWorker) -> None:
        self._root = metadata_root
        self._io = io
        self._known: dict[TenantLocation, frozenset[str]] = {}
        self._lock = DeferredLock()

    def path(self, location: TenantLocation) -> Path:
        """The placement file of C{location}."""
        return metadata_dir(self._root, location) / PLACED_FILE

    async def contains(self, location: TenantLocation, agent_id: str) -> bool:
        """
        Whether C{agent_id} is recorded as placed in C{location}.

        @raise PlacementFileError: the tenant's file is unreadable.
        """
        known = self._known.get(location)
        if known is None:
            known = await self._locked(location, None)
        return agent_id in known

    async def add(self, location: TenantLocation, agent_id: str) -> None:
        """Record C{agent_id} as placed in C{location} (written before it returns)."""
        await self._locked(location, lambda agents: agents | {agent_id})

    async def remove(self, location: TenantLocation, agent_id: str) -> None:
        """Record C{agent_id} as no longer placed in C{location}."""
        await self._locked(location, lambda agents: agents - {agent_id})

    async def _locked(
        self,
        location: TenantLocation,
        change: Callable[[frozenset[str]], frozenset[str]] | None,
    ) -> frozenset[str]:
        await self._lock.acquire()
        try:
            path = self.path(location)
            known = self._known.get(location)
            if known is None:
                read = await self._io.submit(lambda: _read(path))
                if read is not None:
                    self._known[location] = read
                known = read or frozenset()
            if change is None:
                return known
            changed = change(known)
            if changed != known:
                await self._io.submit(lambda: _write(path, changed))
                self._known[location] = changed
            return changed
        finally:
            self._lock.release()


def _read(path: Path) -> frozenset[str] | None:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    return parse_placed(raw, str(path))


def _write(path: Path, agents: frozenset[str]) -> None:
    make_directories(path.parent)
    write_file_atomically(path, render_placed(agents), 0o600)


@attrs.frozen
class _Miss:
    verdict: Verdict
    until: float


class Placements:
    """
    The placement check of one server; see the module docstring.

    @param record: the placement files.
    @param clock: times the remembered misses.
    @param ask: asks the control plane (L{None}: static certificates, only
        the record counts).
    @param miss_ttl: seconds a miss is remembered.
    @param max_misses: misses remembered at most.
    """

    def __init__(
        self,
        record: PlacementRecord,
        clock: Seconds,
        ask: AskControlPlane | None = None,
        *,
        miss_ttl: float = DEFAULT_MISS_TTL,
        max_misses: int = DEFAULT_MAX_MISSES,
    ) -> None:
        self.record = record
        self._clock = clock
        self._ask = ask
        self._miss_ttl = miss_ttl
        self._max_misses = max_misses
        self._misses: dict[tuple[TenantLocation, str], _Miss] = {}
        self._asking: dict[tuple[TenantLocation, str], list[Deferred[Verdict]]] = {}

    async def check(self, location: TenantLocation, agent_id: str) -> Verdict:
        """
        Whether C{agent_id} of C{location} may use its storage here: on
        record, or (not remembered as a miss) confirmed by the control plane
        now. Concurrent look-ups of one identity share one question.

        @raise PlacementFileError: the tenant's placement file is unreadable.
        """
        if await self.record.contains(location, agent_id):
            return Verdict.PLACED
        key = (location, agent_id)
        miss = self._misses.get(key)
        if miss is not None and miss.until > self._clock.seconds():
            return miss.verdict
        waiting = self._asking.get(key)
        if waiting is not None:
            answer: Deferred[Verdict] = Deferred()
            waiting.append(answer)
            return await answer
        self._asking[key] = []
        try:
            verdict = await self._look_up(location, agent_id)
        except BaseException:
            for other in self._asking.pop(key, []):
                other.callback(Verdict.UNCONFIRMED)
            raise
        for other in self._asking.pop(key, []):
            other.callback(verdict)
        return verdict

    async def _look_up(self, location: TenantLocation, agent_id: str) -> Verdict:
        if self._ask is None:
            verdict = Verdict.NOT_PLACED
        else:
            try:
                placed = await self._ask(location, agent_id)
            except Exception as e:
                _log.warn(
                    "cannot confirm the placement of {tenant}/{agent_id} (owner {owner}): {error}",
                    tenant=location.tenant,
                    agent_id=agent_id,
                    owner=location.owner,
                    error=str(e) or type(e).__name__,
                )
                verdict = Verdict.UNCONFIRMED
            else:
                verdict = Verdict.PLACED if placed else Verdict.NOT_PLACED
        if verdict is Verdict.PLACED:
            await self.place(location, agent_id)
        else:
            self._remember(location, agent_id, verdict)
        return verdict

    def _remember(self, location: TenantLocation, agent_id: str, verdict: Verdict) -> None:
        now = self._clock.seconds()
        if len(self._misses) >= self._max_misses:
            for key in [k for k, m in self._misses.items() if m.until <= now]:
                del self._misses[key]
        while len(self._misses) >= self._max_misses:
            del self._misses[next(iter(self._misses))]
        self._misses.pop((location, agent_id), None)
        self._misses[(location, agent_id)] = _Miss(verdict, now + self._miss_ttl)

    async def place(self, location: TenantLocation, agent_id: str) -> None:
        """Record C{agent_id} of C{location} as placed here (a grant push, a yes)."""
        await self.record.add(location, agent_id)
        self._misses.pop((location, agent_id), None)

    async def forget(self, location: TenantLocation, agent_id: str) -> None:
        """Record C{agent_id} of C{location} as no longer placed here (its data purged)."""
        await self.record.remove(location, agent_id)
