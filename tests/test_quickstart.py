"""
The demo stack behind C{scripts/demo}: real control-plane and data-plane
processes, a provisioned and enrolled agent, a file written and read back,
and a stop that leaves no process behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from twisted.trial.unittest import TestCase

from svc.quickstart import fuse_available

REPO = Path(__file__).resolve().parent.parent


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class QuickstartTests(TestCase):
    """
    C{python -m svc.quickstart start} then C{stop}.
    """

    def quickstart(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "svc.quickstart", *args, "--dir", str(self.state)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )

    def setUp(self) -> None:
        self.state = Path(self.mktemp()).resolve()
        self.addCleanup(self.quickstart, "stop")

    def test_start_writes_and_stop_cleans_up(self) -> None:
        """The demo writes a file over mTLS and through the mount; stop ends and unmounts all."""
        started = self.quickstart("start")
        self.assertEqual(started.returncode, 0, started.stdout + started.stderr)
        self.assertIn("read back", started.stdout)
        self.assertIn("identical", started.stdout)
        pids = [int((self.state / f"{name}.pid").read_text()) for name in ("control", "dataplane")]
        self.assertTrue(all(_alive(pid) for pid in pids))
        state = json.loads((self.state / "state.json").read_text())
        self.assertTrue(state["session_id"].startswith("mount:"))
        audit = (self.state / "dataplane-audit.log").read_text().splitlines()
        events = [json.loads(line)["event"] for line in audit]
        self.assertIn("manifest_put", events)
        mount_point = Path(state["mount_point"])
        if fuse_available() is None:
            self.assertIn("wrote written-through-fuse.txt through the mount", started.stdout)
            self.assertTrue(os.path.ismount(mount_point))
            self.assertIn("hello.txt", os.listdir(mount_point))
            pids.append(int((self.state / "mount.pid").read_text()))
        elif os.environ.get("CI") == "true":
            self.fail(f"FUSE unavailable under CI: {fuse_available()}")
        stopped = self.quickstart("stop")
        self.assertEqual(stopped.returncode, 0, stopped.stderr)
        self.assertFalse(any(_alive(pid) for pid in pids))
        self.assertFalse(os.path.ismount(mount_point))
        self.assertFalse((self.state / "control.pid").exists())
        # A second start reuses the same CA and data (the file is there, version 2 now).
        again = self.quickstart("start")
        self.assertEqual(again.returncode, 0, again.stdout + again.stderr)
        self.assertIn("version 2", again.stdout)
