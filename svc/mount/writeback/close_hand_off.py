"""
When a C{close} may return once its commit is sent, and the write-backs
that go on after the call that started them returned
(``docs/specifications/mount-consistency.md`` section 2.5).

L{HandOffs} is shared by L{svc.mount.ops.file_closes.FileCloses} and
L{svc.mount.writeback.file_write_back.WriteBack}: it decides whether a
close hands off (L{HandOffs.allowed}), runs a handed-off write-back
(L{HandOffs.hand_off}, which records its commit in the outbox before the
close returns: ``mount-outbox.md`` section 8), and counts
every write-back nobody waits for any more, a release's included, so
shutdown can wait for them (L{HandOffs.settled}).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from svc.mount.core.attributes import QuotaReport
from svc.mount.core.errors import FSError
from svc.mount.remote.in_flight import InFlight

_log = Logger()

HAND_OFF_MAX_BYTES = 8 << 20
"""Largest file whose C{close} may return once its commit is sent (a bigger
file's write-back is mostly its uploads, which a close waits for anyway)."""

HAND_OFF_MAX_FILES = 64
"""Most handed-off commits unanswered at once: a close beyond waits for its own."""

HAND_OFF_MAX_IN_FLIGHT_BYTES = 64 << 20
"""Most bytes of handed-off files unanswered at once (their spills stay until answered)."""

HAND_OFF_HEADROOM = 64 << 20
"""Room under the disk's quota that must remain after every handed-off
commit for a C{close} to hand off (else it waits, to report C{EDQUOT})."""

WriteBack = Callable[[Callable[[], None]], Awaitable[None]]
"""C{write_back(on_sent)}: a file's write-back, calling C{on_sent} once its
commit is sent."""


class HandOffs:
    """See the module docstring."""

    def __init__(
        self,
        *,
        durable_close: bool,
        quota: Callable[[], Deferred[QuotaReport]] | None,
        connected: Callable[[], bool] = lambda: True,
    ) -> None:
        """
        @param durable_close: no close hands off.
        @param quota: the disk's quota and usage (L{None}: not known, no limit).
        @param connected: whether the data plane's connection is open now.
        """
        self._durable_close = durable_close
        self._quota = quota
        self._connected = connected
        self._unfinished = InFlight()
        self._bytes = 0  # sizes of the files handed off and still running
        self._files = 0  # how many those are
        self._waiting_for_room: list[Deferred[None]] = []
        self._failed = False  # a handed-off write-back failed since the last commit

    # Write-backs nobody waits for

    def started(self) -> None:
        """A write-back nobody will wait for began (a release's)."""
        self._unfinished.add()

    def finished(self) -> None:
        """One that L{started} ended."""
        self._unfinished.done()

    def settled(self) -> Deferred[None]:
        """Fires once none is running (at once when none is)."""
        return self._unfinished.settled()

    # Closes

    def committed(self) -> None:
        """A commit succeeded: closes may hand off again."""
        self._failed = False

    def may_return_early(self, *, read_only: bool) -> bool:
        """
        Whether closes may return before their commits are answered at all:
        not with C{durable_close}, on a read-only mount, or while the data
        plane's connection is not open. L{allowed} adds the per-file rules.
        """
        return not self._durable_close and not read_only and self._connected()

    async def allowed(self, size: int, *, read_only: bool) -> bool:
        """
        Whether the close of a file of C{size} bytes with something to
        commit may return once its commit is sent: not with
        C{durable_close}, on a read-only mount, while the data plane's
        connection is not open (the commit would only wait in the queue for
        a new one, and whether it gets through is the program's to hear), for
        a file over L{HAND_OFF_MAX_BYTES}, after a handed-off write-back
        failed (until a commit succeeds), or when the disk's quota (the C{statfs} answer, a
        few seconds old at most) would leave less than L{HAND_OFF_HEADROOM}
        once every handed-off file is stored, or cannot be had. Then the
        close waits and reports.

        While L{HAND_OFF_MAX_FILES} handed-off commits, or
        L{HAND_OFF_MAX_IN_FLIGHT_BYTES} of their files, are unanswered, it
        first waits until one is answered: what is in flight stays bounded
        (each file keeps its spill until then), and the close waits for the
        oldest commit, not for its own behind all the others.
        """
        if not self.may_return_early(read_only=read_only) or size > HAND_OFF_MAX_BYTES:
            return False
        while not self._failed and self._full(size):
            await self._room()
        if self._failed:
            return False
        if self._quota is None:
            return True
        try:
            report = await self._quota()
        except Exception:
            return False  # no answer: wait for the commit's own
        if report.quota_bytes is None:
            return True
        left = report.quota_bytes - report.used_bytes - self._bytes - size
        return left >= HAND_OFF_HEADROOM

    def _full(self, size: int) -> bool:
        """Whether handing off one more file of C{size} bytes would pass the bounds."""
        return self._files >= HAND_OFF_MAX_FILES or (
            self._files > 0 and self._bytes + size > HAND_OFF_MAX_IN_FLIGHT_BYTES
        )

    def _room(self) -> Deferred[None]:
        """Fires once a handed-off write-back ends (room for another, perhaps)."""
        waiter: Deferred[None] = Deferred()
        self._waiting_for_room.append(waiter)
        return waiter

    def hand_off(self, ino: int, size: int, write_back: WriteBack) -> Deferred[None]:
        """
        Run C{write_back} of file C{ino} (C{size} bytes), firing once its
        commit is sent, or once it ends if it ends first (nothing to commit,
        or a failure before sending, which is the result). The rest runs on
        (holding the file's lock, so the file's next write, flush, fsync and
        release wait for the answer); a failure then is logged (the
        write-back wrote its C{flush} audit line) and makes later closes wait
        until a commit succeeds (the file stays dirty, so its next
        write-back, at the latest its last release, tries again).
        """
        sent: Deferred[None] = Deferred()

        def on_sent() -> None:
            if not sent.called:
                sent.callback(None)

        def ended(result: Failure | None) -> None:
            self.finished()
            self._bytes -= size
            self._files -= 1
            if not sent.called:  # ended before sending: its result is the close's
                if isinstance(result, Failure):
                    sent.errback(result)
                else:
                    sent.callback(None)
            elif isinstance(result, Failure):
                self._failed = True
                if isinstance(result.value, FSError):
                    _log.warn(
                        "write-back of inode {ino} failed after its close returned: "
                        "{error}; its next write-back tries again",
                        ino=ino,
                        error=result.value,
                    )
                else:
                    _log.failure("write-back of inode {ino} failed", result, ino=ino)
            # Last, so a close waiting for room sees this one's failure.
            waiting, self._waiting_for_room = self._waiting_for_room, []
            for waiter in waiting:
                waiter.callback(None)

        async def running() -> None:
            await write_back(on_sent)

        self.started()
        self._bytes += size
        self._files += 1
        Deferred.fromCoroutine(running()).addBoth(ended)
        return sent
