"""
The data-plane server's operator surface as a real C{twist svc-dataplane}
process: the operator listener (C{--metrics-listen}, plain HTTP) serves
C{/metrics}, C{/healthz} and C{/readyz}, and C{/metrics} then leaves the
HTTPS surface agents reach; C{/readyz} answers on both; a held lease's
path reaches the exposition only as its hash (the default) or not at all.
"""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from twisted.internet import reactor
from twisted.trial.unittest import TestCase

from svc.metrics import PathLabelPolicy, PathLabels
from tests.dataplane_harness import (
    SERVICE_TOKEN,
    DataPlaneProcess,
    DiskPKI,
    async_test,
    class_server,
    connect_agent,
    metric_sample,
)

_reactor: Any = reactor

READY = {
    "status": "ready",
    "checks": {"storage": "ok", "credentials": "ok", "listeners": "ok"},
}


def lease_labels(exposition: str) -> list[str]:
    """The path labels of the svc_lease_held series."""
    return [
        sample.labels["path"]
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
        if sample.name == "svc_lease_held"
    ]


class OperatorListenerTests(TestCase):
    """A server started with --metrics-listen (path labels hashed, the default)."""

    def setUp(self) -> None:
        self.server: DataPlaneProcess = class_server(
            self,
            lambda workdir: DataPlaneProcess(
                workdir, DiskPKI.create(workdir / "pki"), operator_listener=True
            ),
        )

    def test_metrics_only_on_the_operator_listener(self) -> None:
        """/metrics answers on the plain-HTTP listener and is 404 on the HTTPS surface."""
        answer = self.server.operator("/metrics")
        self.assertEqual(answer.status, 200)
        self.assertIn(b"# TYPE svc_dataplane_op_duration_seconds histogram", answer.body)
        hidden = self.server.https("GET", "/metrics")
        self.assertEqual((hidden.status, hidden.json()), (404, {"error": "not_found"}))

    def test_probes(self) -> None:
        """/healthz and /readyz answer on both listeners; the started server is ready."""
        self.assertEqual(self.server.operator("/healthz").status, 200)
        for answer in (self.server.operator("/readyz"), self.server.https("GET", "/readyz")):
            self.assertEqual((answer.status, answer.json()), (200, READY))

    @async_test
    async def test_lease_path_hashed(self) -> None:
        """A held lease's series is labelled by the keyed hash; the file name is nowhere."""
        client = await connect_agent(
            _reactor, self.server, self.server.pki.agent("tenant-a", "op-1")
        )
        self.addCleanup(client.close)
        path = "/op-1/quarterly-secrets.txt"
        reply = await client.call("lease_grant", {"path": path, "mode": "write"})
        self.assertIs(reply.payload["granted"], True, reply)
        exposition = self.server.metrics_text()
        policy = PathLabelPolicy.of(PathLabels.HASH, SERVICE_TOKEN)
        label = policy.label("user-1/tenant-a", path)
        assert label is not None
        self.assertEqual(metric_sample(exposition, "svc_lease_held", path=label), 1.0)
        self.assertNotIn("quarterly-secrets", exposition)


class DroppedPathLabelTests(TestCase):
    """A server with SVC_METRICS_PATH_LABELS=drop and no operator listener."""

    def setUp(self) -> None:
        self.server: DataPlaneProcess = class_server(
            self,
            lambda workdir: DataPlaneProcess(
                workdir, DiskPKI.create(workdir / "pki"), {"SVC_METRICS_PATH_LABELS": "drop"}
            ),
        )

    @async_test
    async def test_no_lease_series(self) -> None:
        """A held lease makes no svc_lease_held series; /metrics stays on HTTPS."""
        client = await connect_agent(
            _reactor, self.server, self.server.pki.agent("tenant-a", "op-2")
        )
        self.addCleanup(client.close)
        reply = await client.call("lease_grant", {"path": "/op-2/f", "mode": "write"})
        self.assertIs(reply.payload["granted"], True, reply)
        exposition = self.server.metrics_text()
        self.assertIn("# TYPE svc_lease_held gauge", exposition)
        self.assertEqual(lease_labels(exposition), [])
        answer = self.server.https("GET", "/readyz")
        self.assertEqual((answer.status, answer.json()), (200, READY))
