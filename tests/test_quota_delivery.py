"""
Quota delivery across real processes: an account budget set while the
owner's tenant has no data-plane server yet is enforced by the server the
tenant is placed on at its first enrollment (C{chunk_put} answers
C{EDQUOT}), and still after both processes restart.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from twisted.internet import reactor
from twisted.internet.task import deferLater
from twisted.trial.unittest import TestCase

from svc.chunking import chunk_bytes
from svc.dataplane_client.client import DataPlaneClient
from svc.dataplane_client.errors import RemoteError
from svc.quickstart import http, sdk_client, start_processes, wait_until
from svc.quickstart_stack import Stack
from svc.wire.errno import WireErrno
from tests.json_logs import JSON_LOGS, check_json_log, stack_logs
from tests.mount_harness import connect_enrolled

OWNER = "budget-owner"
AGENT = "budget-agent"
BUDGET = 1000
"""Bytes: less than one chunk of the uploads below."""
CHUNK = 4096
DELIVERY_TIMEOUT = 30.0


def port_open(port: int) -> bool:
    """Whether something listens on 127.0.0.1:C{port}."""
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def stop_stack(stack: Stack, timeout: float = 20.0) -> None:
    """
    Stop the stack's processes, reaping them: they are this process's
    children, so L{Stack.stop} would wait on their zombies.
    """
    for name in ("dataplane", "control"):
        pid = stack.running(name)
        if pid is None:
            continue
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                break
            time.sleep(0.05)
        (stack.root / f"{name}.pid").unlink()


class BudgetBeforePlacementTests(TestCase):
    """A budget set before the tenant's placement reaches its data plane."""

    def setUp(self) -> None:
        self.stack = Stack(Path(self.mktemp()))
        self.stack.root.mkdir(parents=True)
        self.state = self.stack.first_time_state()
        self.stack.save_state(self.state)
        environ = {**self.stack.control_environ(self.state), **JSON_LOGS}
        (self.stack.root / "secrets").mkdir(mode=0o700)
        subprocess.run(
            [self.stack._bin("svc"), "ca", "init"],
            env=environ,
            cwd=self.stack.root,
            check=True,
            capture_output=True,
            timeout=60,
        )
        self.addCleanup(check_json_log, stack_logs(self.stack.root))
        self.addCleanup(stop_stack, self.stack)
        self.control_url = start_processes(self.stack, self.state, environ)

    def enroll(self) -> dict[str, Any]:
        """Enroll the agent once the data plane has registered (503 until then)."""
        client = sdk_client(self.stack, self.state, self.control_url)

        def enrolled() -> Any:
            token = client.mint_enroll_token(AGENT).token
            status, body = http("POST", self.control_url + "/agent/enroll", None, token)
            if status == 503:
                return None
            self.assertEqual(status, 200, body)
            return body

        enrollment: dict[str, Any] = wait_until("enrollment", enrolled)
        return enrollment

    async def upload_refused(self, client: DataPlaneClient) -> bool:
        """Whether C{chunk_put} of new bytes (one chunk over the budget) is EDQUOT."""
        data = os.urandom(CHUNK)
        (ref,) = chunk_bytes(data)
        try:
            await client.call("chunk_put", {"hash": ref.hash}, data)
        except RemoteError as error:
            if error.errno != WireErrno.EDQUOT:
                raise
            return True
        return False

    async def refused_within(self, enrollment: dict[str, Any], seconds: float) -> bool:
        """Whether uploads start being refused with EDQUOT within C{seconds}."""
        client = await connect_enrolled(enrollment)
        try:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                if await self.upload_refused(client):
                    return True
                await deferLater(reactor, 0.25, lambda: None)
            return False
        finally:
            await client.close()

    async def test_budget_enforced_after_first_enrollment_and_restart(self) -> None:
        """EDQUOT for a budget set before enrollment placed the tenant, also after a restart."""
        sdk = sdk_client(self.stack, self.state, self.control_url)
        sdk.allocate_disk(AGENT, OWNER, 1 << 30)
        self.assertEqual(sdk.set_account_budget(OWNER, BUDGET).budget_bytes, BUDGET)
        enrollment = self.enroll()
        self.assertTrue(
            await self.refused_within(enrollment, DELIVERY_TIMEOUT),
            "the data plane never enforced the budget set before placement",
        )
        budget_file = self.stack.root / "tenants" / OWNER / "account.json"
        self.assertTrue(budget_file.exists())
        # Both processes restart: the control plane's memory is gone, the
        # data plane must keep the budget from its own files.
        stop_stack(self.stack)
        environ = {**self.stack.control_environ(self.state), **JSON_LOGS}
        self.control_url = start_processes(self.stack, self.state, environ)
        wait_until("the data plane", lambda: port_open(self.state["dataplane_port"]))
        self.assertTrue(await self.refused_within(enrollment, 0.1))
