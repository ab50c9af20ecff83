"""
A real mount outlives its data-plane connections: a data-plane process
killed and started again, and the server's idle timeout, each end the
connection; the mount reconnects on its next request, and a write made
while the data plane is down waits for it instead of failing.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

from svc.quickstart import Stack, start_dataplane
from tests.mount_harness import MountStackCase

IDLE_SECONDS = 2
"""The restarted data plane's idle timeout (SVC_IDLE_TIMEOUT_SECONDS)."""


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


class MountReconnectTests(MountStackCase):
    """
    The mount keeps working across data-plane restarts and idle timeouts.
    """

    def kill_dataplane(self) -> None:
        """SIGKILL the data-plane process and wait until its port is closed."""
        pid = int((self.stack / "dataplane.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while port_open(self.state["dataplane_port"]):
            self.assertLess(time.monotonic(), deadline, "the data plane's port stayed open")
            time.sleep(0.1)

    def start_dataplane(self) -> None:
        """Start it again (short idle timeout) and wait for its frame port."""
        start_dataplane(
            Stack(self.stack), self.state, {"SVC_IDLE_TIMEOUT_SECONDS": str(IDLE_SECONDS)}
        )
        deadline = time.monotonic() + 60
        while not port_open(self.state["dataplane_port"]):
            self.assertLess(time.monotonic(), deadline, "the data plane did not come back")
            time.sleep(0.1)

    def test_writes_survive_restart_outage_and_idle_timeout(self) -> None:
        """Data written before, during and after an outage and an idle period is all there."""
        mount = self.mount()
        self.sh("mkdir work && echo before > work/before.txt && cat work/before.txt", mount)

        self.kill_dataplane()
        # A write while the data plane is down waits for it (close commits).
        writer = subprocess.Popen(
            ["sh", "-euc", "echo during > work/during.txt"], cwd=self.mount_point
        )
        time.sleep(1.5)
        self.assertIsNone(writer.poll(), "the close waited for the data plane")
        self.start_dataplane()
        self.assertEqual(writer.wait(60), 0, mount.log.read_text(errors="replace"))

        self.sh("echo after > work/after.txt", mount)
        time.sleep(IDLE_SECONDS * 2)  # the server ends the idle connection
        self.sh("echo idle > work/idle.txt && cat work/before.txt work/after.txt", mount)
        self.unmount(mount)

        log = mount.log.read_text(errors="replace")
        self.assertIn("data-plane connection ended", log)
        self.assertIn("GOAWAY idle_timeout", log)

        fresh = self.mount(cache=self.tmp / "fresh-cache")
        contents = {
            name: (self.mount_point / "work" / f"{name}.txt").read_text()
            for name in ("before", "during", "after", "idle")
        }
        self.assertEqual(
            contents,
            {"before": "before\n", "during": "during\n", "after": "after\n", "idle": "idle\n"},
        )
        self.unmount(fresh)
