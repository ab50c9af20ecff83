"""
Revocation across real processes: releasing a mount lease at a real control
plane puts the agent's leaf serial on the deny-list, the control plane pushes
it to the real data-plane server, and the server closes the agent's live
connection and refuses new ones. The same holds for a connection opened with
a leaf the agent has since renewed, and, when the service revokes the
allocation, for a second enrollment of the agent that never held the lease.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater
from twisted.trial.unittest import TestCase

from svc.control.agent_auth import sign_request
from svc.dataplane_client.client import DataPlaneClient
from svc.dataplane_client.errors import AdmissionFailed
from svc.pki.pem import cert_from_pem, key_from_pem
from svc.quickstart import http
from tests.json_logs import JSON_LOGS, check_json_log, stack_logs
from tests.mount_harness import connect_enrolled

REPO = Path(__file__).resolve().parent.parent
PUSH_INTERVAL = 2


class RevocationPushTests(TestCase):
    """
    The deny-list reaches a running data plane within one push interval.
    """

    def setUp(self) -> None:
        self.state_dir = Path(self.mktemp()).resolve()
        environ = {
            **os.environ,
            **JSON_LOGS,
            "SVC_REVOCATION_PUSH_INTERVAL_SECONDS": str(PUSH_INTERVAL),
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
        self.state: dict[str, Any] = json.loads((self.state_dir / "state.json").read_text())

    def enroll(self, take_lease: bool = True) -> dict[str, Any]:
        """A fresh enrollment of the demo agent, holding its mount lease if C{take_lease}."""
        control = f"http://127.0.0.1:{self.state['control_port']}"
        status, minted = http(
            "POST", control + "/v1/agents/demo-agent/enroll-token", {}, self.state["token"]
        )
        self.assertEqual(status, 200, minted)
        status, enrolled = http("POST", control + "/agent/enroll", None, minted["token"])
        self.assertEqual(status, 200, enrolled)
        enrollment: dict[str, Any] = enrolled
        mount = f"{control}/allocations/{self.state['allocation_id']}/mount"
        if take_lease:
            proof = {"agent_fingerprint": enrollment["agent_fingerprint"], "force": True}
            status, lease = http("POST", mount, proof)
            self.assertEqual(status, 200, lease)
        enrollment["mount_url"] = mount
        return enrollment

    def connect(self, enrollment: dict[str, Any]) -> Deferred[DataPlaneClient]:
        return Deferred.fromCoroutine(connect_enrolled(enrollment))

    def try_renew(self, enrollment: dict[str, Any]) -> tuple[int, Any]:
        """C{POST /agent/renew} signed with C{enrollment}'s key: status and body."""
        control = f"http://127.0.0.1:{self.state['control_port']}"
        key: Any = key_from_pem(enrollment["client_key_pem"].encode())
        leaf = cert_from_pem(enrollment["client_cert_pem"].encode())
        body: dict[str, Any] = sign_request(
            key, leaf, "POST", "/agent/renew", int(time.time() * 1000)
        )
        body["ca_chain_pem"] = enrollment["ca_chain_pem"]
        return http("POST", control + "/agent/renew", body)

    def renew(self, enrollment: dict[str, Any]) -> dict[str, Any]:
        """C{POST /agent/renew} signed with C{enrollment}'s key: the new enrollment."""
        status, body = self.try_renew(enrollment)
        self.assertEqual(status, 200, body)
        renewed: dict[str, Any] = body
        renewed["mount_url"] = enrollment["mount_url"]
        return renewed

    async def assertClosed(self, closed: Deferred[Any], what: str) -> None:
        """C{closed} fires within two push intervals (plus start-up slack)."""
        for _ in range(PUSH_INTERVAL * 10 + 20):
            if closed.called:
                break
            await deferLater(reactor, 0.5, lambda: None)
        self.assertTrue(closed.called, f"the data plane kept {what} connected")

    async def test_release_after_renewal_closes_connection_of_older_leaf(self) -> None:
        """Releasing with a renewed leaf ends the connection opened with the leaf renewed from."""
        enrollment = self.enroll()
        client = await self.connect(enrollment)
        await client.call("ping", {})
        closed = client.when_closed()
        renewed = self.renew(enrollment)
        release = {"agent_fingerprint": renewed["agent_fingerprint"]}
        status, body = http("DELETE", renewed["mount_url"], release)
        self.assertEqual(status, 204, body)
        await self.assertClosed(closed, "the connection of the leaf renewed from")
        for leaf in (enrollment, renewed):
            with self.assertRaises(AdmissionFailed):
                await self.connect(leaf)

    async def test_release_closes_live_connection(self) -> None:
        """After DELETE /allocations/{id}/mount the live connection ends; a new one is refused."""
        enrollment = self.enroll()
        client = await self.connect(enrollment)
        await client.call("ping", {})
        closed = client.when_closed()
        fingerprint = enrollment["agent_fingerprint"]
        status, body = http("DELETE", enrollment["mount_url"], {"agent_fingerprint": fingerprint})
        self.assertEqual(status, 204, body)
        # The release pushes at once; allow up to two push intervals (plus start-up slack).
        for _ in range(PUSH_INTERVAL * 10 + 20):
            if closed.called:
                break
            await deferLater(reactor, 0.5, lambda: None)
        self.assertTrue(closed.called, "the data plane kept the revoked agent connected")
        with self.assertRaises(AdmissionFailed):
            await self.connect(enrollment)

    async def test_service_revocation_closes_second_enrollment(self) -> None:
        """
        When the service revokes the allocation, a second enrollment of the
        agent that never held the lease is cut off too: its live connection
        ends, a new one is refused and its renewal is 410 revoked.
        """
        holder = self.enroll()
        second = self.enroll(take_lease=False)
        clients = [await self.connect(second), await self.connect(holder)]
        for client in clients:
            await client.call("ping", {})
        closed = [client.when_closed() for client in clients]
        control = f"http://127.0.0.1:{self.state['control_port']}"
        status, body = http(
            "DELETE", control + "/v1/entities/agent/demo-agent", None, self.state["token"]
        )
        self.assertEqual(status, 204, body)
        await self.assertClosed(closed[0], "the second enrollment")
        await self.assertClosed(closed[1], "the lease holder")
        with self.assertRaises(AdmissionFailed):
            await self.connect(second)
        status, body = self.try_renew(second)
        self.assertEqual((status, body["error"]), (410, "revoked"), body)
