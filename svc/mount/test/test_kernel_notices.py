"""
Tests for L{svc.mount.runtime.kernel_notices}: what the mount tells the kernel
about its caches.
"""

from __future__ import annotations

import errno
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from svc.mount.runtime.kernel_notices import KernelNotices


class RecordingFuse:
    """llfuse's notice functions, recorded; C{refuse} makes each one raise."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.refuse = False

    def _record(self, name: str, *args: Any, **kwargs: Any) -> None:
        if self.refuse:
            raise OSError(errno.ENOENT, "no such inode")
        self.sent.append((name, args, kwargs))

    def invalidate_inode(self, *args: Any, **kwargs: Any) -> None:
        self._record("invalidate_inode", *args, **kwargs)

    def invalidate_entry(self, *args: Any, **kwargs: Any) -> None:
        self._record("invalidate_entry", *args, **kwargs)


class KernelNoticesTests(SynchronousTestCase):
    """The kernel hears of cache changes only while the FUSE loop serves."""

    def setUp(self) -> None:
        self.fuse = RecordingFuse()
        self.serving = True
        self.notices = KernelNotices(lambda: self.serving, fuse=self.fuse)

    def send_all(self) -> None:
        self.notices.invalidate(5)
        self.notices.forget_attributes(6)
        self.notices.invalidate_entry(1, b"name")

    def test_notices_while_serving(self) -> None:
        """Each notice is the matching llfuse call; attributes alone keep the pages."""
        self.send_all()
        self.assertEqual(
            self.fuse.sent,
            [
                ("invalidate_inode", (5,), {}),
                ("invalidate_inode", (6,), {"attr_only": True}),
                ("invalidate_entry", (1, b"name"), {}),
            ],
        )

    def test_dropped_when_not_serving(self) -> None:
        """Before the loop runs or after it ended nothing reaches llfuse's queue."""
        self.serving = False
        self.send_all()
        self.assertEqual(self.fuse.sent, [])

    def test_refusal_is_logged_not_raised(self) -> None:
        """A notice the kernel refuses does not fail the caller."""
        self.fuse.refuse = True
        self.send_all()
        self.assertEqual(self.fuse.sent, [])
