"""
Tests for the operator options of C{twist svc-dataplane}: C{--metrics-listen}
and C{SVC_METRICS_PATH_LABELS}, and what the server builds from them.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry
from twisted.internet.testing import MemoryReactorClock
from twisted.python.usage import UsageError
from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane.http_operator import OperatorHttp, QuietSite
from svc.dataplane.tap import DataPlaneServer
from svc.dataplane.test.test_tap import BASE, TOKEN, StaticFiles, parse
from svc.metrics import PathLabelPolicy, PathLabels
from svc.web.readiness import ReadinessProbe

LISTEN = "tcp:9464:interface=127.0.0.1"


class MetricsListenOptionTests(SynchronousTestCase):
    """--metrics-listen."""

    def test_default_none(self) -> None:
        """Without the option there is no operator listener."""
        self.assertIsNone(parse(BASE, StaticFiles(self).args()).metrics_listen)

    def test_given(self) -> None:
        """A plain stream endpoint is kept."""
        config = parse(BASE, [*StaticFiles(self).args(), "--metrics-listen", LISTEN])
        self.assertEqual(config.metrics_listen, LISTEN)

    def test_refused(self) -> None:
        """A TLS endpoint or garbage is a usage error naming --metrics-listen."""
        for bad in ("ssl:9464", "nonsense:1"):
            error = self.assertRaises(
                UsageError, parse, BASE, [*StaticFiles(self).args(), "--metrics-listen", bad]
            )
            self.assertTrue(str(error).startswith("--metrics-listen"), str(error))


class PathLabelSettingTests(SynchronousTestCase):
    """SVC_METRICS_PATH_LABELS and the server's metrics."""

    def server(self, environ: dict[str, str]) -> DataPlaneServer:
        config = parse(
            {**BASE, "SVC_TENANTS_ROOT": self.mktemp(), **environ}, StaticFiles(self).args()
        )
        reactor: Any = MemoryReactorClock()
        return DataPlaneServer(config, reactor, install_signal=None)

    def test_modes(self) -> None:
        """hash is the default; keep, drop and hash are accepted in any case."""
        self.assertIs(
            parse(BASE, StaticFiles(self).args()).settings.metrics_path_labels, PathLabels.HASH
        )
        for raw, mode in (
            ("keep", PathLabels.KEEP),
            ("DROP", PathLabels.DROP),
            ("Hash", PathLabels.HASH),
        ):
            environ = {**BASE, "SVC_METRICS_PATH_LABELS": raw}
            self.assertIs(
                parse(environ, StaticFiles(self).args()).settings.metrics_path_labels, mode
            )

    def test_refused(self) -> None:
        """Another value is a usage error naming the variable and the choices."""
        environ = {**BASE, "SVC_METRICS_PATH_LABELS": "plain"}
        error = self.assertRaises(UsageError, parse, environ, StaticFiles(self).args())
        self.assertIn("SVC_METRICS_PATH_LABELS: must be keep/hash/drop", str(error))

    def test_server_hashes_by_default(self) -> None:
        """The server's gauge is labelled with the token-keyed hash by default."""
        server = self.server({})
        server.metrics.set_lease_held("/a1/f", 1, "user-1/tenant-a")
        label = PathLabelPolicy.of(PathLabels.HASH, TOKEN).label("user-1/tenant-a", "/a1/f")
        assert label is not None
        value = server.registry.get_sample_value("svc_lease_held", {"path": label})
        self.assertEqual(value, 1.0)

    def test_server_keeps_when_asked(self) -> None:
        """SVC_METRICS_PATH_LABELS=keep labels with the path."""
        server = self.server({"SVC_METRICS_PATH_LABELS": "keep"})
        server.metrics.set_lease_held("/a1/f", 1, "user-1/tenant-a")
        value = server.registry.get_sample_value("svc_lease_held", {"path": "/a1/f"})
        self.assertEqual(value, 1.0)


class OperatorListenTests(SynchronousTestCase):
    """L{OperatorHttp.listen} opens a quiet site on the endpoint."""

    def test_listen(self) -> None:
        """The endpoint is listened on with an access-log-free site."""
        reactor = MemoryReactorClock()
        operator = OperatorHttp(CollectorRegistry(), ReadinessProbe([], reactor))
        port = self.successResultOf(operator.listen(reactor, LISTEN))
        [(number, factory, _backlog, interface)] = reactor.tcpServers
        self.assertEqual((number, interface), (9464, "127.0.0.1"))
        self.assertIsInstance(factory, QuietSite)
        self.assertIsNotNone(port)
