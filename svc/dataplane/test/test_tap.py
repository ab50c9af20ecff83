"""
Tests for L{svc.dataplane.tap} and L{svc.dataplane.settings}: what
C{twist svc-dataplane} accepts, what it refuses (naming the variable or
option), and the service it builds.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Any

from twisted.internet.testing import MemoryReactorClock
from twisted.python.usage import UsageError
from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane.answer_budget import MIB, AnswerLimits
from svc.dataplane.servercert import RegistrationRefused
from svc.dataplane.settings import (
    DEFAULT_HTTP_LISTEN,
    DEFAULT_IO_THREADS,
    DEFAULT_LISTEN,
    DEFAULT_SERVER_FQDN,
    DataPlaneSettings,
    TapConfig,
)
from svc.dataplane.tap import DataPlaneServer, Options, RenewableAdmission
from svc.pki.errors import AdmissionRefused
from svc.pki.identity import DenyList
from svc.pki.pem import cert_to_pem, key_to_pem
from svc.startup import FAILED_STATUS
from svc.store.footprint import FootprintPolicy
from svc.testing.pki import shared_test_pki
from svc.wire.ops import Op

TOKEN = "unit-test-service-token-" + "x" * 16

BASE = {
    "SVC_TENANTS_ROOT": "/srv/svc/tenants",
    "SVC_TRUST_DOMAIN": "svc.test",
    "SVC_CONTROL_PLANE_TOKEN": TOKEN,
}
CONTROL = {**BASE, "SVC_CONTROL_URL": "https://control.example:8443"}


class StaticFiles:
    """The shared test PKI's server leaf, key and root written to a directory."""

    def __init__(self, case: SynchronousTestCase) -> None:
        pki = shared_test_pki()
        directory = Path(case.mktemp())
        directory.mkdir()
        self.cert = directory / "cert.pem"
        self.key = directory / "key.pem"
        self.root = directory / "root.pem"
        self.other_root = directory / "other-root.pem"
        self.cert.write_bytes(cert_to_pem(pki.server.cert))
        self.key.write_bytes(key_to_pem(pki.server.key))
        self.root.write_bytes(cert_to_pem(pki.root.cert))
        self.other_root.write_bytes(cert_to_pem(pki.other_root.cert))

    def args(self, root: Path | None = None) -> list[str]:
        return ["--cert", str(self.cert), "--key", str(self.key), "--root", str(root or self.root)]


def parse(environ: dict[str, str], args: list[str] | None = None) -> TapConfig:
    """Parse C{args} against C{environ}; the checked configuration."""
    options = Options(environ)
    options.parseOptions(args or [])
    config: TapConfig = options["config"]
    return config


class OptionsTests(SynchronousTestCase):
    """
    Accepted command lines and environments, and their defaults.
    """

    def test_static_defaults(self) -> None:
        """With the three files, only the tenants root, trust domain and token are needed."""
        files = StaticFiles(self)
        config = parse(BASE, files.args())
        self.assertEqual((config.listen, config.http_listen), (DEFAULT_LISTEN, DEFAULT_HTTP_LISTEN))
        self.assertIsNone(config.registration)
        assert config.static_credentials is not None
        self.assertEqual(config.static_credentials.cert, shared_test_pki().server.cert)
        settings = config.settings
        self.assertEqual(settings.metadata_root, Path("/srv/svc/tenants"))
        self.assertEqual(settings.audit_log, Path("./audit.log"))
        self.assertEqual(settings.server_fqdn, DEFAULT_SERVER_FQDN)
        self.assertEqual(settings.io_threads, DEFAULT_IO_THREADS)
        self.assertEqual(settings.gc_interval_seconds, 3600)
        self.assertFalse(settings.gc_dry_run)
        self.assertEqual(settings.retention.chunk_grace_seconds, 3600.0)
        self.assertEqual(settings.retention.journal_retention_seconds, 7 * 24 * 3600.0)
        self.assertEqual(settings.retention.footprint, FootprintPolicy(Fraction(1), 1 << 30))
        self.assertEqual(settings.lease_timings.revoke_timeout, 10.0)
        self.assertIsNone(settings.policy_dir)

    def test_every_variable(self) -> None:
        """Each variable lands in its setting."""
        environ = {
            **CONTROL,
            "SVC_METADATA_ROOT": "/srv/svc/meta",
            "SVC_AUDIT_LOG": "/var/log/svc/audit.log",
            "SVC_SERVER_FQDN": "DP1.Example.COM",
            "SVC_STATE_DIR": "/var/lib/svc-dp",
            "SVC_GC_INTERVAL_SECONDS": "60",
            "SVC_GC_DRY_RUN": "yes",
            "SVC_CHUNK_GRACE_SECONDS": "0",
            "SVC_JOURNAL_RETENTION_SECONDS": "86400",
            "SVC_RETENTION_FACTOR": "0.25",
            "SVC_UNGRANTED_FOOTPRINT_BYTES": "0",
            "SVC_IO_THREADS": "8",
            "SVC_IDLE_TIMEOUT_SECONDS": "45",
            "SVC_MAX_CONNECTIONS": "100",
            "SVC_MAX_CONNECTIONS_PER_AGENT": "3",
            "SVC_MAX_PENDING_CONNECTIONS": "50",
            "SVC_MAX_PENDING_PER_ADDRESS": "4",
            "SVC_HANDSHAKE_TIMEOUT_SECONDS": "7",
            "SVC_ANSWER_MEMORY_PER_CONNECTION_MIB": "16",
            "SVC_ANSWER_MEMORY_PER_AGENT_MIB": "48",
            "SVC_ANSWER_MEMORY_MIB": "256",
            "SVC_LEASE_REVOKE_TIMEOUT_SECONDS": "2",
            "SVC_ADVERTISE_ADDR": "dp1.example.com:443",
            "SVC_HTTP_ADVERTISE_ADDR": "[2001:db8::1]:7444",
        }
        settings = parse(environ).settings
        self.assertEqual(settings.metadata_root, Path("/srv/svc/meta"))
        self.assertEqual(settings.audit_log, Path("/var/log/svc/audit.log"))
        self.assertEqual(settings.server_fqdn, "dp1.example.com")
        self.assertEqual(settings.state_dir, Path("/var/lib/svc-dp"))
        self.assertEqual(settings.gc_interval_seconds, 60)
        self.assertTrue(settings.gc_dry_run)
        self.assertEqual(settings.retention.chunk_grace_seconds, 0.0)
        self.assertEqual(settings.retention.journal_retention_seconds, 86400.0)
        self.assertEqual(settings.retention.footprint, FootprintPolicy(Fraction(1, 4), 0))
        self.assertEqual(settings.io_threads, 8)
        self.assertEqual(settings.idle_timeout_seconds, 45)
        self.assertEqual((settings.max_connections, settings.max_connections_per_agent), (100, 3))
        self.assertEqual(
            (
                settings.max_pending_connections,
                settings.max_pending_per_address,
                settings.handshake_timeout_seconds,
            ),
            (50, 4, 7),
        )
        self.assertEqual(settings.answer_limits, AnswerLimits(16 * MIB, 48 * MIB, 256 * MIB))
        self.assertEqual(settings.lease_timings.revoke_timeout, 2.0)
        self.assertEqual(settings.control_url, "https://control.example:8443")

    def test_answer_budgets_follow_the_level_below(self) -> None:
        """An unset answer budget smaller than the level below it defaults to that level."""
        environ = {**CONTROL, "SVC_ANSWER_MEMORY_PER_CONNECTION_MIB": "100"}
        self.assertEqual(
            parse(environ).settings.answer_limits,
            AnswerLimits(100 * MIB, 100 * MIB, 512 * MIB),
        )
        environ = {
            **CONTROL,
            "SVC_ANSWER_MEMORY_PER_AGENT_MIB": "100",
            "SVC_ANSWER_MEMORY_MIB": "64",
        }
        error = self.assertRaises(UsageError, parse, environ)
        self.assertTrue(str(error).startswith("SVC_ANSWER_MEMORY_MIB"), str(error))

    def test_registration_from_listeners(self) -> None:
        """Without the files, the registration's addresses come from the listen options."""
        config = parse(CONTROL, ["--listen", "tcp:9443:interface=10.0.0.5"])
        assert config.registration is not None
        self.assertEqual(config.registration.fqdn, "localhost")
        self.assertEqual(config.registration.advertise_addr, "10.0.0.5:9443")
        self.assertEqual(config.registration.http_addr, "127.0.0.1:7444")

    def test_registration_names_trust_domain_and_replaced_key(self) -> None:
        """The registration carries the trust domain and SVC_REPLACE_SERVER_KEY (lower-cased)."""
        key = "AB" * 32
        config = parse({**CONTROL, "SVC_REPLACE_SERVER_KEY": key})
        assert config.registration is not None
        self.assertEqual(config.registration.trust_domain, config.settings.trust_domain)
        self.assertEqual(config.registration.replaces, key.lower())
        plain = parse(CONTROL).registration
        assert plain is not None
        self.assertIsNone(plain.replaces)
        error = self.assertRaises(UsageError, parse, {**CONTROL, "SVC_REPLACE_SERVER_KEY": "ab"})
        self.assertTrue(str(error).startswith("SVC_REPLACE_SERVER_KEY"), str(error))

    def test_wildcard_interface_advertises_fqdn(self) -> None:
        """A listener on every interface is advertised under the server's FQDN."""
        environ = {**CONTROL, "SVC_SERVER_FQDN": "dp1.example.com"}
        config = parse(
            environ, ["--listen", "tcp:7443", "--http-listen", "tcp:7444:interface=0.0.0.0"]
        )
        assert config.registration is not None
        self.assertEqual(config.registration.advertise_addr, "dp1.example.com:7443")
        self.assertEqual(config.registration.http_addr, "dp1.example.com:7444")

    def test_ipv6_interface_bracketed(self) -> None:
        """An IPv6 interface is advertised in brackets."""
        config = parse(CONTROL, ["--listen", r"tcp6:7443:interface=2001\:db8\:\:5"])
        assert config.registration is not None
        self.assertEqual(config.registration.advertise_addr, "[2001:db8::5]:7443")

    def test_advertise_addr_wins(self) -> None:
        """SVC_ADVERTISE_ADDR replaces the address derived from --listen."""
        config = parse({**CONTROL, "SVC_ADVERTISE_ADDR": "dp.example.com:443"})
        assert config.registration is not None
        self.assertEqual(config.registration.advertise_addr, "dp.example.com:443")

    def test_static_files_win_over_control_url(self) -> None:
        """With the three files the control plane is not asked for a certificate."""
        files = StaticFiles(self)
        config = parse(CONTROL, files.args())
        self.assertIsNone(config.registration)
        self.assertIsNotNone(config.static_credentials)

    def test_policy_directory(self) -> None:
        """SVC_POLICY_DIR's policies are loaded at start, one per tenant and agent."""
        directory = Path(self.mktemp())
        (directory / "tenant-a").mkdir(parents=True)
        policy = {"deny": ["secrets/**"], "readonly": False}
        (directory / "tenant-a" / "agent-1.json").write_text(json.dumps(policy))
        config = parse({**CONTROL, "SVC_POLICY_DIR": str(directory)})
        self.assertIsNotNone(config.policies.lookup("tenant-a", "agent-1"))
        self.assertIsNone(config.policies.lookup("tenant-a", "agent-2"))

    def test_token_not_in_repr(self) -> None:
        """The service token never shows in the settings' repr."""
        settings = DataPlaneSettings.from_environ(BASE)
        self.assertNotIn(TOKEN, repr(settings))


class RefusalTests(SynchronousTestCase):
    """
    Every bad configuration is a usage error naming what is wrong.
    """

    def assertRefused(
        self, environ: dict[str, str], name: str, args: list[str] | None = None
    ) -> None:
        """Parsing fails with a UsageError whose message starts with C{name}."""
        error = self.assertRaises(UsageError, parse, environ, args)
        self.assertTrue(str(error).startswith(name), str(error))

    def test_required_variables(self) -> None:
        """Each required variable, when missing, is named."""
        files = StaticFiles(self)
        for name in ("SVC_TENANTS_ROOT", "SVC_TRUST_DOMAIN", "SVC_CONTROL_PLANE_TOKEN"):
            environ = {k: v for k, v in BASE.items() if k != name}
            self.assertRefused(environ, name, files.args())

    def test_bad_values(self) -> None:
        """A malformed value of each checked variable is refused naming it."""
        files = StaticFiles(self)
        bad = {
            "SVC_TRUST_DOMAIN": "Not A Domain",
            "SVC_CONTROL_PLANE_TOKEN": "short",
            "SVC_CONTROL_URL": "ftp://control.example",
            "SVC_SERVER_FQDN": "bad_name!",
            "SVC_ADVERTISE_ADDR": "no-port",
            "SVC_HTTP_ADVERTISE_ADDR": "host:99999",
            "SVC_GC_INTERVAL_SECONDS": "0",
            "SVC_GC_DRY_RUN": "maybe",
            "SVC_CHUNK_GRACE_SECONDS": "-1",
            "SVC_JOURNAL_RETENTION_SECONDS": "a week",
            "SVC_RETENTION_FACTOR": "1.0001",
            "SVC_UNGRANTED_FOOTPRINT_BYTES": "-1",
            "SVC_IO_THREADS": "0",
            "SVC_IDLE_TIMEOUT_SECONDS": "0",
            "SVC_MAX_CONNECTIONS": "0",
            "SVC_MAX_CONNECTIONS_PER_AGENT": "-1",
            "SVC_MAX_PENDING_CONNECTIONS": "0",
            "SVC_MAX_PENDING_PER_ADDRESS": "0",
            "SVC_HANDSHAKE_TIMEOUT_SECONDS": "0",
            "SVC_ANSWER_MEMORY_PER_CONNECTION_MIB": "15",
            "SVC_ANSWER_MEMORY_MIB": "32",
            "SVC_LEASE_TTL_SECONDS": "0",
            "SVC_LEASE_REVOKE_TIMEOUT_SECONDS": "100",
        }
        for name, value in bad.items():
            self.assertRefused({**BASE, name: value}, name, files.args())

    def test_token_with_illegal_characters(self) -> None:
        """A long token with characters a Bearer header cannot carry is refused."""
        self.assertRefused(
            {**CONTROL, "SVC_CONTROL_PLANE_TOKEN": "x" * 40 + " y"}, "SVC_CONTROL_PLANE_TOKEN"
        )

    def test_token_from_file(self) -> None:
        """SVC_CONTROL_PLANE_TOKEN_FILE gives the token; a bad one is refused naming it."""
        files = StaticFiles(self)
        secret = Path(self.mktemp())
        secret.write_text(TOKEN + "\n")
        environ = {k: v for k, v in BASE.items() if k != "SVC_CONTROL_PLANE_TOKEN"}
        config = parse({**environ, "SVC_CONTROL_PLANE_TOKEN_FILE": str(secret)}, files.args())
        self.assertEqual(config.settings.control_plane_token, TOKEN)
        secret.write_text("short\n")
        self.assertRefused(
            {**environ, "SVC_CONTROL_PLANE_TOKEN_FILE": str(secret)},
            "SVC_CONTROL_PLANE_TOKEN_FILE",
            files.args(),
        )
        self.assertRefused(
            {**BASE, "SVC_CONTROL_PLANE_TOKEN_FILE": str(secret)},
            "SVC_CONTROL_PLANE_TOKEN_FILE",
            files.args(),
        )

    def test_no_certificate_source(self) -> None:
        """Neither the three files nor SVC_CONTROL_URL: SVC_CONTROL_URL is named."""
        self.assertRefused(BASE, "SVC_CONTROL_URL")

    def test_partial_files(self) -> None:
        """--cert without --key and --root is refused."""
        files = StaticFiles(self)
        self.assertRefused(BASE, "--cert/--key/--root", ["--cert", str(files.cert)])

    def test_missing_file(self) -> None:
        """A certificate file that cannot be read is refused."""
        files = StaticFiles(self)
        args = ["--cert", str(files.cert) + ".missing", "--key", str(files.key)]
        self.assertRefused(BASE, "--cert/--key/--root", [*args, "--root", str(files.root)])

    def test_mismatched_key(self) -> None:
        """A key that does not belong to the certificate is refused."""
        files = StaticFiles(self)
        files.key.write_bytes(key_to_pem(shared_test_pki().control.key))
        self.assertRefused(BASE, "--cert/--key/--root", files.args())

    def test_leaf_not_from_root(self) -> None:
        """A server leaf that does not verify to --root is refused."""
        files = StaticFiles(self)
        self.assertRefused(BASE, "--cert/--key/--root", files.args(root=files.other_root))

    def test_tls_endpoints_refused(self) -> None:
        """--listen and --http-listen take plain endpoints; the server adds TLS."""
        files = StaticFiles(self)
        self.assertRefused(BASE, "--listen", ["--listen", "ssl:7443", *files.args()])
        self.assertRefused(BASE, "--http-listen", ["--http-listen", "tls:7444", *files.args()])

    def test_not_an_endpoint(self) -> None:
        """An endpoint string Twisted cannot parse is refused naming the option."""
        files = StaticFiles(self)
        self.assertRefused(BASE, "--listen", ["--listen", "tcp:notaport", *files.args()])

    def test_unadvertisable_listener(self) -> None:
        """A port-0 listener cannot be registered without SVC_ADVERTISE_ADDR."""
        self.assertRefused(CONTROL, "SVC_ADVERTISE_ADDR", ["--listen", "tcp:0"])
        self.assertRefused(CONTROL, "SVC_HTTP_ADVERTISE_ADDR", ["--http-listen", "unix:/tmp/x"])

    def test_unreadable_ca_file(self) -> None:
        """SVC_CA_FILE must be a readable PEM file."""
        missing = str(Path(self.mktemp()) / "ca.pem")
        self.assertRefused({**CONTROL, "SVC_CA_FILE": missing}, "SVC_CA_FILE")
        garbage = Path(self.mktemp())
        garbage.write_text("not a certificate")
        self.assertRefused({**CONTROL, "SVC_CA_FILE": str(garbage)}, "SVC_CA_FILE")

    def test_bad_policy(self) -> None:
        """A policy file that does not parse refuses the start naming SVC_POLICY_DIR."""
        directory = Path(self.mktemp())
        (directory / "tenant-a").mkdir(parents=True)
        (directory / "tenant-a" / "agent-1.json").write_text("{not json")
        self.assertRefused({**CONTROL, "SVC_POLICY_DIR": str(directory)}, "SVC_POLICY_DIR")


class ServerTests(SynchronousTestCase):
    """
    The service tree C{makeService} returns, without starting it.
    """

    def build(self) -> DataPlaneServer:
        files = StaticFiles(self)
        environ = {**BASE, "SVC_TENANTS_ROOT": self.mktemp()}
        reactor: Any = MemoryReactorClock()
        return DataPlaneServer(parse(environ, files.args()), reactor, install_signal=None)

    def test_children_in_order(self) -> None:
        """The tree holds the audit log, the server certificate and the GC loop, in order."""
        server = self.build()
        self.assertEqual(list(server), [server.audit, server.certificate, server.gc])

    def test_credentials_installed_and_swapped(self) -> None:
        """New credentials replace both listeners' TLS options for new connections."""
        server = self.build()
        self.assertIsNone(server.frame_tls)
        pki = shared_test_pki()
        server.install_credentials(pki.server.cert, pki.server.key, pki.root.cert)
        assert server.frame_tls is not None and server.http_tls is not None
        first = (server.frame_tls.current, server.http_tls.current)
        renewed = pki.server_leaf("dataplane.test")
        server.install_credentials(renewed.cert, renewed.key, pki.root.cert)
        self.assertNotEqual(first[0], server.frame_tls.current)
        self.assertNotEqual(first[1], server.http_tls.current)

    def test_limits_reach_the_factory_and_service(self) -> None:
        """The connection limits and answer budgets of the settings are the server's."""
        files = StaticFiles(self)
        environ = {
            **BASE,
            "SVC_TENANTS_ROOT": self.mktemp(),
            "SVC_MAX_PENDING_CONNECTIONS": "9",
            "SVC_MAX_PENDING_PER_ADDRESS": "2",
            "SVC_HANDSHAKE_TIMEOUT_SECONDS": "3",
            "SVC_ANSWER_MEMORY_PER_AGENT_MIB": "40",
        }
        reactor: Any = MemoryReactorClock()
        server = DataPlaneServer(parse(environ, files.args()), reactor, install_signal=None)
        limits = server.factory.limits
        self.assertEqual(
            (limits.max_pending_connections, limits.max_pending_per_address),
            (9, 2),
        )
        self.assertEqual(limits.handshake_timeout, 3.0)
        self.assertEqual(server.service.answer_budgets.limits.per_agent, 40 * MIB)

    def test_metrics_registered(self) -> None:
        """The server's registry carries the data-plane families from the start."""
        server = self.build()
        server.metrics.observe_op(Op.PING.value, 0.001)
        names = {family.name for family in server.registry.collect()}
        self.assertIn("svc_dataplane_op_duration_seconds", names)

    def test_refusal_after_start_ends_the_process(self) -> None:
        """
        A registration refused once the server serves (a later renewal) stops
        the reactor and exits with status 1; one refused while starting
        leaves that to the failed start.
        """
        files = StaticFiles(self)
        environ = {**BASE, "SVC_TENANTS_ROOT": self.mktemp()}
        reactor = MemoryReactorClock()
        server = DataPlaneServer(parse(environ, files.args()), reactor, install_signal=None)
        refused = RegistrationRefused("refused", "fqdn_registered")
        server._registration_refused(refused)
        self.assertFalse(reactor.hasStopped)
        server._serving = True
        server._registration_refused(refused)
        self.assertTrue(reactor.hasStopped)
        (trigger,) = reactor.triggers["after"]["shutdown"]
        self.assertEqual(trigger[1], (FAILED_STATUS,))

    def test_storage_reports_to_the_metrics(self) -> None:
        """The storage engine reports chunk deletions and journal rows to the server's metrics."""
        server = self.build()
        self.assertIs(server.service.engine.observer, server.metrics)


class RenewableAdmissionTests(SynchronousTestCase):
    """
    The admission check follows the installed org root.
    """

    def test_refuses_before_root(self) -> None:
        """Before any root is installed, every connection is refused."""
        admission = RenewableAdmission("svc.test", DenyList)
        transport: Any = object()
        self.assertRaises(AdmissionRefused, admission, transport)


class IdentitySettingsTests(SynchronousTestCase):
    """
    The placement check, its remembered misses, and the control-plane query
    timeout: defaults, values, refusals, and what the server builds.
    """

    def server(self, environ: dict[str, str], args: list[str] | None = None) -> DataPlaneServer:
        reactor: Any = MemoryReactorClock()
        environ = {**environ, "SVC_TENANTS_ROOT": self.mktemp()}
        return DataPlaneServer(parse(environ, args), reactor, install_signal=None)

    def test_defaults(self) -> None:
        """The check is on, misses are remembered 10 s, questions bounded by 10 s."""
        settings = parse(CONTROL).settings
        self.assertTrue(settings.placement_check)
        self.assertEqual(settings.placement_miss_ttl_seconds, 10)
        self.assertEqual(settings.control_query_timeout_seconds, 10)

    def test_values(self) -> None:
        """Each variable lands in its setting; the check may be off with the three files."""
        files = StaticFiles(self)
        environ = {
            **BASE,
            "SVC_PLACEMENT_CHECK": "off",
            "SVC_PLACEMENT_MISS_TTL_SECONDS": "30",
            "SVC_CONTROL_QUERY_TIMEOUT_SECONDS": "3",
        }
        settings = parse(environ, files.args()).settings
        self.assertFalse(settings.placement_check)
        self.assertEqual(settings.placement_miss_ttl_seconds, 30)
        self.assertEqual(settings.control_query_timeout_seconds, 3)

    def test_refusals(self) -> None:
        """Bad values are refused naming the variable; never off with a control plane."""
        files = StaticFiles(self)
        for name, value in {
            "SVC_PLACEMENT_CHECK": "sometimes",
            "SVC_PLACEMENT_MISS_TTL_SECONDS": "0",
            "SVC_CONTROL_QUERY_TIMEOUT_SECONDS": "301",
        }.items():
            error = self.assertRaises(UsageError, parse, {**BASE, name: value}, files.args())
            self.assertTrue(str(error).startswith(name), str(error))
        error = self.assertRaises(UsageError, parse, {**CONTROL, "SVC_PLACEMENT_CHECK": "0"})
        self.assertTrue(str(error).startswith("SVC_PLACEMENT_CHECK"), str(error))

    def test_built_check(self) -> None:
        """With a control plane the check asks it; static files: the record only; off: none."""
        managed = self.server(CONTROL)
        self.assertIsNotNone(managed.queries)
        self.assertIsNotNone(managed.placements)
        files = StaticFiles(self)
        static = self.server(BASE, files.args())
        self.assertIsNone(static.queries)
        self.assertIsNotNone(static.placements)
        unchecked = self.server({**BASE, "SVC_PLACEMENT_CHECK": "no"}, files.args())
        self.assertIsNone(unchecked.placements)
