"""
What a killed mount left in its outbox, sent by the next mount on the same
cache before it serves (``mount-outbox.md`` sections 6 and 8).

    outbox, replaying = open_outbox(
        cache / "outbox", remote, reactor, reactor.seconds, session_id, unsent, in_reactor
    )
    await replaying

Each entry left is sent as it was (its tag makes a request that ran before
the mount died answer as it did then, without running again). An answer is
logged. A refusal keeps the content:

 - a commit refused C{ESTALE} (another writer changed the file since the
   dead mount read it) is appended again as a new file beside it, the
   conflict copy C{<name>.conflict-<session tag>-<UTC time>}
   (L{svc.mount.writeback.commit.conflict_name}), as a live write-back would;
 - any other refusal of a commit (a conflict copy's included: no room under
   the quota, a name too long, a mount fenced by another) saves the content
   under the cache's C{unsent} directory (L{svc.mount.writeback.unsent}), read from
   the held chunks and, for the chunks of its base, from the data plane;
 - a refusal of any other entry is logged: nothing of the agent's data is
   in it.

Every refusal is logged at C{warn} or C{error}, naming the path.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
from twisted.internet.defer import Deferred, gatherResults, succeed
from twisted.logger import Logger

from svc.mount.core.errors import RemoteFailure
from svc.mount.outbox.entries import Commit, Entry
from svc.mount.outbox.log import Replay
from svc.mount.outbox.outbox import Outbox
from svc.mount.remote.data_plane import Remote
from svc.mount.writeback.commit import conflict_name
from svc.mount.writeback.unsent import UnsentFiles
from svc.timers import TimerClock
from svc.wire.errno import WireErrno

_log = Logger()

CONFLICT_SUFFIX = ".conflict-"
"""What the name of a conflict copy contains (a copy refused is not copied again)."""


class ReplayReconciler:
    """See the module docstring."""

    def __init__(
        self,
        unsent: UnsentFiles,
        chunk_get: Callable[[str], Deferred[bytes]],
        session_id: Callable[[], str | None],
        now: Callable[[], float],
    ) -> None:
        self._unsent = unsent
        self._chunk_get = chunk_get
        self._session_id = session_id
        self._now = now
        self._outbox: Outbox | None = None
        self._saving: list[Deferred[None]] = []
        self._copies: list[int] = []
        self.applied = 0
        self.refused_entries = 0

    def bind(self, outbox: Outbox) -> None:
        """The outbox whose entries this reconciles (conflict copies go in it)."""
        self._outbox = outbox

    def answered(self, entry: Entry, answer: Any) -> None:
        """A replayed entry was applied (now, or before the mount died)."""
        self.applied += 1
        _log.info(
            "outbox replay: {op} {path} (entry {seq}) applied",
            op=entry.op.value,
            path=entry.path,
            seq=entry.seq,
        )

    def refused(self, entry: Entry, failure: RemoteFailure) -> None:
        """A replayed entry was refused; see the module docstring."""
        self.refused_entries += 1
        if not isinstance(entry, Commit):
            _log.error(
                "outbox replay: {op} {path} (entry {seq}) refused: {error}",
                op=entry.op.value,
                path=entry.path,
                seq=entry.seq,
                error=failure,
            )
            return
        outbox = self._outbox
        assert outbox is not None, "bind the outbox first"
        held = outbox.held_chunks_of(entry)
        name = posixpath.basename(entry.path)
        if failure.wire is WireErrno.ESTALE and held is not None and CONFLICT_SUFFIX not in name:
            copy = posixpath.join(
                posixpath.dirname(entry.path),
                conflict_name(name, self._session_id(), self._now()),
            )
            _log.warn(
                "outbox replay: the commit of {path} (entry {seq}) lost to another"
                " writer's change ({error}); its content goes to {copy}",
                path=entry.path,
                seq=entry.seq,
                error=failure,
                copy=copy,
            )
            appended = outbox.append(
                lambda seq: attrs.evolve(entry, seq=seq, path=copy, expected=0, chained=False),
                held,
            )
            self._copies.append(appended.seq)
            return
        _log.error(
            "outbox replay: the commit of {path} (entry {seq}) was refused ({error});"
            " its content is saved under the cache's unsent directory",
            path=entry.path,
            seq=entry.seq,
            error=failure,
        )
        self._saving.append(Deferred.fromCoroutine(self._save(entry, held or {})))

    async def _save(self, entry: Commit, held: dict[str, bytes]) -> None:
        """Save C{entry}'s content under the unsent directory (failures logged there)."""
        pieces: list[bytes] = []
        try:
            for ref in entry.chunks:
                data = held.get(ref.hash)
                pieces.append(data if data is not None else await self._chunk_get(ref.hash))
        except RemoteFailure as error:
            _log.error(
                "outbox replay: the content of {path} (entry {seq}) cannot be read whole"
                " ({error}); it is lost",
                path=entry.path,
                seq=entry.seq,
                error=error,
            )
            return
        content = b"".join(pieces)
        rel = entry.path.split("/", 2)[2] if entry.path.count("/") >= 2 else entry.path
        await self._unsent.save(
            rel, 0, entry.size, lambda offset, length: succeed(content[offset : offset + length])
        )

    async def settled(self, outbox: Outbox) -> None:
        """Wait for the conflict copies appended so far, and the saves begun."""
        if self._copies:
            await outbox.settled(max(self._copies))
        await gatherResults(self._saving)


async def replay(outbox: Outbox, left: Replay, reconciler: ReplayReconciler) -> None:
    """Wait until what a dead mount left (C{left}) is settled, and its copies saved."""
    if left.damage is not None:
        _log.error(
            "the outbox log was damaged ({damage}); it is kept as {kept}, and only the"
            " entries before the damage are sent",
            damage=left.damage,
            kept=str(left.kept),
        )
    if not left.unsettled:
        return
    last = left.unsettled[-1].seq
    _log.info(
        "outbox: sending {count} changes an earlier run of this mount left unanswered",
        count=len(left.unsettled),
    )
    await outbox.settled(last)
    await reconciler.settled(outbox)
    _log.info(
        "outbox: the earlier run's changes are settled ({applied} applied, {refused} refused)",
        applied=reconciler.applied,
        refused=reconciler.refused_entries,
    )


def open_outbox(
    root: Path,
    remote: Remote,
    clock: TimerClock,
    now: Callable[[], float],
    session_id: str | None,
    unsent: UnsentFiles,
    in_reactor: Callable[[Callable[[], None]], object],
) -> tuple[Outbox, Deferred[None]]:
    """
    Open the outbox under C{root}, start its sender (on C{remote}, with
    C{session_id}), and send what a killed run left in it: the outbox, and
    a L{Deferred} that fires once that is settled.

    @raise OSError: the outbox cannot be opened or written.
    """
    reconciler = ReplayReconciler(unsent, remote.chunk_get, lambda: session_id, now)
    outbox, left, missing = Outbox.open(root, reconciler, in_reactor)
    if missing:
        _log.error(
            "{count} chunks the outbox's entries hold are missing from the cache",
            count=len(missing),
        )
    reconciler.bind(outbox)
    outbox.start(remote, clock, lambda: session_id)
    return outbox, Deferred.fromCoroutine(replay(outbox, left, reconciler))
