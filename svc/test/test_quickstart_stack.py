"""
Tests for L{svc.quickstart_stack.Stack.running}: a pid file counts only while its
process is this stack's (a reused pid must never be signalled).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from svc.quickstart_stack import Stack


class RunningTests(SynchronousTestCase):
    """L{Stack.running}."""

    def setUp(self) -> None:
        self.root = Path(self.mktemp())
        self.root.mkdir()
        self.stack = Stack(self.root)

    def pid_file(self, name: str, content: str) -> None:
        (self.root / f"{name}.pid").write_text(content)

    def test_our_process_counts(self) -> None:
        """A live process started as svc-mount is the stack's mount."""
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "svc-mount"])
        self.addCleanup(child.wait)
        self.addCleanup(child.kill)
        self.pid_file("mount", str(child.pid))
        self.assertEqual(self.stack.running("mount"), child.pid)
        self.assertIsNone(self.stack.running("dataplane"))

    def test_stranger_gone_or_garbage_does_not(self) -> None:
        """Another program behind the pid, no such process, or a bad file: not running."""
        self.pid_file("mount", str(os.getpid()))  # the test runner, not a mount
        self.assertIsNone(self.stack.running("mount"))
        self.pid_file("control", "999999999")
        self.assertIsNone(self.stack.running("control"))
        self.pid_file("dataplane", "not a pid")
        self.assertIsNone(self.stack.running("dataplane"))
        self.assertIsNone(self.stack.running("nothing-written"))
