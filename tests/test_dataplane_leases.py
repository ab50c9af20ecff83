"""
System tests of data-plane leases between two real connections of one
agent, against a real C{twist svc-dataplane} process:

  - contention: the holder of a write lease receives a C{lease_revoke}
    PUSH when another connection waits for the path; once it releases, the
    waiter is granted;
  - a holder that ignores the revoke loses the lease after the revoke
    timeout (1 s for that process): C{lease_violation revoke_timeout} is
    audited, the waiter is granted, and the holder is fenced on the path.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import DeferredQueue
from twisted.trial.unittest import TestCase

from svc.dataplane_client.client import DataPlaneClient
from svc.dataplane_client.errors import RemoteError
from svc.metrics import PathLabelPolicy, PathLabels
from svc.testing.pki import AgentCredentials
from svc.wire.errno import WireErrno
from tests.dataplane_harness import (
    SERVICE_TOKEN,
    DataPlaneProcess,
    async_test,
    bounded,
    class_server,
    connect_agent,
    metric_sample,
    standard_server,
)

_reactor: Any = reactor

LEASE_LINE = [
    "ts",
    "event",
    "path",
    "allowed",
    "command",
    "size",
    "offset",
    "agent_id",
    "lease_id",
    "mode",
    "reason",
]

Push = tuple[str, dict[str, Any]]


class LeaseSystemCase(TestCase):
    """Shared set-up: this class's server and two-connection helpers."""

    environ: dict[str, str] = {}

    def setUp(self) -> None:
        self.server: DataPlaneProcess = class_server(
            self, lambda workdir: standard_server(workdir, self.environ)
        )
        self.pki = self.server.pki

    async def connect(self, credentials: AgentCredentials) -> DataPlaneClient:
        """An admitted client for C{credentials}, closed after the test."""
        client = await connect_agent(_reactor, self.server, credentials)
        self.addCleanup(client.close)
        return client

    async def two_connections(
        self, agent_id: str
    ) -> tuple[DataPlaneClient, DataPlaneClient, DeferredQueue[Push]]:
        """Two connections of one agent; the first one's pushes are queued."""
        credentials = self.pki.agent("tenant-a", agent_id)
        first = await self.connect(credentials)
        second = await self.connect(credentials)
        pushes: DeferredQueue[Push] = DeferredQueue()
        first.on_push(lambda op, payload, raw: pushes.put((op, dict(payload))))
        return first, second, pushes

    async def write_lease(self, client: DataPlaneClient, path: str) -> str:
        """Take a write lease at once; its id."""
        reply = await client.call("lease_grant", {"path": path, "mode": "write"})
        self.assertIs(reply.payload["granted"], True, reply)
        self.assertEqual(reply.payload["mode"], "write")
        return str(reply.payload["lease_id"])

    def lease_lines(self, lease_id: str, event: str) -> list[dict[str, Any]]:
        """The audit lines of C{event} about C{lease_id} (waits for one)."""
        return self.server.wait_for_audit(
            lambda r: r["event"] == event and r.get("lease_id") == lease_id
        )


class LeaseContentionTests(LeaseSystemCase):
    """
    A cooperative holder: revoked, releases, the waiter gets the lease.
    """

    environ = {"SVC_LEASE_REVOKE_TIMEOUT_SECONDS": "60"}

    @async_test
    async def test_revoke_release_grant(self) -> None:
        """The holder is pushed lease_revoke; once it releases, the waiting one is granted."""
        first, second, pushes = await self.two_connections("lease-1")
        path = "/lease-1/shared.txt"
        held = await self.write_lease(first, path)

        waiting = second.call("lease_grant", {"path": path, "mode": "write", "wait": True})
        op, revoke = await bounded(pushes.get(), _reactor)
        self.assertEqual(op, "lease_revoke")
        self.assertEqual(
            (revoke["lease_id"], revoke["path"], revoke["mode"], revoke["reason"]),
            (held, path, "write", "contention"),
        )
        self.assertGreater(revoke["deadline_ms"], 0)
        # Nothing was released yet and the revoke timeout is a minute away.
        self.assertFalse(waiting.called)

        await first.call("lease_release", {"lease_id": held})
        granted = await bounded(waiting, _reactor)
        self.assertIs(granted.payload["granted"], True)
        taken = str(granted.payload["lease_id"])
        self.assertNotEqual(taken, held)

        [revoked] = self.lease_lines(held, "lease_revoke")
        self.assertEqual(list(revoked), LEASE_LINE)
        self.assertEqual(
            (revoked["agent_id"], revoked["path"], revoked["reason"], revoked["allowed"]),
            ("lease-1", path, "contention", True),
        )
        [released] = self.lease_lines(held, "lease_release")
        self.assertEqual(released["reason"], "client")
        self.lease_lines(taken, "lease_grant")
        # By default the path label is hashed (SVC_METRICS_PATH_LABELS=hash).
        label = PathLabelPolicy.of(PathLabels.HASH, SERVICE_TOKEN).label("user-1/tenant-a", path)
        assert label is not None
        exposition = self.server.metrics_text()
        self.assertEqual(metric_sample(exposition, "svc_lease_held", path=label), 1.0)
        self.assertNotIn(path, exposition)


class RevokeTimeoutTests(LeaseSystemCase):
    """
    A holder that ignores the revoke (revoke timeout 1 s in this process).
    """

    environ = {"SVC_LEASE_REVOKE_TIMEOUT_SECONDS": "1"}

    @async_test
    async def test_ignored_revoke_is_a_violation(self) -> None:
        """An ignored revoke is audited as lease_violation revoke_timeout; the waiter wins."""
        first, second, pushes = await self.two_connections("lease-2")
        path = "/lease-2/contended.txt"
        held = await self.write_lease(first, path)

        waiting = second.call("lease_grant", {"path": path, "mode": "write", "wait": True})
        op, revoke = await bounded(pushes.get(), _reactor)
        self.assertEqual((op, revoke["lease_id"]), ("lease_revoke", held))
        granted = await bounded(waiting, _reactor)
        self.assertIs(granted.payload["granted"], True)

        [violation] = self.lease_lines(held, "lease_violation")
        self.assertEqual(list(violation), LEASE_LINE)
        self.assertEqual(
            {k: violation[k] for k in ("path", "allowed", "command", "agent_id", "mode", "reason")},
            {
                "path": path,
                "allowed": True,
                "command": "svc-server",
                "agent_id": "lease-2",
                "mode": "write",
                "reason": "revoke_timeout",
            },
        )
        # The dropped holder is fenced on the path.
        with self.assertRaises(RemoteError) as raised:
            await first.call(
                "manifest_put",
                {
                    "path": path,
                    "expected_version": 0,
                    "chunks": [],
                    "size": 0,
                    "mode": 0o644,
                    "mtime_ns": 1,
                },
            )
        self.assertEqual(raised.exception.errno, WireErrno.ESTALE)
        self.assertEqual(raised.exception.details.get("reason"), "lease_conflict")
