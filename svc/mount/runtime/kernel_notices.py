"""
What the mount tells the kernel about its caches (L{KernelNotices}),
through llfuse (``docs/specifications/mount-runtime.md`` section 2).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import llfuse
from twisted.logger import Logger

_log = Logger()


class KernelNotices:
    """
    What C{MountFS} tells the kernel about its caches (its C{invalidate},
    C{forget_attributes} and C{invalidate_entry}), through llfuse, which
    queues each notice for a thread of its own. That queue holds 1,000 and
    its C{put} blocks; the thread runs only while C{llfuse.main} does. So a
    notice while the FUSE loop is not serving (C{serving} false) is dropped:
    the kernel caches nothing of an unmounted file system, and a blocked put
    would stop the reactor. A notice the kernel refuses is logged.
    """

    def __init__(self, serving: Callable[[], bool], fuse: Any = llfuse) -> None:
        self._serving = serving
        self._fuse = fuse

    def invalidate(self, ino: int) -> None:
        """Drop an inode's attributes and page cache."""
        self._send("invalidate_inode", ino)

    def forget_attributes(self, ino: int) -> None:
        """Drop an inode's cached attributes, not its pages."""
        self._send("invalidate_inode", ino, attr_only=True)

    def invalidate_entry(self, parent: int, name: bytes) -> None:
        """Drop directory C{parent}'s entry C{name}."""
        self._send("invalidate_entry", parent, name)

    def _send(self, notice: str, *args: Any, **kwargs: Any) -> None:
        if not self._serving():
            return
        try:
            getattr(self._fuse, notice)(*args, **kwargs)
        except Exception as error:  # the kernel refused
            _log.info(
                "kernel notice {notice}{args} failed: {error}",
                notice=notice,
                args=args,
                error=error,
            )
