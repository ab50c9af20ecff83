"""
Tests for L{svc.control.tap}: options and configuration errors, the
optional-client-certificate TLS listener, and the service started in
process on the real reactor (loopback only).
"""

from __future__ import annotations

import base64
import json
import socket
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from treq.client import HTTPClient
from twisted.internet import reactor as global_reactor
from twisted.internet.ssl import CertificateOptions
from twisted.python import usage
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.client import Agent, HTTPConnectionPool

from svc.config import ConfigError
from svc.control.dataplane_client import AgentGrant
from svc.control.revocation_push import ControlPushLoop
from svc.control.tap import (
    DEFAULT_LISTEN,
    ControlPlaneService,
    Options,
    TapSettings,
    makeService,
)
from svc.control.test.test_tls_listener import key_pem, operator_chain, pem, tls_get
from svc.pki.filesystem import FilesystemCA
from svc.pki.tls import org_root_trust
from svc.testing.registration import registration_body

TOKEN = "service-token-" + "y" * 30
KEK = base64.b64encode(b"k" * 32).decode()
_reactor: Any = global_reactor
HEADERS: Any = {"Authorization": f"Bearer {TOKEN}"}


def options(argv: list[str], environ: dict[str, str] | None = None) -> Options:
    """Parsed options for C{argv} in C{environ}."""
    parsed = Options(environ or {})
    parsed.parseOptions(argv)
    return parsed


class OptionsTests(SynchronousTestCase):
    """Command line and environment checks, all before anything starts."""

    def test_default_listen(self) -> None:
        """Without listeners the default loopback HTTP listener is used."""
        self.assertEqual(options([])["listen"], [DEFAULT_LISTEN])
        self.assertEqual(options([])["tls_listen"], [])

    def test_repeatable_listen(self) -> None:
        """--listen may be given several times."""
        parsed = options(["--listen", "tcp:1", "-l", "tcp:2:interface=127.0.0.1"])
        self.assertEqual(parsed["listen"], ["tcp:1", "tcp:2:interface=127.0.0.1"])

    def test_bad_endpoint(self) -> None:
        """A malformed endpoint description is a usage error naming the option."""
        error = self.assertRaises(usage.UsageError, options, ["--listen", "nonsense:1"])
        self.assertIn("--listen", str(error))

    def test_config_error_names_variable(self) -> None:
        """A bad variable is a usage error naming it."""
        error = self.assertRaises(usage.UsageError, options, [], {"DATABASE_URL": "mysql://x/y"})
        self.assertIn("DATABASE_URL", str(error))
        error = self.assertRaises(
            usage.UsageError, options, [], {"SVC_MOUNT_LEASE_TTL_SECONDS": "5"}
        )
        self.assertIn("SVC_MOUNT_LEASE_TTL_SECONDS", str(error))

    def test_tls_listen_needs_ca(self) -> None:
        """--tls-listen without a database and an agent CA is refused."""
        error = self.assertRaises(usage.UsageError, options, ["--tls-listen", "tcp:0"])
        self.assertIn("--tls-listen", str(error))

    def test_make_service(self) -> None:
        """makeService builds the control-plane service without starting it."""
        service = makeService(options(["--listen", "tcp:0"]))
        self.assertIsInstance(service, ControlPlaneService)
        self.assertFalse(service.running)


class TapSettingsTests(SynchronousTestCase):
    """The variables only the tap reads."""

    def test_defaults(self) -> None:
        """Unset variables take the documented defaults."""
        self.assertEqual(TapSettings.from_environ({}), TapSettings(120, 60, 15, "localhost"))

    def test_values(self) -> None:
        """Set variables are read."""
        settings = TapSettings.from_environ(
            {
                "SVC_MOUNT_LEASE_TTL_SECONDS": "300",
                "SVC_REVOCATION_PUSH_INTERVAL_SECONDS": "5",
                "SVC_DATAPLANE_CALL_TIMEOUT_SECONDS": "3",
                "SVC_CONTROL_FQDN": "Control.Example",
            }
        )
        self.assertEqual(settings, TapSettings(300, 5, 3, "control.example"))

    def test_operator_certificate_files(self) -> None:
        """The operator's TLS files are read as a pair; one without the other is refused."""
        settings = TapSettings.from_environ(
            {"SVC_CONTROL_TLS_CERT_FILE": "/etc/c.pem", "SVC_CONTROL_TLS_KEY_FILE": "/etc/k.pem"}
        )
        self.assertEqual(
            (settings.tls_cert_file, settings.tls_key_file),
            (Path("/etc/c.pem"), Path("/etc/k.pem")),
        )
        for present, missing in (
            ("SVC_CONTROL_TLS_CERT_FILE", "SVC_CONTROL_TLS_KEY_FILE"),
            ("SVC_CONTROL_TLS_KEY_FILE", "SVC_CONTROL_TLS_CERT_FILE"),
        ):
            error = self.assertRaises(
                ConfigError, TapSettings.from_environ, {present: "/etc/x.pem"}
            )
            self.assertEqual(error.variable, missing)

    def test_refused(self) -> None:
        """Out-of-range numbers and bad host names are refused naming the variable."""
        for name, value in (
            ("SVC_MOUNT_LEASE_TTL_SECONDS", "9"),
            ("SVC_REVOCATION_PUSH_INTERVAL_SECONDS", "0"),
            ("SVC_DATAPLANE_CALL_TIMEOUT_SECONDS", "x"),
            ("SVC_CONTROL_FQDN", "bad_name!"),
        ):
            error = self.assertRaises(ConfigError, TapSettings.from_environ, {name: value})
            self.assertIn(name, str(error))


class ControlPlaneServiceTests(TestCase):
    """The service started in process on loopback with SQLite and a filesystem CA."""

    def setUp(self) -> None:
        pool = HTTPConnectionPool(_reactor, persistent=False)
        agent: Any = Agent(_reactor, pool=pool)
        self.http = HTTPClient(agent)

    def environ(self, **extra: str) -> dict[str, str]:
        base = Path(self.mktemp())
        (base / "secrets").mkdir(parents=True)
        return {
            "DATABASE_URL": f"sqlite:///{base.absolute()}/control.db",
            "SVC_CONTROL_PLANE_TOKEN": TOKEN,
            "SVC_SECRETS_DIR": str(base / "secrets"),
            "SVC_CA_KEK": KEK,
            "SVC_TRUST_DOMAIN": "svc.test",
            **extra,
        }

    async def start(self, environ: dict[str, str], argv: list[str]) -> ControlPlaneService:
        parsed = options(argv, environ)
        service = ControlPlaneService(
            parsed["settings"],
            parsed["tap_settings"],
            parsed["listen"],
            parsed["tls_listen"],
            _reactor,
            exit_on_failure=False,
        )
        service.startService()
        self.addCleanup(service.stopService)
        assert service.started is not None
        await service.started
        return service

    async def test_serves_and_stops(self) -> None:
        """It serves provisioning and usage (control certificate issued), then stops cleanly."""
        environ = self.environ()
        FilesystemCA(Path(environ["SVC_SECRETS_DIR"]), "svc.test", b"k" * 32).init_root(
            "Test Org", datetime.now(UTC)
        )
        service = await self.start(environ, ["--listen", "tcp:0:interface=127.0.0.1"])
        base = f"http://127.0.0.1:{service.addresses[0].port}"
        body = {"type": "agent", "id": "a1", "owner": "acme", "grant_bytes": 1}
        response = await self.http.post(base + "/v1/entities", json=body, headers=HEADERS)
        self.assertEqual(response.code, 200)
        self.assertEqual(json.loads(await response.content())["virtual_path"], "/mnt/svc/agents/a1")
        response = await self.http.get(base + "/v1/tenants/acme/usage", headers=HEADERS)
        self.assertEqual(response.code, 200, await response.content())
        assert service.keeper is not None
        self.assertIsNotNone(service.keeper.current())
        await service.stopService()
        self.assertEqual(service.addresses, [])

    async def test_enrollment_queues_grant(self) -> None:
        """An enrollment hands the agent's grant to the running push loop for its server."""
        environ = self.environ()
        FilesystemCA(Path(environ["SVC_SECRETS_DIR"]), "svc.test", b"k" * 32).init_root(
            "Test Org", datetime.now(UTC)
        )
        service = await self.start(environ, ["--listen", "tcp:0:interface=127.0.0.1"])
        base = f"http://127.0.0.1:{service.addresses[0].port}"
        with socket.socket() as probe:  # a loopback port nobody listens on
            probe.bind(("127.0.0.1", 0))
            closed = f"127.0.0.1:{probe.getsockname()[1]}"
        register = registration_body("dp.test", closed, closed, "svc.test")
        for path, body in (
            ("/control/sign-server-cert", register),
            ("/v1/entities", {"type": "agent", "id": "a1", "owner": "acme", "grant_bytes": 5}),
        ):
            response = await self.http.post(base + path, json=body, headers=HEADERS)
            self.assertEqual(response.code, 200, await response.content())
        response = await self.http.post(base + "/v1/agents/a1/enroll-token", headers=HEADERS)
        token = json.loads(await response.content())["token"]
        enroll_headers: Any = {"Authorization": f"Bearer {token}"}
        response = await self.http.post(base + "/agent/enroll", headers=enroll_headers)
        self.assertEqual(response.code, 200, await response.content())
        (loop,) = [child for child in service if isinstance(child, ControlPushLoop)]
        # The server is unreachable, so the update stays queued for the next round.
        self.assertEqual(loop.pending_quotas, (AgentGrant("acme", "acme", "a1", 5),))

    async def test_without_root_usage_unavailable(self) -> None:
        """Before 'svc ca init' the CA routes answer 503 and the rest works."""
        service = await self.start(self.environ(), ["--listen", "tcp:0:interface=127.0.0.1"])
        base = f"http://127.0.0.1:{service.addresses[0].port}"
        response = await self.http.get(base + "/v1/tenants/acme/usage", headers=HEADERS)
        self.assertEqual(response.code, 503)
        await response.content()
        response = await self.http.get(base + "/healthz")
        self.assertEqual(response.code, 200)
        await response.content()

    def init_root(self, environ: dict[str, str]) -> FilesystemCA:
        ca = FilesystemCA(Path(environ["SVC_SECRETS_DIR"]), "svc.test", b"k" * 32)
        ca.init_root("Test Org", datetime.now(UTC))
        return ca

    async def test_tls_listener_serves_ecdsa_leaf(self) -> None:
        """--tls-listen serves an ECDSA P-256 leaf for SVC_CONTROL_FQDN under the org root."""
        environ = self.environ(SVC_CONTROL_FQDN="control.test")
        root = self.init_root(environ).load_root().cert
        service = await self.start(environ, ["--tls-listen", "tcp:0:interface=127.0.0.1"])
        trust = CertificateOptions(trustRoot=org_root_trust(root))
        answer, served = await tls_get(service.addresses[0].port, trust)
        self.assertIn(b'{"status":"ok"}', answer)
        self.assertIsInstance(served.public_key(), ec.EllipticCurvePublicKey)
        self.assertIsInstance(served.public_key().curve, ec.SECP256R1)
        served.verify_directly_issued_by(root)
        sans = served.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        self.assertEqual(sans.get_values_for_type(x509.DNSName), ["control.test"])

    async def test_tls_listener_serves_operator_files(self) -> None:
        """With the operator's files the listener serves them, and their replacement later."""
        ca, leaf, key = operator_chain()
        directory = Path(self.mktemp())
        directory.mkdir()
        cert_file, key_file = directory / "cert.pem", directory / "key.pem"
        cert_file.write_bytes(pem(leaf, ca))
        key_file.write_bytes(key_pem(key))
        environ = self.environ(
            SVC_CONTROL_TLS_CERT_FILE=str(cert_file), SVC_CONTROL_TLS_KEY_FILE=str(key_file)
        )
        self.init_root(environ)
        service = await self.start(environ, ["--tls-listen", "tcp:0:interface=127.0.0.1"])
        port = service.addresses[0].port
        _, served = await tls_get(port, CertificateOptions())
        self.assertEqual(served, leaf)
        ca2, leaf2, key2 = operator_chain()
        cert_file.write_bytes(pem(leaf2, ca2))
        key_file.write_bytes(key_pem(key2))
        await service.check_tls_certificate()
        _, served = await tls_get(port, CertificateOptions())
        self.assertEqual(served, leaf2)

    async def test_start_failure(self) -> None:
        """A database that cannot be opened fails the start."""
        environ = self.environ(DATABASE_URL="sqlite:////nonexistent-dir/x/control.db")
        parsed = options(["--listen", "tcp:0:interface=127.0.0.1"], environ)
        service = ControlPlaneService(
            parsed["settings"],
            parsed["tap_settings"],
            parsed["listen"],
            [],
            _reactor,
            exit_on_failure=False,
        )
        service.startService()
        assert service.started is not None
        failures: list[Failure] = []
        service.started.addErrback(failures.append)
        await service.started
        self.assertEqual(len(failures), 1)
        await service.stopService()
        self.flushLoggedErrors()
