"""
Write-time C{EDQUOT}: whether a write may add bytes under the disk's quota
(``docs/specifications/mount-fs.md`` section 5.2, "The quota at write time").

The data plane checks the agent's grant when a file is committed
(``storage-engine.md``, "When EDQUOT is returned"), so a program whose
writes went over it used to learn so only from C{close}, which many
programs never check. L{QuotaRoom} lets the mount refuse the write itself,
as a local disk with quotas does, without asking the server on every write:

 - Each open file counts its I{growth}: the bytes written beyond its
   committed size and not committed yet (L{svc.mount.core.file_state.FileState}
   tells the room: L{QuotaRoom.grew}, L{QuotaRoom.committed}).
 - The disk's usage is estimated as the usage of the last report the room
   asked for itself (a C{statfs}), plus the growth committed since it was
   asked, plus every open file's growth.
 - A write that would take that estimate over the quota is not refused at
   once: the room first waits for the mount's write-backs and removals in
   flight, asks the server again, and refuses only when that fresh look
   leaves no room either (L{QuotaRoom.check}).

The estimate counts written bytes as new: content the server holds already
(a copy of another file) costs the grant nothing, so near a full grant such
a write may be refused although its commit would have been taken. Bytes
written over a file's committed content count nothing (they replace it).
Without a quota, before the first report, or without an answer, nothing is
refused here: the commit's own check stays the authority.
"""

from __future__ import annotations

import errno
from collections.abc import Callable

from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure

from svc.mount.core.attributes import QuotaReport
from svc.mount.core.errors import FSError
from svc.mount.remote.quota_source import statfs_unsupported

_log = Logger()


class QuotaRoom:
    """See the module docstring. Runs on the reactor; L{fits} on any thread."""

    def __init__(
        self,
        fetch: Callable[[], Deferred[QuotaReport]] | None,
        settled: Callable[[], Deferred[None]],
    ) -> None:
        """
        @param fetch: asks the server for the disk's quota and usage now
            (never a cached answer); L{None}: no quota is known, the room
            refuses nothing.
        @param settled: fires once no write-back or removal the mount sent
            is unanswered.
        """
        self._fetch = fetch
        self._settled = settled
        self._report: QuotaReport | None = None
        self._grown = 0  # open files' growth, not committed
        self._committed = 0  # growth committed since the report was asked for

    @property
    def enabled(self) -> bool:
        """Whether the room may refuse writes (a quota source was given)."""
        return self._fetch is not None

    def grew(self, delta: int) -> None:
        """An open file's growth changed by C{delta} bytes (negative: it shrank)."""
        self._grown += delta

    def committed(self, amount: int) -> None:
        """An open file's growth of C{amount} bytes was committed."""
        self._grown -= amount
        self._committed += amount

    def fits(self, extra: int) -> bool:
        """
        Any thread: whether C{extra} more bytes of growth leave the estimate
        within the quota (true when nothing is known).
        """
        report = self._report
        if extra <= 0 or report is None or report.quota_bytes is None:
            return True
        estimate = report.used_bytes + self._committed + self._grown + extra
        return estimate <= report.quota_bytes

    async def check(self, extra: int) -> None:
        """
        Let a write of C{extra} bytes of growth go ahead, or refuse it
        (C{EDQUOT}) once a fresh look at the server's usage, taken after
        the mount's changes in flight were answered, leaves no room.
        """
        if self.fits(extra):
            return
        await self._settled()
        await self.refresh()
        if not self.fits(extra):
            raise FSError(errno.EDQUOT, "the write would exceed the disk's quota")

    def refresh(self) -> Deferred[None]:
        """
        Ask the server for a new report; never fails (no answer keeps the
        previous report, a server without C{statfs} disables the room).
        """
        fetch = self._fetch
        if fetch is None:
            return succeed(None)
        committed_before = self._committed

        def answered(result: QuotaReport | Failure) -> None:
            if isinstance(result, Failure):
                if statfs_unsupported(result):
                    self._fetch = None
                    self._report = None
                    return
                _log.info("the disk's quota could not be had: {error}", error=result.value)
                return
            self._report = result
            # The report holds what was committed before it was asked for.
            self._committed -= committed_before

        return fetch().addBoth(answered)
