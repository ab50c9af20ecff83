"""
Tests for L{svc.mount.runtime.fuse_callers}: the process behind a FUSE request.
"""

from __future__ import annotations

import os

from twisted.trial.unittest import SynchronousTestCase

from svc.audit.events import CallerProcess
from svc.mount.runtime.fuse_callers import caller_of, process_name


class Context:
    """Stands in for llfuse.RequestContext."""

    def __init__(self, pid: int, uid: int = 1000, gid: int = 1000) -> None:
        self.pid = pid
        self.uid = uid
        self.gid = gid


class CallerTests(SynchronousTestCase):
    """The caller of a request comes from the llfuse context and /proc."""

    def test_process_name(self) -> None:
        """The command name of this process is read from /proc/<pid>/comm."""
        with open(f"/proc/{os.getpid()}/comm") as comm:
            expected = comm.read().strip()
        self.assertEqual(process_name(os.getpid()), expected)

    def test_unknown_process(self) -> None:
        """A pid without /proc entry (or 0) has no name, but keeps uid and gid."""
        self.assertIsNone(process_name(0))
        self.assertEqual(caller_of(Context(0, 3, 4)), CallerProcess(uid=3, gid=4))
