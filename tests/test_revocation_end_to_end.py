"""
Revocation across real processes: releasing a mount lease at a real control
plane puts the agent's leaf serial on the deny-list, the control plane pushes
it to the real data-plane server, and the server closes the agent's live
connection and refuses new ones.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater
from twisted.trial.unittest import TestCase

from svc.dataplane.client import DataPlaneClient, connect_dataplane
from svc.dataplane.client_errors import AdmissionFailed
from svc.pki.pem import cert_from_pem, certs_from_pem, key_from_pem
from svc.pki.tls import client_tls_options
from svc.quickstart import http

REPO = Path(__file__).resolve().parent.parent
PUSH_INTERVAL = 2


class RevocationPushTests(TestCase):
    """
    The deny-list reaches a running data plane within one push interval.
    """

    def setUp(self) -> None:
        self.state_dir = Path(self.mktemp()).resolve()
        environ = {**os.environ, "SVC_REVOCATION_PUSH_INTERVAL_SECONDS": str(PUSH_INTERVAL)}
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

    def connect(self) -> Deferred[DataPlaneClient]:
        agent = self.state_dir / "agent"
        chain = certs_from_pem((agent / "chain.pem").read_bytes())
        tls = client_tls_options(
            cert_from_pem((agent / "leaf.pem").read_bytes()),
            key_from_pem((agent / "key.pem").read_bytes()),
            chain[:-1],
            chain[-1],
            self.state["server_name"],
        )
        host, port = self.state["server_addr"].rsplit(":", 1)
        return connect_dataplane(reactor, (host, int(port)), tls)

    async def test_release_closes_live_connection(self) -> None:
        """After DELETE /allocations/{id}/mount the live connection ends; a new one is refused."""
        client = await self.connect()
        await client.call("ping", {})
        closed = client.when_closed()
        fingerprint = self.state["agent_fingerprint"]
        control = f"http://127.0.0.1:{self.state['control_port']}"
        url = f"{control}/allocations/{self.state['allocation_id']}/mount"
        status, body = http("DELETE", url, {"agent_fingerprint": fingerprint})
        self.assertEqual(status, 204, body)
        # The release pushes at once; allow up to two push intervals (plus start-up slack).
        for _ in range(PUSH_INTERVAL * 10 + 20):
            if closed.called:
                break
            await deferLater(reactor, 0.5, lambda: None)
        self.assertTrue(closed.called, "the data plane kept the revoked agent connected")
        with self.assertRaises(AdmissionFailed):
            await self.connect()
