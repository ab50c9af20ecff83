"""
The write-back of every open handle when the mount shuts down
(L{sync_all}, before unmounting; ``docs/specifications/mount-runtime.md``
section 4).
"""

from __future__ import annotations

import errno

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from svc.audit.events import CallerProcess
from svc.mount.core.errors import FSError
from svc.mount.fs import MountFS

_log = Logger()


def sync_all(fs: MountFS, handles: dict[int, CallerProcess]) -> Deferred[int]:
    """
    On the reactor thread: tell C{fs} that shutdown begins, write back
    every open handle (before unmounting), then make the final attempt at
    the files kept through an outage; fires with how many handles failed
    (each logged).
    """

    async def syncing() -> int:
        fs.stopping()
        failed = 0
        for fh, caller in sorted(handles.items()):
            try:
                await fs.fsync(fh, False, caller)
            except FSError as error:
                if error.errno == errno.EBADF:
                    # Closed meanwhile: its release is writing it back, and is
                    # waited for below.
                    continue
                failed += 1
                _log.error(
                    "write-back of handle {fh} failed at shutdown: {error}", fh=fh, error=error
                )
        await fs.write_backs_settled()
        await fs.last_write_backs()
        return failed

    return Deferred.fromCoroutine(syncing())
