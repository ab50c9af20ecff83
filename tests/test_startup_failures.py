"""
Start failures of the real C{twist} processes, run as an operator would,
with output not on a terminal (so JSON logs): each is one line on stderr and
one in the log naming the variable, and the process exits promptly.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from twisted.trial.unittest import TestCase

from tests.dataplane_harness import TWIST, DiskPKI
from tests.json_logs import check_json_log
from tests.test_control_system import ControlProcess, operator

TOKEN = "startup-failure-test-token-" + "s" * 20
KEK = base64.b64encode(b"startup-failures-kek-" * 2).decode()
OTHER_KEK = base64.b64encode(b"another-startup-kek--" * 2).decode()
PROMPTLY = 20.0
"""Seconds within which a failed start has ended the process."""


class Run:
    """What one C{twist} run left: exit status, seconds, stderr lines, log records."""

    def __init__(self, status: int, seconds: float, stderr: str, log: Path) -> None:
        self.status = status
        self.seconds = seconds
        self.stderr_lines = stderr.splitlines()
        self.log = log
        self.records: list[dict[str, Any]] = [
            json.loads(line) for line in log.read_text().splitlines()
        ]

    def failure_records(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("svc_start_failed")]


class StartFailureTests(TestCase):
    """Each start failure: one line naming the variable, a prompt non-zero exit."""

    def setUp(self) -> None:
        self.work = Path(self.mktemp()).resolve()
        self.work.mkdir(parents=True)

    def twist(self, argv: list[str], environ: dict[str, str]) -> Run:
        """Run C{twist <argv>} with C{environ} (no inherited C{SVC_*}), logging to a file."""
        log = self.work / f"twist-{len(list(self.work.glob('twist-*.log')))}.log"
        base = {k: v for k, v in os.environ.items() if not k.startswith("SVC_")}
        began = time.monotonic()
        try:
            done = subprocess.run(
                [str(TWIST), f"--log-file={log}", *argv],
                env={**base, **environ},
                cwd=self.work,
                capture_output=True,
                text=True,
                timeout=PROMPTLY * 2,
                check=False,
            )
        except subprocess.TimeoutExpired as e:
            self.fail(f"still running after {PROMPTLY * 2}s: {log.read_text()} {e.stderr!r}")
        check_json_log([log])
        return Run(done.returncode, time.monotonic() - began, done.stderr, log)

    def assertOneLine(self, run: Run, status: int, variable: str) -> None:
        """Exit status, promptly, one stderr line naming C{variable}, the same in the log."""
        context = f"{run.stderr_lines} {run.records}"
        self.assertEqual(run.status, status, context)
        self.assertLess(run.seconds, PROMPTLY, context)
        [line] = run.stderr_lines
        self.assertIn(f" failed to start: {variable}: ", line)
        [record] = run.failure_records()
        self.assertEqual((record["msg"], record["resource"]), (line, variable))

    def test_wrong_kek(self) -> None:
        """svc-control with a KEK that does not decrypt the org root key: SVC_CA_KEK, status 1."""
        environ = {
            "DATABASE_URL": f"sqlite:///{self.work}/control.db",
            "SVC_CONTROL_PLANE_TOKEN": TOKEN,
            "SVC_SECRETS_DIR": str(self.work / "secrets"),
            "SVC_TRUST_DOMAIN": "svc.test",
        }
        operator({**os.environ, **environ, "SVC_CA_KEK": KEK}, "ca", "init")
        run = self.twist(
            ["svc-control", "--listen=tcp:0:interface=127.0.0.1"],
            {**environ, "SVC_CA_KEK": OTHER_KEK},
        )
        self.assertOneLine(run, 1, "SVC_CA_KEK")

    def test_unreachable_database(self) -> None:
        """
        svc-control whose PostgreSQL does not answer (nothing listens on the
        port): one line naming DATABASE_URL, status 1, without waiting for it.
        """
        with socket.socket() as closed:
            closed.bind(("127.0.0.1", 0))
            port = closed.getsockname()[1]
        run = self.twist(
            ["svc-control", "--listen=tcp:0:interface=127.0.0.1"],
            {
                "DATABASE_URL": f"postgres://postgres@127.0.0.1:{port}/svc",
                "SVC_CONTROL_PLANE_TOKEN": TOKEN,
            },
        )
        self.assertOneLine(run, 1, "DATABASE_URL")

    def test_unusable_jwt_key_without_database(self) -> None:
        """
        svc-control with an unreadable SVC_IDENTITY_PUBLIC_KEY_FILE and no
        DATABASE_URL exits 1 at once instead of staying alive, listening on
        nothing.
        """
        run = self.twist(
            ["svc-control", "--listen=tcp:0:interface=127.0.0.1"],
            {
                "SVC_IDENTITY_AUDIENCE": "svc",
                "SVC_IDENTITY_TENANT_ALLOWLIST": "t1",
                "SVC_IDENTITY_PUBLIC_KEY_FILE": str(self.work / "no-such-key.pem"),
            },
        )
        self.assertOneLine(run, 1, "SVC_IDENTITY_PUBLIC_KEY_FILE")

    def test_bad_variable(self) -> None:
        """A bad variable: one line (no usage text), status 64."""
        run = self.twist(["svc-control"], {"SVC_MOUNT_LEASE_TTL_SECONDS": "5"})
        self.assertOneLine(run, 64, "SVC_MOUNT_LEASE_TTL_SECONDS")

    def test_port_in_use(self) -> None:
        """svc-dataplane on a port already in use: one line naming --listen, status 1."""
        pki = DiskPKI.create(self.work / "pki")
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen(1)
            port = busy.getsockname()[1]
            run = self.twist(
                [
                    "svc-dataplane",
                    f"--listen=tcp:{port}:interface=127.0.0.1",
                    "--http-listen=tcp:0:interface=127.0.0.1",
                    f"--cert={pki.server_cert_file}",
                    f"--key={pki.server_key_file}",
                    f"--root={pki.root_file}",
                ],
                {
                    "SVC_TENANTS_ROOT": str(self.work / "tenants"),
                    "SVC_AUDIT_LOG": str(self.work / "audit.log"),
                    "SVC_TRUST_DOMAIN": pki.trust_domain,
                    "SVC_CONTROL_PLANE_TOKEN": TOKEN,
                    "SVC_STATE_DIR": str(self.work / "state"),
                    "SVC_PLACEMENT_CHECK": "off",
                },
            )
        self.assertOneLine(run, 1, f"--listen tcp:{port}:interface=127.0.0.1")

    def test_wrong_service_token(self) -> None:
        """
        svc-dataplane whose service token the control plane refuses (401)
        stops at once naming SVC_CONTROL_PLANE_TOKEN, instead of asking
        again forever.
        """
        control_environ = {
            **{k: v for k, v in os.environ.items() if not k.startswith("SVC_")},
            "DATABASE_URL": f"sqlite:///{self.work}/control.db",
            "SVC_CONTROL_PLANE_TOKEN": TOKEN,
            "SVC_SECRETS_DIR": str(self.work / "secrets"),
            "SVC_CA_KEK": KEK,
            "SVC_TRUST_DOMAIN": "svc.test",
        }
        operator(control_environ, "ca", "init")
        control = ControlProcess(self.work, control_environ, tls=False)
        self.addCleanup(control.stop)
        control.start()
        run = self.twist(
            [
                "svc-dataplane",
                "--listen=tcp:0:interface=127.0.0.1",
                "--http-listen=tcp:0:interface=127.0.0.1",
            ],
            {
                "SVC_TENANTS_ROOT": str(self.work / "tenants"),
                "SVC_AUDIT_LOG": str(self.work / "audit.log"),
                "SVC_TRUST_DOMAIN": "svc.test",
                "SVC_CONTROL_PLANE_TOKEN": "a-different-token-" + "d" * 20,
                "SVC_STATE_DIR": str(self.work / "state"),
                "SVC_CONTROL_URL": control.url,
                "SVC_ADVERTISE_ADDR": "127.0.0.1:7443",
                "SVC_HTTP_ADVERTISE_ADDR": "127.0.0.1:7444",
            },
        )
        self.assertOneLine(run, 1, "SVC_CONTROL_PLANE_TOKEN")
        self.assertIn("401", run.stderr_lines[0])

    def test_control_url_without_scheme(self) -> None:
        """svc-mount with a control URL without a scheme is refused at once (status 64)."""
        (self.work / "mnt").mkdir()
        run = self.twist(
            ["svc-mount"],
            {
                "SVC_CONTROL_URL": "127.0.0.1:8080",
                "SVC_ENROLL_TOKEN": "token",
                "SVC_MOUNT_POINT": str(self.work / "mnt"),
                "SVC_CACHE_DIR": str(self.work / "cache"),
                "SVC_AUDIT_LOG": str(self.work / "mount-audit.log"),
            },
        )
        self.assertOneLine(run, 64, "SVC_CONTROL_URL")
