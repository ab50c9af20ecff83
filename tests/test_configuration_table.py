"""
Every row of C{docs/configuration.md}'s tables, misconfigured as a new
operator might, refuses the start with one line naming it.

The test walks the tables: each variable or option has a bad value here
(L{BAD}), or a reason why no value of it is bad (L{NO_BAD_VALUE}); a row in
neither fails the test. Each bad value goes through the real path in
process: C{twist}'s own option parsing of the plugin (a refusal there is
one line on stderr, one JSON line in the log, exit status 64), and, when the
options pass, the plugin's service started on the reactor until its start
fails (the line L{svc.startup.end_start} writes, from
L{svc.startup.failure_line}).
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import socket
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import attrs
from twisted.application.twist._options import TwistOptions
from twisted.internet import reactor
from twisted.python.failure import Failure
from twisted.trial.unittest import TestCase

from svc import logs
from svc.control.tap import ControlPlaneService
from svc.dataplane.tap import DataPlaneServer
from svc.mount.runtime.service import MountService
from svc.pki.filesystem import FilesystemCA
from svc.startup import USAGE_STATUS, failure_line
from tests.dataplane_harness import DiskPKI

ROOT = Path(__file__).resolve().parent.parent
TABLES = ROOT / "docs" / "configuration.md"
TOKEN = "configuration-table-test-token-" + "t" * 16
KEK = "a2V5LWVuY3J5cHRpb24ta2V5LWZvci10aGUtdGFibGUtdGVzdA=="
OTHER_KEK = "b3RoZXIta2V5LWVuY3J5cHRpb24ta2V5LWZvci10aGUtdGVzdHM="
NUMBER = "plenty"

PROCESS = {"control": "svc-control", "dataplane": "svc-dataplane", "mount": "svc-mount"}


@attrs.frozen
class Bad:
    """
    A misconfiguration of C{process}: C{environ} over its good base (a
    value L{None} removes the variable), C{argv} after its good arguments;
    the line must name C{names} (default: the row's name). C{base} picks
    another good base (C{"dataplane-control"}: signed by a control plane,
    C{"control-ca"}: a database and a filesystem CA).
    """

    process: str
    environ: Mapping[str, str | None] = attrs.field(factory=dict)
    argv: tuple[str, ...] = ()
    names: str | None = None
    base: str | None = None


def dp(**environ: str | None) -> Bad:
    return Bad("dataplane", environ)


def cp(**environ: str | None) -> Bad:
    return Bad("control", environ)


def mt(**environ: str | None) -> Bad:
    return Bad("mount", environ)


IN_A_FILE = "{tmp}/a-file/below"
"""A path under a regular file: no directory can be made there."""

BAD: dict[tuple[str, str], Bad] = {
    # The data plane's options and variables.
    ("dataplane", "--listen"): Bad("dataplane", argv=("--listen=tls:7443",)),
    ("dataplane", "--http-listen"): Bad("dataplane", argv=("--http-listen={busy}",)),
    ("dataplane", "--cert"): Bad("dataplane", argv=("--cert={tmp}/missing.pem",)),
    ("dataplane", "SVC_TENANTS_ROOT"): dp(SVC_TENANTS_ROOT=IN_A_FILE),
    ("dataplane", "SVC_METADATA_ROOT"): dp(SVC_METADATA_ROOT=IN_A_FILE),
    ("dataplane", "SVC_AUDIT_LOG"): dp(SVC_AUDIT_LOG="{tmp}/no-such-dir/audit.log"),
    ("dataplane", "SVC_TRUST_DOMAIN"): dp(SVC_TRUST_DOMAIN="Not A Domain"),
    ("dataplane", "SVC_CONTROL_PLANE_TOKEN"): dp(SVC_CONTROL_PLANE_TOKEN="short"),
    ("dataplane", "SVC_CONTROL_URL"): Bad(
        "dataplane", {"SVC_CONTROL_URL": "control.example:8080"}, base="dataplane-control"
    ),
    ("dataplane", "SVC_CA_FILE"): Bad(
        "dataplane", {"SVC_CA_FILE": "{tmp}/missing-ca.pem"}, base="dataplane-control"
    ),
    ("dataplane", "SVC_SERVER_FQDN"): dp(SVC_SERVER_FQDN="not a host"),
    ("dataplane", "SVC_ADVERTISE_ADDR"): dp(SVC_ADVERTISE_ADDR="nowhere"),
    ("dataplane", "SVC_HTTP_ADVERTISE_ADDR"): dp(SVC_HTTP_ADVERTISE_ADDR="host:99999"),
    ("dataplane", "SVC_STATE_DIR"): dp(SVC_STATE_DIR="{tmp}/a-file"),
    ("dataplane", "SVC_PLACEMENT_CHECK"): dp(SVC_PLACEMENT_CHECK="sometimes"),
    ("dataplane", "SVC_POLICY_DIR"): dp(SVC_POLICY_DIR="{tmp}/bad-policies"),
    ("dataplane", "SVC_GC_DRY_RUN"): dp(SVC_GC_DRY_RUN="maybe"),
    ("dataplane", "SVC_RETENTION_FACTOR"): dp(SVC_RETENTION_FACTOR="-1"),
    ("dataplane", "SVC_LEASE_REVOKE_TIMEOUT_SECONDS"): dp(
        SVC_LEASE_TTL_SECONDS="5", SVC_LEASE_REVOKE_TIMEOUT_SECONDS="10"
    ),
    ("dataplane", "SVC_REPLACE_SERVER_KEY"): dp(SVC_REPLACE_SERVER_KEY="not-a-key"),
    ("dataplane", "--metrics-listen"): Bad("dataplane", argv=("--metrics-listen={busy}",)),
    ("dataplane", "SVC_METRICS_PATH_LABELS"): dp(SVC_METRICS_PATH_LABELS="sometimes"),
    # The control plane's variables and options.
    ("control", "--listen"): Bad("control", argv=("--listen={busy}",)),
    ("control", "--tls-listen"): Bad("control", argv=("--tls-listen=tcp:0",)),
    ("control", "DATABASE_URL"): cp(
        DATABASE_URL="sqlite:////nonexistent-svc-dir/control.db", SVC_CONTROL_PLANE_TOKEN=TOKEN
    ),
    ("control", "SVC_CONTROL_PLANE_TOKEN"): cp(SVC_CONTROL_PLANE_TOKEN="has spaces " * 4),
    ("control", "SVC_SECRETS_DIR"): Bad(
        "control", {"SVC_SECRETS_DIR": "{tmp}/a-file"}, base="control-ca"
    ),
    ("control", "SVC_SECRETS_BACKEND"): cp(SVC_SECRETS_BACKEND="vault"),
    ("control", "SVC_CA_KEK"): Bad("control", {"SVC_CA_KEK": OTHER_KEK}, base="control-ca"),
    ("control", "SVC_CONTROL_TLS_CERT_FILE"): Bad(
        "control",
        {
            "SVC_CONTROL_TLS_CERT_FILE": "{tmp}/missing-cert.pem",
            "SVC_CONTROL_TLS_KEY_FILE": "{tmp}/a-file",
        },
        argv=("--tls-listen=tcp:0",),
        base="control-ca",
    ),
    ("control", "SVC_CONTROL_TLS_KEY_FILE"): Bad(
        "control",
        {"SVC_CONTROL_TLS_CERT_FILE": "{tmp}/a-file", "SVC_CONTROL_TLS_KEY_FILE": None},
    ),
    ("control", "SVC_CA_KEK_FILE"): Bad(
        "control", {"SVC_CA_KEK": None, "SVC_CA_KEK_FILE": "{tmp}/no-kek"}, base="control-ca"
    ),
    ("control", "SVC_TRUST_DOMAIN"): Bad("control", {"SVC_TRUST_DOMAIN": None}, base="control-ca"),
    ("control", "SVC_ORG_NAME"): cp(SVC_ORG_NAME="x" * 200),
    ("control", "SVC_MOUNT_PREFIX"): cp(SVC_MOUNT_PREFIX="relative/path"),
    ("control", "SVC_IDENTITY_AUDIENCE"): cp(SVC_IDENTITY_ISSUER="https://issuer.example"),
    ("control", "SVC_IDENTITY_PUBLIC_KEY_FILE"): cp(
        SVC_IDENTITY_AUDIENCE="svc",
        SVC_IDENTITY_TENANT_ALLOWLIST="t1",
        SVC_IDENTITY_PUBLIC_KEY_FILE="{tmp}/no-such-key.pem",
    ),
    ("control", "SVC_IDENTITY_ISSUER"): cp(SVC_IDENTITY_ISSUER="https://issuer.example"),
    ("control", "SVC_IDENTITY_TENANT_CLAIM"): cp(SVC_IDENTITY_TENANT_CLAIM="tenant"),
    ("control", "SVC_IDENTITY_TENANT_ALLOWLIST"): cp(
        SVC_IDENTITY_AUDIENCE="svc",
        SVC_IDENTITY_PUBLIC_KEY_FILE="{tmp}/no-such-key.pem",
        SVC_IDENTITY_TENANT_ALLOWLIST=" , ",
    ),
    ("control", "SVC_ENROLL_RATE_LIMIT"): cp(SVC_ENROLL_RATE_LIMIT="many"),
    ("control", "SVC_TENANT_ALLOWLIST"): cp(SVC_TENANT_ALLOWLIST=","),
    ("control", "SVC_DEV_MODE"): cp(SVC_DEV_MODE="perhaps"),
    ("control", "SVC_CONTROL_FQDN"): cp(SVC_CONTROL_FQDN="not a host"),
    # The mount client's.
    ("mount", "SVC_CONTROL_URL"): mt(SVC_CONTROL_URL="127.0.0.1:8080"),
    ("mount", "SVC_ENROLL_TOKEN"): mt(SVC_ENROLL_TOKEN="not-a-token-it-knows"),
    ("mount", "SVC_MOUNT_POINT"): mt(SVC_MOUNT_POINT="{tmp}/no-such-mount-point"),
    ("mount", "SVC_CACHE_DIR"): mt(SVC_CACHE_DIR=IN_A_FILE),
    ("mount", "SVC_POLICY_FILE"): mt(SVC_POLICY_FILE="{tmp}/a-file"),
    ("mount", "SVC_AUDIT_LOG"): mt(SVC_AUDIT_LOG="{tmp}/no-such-dir/audit.log"),
    ("mount", "SVC_CA_FILE"): mt(SVC_CA_FILE="{tmp}/missing-ca.pem"),
    ("mount", "SVC_FUSE_WORKERS"): mt(SVC_FUSE_WORKERS="0"),
    ("mount", "SVC_START_WAIT"): mt(SVC_START_WAIT=NUMBER),
    ("mount", "XDG_CACHE_HOME"): Bad(
        "mount",
        {"SVC_CACHE_DIR": None, "XDG_CACHE_HOME": "relative", "HOME": None},
        names="HOME",
    ),
    # The secrets' file variants (one process that reads each).
    ("secrets", "SVC_CONTROL_PLANE_TOKEN_FILE"): dp(
        SVC_CONTROL_PLANE_TOKEN=None, SVC_CONTROL_PLANE_TOKEN_FILE="{tmp}/no-token"
    ),
    ("secrets", "SVC_CA_KEK_FILE"): Bad(
        "control", {"SVC_CA_KEK": None, "SVC_CA_KEK_FILE": "{tmp}/a-file"}, base="control-ca"
    ),
    ("secrets", "DATABASE_URL_FILE"): Bad(
        "control", {"DATABASE_URL": None, "DATABASE_URL_FILE": "{tmp}/no-url"}, base="control-ca"
    ),
    ("secrets", "SVC_ENROLL_TOKEN_FILE"): mt(
        SVC_ENROLL_TOKEN=None, SVC_ENROLL_TOKEN_FILE="{tmp}/no-token"
    ),
    # Logging, the same in all three.
    ("logging", "SVC_LOG_FORMAT"): cp(SVC_LOG_FORMAT="xml"),
    ("logging", "SVC_LOG_LEVEL"): cp(SVC_LOG_LEVEL="verbose"),
}
"""A bad value of each row (numbers not listed get L{NUMBER})."""

NO_BAD_VALUE = {
    ("setup", "PYTHON"): "read by scripts/bootstrap, not by the processes",
    ("mount", "SVC_MOUNT_ALLOW_OTHER"): "any value other than 1/true/yes/on means off",
    ("mount", "SVC_MOUNT_FORCE"): "any value other than 1/true/yes/on means off",
    ("mount", "SVC_DURABLE_CLOSE"): "any value other than 1/true/yes/on means off",
    ("mount", "SVC_MOUNT_WRITE_LEASES"): "any value other than 1/true/yes/on means off",
    ("tests", "SVC_TEST_POSTGRES_URL"): "read by the test harness only",
    ("tests", "CI"): "read by the test harness only",
}
"""Rows no value of which is a misconfiguration, and why."""

_NUMERIC = re.compile(r"_(SECONDS|MIB|BYTES|THREADS|CONNECTIONS|AGENT|ADDRESS)\Z")


def table_rows() -> list[tuple[str, str]]:
    """
    (section, first name) of every variable and option row of the tables;
    for the secrets' table, the file variant (the secret itself is a row of
    its process's table).
    """
    rows: list[tuple[str, str]] = []
    section = ""
    kind = None
    for line in TABLES.read_text().splitlines():
        if line.startswith("## "):
            section = _section(line[3:])
            kind = None
        elif line.startswith("| ") and not line.startswith("|-") and kind is None:
            kind = line.split("|")[1].strip()
        elif not line.startswith("|"):
            kind = None
        elif line.startswith("| `") and kind in ("variable", "option", "also read"):
            names = re.findall(r"`([^`]+)`", line.split("|")[1])
            rows.append((section, names[0]))
        elif line.startswith("| `") and kind == "secret":
            [file_variant] = re.findall(r"`([^`]+)`", line.split("|")[2])
            rows.append((section, file_variant))
    return rows


def _section(heading: str) -> str:
    lowered = heading.lower()
    for key, section in (
        ("secrets as files", "secrets"),
        ("set-up", "setup"),
        ("data plane", "dataplane"),
        ("control plane", "control"),
        ("mount client", "mount"),
        ("logging", "logging"),
        ("tests", "tests"),
    ):
        if key in lowered:
            return section
    return lowered


def bad_value(section: str, name: str) -> Bad | None:
    """The misconfiguration of a row (L{None}: it has none)."""
    if (section, name) in BAD:
        return BAD[(section, name)]
    if _NUMERIC.search(name) and section in ("dataplane", "control"):
        return Bad(section, {name: NUMBER})
    return None


class TableTests(TestCase):
    """Each row's misconfiguration gives one line naming it."""

    def setUp(self) -> None:
        self.tmp = Path(self.mktemp()).resolve()
        self.tmp.mkdir(parents=True)
        (self.tmp / "a-file").write_text("not a directory, not a policy\n")
        (self.tmp / "bad-policies" / "t1").mkdir(parents=True)
        (self.tmp / "bad-policies" / "t1" / "a1.json").write_text("{not json")
        (self.tmp / "mnt").mkdir()
        self.pki = DiskPKI.create(self.tmp / "pki")
        self.busy = socket.socket()
        self.busy.bind(("127.0.0.1", 0))
        self.busy.listen(1)
        self.addCleanup(self.busy.close)
        self.addCleanup(setattr, logs._Adopted, "target", None)
        secrets = self.tmp / "secrets"
        secrets.mkdir()
        FilesystemCA(secrets, "svc.test", base64.b64decode(KEK)).init_root(
            "Test", datetime.now(UTC)
        )

    def test_every_row_has_a_case(self) -> None:
        """Each row of the tables has a bad value or a reason why it has none."""
        rows = table_rows()
        self.assertGreater(len(rows), 60)
        missing = [r for r in rows if bad_value(*r) is None and r not in NO_BAD_VALUE]
        self.assertEqual(missing, [])
        stale = [key for key in BAD if key not in rows]
        self.assertEqual(stale, [])

    async def test_each_misconfiguration_is_one_line_naming_it(self) -> None:
        """Options refused (exit 64) or start failed: one line that names the row."""
        failures = []
        for section, name in table_rows():
            bad = bad_value(section, name)
            if bad is None:
                continue
            line = await self.first_line(bad)
            expected = bad.names or name
            if line is None or "\n" in line or expected not in line:
                failures.append(f"{section} {name}: {line!r}")
        self.assertEqual(failures, [])

    # The real paths

    def good(self, bad: Bad) -> tuple[dict[str, str], list[str]]:
        """The good environment and arguments C{bad} spoils."""
        tmp = self.tmp
        kind = bad.base or bad.process
        environ: dict[str, str] = {"PATH": os.environ.get("PATH", "")}
        argv: list[str] = []
        if kind.startswith("dataplane"):
            environ.update(
                SVC_TENANTS_ROOT=str(tmp / "tenants"),
                SVC_AUDIT_LOG=str(tmp / "audit.log"),
                SVC_TRUST_DOMAIN=self.pki.trust_domain,
                SVC_CONTROL_PLANE_TOKEN=TOKEN,
                SVC_STATE_DIR=str(tmp / "state"),
            )
            argv = ["--listen=tcp:0:interface=127.0.0.1", "--http-listen=tcp:0"]
            if kind == "dataplane":
                environ["SVC_PLACEMENT_CHECK"] = "off"
                argv += [
                    f"--cert={self.pki.server_cert_file}",
                    f"--key={self.pki.server_key_file}",
                    f"--root={self.pki.root_file}",
                ]
            else:
                environ["SVC_CONTROL_URL"] = "http://127.0.0.1:9"
                environ["SVC_ADVERTISE_ADDR"] = "127.0.0.1:7443"
                environ["SVC_HTTP_ADVERTISE_ADDR"] = "127.0.0.1:7444"
        elif kind == "control":
            argv = ["--listen=tcp:0:interface=127.0.0.1"]
        elif kind == "control-ca":
            environ.update(
                DATABASE_URL=f"sqlite:///{tmp}/control.db",
                SVC_CONTROL_PLANE_TOKEN=TOKEN,
                SVC_SECRETS_DIR=str(tmp / "secrets"),
                SVC_CA_KEK=KEK,
                SVC_TRUST_DOMAIN="svc.test",
            )
            argv = ["--listen=tcp:0:interface=127.0.0.1"]
        else:
            environ.update(
                SVC_CONTROL_URL=self.control_url,
                SVC_ENROLL_TOKEN="a-token-nobody-minted",
                SVC_MOUNT_POINT=str(tmp / "mnt"),
                SVC_CACHE_DIR=str(tmp / "cache"),
                SVC_AUDIT_LOG=str(tmp / "mount-audit.log"),
                HOME=str(tmp),
            )
        return environ, argv

    async def first_line(self, bad: Bad) -> str | None:
        """The one line the misconfiguration gives (L{None}: the start went through)."""
        if bad.process == "mount" and not hasattr(self, "control_url"):
            await self.start_control_plane()
        environ, argv = self.good(bad)
        busy = f"tcp:{self.busy.getsockname()[1]}:interface=127.0.0.1"

        def fill(text: str) -> str:
            return text.format(tmp=self.tmp, busy=busy)

        for key, value in bad.environ.items():
            if value is None:
                environ.pop(key, None)
            else:
                environ[key] = fill(value)
        argv += [fill(arg) for arg in bad.argv]
        refused = self.parse(bad.process, environ, argv)
        if isinstance(refused, str):
            return refused
        return await self.start(bad.process, refused)

    def parse(self, process: str, environ: dict[str, str], argv: list[str]) -> Any:
        """
        twist's own parsing of the plugin's options: the one line it
        refused with (checked: alone on stderr, and the log's one JSON
        line), or the plugin's parsed options.
        """
        log_file = self.tmp / "twist.log"
        log_file.unlink(missing_ok=True)
        stderr = io.StringIO()
        patches = [self.patch(sys, "__stderr__", stderr), self.patch(os, "environ", environ)]
        options = TwistOptions()
        try:
            options.parseOptions([f"--log-file={log_file}", PROCESS[process], *argv])
        except SystemExit as exited:
            self.assertEqual(exited.code, USAGE_STATUS)
            lines = stderr.getvalue().splitlines()
            [record] = [json.loads(x) for x in log_file.read_text().splitlines()]
            self.assertEqual([record["msg"]], lines)
            return lines[0]
        finally:
            if "logFile" in options:
                options["logFile"].close()
            for patch in patches:
                patch.restore()
        return options.subOptions

    async def start(self, process: str, options: Any) -> str | None:
        """Start the plugin's service in process; the line of its failure."""
        if process == "control":
            service: Any = ControlPlaneService(
                options["settings"],
                options["tap_settings"],
                options["listen"],
                options["tls_listen"],
                reactor,
                exit_on_failure=False,
            )
        elif process == "dataplane":
            service = DataPlaneServer(
                options["config"], reactor, install_signal=None, exit_on_failure=False
            )
        else:
            service = MountService(
                reactor, options.settings, install_signal=None, exit_on_failure=False
            )
        service.startService()
        try:
            await service.started
        except Exception:
            return failure_line(PROCESS[process], Failure().value)
        finally:
            await service.stopService()
        return None

    async def start_control_plane(self) -> None:
        """A real control plane (SQLite, a filesystem CA) for the mount's enrollment."""
        environ = {
            "DATABASE_URL": f"sqlite:///{self.tmp}/mount-control.db",
            "SVC_CONTROL_PLANE_TOKEN": TOKEN,
            "SVC_SECRETS_DIR": str(self.tmp / "secrets"),
            "SVC_CA_KEK": KEK,
            "SVC_TRUST_DOMAIN": "svc.test",
        }
        options = self.parse("control", environ, ["--listen=tcp:0:interface=127.0.0.1"])
        service = ControlPlaneService(
            options["settings"],
            options["tap_settings"],
            options["listen"],
            [],
            reactor,
            exit_on_failure=False,
        )
        service.startService()
        self.addCleanup(service.stopService)
        await service.started
        self.control_url = f"http://127.0.0.1:{service.addresses[0].port}"
