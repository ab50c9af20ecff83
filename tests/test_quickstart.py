"""
The demo stack behind C{scripts/demo}: real control-plane and data-plane
processes, a provisioned and enrolled agent, a file written and read back,
and a stop that leaves no process behind.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
import urllib.parse
from pathlib import Path

from twisted.trial.unittest import TestCase

from svc.quickstart import DEMO_AGENT, DEMO_GRANT, fuse_available
from svc.quickstart import http as json_request
from tests.json_logs import JSON_LOGS, check_json_log, stack_logs

REPO = Path(__file__).resolve().parent.parent


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _get_without_redirect(url: str) -> tuple[int, str]:
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.netloc, timeout=30)
    try:
        connection.request("GET", f"{parts.path}?{parts.query}")
        response = connection.getresponse()
        response.read()
        return response.status, response.getheader("Set-Cookie") or ""
    finally:
        connection.close()


class QuickstartTests(TestCase):
    """
    C{python -m svc.quickstart start} then C{stop}.
    """

    def quickstart(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "svc.quickstart", *args, "--dir", str(self.state)],
            cwd=REPO,
            env={**os.environ, **JSON_LOGS},
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )

    def setUp(self) -> None:
        self.state = Path(self.mktemp()).resolve()
        self.addCleanup(check_json_log, stack_logs(self.state))
        self.addCleanup(self.quickstart, "stop")

    def assert_sign_in_link_works(self, output: str) -> None:
        """The printed dashboard link signs the demo owner in, once."""
        [url] = re.findall(r"(http://127\.0\.0\.1:\d+/admin/session\?token=\S+)", output)
        status, cookie = _get_without_redirect(url)
        self.assertEqual(status, 303)
        self.assertTrue(cookie.startswith("svc_admin_session="), cookie)
        self.assertEqual(_get_without_redirect(url)[0], 401)

    def test_start_writes_and_stop_cleans_up(self) -> None:
        """
        The demo writes a file over mTLS and through the mount; stop ends and
        unmounts all; a second start reuses the data and keeps a quota the
        owner changed meanwhile.
        """
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
        self.assert_sign_in_link_works(started.stdout)
        self.assert_sign_in_link_works(self.quickstart("link").stdout)
        # The owner raises the demo agent's quota; the next start keeps it.
        status, _ = json_request(
            "PATCH",
            f"http://127.0.0.1:{state['control_port']}/v1/entities/agent/{DEMO_AGENT}",
            {"grant_bytes": 3 * DEMO_GRANT},
            state["token"],
        )
        self.assertEqual(status, 200)
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
        self.assertIn(f"keeps the quota its owner set: {3 * DEMO_GRANT} bytes", again.stdout)
