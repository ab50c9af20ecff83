"""
The mount's per-path write leases on the data plane
(``docs/specifications/mount-consistency.md`` section 6).

A file that exists on the data plane and is opened for writing asks for
the write lease on its path (C{lease_grant}, mode C{write}, not waiting;
the open does not wait for the answer either), and keeps it while this
mount has the file open and for L{LINGER_SECONDS} after its last handle is
released and written back (at most L{MAX_LINGERING} such), so that the next
open for writing asks nothing; then it is released (not waited for). Held
leases are refreshed every third of their TTL. New files (not yet on the
data plane) take none: nobody else knows their name yet.

A refused lease (another connection holds it) is the caller's to audit
(C{lease_denied}); the file is then written uncached (section 6 there).
A lease the data plane asks back (a C{lease_revoke} push) is yielded: the
file's changes are written back first, then the lease is released. A
write-back refused because another connection holds the path's lease
(C{ESTALE} C{lease_conflict}) asks for it again, this time waiting in the
path's queue (L{WriteLeases.wait_for}): the holder is asked to yield, and
the data plane grants it within its revoke timeout.

A refresh answered C{ENOENT} (the connection the lease was granted on is
gone, or the server restarted without it) asks for the lease again on the
current connection; a refusal then ends it, with a warning. When a new
connection replaces a lost one, every held lease is refreshed at once
(L{WriteLeases.reconnected}).

Keys are FUSE inode numbers (one open state per inode). Nothing here blocks
or raises to its callers: failures are logged.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping

import attrs
from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger

from svc.mount.core.errors import RemoteFailure
from svc.mount.remote.data_plane import Remote
from svc.mount.remote.remote_values import LeaseAnswer
from svc.timers import Timer, TimerClock
from svc.wire.errno import WireErrno

_log = Logger()

RETRY_SECONDS = 5.0
"""How soon a refresh that could not be sent (no connection) is tried again."""

LINGER_SECONDS = 10.0
"""How long a lease is kept after its file's last close, for the next open."""

MAX_LINGERING = 256
"""The most leases kept for closed files (the oldest is given back first)."""

YieldCallback = Callable[[int], Deferred[None]]
"""Writes back the file of an inode whose lease is asked back."""


@attrs.define
class _Held:
    """A write lease this mount holds for an open file."""

    path: str
    lease_id: str
    timer: Timer | None = None
    yielding: bool = False
    linger: Timer | None = None


class WriteLeases:
    """See the module docstring."""

    def __init__(
        self,
        remote: Remote,
        clock: TimerClock,
        session_id: Callable[[], str | None],
    ) -> None:
        """
        @param remote: the data-plane operations.
        @param clock: schedules refreshes.
        @param session_id: the mount session sent with grants (so a session
            can reclaim its leases after a data-plane restart).
        """
        self._remote = remote
        self._clock = clock
        self._session_id = session_id
        self._held: dict[int, _Held] = {}
        self._wanted: set[int] = set()
        self._lingering: OrderedDict[int, None] = OrderedDict()
        self._yield: YieldCallback | None = None
        self._closed = False

    def on_yield(self, callback: YieldCallback) -> None:
        """Call C{callback(ino)} to write a file back before its lease is yielded."""
        self._yield = callback

    # Taking and giving back

    def acquire(self, ino: int, path: str) -> Deferred[bool | None]:
        """
        Take the write lease on server path C{path} for C{ino}, not
        waiting; fires C{True} when held (at once when it is already),
        C{False} when refused, L{None} when the request was not answered
        (the connection was lost: nobody refused it; logged) or the file
        was closed before the grant came (given back at once).
        """
        self._wanted.add(ino)
        held = self._kept(ino, path)
        if held is not None:
            # Being yielded: the server would only renew it (same holder).
            return succeed(not held.yielding)
        granted: Deferred[bool | None] = Deferred.fromCoroutine(self._grant(ino, path, wait=False))
        return granted

    def wait_for(self, ino: int, path: str) -> Deferred[bool | None]:
        """
        Take the write lease on C{path} for C{ino}, waiting in the path's
        queue (the holder is asked to yield); fires whether it is held, or
        L{None} when the request was not answered (the connection was lost,
        or the file was closed meanwhile: nobody refused it).
        """
        self._wanted.add(ino)
        held = self._kept(ino, path)
        if held is not None:
            # Asked back: asking again would only renew it.
            return succeed(not held.yielding)
        granted: Deferred[bool | None] = Deferred.fromCoroutine(self._grant(ino, path, wait=True))
        return granted

    def _kept(self, ino: int, path: str) -> _Held | None:
        """
        C{ino}'s lease, if it holds one on C{path} (no longer kept for a
        closed file: open again); one on another path (the file was
        renamed) is given back.
        """
        held = self._held.get(ino)
        if held is not None and held.path != path and not held.yielding:
            self._drop(ino)
            return None
        if held is not None:
            self._lingering.pop(ino, None)
            _stop(held.linger)
            held.linger = None
        return held

    def release(self, ino: int) -> None:
        """
        C{ino}'s file is closed: keep its lease for L{LINGER_SECONDS} (at
        most L{MAX_LINGERING} of them), then give it back (not waited for).
        """
        self._wanted.discard(ino)
        held = self._held.get(ino)
        if held is None:
            return
        if held.yielding or self._closed:
            self._drop(ino)
            return
        _stop(held.linger)
        held.linger = self._clock.callLater(LINGER_SECONDS, self._linger_over, ino, held)
        self._lingering[ino] = None
        while len(self._lingering) > MAX_LINGERING:
            oldest, _ = self._lingering.popitem(last=False)
            self._drop(oldest)

    def _linger_over(self, ino: int, held: _Held) -> None:
        held.linger = None
        if self._held.get(ino) is held and ino not in self._wanted:
            self._drop(ino)

    def _drop(self, ino: int) -> None:
        """Forget C{ino}'s lease and give it back."""
        self._lingering.pop(ino, None)
        held = self._held.pop(ino, None)
        if held is not None:
            self._give_back(held)

    def close(self) -> None:
        """Stop refreshing (the connection's close releases the leases)."""
        self._closed = True
        for held in self._held.values():
            _cancel(held)
        self._held.clear()
        self._wanted.clear()
        self._lingering.clear()

    async def _grant(self, ino: int, path: str, *, wait: bool) -> bool | None:
        """Whether the lease is held now; L{None} when the request was not answered."""
        try:
            answer = await self._remote.lease_grant(
                path, "write", wait=wait, session_id=self._session_id()
            )
        except RemoteFailure as failure:
            _log.warn(
                "could not ask for the write lease on {path}: {error}", path=path, error=failure
            )
            return None
        if not answer.granted or answer.lease_id is None:
            _log.info("write lease on {path} refused ({reason})", path=path, reason=answer.reason)
            return False
        held = _Held(path, answer.lease_id)
        if ino not in self._wanted or self._closed:
            self._give_back(held)  # the file was closed meanwhile: no refusal
            return None
        previous = self._held.pop(ino, None)
        self._lingering.pop(ino, None)
        if previous is not None:
            _cancel(previous)
            if previous.lease_id != held.lease_id:
                self._give_back(previous)
        self._held[ino] = held
        self._schedule(ino, held, answer)
        return True

    def _give_back(self, held: _Held) -> None:
        _cancel(held)
        if self._closed:
            return
        if any(other.lease_id == held.lease_id for other in self._held.values()):
            # Another open inode at the same path holds it too (a file
            # renamed over one still open: the server renewed the same
            # lease for the second): it stays until that one gives it back.
            return
        released = self._remote.lease_release(held.lease_id)
        released.addErrback(self._release_failed, held)

    @staticmethod
    def _release_failed(failure: object, held: _Held) -> None:
        # ENOENT: already ended (its connection closed, or it was dropped).
        _log.info(
            "write lease {lease} on {path} not released: {error}",
            lease=held.lease_id,
            path=held.path,
            error=getattr(failure, "value", failure),
        )

    # Refreshing

    def _schedule(self, ino: int, held: _Held, answer: LeaseAnswer) -> None:
        ttl_seconds = (answer.ttl_ms or 0) / 1000
        self._schedule_in(ino, held, max(1.0, ttl_seconds / 3))

    def _schedule_in(self, ino: int, held: _Held, delay: float) -> None:
        _stop(held.timer)  # not its linger: a refresh does not keep a closed file's lease longer
        held.timer = self._clock.callLater(delay, self._refresh, ino, held)

    def _refresh(self, ino: int, held: _Held) -> None:
        held.timer = None
        if self._held.get(ino) is not held:
            return
        Deferred.fromCoroutine(self._refreshing(ino, held))

    async def _refreshing(self, ino: int, held: _Held) -> None:
        try:
            answer = await self._remote.lease_refresh(held.lease_id)
        except RemoteFailure as failure:
            if self._held.get(ino) is not held:
                return
            if failure.wire is WireErrno.ENOENT:
                # Granted on a connection that is gone: ask on this one.
                lingering = ino in self._lingering
                self._lingering.pop(ino, None)
                del self._held[ino]
                if lingering:
                    return  # its file is closed: nothing to keep it for
                if not await self._grant(ino, held.path, wait=False):
                    _log.warn(
                        "write lease on {path} lost and not granted again;"
                        " its next write-back may meet another writer's",
                        path=held.path,
                    )
                return
            self._schedule_in(ino, held, RETRY_SECONDS)
            return
        if self._held.get(ino) is held:
            self._schedule(ino, held, answer)

    def reconnected(self) -> None:
        """
        The data-plane connection was replaced (a lost one): refresh every
        held lease now rather than at its next refresh. A lease ends with
        the connection it was granted on, so the refresh is answered
        C{ENOENT} and the lease asked for again on the new connection
        before the commits waiting for it are sent (a closed file's kept
        lease is simply dropped).
        """
        for ino, held in list(self._held.items()):
            if not held.yielding:
                _stop(held.timer)
                self._refresh(ino, held)

    # Revokes

    def revoked(self, lease_id: str) -> None:
        """
        The data plane asks lease C{lease_id} back: write its file back,
        then release it, starting on the next turn of the reactor (not
        inside the push's delivery). Unknown ids (a lease already given
        back) are ignored.
        """
        for ino, held in self._held.items():
            if held.lease_id == lease_id:
                if not held.yielding:
                    held.yielding = True
                    self._clock.callLater(0, self._start_yield, ino, held)
                return

    def _start_yield(self, ino: int, held: _Held) -> None:
        Deferred.fromCoroutine(self._yielding(ino, held))

    async def _yielding(self, ino: int, held: _Held) -> None:
        if self._yield is not None:
            try:
                await self._yield(ino)
            except Exception as error:
                _log.warn(
                    "write-back before yielding the lease on {path} failed: {error}",
                    path=held.path,
                    error=error,
                )
        if self._held.get(ino) is held:
            self._drop(ino)
            _log.info("write lease on {path} yielded to another writer", path=held.path)


def revoke_pushes(
    receive: Callable[[str], object],
) -> Callable[[str, Mapping[str, object], bytes], None]:
    """
    A push callback that hands each C{lease_revoke} push's C{lease_id} to
    C{receive}; other pushes are not its business, and a revoke without a
    string C{lease_id} is logged and dropped.
    """

    def pushed(op: str, payload: Mapping[str, object], raw: bytes) -> None:
        if op != "lease_revoke":
            return
        lease_id = payload.get("lease_id")
        if not isinstance(lease_id, str):
            _log.warn("ignoring a lease_revoke push without a lease id")
            return
        receive(lease_id)

    return pushed


def _cancel(held: _Held) -> None:
    """Stop C{held}'s timers."""
    _stop(held.timer)
    _stop(held.linger)
    held.timer = held.linger = None


def _stop(timer: Timer | None) -> None:
    if timer is not None and timer.active():
        timer.cancel()
