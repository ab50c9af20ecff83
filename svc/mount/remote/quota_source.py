"""
Where the mount's C{statfs} gets the disk's quota: the data plane's
C{statfs} operation, its answer kept for a few seconds.

L{QuotaSource} is the C{quota} callable of L{svc.mount.fs.MountFS}. A burst
of C{statfs} calls (C{df} on a busy machine, a desktop polling free space)
costs one request: callers arriving while a request is in flight share it,
and a successful answer is reused for L{QUOTA_CACHE_SECONDS}. A failed
request is not kept: its callers get its L{svc.mount.core.errors.RemoteFailure}
(EIO when no answer came) and the next call asks again. A data plane that
does not know the operation (C{ENOSYS}: older than this mount) reports no
quota, as a disk without limits does, and is not asked again.

Capacity (``docs/specifications/mount-fs.md``, C{statfs}): the bytes the
agent uses plus the bytes it may still store, so C{f_blocks} is what the
disk could hold now and C{f_bavail} the room left under the tighter of its
grant and its owner's account budget; with neither limit the capacity is
unknown (L{None}).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from twisted.internet.defer import Deferred, succeed
from twisted.python.failure import Failure

from svc.mount.core.attributes import QuotaReport
from svc.mount.core.errors import RemoteFailure
from svc.mount.remote.remote_values import DiskUsage
from svc.wire.errno import WireErrno

QUOTA_CACHE_SECONDS = 5.0
"""How long one C{statfs} answer is reused."""


class Seconds(Protocol):
    """The part of C{IReactorTime} the quota source uses."""

    def seconds(self) -> float:
        """Now, in seconds."""


def quota_report(usage: DiskUsage) -> QuotaReport:
    """
    The L{QuotaReport} of a C{statfs} answer: the quota is the usage plus
    the room left (L{None} when nothing limits the disk).
    """
    if usage.available_bytes is None:
        return QuotaReport(None, usage.used_bytes)
    return QuotaReport(usage.used_bytes + usage.available_bytes, usage.used_bytes)


NO_QUOTA = QuotaReport(None, 0)
"""What a data plane without C{statfs} reports: no limit known, nothing counted."""


def statfs_unsupported(failure: Failure) -> bool:
    """Whether C{failure} says the data plane has no C{statfs} (C{ENOSYS}: older than the mount)."""
    error = failure.value
    return isinstance(error, RemoteFailure) and error.wire is WireErrno.ENOSYS


class QuotaSource:
    """
    The disk's L{QuotaReport}, fetched with C{fetch} (L{svc.mount.remote.data_plane.Remote.statfs})
    at most once per C{lifetime} seconds of C{clock}; see the module docstring.
    """

    def __init__(
        self,
        fetch: Callable[[], Deferred[DiskUsage]],
        clock: Seconds,
        lifetime: float = QUOTA_CACHE_SECONDS,
    ) -> None:
        self._fetch = fetch
        self._clock = clock
        self._lifetime = lifetime
        self._report: QuotaReport | None = None
        self._asked_at = 0.0
        self._unsupported = False
        self._waiting: list[Deferred[QuotaReport]] | None = None

    def __call__(self) -> Deferred[QuotaReport]:
        """The disk's quota and usage, at most C{lifetime} seconds old."""
        if self._unsupported:
            return succeed(NO_QUOTA)
        now = self._clock.seconds()
        # A clock that went backwards ends the answer's life too.
        if self._report is not None and self._asked_at <= now < self._asked_at + self._lifetime:
            return succeed(self._report)
        waiter: Deferred[QuotaReport] = Deferred()
        if self._waiting is not None:
            self._waiting.append(waiter)
            return waiter
        self._waiting = [waiter]
        self._fetch().addBoth(self._answered, now)
        return waiter

    def _answered(self, result: DiskUsage | Failure | None, asked_at: float) -> None:
        waiters, self._waiting = self._waiting or [], None
        if isinstance(result, Failure) and statfs_unsupported(result):
            self._unsupported = True
            result = None
        if result is None:
            for waiter in waiters:
                waiter.callback(NO_QUOTA)
            return
        if isinstance(result, Failure):
            for waiter in waiters:
                waiter.errback(result)
            return
        report = quota_report(result)
        # Aged from when it was asked for: the answer is at least that fresh.
        self._report, self._asked_at = report, asked_at
        for waiter in waiters:
            waiter.callback(report)
