"""
System tests of the C{twist svc-dataplane} process itself:

  - bad configuration exits 64 naming the variable; a failure after the
    options were accepted exits 1;
  - SIGHUP reopens the audit log (rotation) and the process keeps serving;
  - SIGTERM sends GOAWAY C{shutdown} to live connections, flushes the
    audit log and stops cleanly;
  - a server process that stops answering (SIGSTOP: its kernel still
    acknowledges every packet, so TCP reports nothing) is found silent by a
    client with a request in flight, which ends the connection and fails
    the request with an unknown outcome instead of waiting out its timeout;
  - without certificate files the server obtains its leaf from a real
    C{twist svc-control} (C{POST /control/sign-server-cert}), stores it in
    C{SVC_STATE_DIR} and serves with it; a second server claiming the same
    FQDN, or a server of another trust domain, is refused and exits 1
    naming the fix.
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import time
from pathlib import Path
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.trial.unittest import TestCase

from svc.dataplane_client.errors import OutcomeUnknown
from svc.pki import server_identity
from svc.pki.pem import key_from_pem
from tests.dataplane_harness import (
    REPO,
    SERVICE_TOKEN,
    TWIST,
    DataPlaneProcess,
    DiskPKI,
    async_test,
    bounded,
    class_server,
    connect_agent,
    free_ports,
    standard_server,
)
from tests.json_logs import JSON_LOGS, check_json_log

_reactor: Any = reactor

USAGE_ERROR_STATUS = 64


class StartupTests(TestCase):
    """
    How the process refuses to run.
    """

    def setUp(self) -> None:
        self.workdir = Path(self.mktemp()).resolve()
        self.pki = DiskPKI.create(self.workdir / "pki")

    def run_twist(self, **environ: str) -> subprocess.CompletedProcess[str]:
        """Run the server with the static files and C{environ}; wait for it to exit."""
        frame, http = free_ports(2)
        base = {k: v for k, v in os.environ.items() if not k.startswith("SVC_")}
        command = [
            str(TWIST),
            "svc-dataplane",
            f"--listen=tcp:{frame}:interface=127.0.0.1",
            f"--http-listen=tcp:{http}:interface=127.0.0.1",
            f"--cert={self.pki.server_cert_file}",
            f"--key={self.pki.server_key_file}",
            f"--root={self.pki.root_file}",
        ]
        return subprocess.run(
            command,
            env={**base, **environ},
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def test_bad_configuration(self) -> None:
        """A missing or malformed variable exits 64 with a message naming it."""
        good = {
            "SVC_TENANTS_ROOT": str(self.workdir / "tenants"),
            "SVC_TRUST_DOMAIN": self.pki.trust_domain,
            "SVC_CONTROL_PLANE_TOKEN": SERVICE_TOKEN,
            "SVC_AUDIT_LOG": str(self.workdir / "audit.log"),
        }
        missing = {k: v for k, v in good.items() if k != "SVC_TENANTS_ROOT"}
        done = self.run_twist(**missing)
        self.assertEqual(done.returncode, USAGE_ERROR_STATUS, done.stdout + done.stderr)
        self.assertIn("SVC_TENANTS_ROOT", done.stdout + done.stderr)
        done = self.run_twist(**good, SVC_IO_THREADS="none")
        self.assertEqual(done.returncode, USAGE_ERROR_STATUS, done.stdout + done.stderr)
        self.assertIn("SVC_IO_THREADS", done.stdout + done.stderr)

    def test_failed_start(self) -> None:
        """An audit log that cannot be opened stops the process with status 1."""
        done = self.run_twist(
            SVC_TENANTS_ROOT=str(self.workdir / "tenants"),
            SVC_TRUST_DOMAIN=self.pki.trust_domain,
            SVC_CONTROL_PLANE_TOKEN=SERVICE_TOKEN,
            SVC_AUDIT_LOG=str(self.workdir / "no-such-directory" / "audit.log"),
        )
        self.assertEqual(done.returncode, 1, done.stdout + done.stderr)
        self.assertIn("svc-dataplane failed to start", done.stdout + done.stderr)


def wait_for_log(server: DataPlaneProcess, text: str, timeout: float = 10.0) -> None:
    """Wait until the server's log contains C{text}."""
    deadline = time.monotonic() + timeout
    while text not in server.log_text():
        if time.monotonic() > deadline:
            raise AssertionError(f"{text!r} not logged within {timeout}s")
        time.sleep(0.02)


class AuditRotationTests(TestCase):
    """
    SIGHUP: the audit log is reopened for rotation.
    """

    def setUp(self) -> None:
        self.server: DataPlaneProcess = class_server(self, standard_server)

    @async_test
    async def test_sighup_reopens_audit_log(self) -> None:
        """After rename + SIGHUP, new lines go to a new file; the old keeps the earlier ones."""
        server = self.server
        client = await connect_agent(_reactor, server, server.pki.agent("tenant-a", "rot-1"))
        self.addCleanup(client.close)
        await client.call("list", {"path": "/rot-1"})
        server.wait_for_audit(lambda r: r.get("agent_id") == "rot-1")
        rotated = server.audit_log.with_name("audit.log.1")
        server.audit_log.rename(rotated)

        server.send_signal(signal.SIGHUP)
        wait_for_log(server, "reopening the audit log")
        await client.call("head_file", {"path": "/rot-1"})
        [fresh] = server.wait_for_audit(lambda r: r.get("agent_id") == "rot-1")
        self.assertEqual(fresh["event"], "head_file")
        old = [line for line in rotated.read_text().splitlines() if '"agent_id":"rot-1"' in line]
        self.assertEqual(len(old), 1)
        self.assertIn('"event":"list_entries"', old[0])
        self.assertTrue(server.running)
        self.assertEqual(server.https("GET", "/healthz").status, 200)


class GracefulStopTests(TestCase):
    """
    SIGTERM: drain, flush, stop.
    """

    @async_test
    async def test_sigterm(self) -> None:
        """Live connections get GOAWAY shutdown; the audit log is complete; the stop is clean."""
        server = standard_server(Path(self.mktemp()).resolve())
        server.start()
        self.addCleanup(server.kill)
        client = await connect_agent(_reactor, server, server.pki.agent("tenant-a", "stop-1"))
        closed = client.when_closed()
        for n in range(20):
            await client.call("dir_create", {"path": f"/stop-1/d{n}", "mode": 0o755})

        server.send_signal(signal.SIGTERM)
        await bounded(closed, _reactor, 30.0)
        assert client.going_away is not None
        self.assertEqual(client.going_away.reason, "shutdown")
        status = server.wait()
        self.assertIn(status, (0, -signal.SIGTERM), server.log_text())
        log = server.log_text()
        self.assertIn("svc-dataplane stopped", log)
        self.assertNotIn("Traceback", log)
        made = [
            r["path"]
            for r in server.audit_records()
            if r["event"] == "dir_create" and r.get("agent_id") == "stop-1"
        ]
        self.assertEqual(made, [f"/stop-1/d{n}" for n in range(20)])


class SilentServerTests(TestCase):
    """
    A server that stops answering, as a machine that vanished does.
    """

    @async_test
    async def test_stopped_server_is_found_silent(self) -> None:
        """
        SIGSTOP with a request in flight: after two silent checks (the
        second after a ping) the client ends the connection; the request
        fails OutcomeUnknown long before its own timeout.
        """
        server = standard_server(Path(self.mktemp()).resolve())
        server.start()
        self.addCleanup(server.kill)
        self.addCleanup(server.send_signal, signal.SIGCONT)
        client = await connect_agent(
            _reactor,
            server,
            server.pki.agent("tenant-a", "quiet-1"),
            silence_check=1.0,
            call_timeout=120.0,
        )
        closed = client.when_closed()
        await client.call("dir_create", {"path": "/quiet-1/d", "mode": 0o755})

        server.send_signal(signal.SIGSTOP)
        started = time.monotonic()
        pending = client.call("list", {"path": "/quiet-1"})
        failure = await bounded(Deferred.fromCoroutine(_failure_of(pending)), _reactor, 30.0)
        waited = time.monotonic() - started
        self.assertIsInstance(failure, OutcomeUnknown)
        self.assertIn("said nothing for", str(failure))
        self.assertIn("not even to a ping", str(failure))
        self.assertLess(waited, 30.0)
        await bounded(closed, _reactor, 10.0)

        server.send_signal(signal.SIGCONT)
        again = await connect_agent(_reactor, server, server.pki.agent("tenant-a", "quiet-1"))
        self.addCleanup(again.close)
        reply = await again.call("list", {"path": "/quiet-1"})
        self.assertEqual([entry["name"] for entry in reply.payload["entries"]], ["d"])


async def _failure_of(call: Deferred[Any]) -> Exception:
    """The exception C{call} fails with (a test failure if it succeeds)."""
    try:
        result = await call
    except Exception as error:
        return error
    raise AssertionError(f"expected a failure, got {result!r}")


class ManagedCertificateTests(TestCase):
    """
    The server leaf signed by a real control plane (the control plane is
    run as its own system tests run it), and the registration behind it:
    one FQDN, one server identity, one trust domain.
    """

    def setUp(self) -> None:
        from tests.test_control_system import KEK, TOKEN, ControlProcess, operator  # noqa: PLC0415

        self.token = TOKEN
        self.workdir = Path(self.mktemp()).resolve()
        (self.workdir / "secrets").mkdir(parents=True)
        control_environ = {
            **os.environ,
            "DATABASE_URL": f"sqlite:///{self.workdir}/control.db",
            "SVC_CONTROL_PLANE_TOKEN": TOKEN,
            "SVC_SECRETS_DIR": str(self.workdir / "secrets"),
            "SVC_CA_KEK": KEK,
            "SVC_TRUST_DOMAIN": "svc.test",
        }
        operator(control_environ, "ca", "init")
        self.control = ControlProcess(self.workdir, control_environ, tls=False)
        self.addCleanup(self.control.stop)
        self.control.start()

    def dataplane(self, name: str, **settings: str) -> tuple[subprocess.Popen[bytes], int, Path]:
        """
        Start C{twist svc-dataplane} with its own state directory and
        ports, FQDN C{localhost}; its process, HTTPS port and log.
        """
        frame, http = free_ports(2)
        environ = {k: v for k, v in os.environ.items() if not k.startswith("SVC_")}
        environ.update(
            SVC_TENANTS_ROOT=str(self.workdir / f"{name}-tenants"),
            SVC_AUDIT_LOG=str(self.workdir / f"{name}-audit.log"),
            SVC_TRUST_DOMAIN="svc.test",
            SVC_CONTROL_PLANE_TOKEN=self.token,
            SVC_CONTROL_URL=self.control.url,
            SVC_STATE_DIR=str(self.workdir / f"{name}-state"),
            **JSON_LOGS,
        )
        environ.update(settings)
        log = self.workdir / f"{name}.log"
        command = [
            str(TWIST),
            f"--log-file={log}",
            "svc-dataplane",
            f"--listen=tcp:{frame}:interface=127.0.0.1",
            f"--http-listen=tcp:{http}:interface=127.0.0.1",
        ]
        process = subprocess.Popen(command, env=environ, cwd=self.workdir)
        self.addCleanup(check_json_log, [log])
        self.addCleanup(stop_process, process)
        return process, http, log

    def serving(self, name: str, **settings: str) -> subprocess.Popen[bytes]:
        """L{dataplane}, once it answers C{/healthz}."""
        process, http, log = self.dataplane(name, **settings)
        root = self.workdir / f"{name}-state" / "org-root.pem"
        deadline = time.monotonic() + 30
        status = None
        while status is None and time.monotonic() < deadline:
            self.assertIsNone(process.poll(), log.read_text() if log.exists() else "")
            status = healthz_status(http, root)
            time.sleep(0.1)
        self.assertEqual(status, 200, log.read_text())
        return process

    def refused(self, name: str, **settings: str) -> str:
        """L{dataplane}, which must exit 1 without serving; its log."""
        process, http, log = self.dataplane(name, **settings)
        status = process.wait(timeout=60)
        text = log.read_text()
        self.assertEqual(status, 1, text)
        self.assertIsNone(healthz_status(http, self.workdir / "a-state" / "org-root.pem"))
        return text

    def stop(self, process: subprocess.Popen[bytes]) -> None:
        process.terminate()
        self.assertIn(process.wait(timeout=30), (0, -signal.SIGTERM))

    def test_leaf_from_control_plane(self) -> None:
        """With SVC_CONTROL_URL and no files, the leaf is obtained, stored and served."""
        process = self.serving("a")
        state = self.workdir / "a-state"
        self.assertEqual(
            sorted(p.name for p in state.iterdir()),
            [
                "deny-list.json",
                "identity-key.pem",
                "org-root.pem",
                "server-cert.pem",
                "server-key.pem",
            ],
        )
        for secret in ("server-key.pem", "identity-key.pem"):
            self.assertEqual((state / secret).stat().st_mode & 0o777, 0o600)
        self.stop(process)

    def test_second_server_with_the_same_fqdn_is_refused(self) -> None:
        """
        A second server started with a registered FQDN (another state
        directory: another identity) exits 1, naming the setting that would
        let it replace the first; started with it, it takes the FQDN over,
        and the first is then refused in its turn, even with a stored leaf.
        """
        first = self.serving("a")
        log = self.refused("b")
        identity = key_from_pem((self.workdir / "a-state" / "identity-key.pem").read_bytes())
        registered = server_identity.key_text(identity)
        self.assertIn("FQDN localhost is registered to another data-plane server", log)
        self.assertIn(f"SVC_REPLACE_SERVER_KEY={registered}", log)
        self.assertNotIn("Traceback", log)
        self.stop(first)
        self.stop(self.serving("b", SVC_REPLACE_SERVER_KEY=registered))
        again = self.refused("a")
        self.assertIn("SVC_REPLACE_SERVER_KEY=", again)

    def test_trust_domain_mismatch_stops_the_server(self) -> None:
        """A server of another trust domain than the control plane's exits 1 naming the fix."""
        log = self.refused("a", SVC_TRUST_DOMAIN="other.test")
        self.assertIn("SVC_TRUST_DOMAIN=svc.test", log)
        self.assertIn("'other.test'", log)


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """Kill and reap C{process} if it still runs."""
    if process.poll() is None:
        process.kill()
        process.wait(timeout=30)


def healthz_status(port: int, root: Path) -> int | None:
    """The status of GET /healthz trusting only C{root} for C{localhost}; None if unreachable."""
    if not root.exists():
        return None
    context = ssl.create_default_context(cafile=str(root))
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as raw:
            with context.wrap_socket(raw, server_hostname="localhost") as tls:
                tls.sendall(
                    b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
                )
                head = tls.recv(64)
    except OSError:
        return None
    return int(head.split()[1])
