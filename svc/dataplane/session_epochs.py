"""
The newest mount-session epoch seen per agent, kept durably beside the
tenant's C{routes.db} so that fencing survives a restart.

File: C{<metadata_root>/<owner>/[<tenant>/]sessions.json}, a JSON object
C{{"version": 1, "agents": {"<agent_id>": <epoch>, ...}}}, replaced
atomically (L{svc.durable.write_file_atomically}) on the injected worker
whenever an agent's newest epoch rises (once per new mount).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from twisted.internet.defer import Deferred, DeferredLock

from svc.durable import make_directories, write_file_atomically
from svc.sessions import MountSession, SessionBook
from svc.worker import IWorker

SESSIONS_FILE = "sessions.json"
"""The file name, beside C{routes.db}."""

FORMAT_VERSION = 1


class SessionFileError(ValueError):
    """C{sessions.json} exists but cannot be understood."""


def parse_epochs(raw: bytes, source: str) -> dict[str, int]:
    """
    The C{agents} map of a C{sessions.json} document.

    @raise SessionFileError: not the documented format.
    """
    try:
        document = json.loads(raw)
    except ValueError as e:
        raise SessionFileError(f"{source}: not JSON: {e}") from None
    if not isinstance(document, dict) or document.get("version") != FORMAT_VERSION:
        raise SessionFileError(f"{source}: not a version {FORMAT_VERSION} sessions file")
    agents = document.get("agents")
    if not isinstance(agents, dict):
        raise SessionFileError(f"{source}: 'agents' must be an object")
    epochs: dict[str, int] = {}
    for agent, epoch in agents.items():
        if type(epoch) is not int or epoch < 0:
            raise SessionFileError(f"{source}: bad epoch for {agent!r}")
        epochs[agent] = epoch
    return epochs


def render_epochs(epochs: Mapping[str, int]) -> bytes:
    """The C{sessions.json} document for C{epochs}."""
    document = {"version": FORMAT_VERSION, "agents": dict(sorted(epochs.items()))}
    return json.dumps(document, separators=(",", ":")).encode() + b"\n"


def _read(path: Path) -> dict[str, int]:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    return parse_epochs(raw, str(path))


class SessionEpochs:
    """
    One tenant location's L{SessionBook}, loaded from and saved to its
    C{sessions.json}. Build with L{load}.
    """

    def __init__(self, tenant_id: str, path: Path, worker: IWorker, epochs: dict[str, int]):
        self._tenant_id = tenant_id
        self._path = path
        self._worker = worker
        self._book = SessionBook({(tenant_id, agent): epoch for agent, epoch in epochs.items()})
        self._lock = DeferredLock()

    @classmethod
    def load(cls, tenant_id: str, path: Path, worker: IWorker) -> Deferred[SessionEpochs]:
        """Read C{path} (absent: nothing seen yet) on C{worker}."""
        return worker.submit(lambda: _read(path)).addCallback(
            lambda epochs: cls(tenant_id, path, worker, epochs)
        )

    def newest(self, agent_id: str) -> int | None:
        """The newest epoch seen for C{agent_id}, or L{None}."""
        return self._book.highest.get((self._tenant_id, agent_id))

    def admit(self, session: MountSession) -> bool:
        """
        L{SessionBook.admit}: raises L{svc.sessions.SessionRejected}
        (C{fenced}) for an epoch older than the newest seen; returns whether
        this session raised the newest epoch (then call L{save}).
        """
        return self._book.admit(session)

    def raise_to(self, agent_id: str, epoch: int) -> bool:
        """
        L{SessionBook.raise_to}: fence C{agent_id}'s sessions older than
        C{epoch}; returns whether the newest epoch rose (then call L{save}).
        """
        return self._book.raise_to(self._tenant_id, agent_id, epoch)

    def save(self) -> Deferred[None]:
        """
        Write the current epochs; saves are serialised, each writing the
        state at the time it runs.
        """

        async def saving() -> None:
            await self._lock.acquire()
            try:
                epochs = {
                    agent: epoch
                    for (tenant, agent), epoch in self._book.highest.items()
                    if tenant == self._tenant_id
                }
                data = render_epochs(epochs)

                def write() -> None:
                    # A fence may come before the agent's storage was ever opened here.
                    make_directories(self._path.parent)
                    write_file_atomically(self._path, data)

                await self._worker.submit(write)
            finally:
                self._lock.release()

        return Deferred.fromCoroutine(saving())
