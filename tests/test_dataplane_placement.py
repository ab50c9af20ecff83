"""
The placement check across real processes: a real C{twist svc-dataplane}
(static certificates, C{SVC_PLACEMENT_CHECK} on) serves an identity only
once a grant push placed it there. A leaf signed by tenant A's intermediate
but naming another owner gets C{EACCES} on its first request and GOAWAY
C{credentials_expired}, and nothing is stored under the owner it names; the
placement survives a restart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from twisted.internet import reactor
from twisted.trial.unittest import TestCase

from svc.dataplane_client.client import DataPlaneClient
from svc.dataplane_client.errors import RemoteError
from svc.testing.pki import AgentCredentials
from svc.wire.errno import WireErrno
from tests.dataplane_harness import (
    DataPlaneProcess,
    async_test,
    bounded,
    connect_agent,
    standard_server,
)

_reactor: Any = reactor


class PlacementTests(TestCase):
    """Only the placed (owner, tenant, agent) reaches storage."""

    def setUp(self) -> None:
        workdir = Path(self.mktemp()).resolve()
        self.server: DataPlaneProcess = standard_server(workdir, {"SVC_PLACEMENT_CHECK": "on"})
        self.addCleanup(self.server.stop)
        self.server.start()
        self.pki = self.server.pki

    def place(self, owner: str, tenant: str, agent_id: str) -> None:
        """A grant push (no limit) from the control plane for that identity."""
        body = {"owner": owner, "tenant": tenant, "agent_id": agent_id, "grant_bytes": None}
        answer = self.server.https(
            "PUT", "/control/quotas", body, context=self.pki.control_ssl_context()
        )
        self.assertEqual(answer.status, 204, answer)

    async def connect(self, credentials: AgentCredentials) -> DataPlaneClient:
        client = await connect_agent(_reactor, self.server, credentials)
        self.addCleanup(client.close)
        return client

    @async_test
    async def test_other_owner_refused(self) -> None:
        """
        The placed identity writes; the same tenant and agent under another
        owner is refused (EACCES not_placed), told to go away, and leaves no
        directory for that owner.
        """
        self.place("user-1", "tenant-a", "agent-1")
        owner = await self.connect(self.pki.agent("tenant-a", "agent-1", "user-1"))
        await owner.call("dir_create", {"path": "/agent-1/d", "mode": 0o755})
        intruder = await self.connect(self.pki.agent("tenant-a", "agent-1", "user-2"))
        closed = intruder.when_closed()
        with self.assertRaises(RemoteError) as raised:
            await intruder.call("list", {"path": "/agent-1"})
        self.assertEqual(raised.exception.errno, WireErrno.EACCES)
        self.assertEqual(dict(raised.exception.details), {"reason": "not_placed"})
        await bounded(closed, _reactor)
        assert intruder.going_away is not None
        self.assertEqual(intruder.going_away.reason, "credentials_expired")
        self.assertFalse((self.server.tenants_root / "user-2").exists())
        self.server.wait_for_audit(
            lambda r: (
                r.get("event") == "list_entries"
                and r.get("allowed") is False
                and r.get("cert_subject", "").startswith("CN=user-2")
            )
        )
        self.assertIn("not placed on this server", self.server.log_text())
        await owner.call("list", {"path": "/agent-1"})

    @async_test
    async def test_placement_survives_restart(self) -> None:
        """An identity placed before a restart is served after it, without a new push."""
        self.place("user-1", "tenant-a", "agent-1")
        self.server.stop()
        self.server.start()
        client = await self.connect(self.pki.agent("tenant-a", "agent-1", "user-1"))
        await client.call("dir_create", {"path": "/agent-1/d", "mode": 0o755})
        unplaced = await self.connect(self.pki.agent("tenant-a", "agent-2", "user-1"))
        with self.assertRaises(RemoteError) as raised:
            await unplaced.call("list", {"path": "/agent-2"})
        self.assertEqual(raised.exception.errno, WireErrno.EACCES)
