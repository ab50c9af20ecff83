"""
The data plane's deny-list across pushes and restarts, with real processes:

  - pushes merge: a serial a later push leaves out is still refused;
  - a revoked leaf is refused on its first attempt after the data plane
    restarts, because the server kept its deny-list on disk
    (C{SVC_STATE_DIR/deny-list.json});
  - a leaf revoked at the real control plane while the data plane was down
    is refused on its first attempt after the data plane starts again,
    because the server pulls the revocation set (C{GET
    /control/cert-revocations}) before it accepts agents — long before the
    next push (the control plane here pushes only every 60 s).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from twisted.internet import reactor
from twisted.trial.unittest import TestCase

from svc.dataplane_client.errors import AdmissionFailed
from svc.quickstart import http, start_dataplane, wait_until
from svc.quickstart_stack import Stack
from tests.dataplane_harness import (
    DataPlaneProcess,
    async_test,
    connect_agent,
    serial_of,
    standard_server,
)
from tests.json_logs import JSON_LOGS, check_json_log, stack_logs
from tests.mount_harness import connect_enrolled

_reactor: Any = reactor
REPO = Path(__file__).resolve().parent.parent


class KeptDenyListTests(TestCase):
    """A static-certificate server merges pushes and keeps the result on disk."""

    def setUp(self) -> None:
        self.server: DataPlaneProcess = standard_server(Path(self.mktemp()).resolve())
        self.addCleanup(self.server.stop)
        self.server.start()
        self.pki = self.server.pki

    async def assertRefused(self, credentials: Any) -> None:
        """The first connection attempt of C{credentials} gets no HELLO."""
        try:
            client = await connect_agent(_reactor, self.server, credentials)
        except AdmissionFailed:
            return
        await client.close()
        raise self.failureException("the connection was admitted")

    async def assertAdmitted(self, credentials: Any) -> None:
        client = await connect_agent(_reactor, self.server, credentials)
        await client.call("ping")
        await client.close()

    @async_test
    async def test_left_out_serial_stays_denied(self) -> None:
        """After a push of X then a push of only Y, X is still refused."""
        x = self.pki.agent("tenant-a", "agent-1")
        y = self.pki.agent("tenant-a", "agent-2")
        self.server.push_revocations([serial_of(x)])
        self.server.push_revocations([serial_of(y)])
        await self.assertRefused(x)
        await self.assertRefused(y)
        await self.assertAdmitted(self.pki.agent("tenant-a", "agent-3"))

    @async_test
    async def test_revoked_leaf_refused_first_time_after_restart(self) -> None:
        """A pushed serial is refused on the first attempt after a restart; others admitted."""
        revoked = self.pki.agent("tenant-a", "agent-1")
        self.server.push_revocations([serial_of(revoked)])
        self.server.stop()
        self.server.start()
        await self.assertRefused(revoked)
        await self.assertAdmitted(self.pki.agent("tenant-a", "agent-2"))
        kept = json.loads(
            (self.server.workdir / "svc-dataplane-state" / "deny-list.json").read_text()
        )
        self.assertEqual([e["serial"] for e in kept["revocations"]], [serial_of(revoked)])


def gone(pid: int) -> bool:
    """Whether process C{pid} no longer exists (it is not this process's child)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


class PulledDenyListTests(TestCase):
    """A data plane that was down while a leaf was revoked refuses it at once on start."""

    def setUp(self) -> None:
        self.state_dir = Path(self.mktemp()).resolve()
        environ = {
            **os.environ,
            **JSON_LOGS,
            "SVC_REVOCATION_PUSH_INTERVAL_SECONDS": "60",
        }
        self.addCleanup(check_json_log, stack_logs(self.state_dir))
        started = subprocess.run(
            [sys.executable, "-m", "svc.quickstart", "start", "--dir", str(self.state_dir)],
            cwd=REPO,
            env=environ,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        self.addCleanup(
            subprocess.run,
            [sys.executable, "-m", "svc.quickstart", "stop", "--dir", str(self.state_dir)],
            cwd=REPO,
            capture_output=True,
            timeout=120,
            check=False,
        )
        self.assertEqual(started.returncode, 0, started.stdout + started.stderr)
        self.stack = Stack(self.state_dir)
        self.state: dict[str, Any] = json.loads((self.state_dir / "state.json").read_text())
        self.control = f"http://127.0.0.1:{self.state['control_port']}"

    def enroll(self) -> dict[str, Any]:
        """A fresh enrollment of the demo agent holding its mount lease."""
        status, minted = http(
            "POST", self.control + "/v1/agents/demo-agent/enroll-token", {}, self.state["token"]
        )
        self.assertEqual(status, 200, minted)
        status, enrolled = http("POST", self.control + "/agent/enroll", None, minted["token"])
        self.assertEqual(status, 200, enrolled)
        enrollment: dict[str, Any] = enrolled
        mount = f"{self.control}/allocations/{self.state['allocation_id']}/mount"
        proof = {"agent_fingerprint": enrollment["agent_fingerprint"], "force": True}
        status, lease = http("POST", mount, proof)
        self.assertEqual(status, 200, lease)
        enrollment["mount_url"] = mount
        return enrollment

    def stop_dataplane(self) -> None:
        """SIGTERM the running data plane and wait until it is gone."""
        pid = self.stack.running("dataplane")
        assert pid is not None
        os.kill(pid, signal.SIGTERM)
        wait_until("the data plane to stop", lambda: gone(pid))

    def restart_dataplane(self) -> None:
        """Start the data plane again (a child of this process, reaped at cleanup)."""
        pid = start_dataplane(self.stack, self.state)

        def reap() -> None:
            if gone(pid):
                return
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 20
            while os.waitpid(pid, os.WNOHANG) == (0, 0):
                if time.monotonic() > deadline:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    break
                time.sleep(0.05)

        self.addCleanup(reap)

    @async_test
    async def test_revoked_while_down_refused_on_first_attempt(self) -> None:
        """Release the lease while the data plane is down; its first connection after is refused."""
        enrollment = self.enroll()
        client = await connect_enrolled(enrollment)
        await client.call("ping")
        await client.close()
        self.stop_dataplane()
        release = {"agent_fingerprint": enrollment["agent_fingerprint"]}
        status, body = http("DELETE", enrollment["mount_url"], release)
        self.assertEqual(status, 204, body)
        self.restart_dataplane()
        port = self.state["dataplane_port"]
        wait_until("the frame listener", lambda: _port_open(port))
        try:
            client = await connect_enrolled(enrollment)
        except AdmissionFailed:
            pass
        else:
            await client.close()
            self.fail("the leaf revoked while the data plane was down was admitted")
        fresh = self.enroll()
        client = await connect_enrolled(fresh)
        await client.call("ping")
        await client.close()


def _port_open(port: int) -> bool:
    """Whether something listens on 127.0.0.1:C{port}."""
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", port)) == 0
