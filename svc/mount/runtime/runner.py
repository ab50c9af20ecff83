"""
The FUSE loop of a mount: llfuse's session in a thread of its own, beside a
reactor running in the main thread (as C{twist} runs it).

Measured (``docs/specifications/mount-runtime.md``): C{llfuse.main} works in
a non-main thread when called with C{handle_signals=False}, provided the
process ignores C{SIGUSR1}, which llfuse sends to its own worker threads when
the loop ends (without a handler the default action kills the process).
Signals (SIGTERM, SIGINT) stay with the reactor, whose shutdown writes back
open files, unmounts (which ends the loop) and releases the lease.

Only L{FuseLoop.mount} touches the process's signal disposition; it must run
in the main thread (C{signal.signal}), which the reactor thread is.
"""

from __future__ import annotations

import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import llfuse
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorFromThreads
from twisted.internet.threads import deferToThread
from twisted.logger import Logger

from svc.mount.runtime.mount_point import unmount_command

_log = Logger()

UNMOUNT_TIMEOUT = 30.0
"""Seconds to wait for the FUSE loop to end after an unmount request."""


def mount_options(*, allow_other: bool, fsname: str = "svc") -> set[str]:
    """llfuse options: its defaults, C{default_permissions}, our name, maybe C{allow_other}."""
    options = set(llfuse.default_options)
    options.add("default_permissions")
    options.add(f"fsname={fsname}")
    options.add("subtype=svc")
    if allow_other:
        options.add("allow_other")
    return options


class FuseLoop:
    """
    One llfuse session: L{mount} (main thread) mounts and starts the loop in a
    daemon thread; L{unmount} (reactor thread) ends it.
    """

    def __init__(
        self,
        reactor: IReactorFromThreads,
        operations: Any,
        mount_point: Path,
        *,
        workers: int,
        allow_other: bool = False,
    ) -> None:
        self._reactor = reactor
        self._operations = operations
        self.mount_point = mount_point
        self._workers = workers
        self._allow_other = allow_other
        self._thread: threading.Thread | None = None
        self._ended = threading.Event()
        self._closed = False
        self.ended: Deferred[object] = Deferred()
        """Fires (on the reactor thread) when the loop returns."""

    @property
    def running(self) -> bool:
        """Whether the loop is mounted and serving."""
        return self._thread is not None and not self._ended.is_set()

    def mount(self) -> None:
        """Mount and start serving (call from the main thread)."""
        signal.signal(signal.SIGUSR1, lambda signum, frame: None)
        llfuse.init(
            self._operations, str(self.mount_point), mount_options(allow_other=self._allow_other)
        )
        self._thread = threading.Thread(target=self._serve, name="svc-fuse-main", daemon=True)
        self._thread.start()
        _log.info("mounted at {mount_point}", mount_point=str(self.mount_point))

    def _serve(self) -> None:
        result: object = None
        try:
            result = llfuse.main(workers=self._workers, handle_signals=False)
        except BaseException as error:
            result = error
            _log.error("FUSE loop failed: {error!r}", error=error)
        finally:
            self._ended.set()
            self._reactor.callFromThread(self.ended.callback, result)

    def unmount(self, timeout: float = UNMOUNT_TIMEOUT) -> Deferred[None]:
        """Unmount (lazily if busy), wait for the loop to end, release llfuse."""
        return deferToThread(self._unmount_blocking, timeout)

    def _unmount_blocking(self, timeout: float) -> None:
        if self._thread is None or self._closed:
            return
        if not self._ended.is_set():
            done = subprocess.run(  # noqa: S603 - fixed argv
                unmount_command(self.mount_point), capture_output=True, check=False
            )
            if done.returncode != 0:
                _log.warn(
                    "unmount refused ({stderr}); detaching lazily",
                    stderr=done.stderr.decode("utf-8", "replace").strip(),
                )
                lazy = unmount_command(self.mount_point, lazy=True)
                subprocess.run(lazy, check=False)  # noqa: S603 - fixed argv
        if not self._ended.wait(timeout):
            _log.error("FUSE loop still running {timeout}s after unmount", timeout=timeout)
        self._closed = True
        llfuse.close(unmount=False)
        _log.info("unmounted {mount_point}", mount_point=str(self.mount_point))
