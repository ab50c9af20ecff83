"""
System tests of the control plane: real C{twist svc-control} processes on
loopback, driven over real HTTP and HTTPS.

  - the full flow (provision, enroll token, data-plane server registration,
    enroll, mount lease over mutual TLS, refresh, release, revoke) on SQLite
    and on a throwaway PostgreSQL database; the released leaf's serial must
    reach a data-plane HTTPS endpoint (a fake one, checking the control
    certificate) within one push interval;
  - SIGKILL while a client provisions in a loop loses no acknowledged
    provisioning (SQLite);
  - a full disk (a 2 MiB tmpfs, as root) gives 500 C{server_error}, and the
    service recovers when space returns;
  - bad configuration exits non-zero naming the variable; a failed start
    exits 1.
"""

from __future__ import annotations

import base64
import errno
import http.client
import http.server
import json
import os
import signal
import socket
import sqlite3
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from twisted.trial.unittest import SkipTest, TestCase

from svc.testing.postgres import database_for_test, in_ci
from svc.testing.registration import registration_body
from tests.json_logs import JSON_LOGS, check_json_log

REPO = Path(__file__).resolve().parent.parent
TWIST = Path(sys.executable).with_name("twist")
TOKEN = "system-test-service-token-" + "z" * 20
KEK = base64.b64encode(b"system-test-kek-" * 2).decode()
PUSH_INTERVAL = 3
DATAPLANE_FQDN = "dp.test"
START_TIMEOUT = 30.0


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def call(
    method: str,
    url: str,
    body: object = None,
    *,
    token: str | None = TOKEN,
    context: ssl.SSLContext | None = None,
    timeout: float = 10.0,
) -> tuple[int, Any, dict[str, str]]:
    """One request: status, parsed JSON body (or None) and headers; never raises on status."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} if data is not None else {}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            status, raw, found = response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as error:
        status, raw, found = error.code, error.read(), dict(error.headers)
    return status, json.loads(raw) if raw else None, found


def operator(environ: dict[str, str], *args: str) -> str:
    """Run an operator command (C{svc ca init} ...), failing the test if it fails; its stdout."""
    from svc import cli  # noqa: PLC0415

    if "svc.control.operator_cli" in cli.SUBCOMMAND_MODULES:
        command = [sys.executable, "-m", "svc.cli", *args]
    else:  # not wired into the svc command yet: run the operator module's parser
        program = (
            "import sys\nfrom svc.control.operator_cli import build_parser\n"
            "a = build_parser().parse_args(sys.argv[1:])\nsys.exit(a.run(a))\n"
        )
        command = [sys.executable, "-c", program, *args]
    done = subprocess.run(
        command, check=False, env=environ, cwd=REPO, capture_output=True, timeout=60
    )
    if done.returncode != 0:
        raise AssertionError(f"{args} failed: {done.stderr.decode()}")
    return done.stdout.decode()


class ControlProcess:
    """One C{twist svc-control} process with a plain and a TLS listener."""

    def __init__(self, workdir: Path, environ: dict[str, str], tls: bool) -> None:
        self.workdir = workdir
        self.environ = environ
        self.tls = tls
        self.process: subprocess.Popen[bytes] | None = None
        self.port = self.tls_port = 0
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def tls_url(self) -> str:
        return f"https://localhost:{self.tls_port}"

    def start(self) -> None:
        self.port, self.tls_port = free_port(), free_port()
        self.starts += 1
        log = self.workdir / f"control-{self.starts}.log"
        command = [
            str(TWIST),
            f"--log-file={log}",
            "svc-control",
            f"--listen=tcp:{self.port}:interface=127.0.0.1",
        ]
        if self.tls:
            command.append(f"--tls-listen=tcp:{self.tls_port}:interface=127.0.0.1")
        # PYTHONFAULTHANDLER: a process that will not stop is made to print
        # every thread's stack (SIGABRT, L{kill}) into the test's output.
        environ = {**self.environ, **JSON_LOGS, "PYTHONFAULTHANDLER": "1"}
        self.process = subprocess.Popen(command, env=environ, cwd=REPO)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"svc-control exited: {log.read_text()}")
            try:
                if call("GET", self.url + "/healthz", token=None, timeout=1)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"svc-control did not start: {log.read_text()}")

    def kill(self, sig: int = signal.SIGKILL) -> int:
        """
        Send C{sig}; its exit status. One that has not ended 30 s later is
        made to print its threads' stacks (SIGABRT, the fault handler) and
        the test fails saying so.
        """
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGABRT)
            self.process.wait(timeout=30)
            raise AssertionError(
                f"svc-control did not end within 30 s of signal {sig}; its threads' stacks"
                " are on standard error above"
            ) from None

    def stop(self) -> None:
        """SIGTERM it; then every line it logged must be JSON (L{check_json_log})."""
        if self.process is not None and self.process.poll() is None:
            self.kill(signal.SIGTERM)
        check_json_log(self.workdir / f"control-{n}.log" for n in range(1, self.starts + 1))


class FakeDataPlane:
    """
    A data plane's HTTPS control surface: TLS 1.3, requires a client
    certificate from the org root, records every request with the peer's
    URI SANs, answers 204 (or purge/usage JSON).
    """

    def __init__(
        self, port: int, cert_pem: str, key_pem: bytes, root_pem: str, workdir: Path
    ) -> None:
        self.requests: list[tuple[str, str, Any, list[str]]] = []
        cert_file, key_file = workdir / "dp-cert.pem", workdir / "dp-key.pem"
        cert_file.write_text(cert_pem)
        key_file.write_bytes(key_pem)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.load_cert_chain(cert_file, key_file)
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cadata=root_pem)
        recorded = self.requests

        class Handler(http.server.BaseHTTPRequestHandler):
            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                peer: Any = self.connection.getpeercert()
                uris = [v for k, v in peer.get("subjectAltName", ()) if k == "URI"]
                recorded.append((self.command, self.path, body, uris))
                answer = b""
                if self.path.startswith("/control/usage"):
                    answer = b'{"owner": "acme", "used_bytes": 0, "agents": {}}'
                elif self.path == "/control/purge-agent":
                    answer = b'{"count": 0, "bytes_freed": 0}'
                self.send_response(200 if answer else 204)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            do_PUT = do_POST = do_GET = _handle

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port: int = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def pushed_serials(self) -> set[str]:
        return {
            entry["serial"]
            for method, path, body, _ in self.requests
            if path == "/control/cert-revocations"
            for entry in body["revocations"]
        }

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class ControlSystemMixin:
    """The control plane on real processes; subclasses give the database."""

    workdir: Path

    def database_url(self) -> str:
        raise NotImplementedError

    def make_control(
        self, case: TestCase, init_ca: bool = True, extra: dict[str, str] | None = None
    ) -> ControlProcess:
        self.workdir = Path(case.mktemp()).resolve()
        secrets_dir = self.workdir / "secrets"
        secrets_dir.mkdir(parents=True)
        environ = {
            **os.environ,
            "DATABASE_URL": self.database_url(),
            "SVC_CONTROL_PLANE_TOKEN": TOKEN,
            "SVC_SECRETS_DIR": str(secrets_dir),
            "SVC_CA_KEK": KEK,
            "SVC_TRUST_DOMAIN": "svc.test",
            "SVC_ORG_NAME": "System Test",
            "SVC_REVOCATION_PUSH_INTERVAL_SECONDS": str(PUSH_INTERVAL),
            **(extra or {}),
        }
        if init_ca:
            operator(environ, "ca", "init")
        control = ControlProcess(self.workdir, environ, tls=init_ca)
        case.addCleanup(control.stop)
        return control


class FullFlowMixin(ControlSystemMixin):
    """The whole provisioning-to-release flow."""

    def register_fake_dataplane(self, case: TestCase, control: ControlProcess) -> FakeDataPlane:
        key = Ed25519PrivateKey.generate()
        port = free_port()
        address = f"127.0.0.1:{port}"
        body = registration_body(DATAPLANE_FQDN, address, address, "svc.test", key=key)
        status, answer, _ = call("POST", control.url + "/control/sign-server-cert", body)
        case.assertEqual(status, 200, answer)
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        plane = FakeDataPlane(
            port, answer["cert_pem"], key_pem, answer["root_ca_pem"], self.workdir
        )
        case.addCleanup(plane.stop)
        self.root_pem = answer["root_ca_pem"]
        return plane

    def agent_context(self, enrollment: dict[str, Any]) -> ssl.SSLContext:
        leaf_file, key_file = self.workdir / "leaf.pem", self.workdir / "leaf-key.pem"
        intermediate = enrollment["ca_chain_pem"].split("-----END CERTIFICATE-----")[0]
        leaf_file.write_text(
            enrollment["client_cert_pem"] + intermediate + "-----END CERTIFICATE-----\n"
        )
        key_file.write_text(enrollment["client_key_pem"])
        context = ssl.create_default_context(cadata=self.root_pem)
        context.load_cert_chain(leaf_file, key_file)
        return context

    def run_full_flow(self, case: TestCase) -> None:
        control = self.make_control(case)
        control.start()
        plane = self.register_fake_dataplane(case, control)
        provision = {"type": "agent", "id": "a1", "owner": "acme", "grant_bytes": 1 << 30}
        status, entity, headers = call("POST", control.url + "/v1/entities", provision)
        case.assertEqual((status, entity["virtual_path"]), (200, "/mnt/svc/agents/a1"))
        case.assertEqual(headers.get("Svc-Api-Version"), "1")
        case.assertEqual(call("POST", control.url + "/api/v1/entities", provision)[0], 200)

        status, minted, _ = call("POST", control.url + "/v1/agents/a1/enroll-token")
        case.assertEqual(status, 200, minted)
        status, enrollment, _ = call("POST", control.url + "/agent/enroll", token=minted["token"])
        case.assertEqual(status, 200, enrollment)
        case.assertEqual(enrollment["server_addr"], f"127.0.0.1:{plane.port}")
        again = call("POST", control.url + "/agent/enroll", token=minted["token"])
        case.assertEqual(again[0], 401)

        tls = self.agent_context(enrollment)
        mount = f"{control.tls_url}/allocations/{entity['allocation_id']}/mount"
        status, lease, _ = call("POST", mount, {}, token=None, context=tls)
        case.assertEqual(status, 200, lease)
        case.assertTrue(lease["session_id"].startswith("mount:"))
        by_fingerprint = {"agent_fingerprint": enrollment["agent_fingerprint"]}
        plain_mount = f"{control.url}/allocations/{entity['allocation_id']}/mount"
        status, conflict, _ = call("POST", plain_mount, by_fingerprint, token=None)
        case.assertEqual((status, conflict["error"]), (409, "already_mounted"))
        status, _, _ = call("POST", mount + "/refresh", {}, token=None, context=tls)
        case.assertEqual(status, 200)

        status, _, _ = call("DELETE", mount, None, token=None, context=tls)
        case.assertEqual(status, 204)
        released = time.monotonic()
        while enrollment["serial"] not in plane.pushed_serials():
            if time.monotonic() - released > PUSH_INTERVAL:
                case.fail(f"serial not pushed within {PUSH_INTERVAL}s: {plane.requests}")
            time.sleep(0.05)
        pushes = [r for r in plane.requests if r[1] == "/control/cert-revocations"]
        case.assertIn("spiffe://svc.test/control", pushes[-1][3])

        status, _, _ = call("DELETE", control.url + "/v1/entities/agent/a1")
        case.assertEqual(status, 204)
        status, gone, _ = call("GET", control.url + "/v1/entities/agent/a1")
        case.assertEqual((status, gone["error"]), (410, "revoked"))
        status, swept, _ = call("POST", control.url + "/v1/admin/purge-sweep")
        case.assertEqual((status, len(swept["purged"])), (200, 1))


class SQLiteFlowTests(FullFlowMixin, TestCase):
    """The flow on SQLite."""

    def database_url(self) -> str:
        return f"sqlite:///{self.workdir}/control.db"

    def test_full_flow(self) -> None:
        """Provision, enroll token, enroll, mount over mTLS, release (pushed), revoke, purge."""
        self.run_full_flow(self)


class PostgresFlowTests(FullFlowMixin, TestCase):
    """The flow on a throwaway PostgreSQL database."""

    def setUp(self) -> None:
        self.postgres_url = database_for_test(self)

    def database_url(self) -> str:
        return self.postgres_url

    def test_full_flow(self) -> None:
        """Provision, enroll token, enroll, mount over mTLS, release (pushed), revoke, purge."""
        self.run_full_flow(self)


class CrashTests(ControlSystemMixin, TestCase):
    """SIGKILL during provisioning on SQLite."""

    def database_url(self) -> str:
        return f"sqlite:///{self.workdir}/control.db"

    def test_kill_nine_loses_nothing_acknowledged(self) -> None:
        """Every provisioning acknowledged before SIGKILL is there after a restart."""
        control = self.make_control(self, init_ca=False)
        control.start()
        acknowledged: list[str] = []

        def provision_forever() -> None:
            for n in range(100_000):
                body = {"type": "agent", "id": f"k{n}", "owner": "acme", "grant_bytes": n}
                try:
                    status, _, _ = call("POST", control.url + "/v1/entities", body, timeout=5)
                except OSError:
                    return
                if status != 200:
                    return
                acknowledged.append(f"k{n}")

        client = threading.Thread(target=provision_forever)
        client.start()
        deadline = time.monotonic() + 30
        while len(acknowledged) < 60 and time.monotonic() < deadline:
            time.sleep(0.01)
        control.kill(signal.SIGKILL)
        client.join(timeout=30)
        self.assertGreaterEqual(len(acknowledged), 60)
        control.start()
        missing = [
            agent
            for agent in acknowledged
            if call("GET", f"{control.url}/v1/entities/agent/{agent}")[0] != 200
        ]
        self.assertEqual(missing, [])


class DiskFullTests(ControlSystemMixin, TestCase):
    """A full disk under the SQLite database."""

    def setUp(self) -> None:
        self.mount_point = Path(self.mktemp()).resolve()
        self.mount_point.mkdir(parents=True)
        if os.geteuid() != 0:
            raise SkipTest("needs root to mount a small tmpfs")
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(self.mount_point)],
            check=False,
            capture_output=True,
        )
        if done.returncode != 0:
            reason = f"cannot mount a tmpfs: {done.stderr.decode().strip()}"
            if in_ci():
                self.fail(reason)
            raise SkipTest(reason)
        self.addCleanup(subprocess.run, ["umount", "-l", str(self.mount_point)])

    def database_url(self) -> str:
        return f"sqlite:///{self.mount_point}/control.db"

    def test_full_disk_then_recovery(self) -> None:
        """A full disk gives 500 server_error; freeing space makes provisioning work again."""
        control = self.make_control(self, init_ca=False)
        control.start()
        provision = {"type": "agent", "id": "before", "owner": "acme", "grant_bytes": 1}
        self.assertEqual(call("POST", control.url + "/v1/entities", provision)[0], 200)
        filler = self.mount_point / "filler"
        with filler.open("wb") as out:
            try:
                while True:
                    out.write(b"\0" * 65536)
                    out.flush()
            except OSError as error:
                self.assertEqual(error.errno, errno.ENOSPC)
        failure = None
        for n in range(300):
            body = {"type": "agent", "id": f"full{n}", "owner": "acme", "grant_bytes": 1}
            status, answer, _ = call("POST", control.url + "/v1/entities", body)
            if status != 200:
                failure = (status, answer)
                break
        self.assertEqual(failure, (500, {"error": "server_error"}))
        filler.unlink()
        body = {"type": "agent", "id": "after", "owner": "acme", "grant_bytes": 1}
        status, answer, _ = call("POST", control.url + "/v1/entities", body)
        self.assertEqual(status, 200, answer)
        self.assertEqual(call("GET", control.url + "/v1/entities/agent/before")[0], 200)


def raw_exchange(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    """Send C{data} on a fresh connection; everything answered until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as connection:
        connection.sendall(data)
        received = b""
        while True:
            chunk = connection.recv(65536)
            if not chunk:
                return received
            received += chunk


def parse_answer(raw: bytes) -> tuple[int, dict[str, str], Any]:
    """Status, headers (lower-case names) and JSON body of one raw HTTP/1.1 answer."""
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(": ")
        headers[name.lower()] = value
    return int(status_line.split()[1]), headers, json.loads(body)


class HttpBoundaryTests(ControlSystemMixin, TestCase):
    """What the real server answers before any route runs (SQLite)."""

    def database_url(self) -> str:
        return f"sqlite:///{self.workdir}/control.db"

    def setUp(self) -> None:
        # Access lines are debug: the parser's 400 must have one too.
        self.control = self.make_control(self, init_ca=False, extra={"SVC_LOG_LEVEL": "debug"})
        self.control.start()

    def test_oversized_enroll_refused_before_body(self) -> None:
        """A 64 MiB unauthenticated enroll is 413 at its headers; the body is never awaited."""
        raw = raw_exchange(
            self.control.port,
            b"POST /agent/enroll HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 67108864\r\n\r\n",
        )
        status, headers, body = parse_answer(raw)
        self.assertEqual(status, 413)
        self.assertEqual(
            body,
            {
                "error": "request_too_large",
                "error_description": "body_too_large",
                "max_body_bytes": 65536,
            },
        )
        self.assertEqual(headers["svc-api-version"], "1")
        self.assertRegex(headers["x-request-id"], "^[0-9a-f]{32}$")

    def test_twisted_bad_request_has_general_headers(self) -> None:
        """A request Twisted's parser refuses is 400 with X-Request-ID and Svc-API-Version."""
        status, headers, body = parse_answer(
            raw_exchange(self.control.port, b"NOT AN HTTP REQUEST LINE\r\n\r\n")
        )
        self.assertEqual(
            (status, body),
            (400, {"error": "invalid_request", "error_description": "malformed_request"}),
        )
        self.assertEqual(headers["svc-api-version"], "1")
        self.assertRegex(headers["x-request-id"], "^[0-9a-f]{32}$")
        log = (self.workdir / "control-1.log").read_text()
        self.assertIn(f"400 0.000s request_id={headers['x-request-id']}", log)

    def test_locked_database_is_503(self) -> None:
        """A control.db another process holds locked is 503 database_unavailable, then works."""
        provision = {"type": "agent", "id": "l1", "owner": "acme", "grant_bytes": 1}
        locker = sqlite3.connect(self.workdir / "control.db", isolation_level=None)
        try:
            locker.execute("BEGIN EXCLUSIVE")
            status, body, headers = call(
                "POST", self.control.url + "/v1/entities", provision, timeout=60
            )
        finally:
            locker.close()
        self.assertEqual(
            (status, body),
            (
                503,
                {"error": "temporarily_unavailable", "error_description": "database_unavailable"},
            ),
        )
        self.assertEqual(headers.get("Retry-After"), "5")
        self.assertEqual(call("POST", self.control.url + "/v1/entities", provision)[0], 200)

    def test_sign_in_link_is_no_cookie(self) -> None:
        """The secret 'svc user seed' prints is refused as a cookie and still signs in once."""
        link = operator(self.control.environ, "user", "seed", "--user", "alice").strip()

        def get(path: str, cookie: str | None = None) -> http.client.HTTPResponse:
            connection = http.client.HTTPConnection("127.0.0.1", self.control.port, timeout=10)
            self.addCleanup(connection.close)
            headers = {} if cookie is None else {"Cookie": f"svc_admin_session={cookie}"}
            connection.request("GET", path, headers=headers)
            return connection.getresponse()

        self.assertEqual(get("/me", cookie=link).status, 401)
        signed_in = get(f"/admin/session?token={link}")
        self.assertEqual(signed_in.status, 303)
        cookie = (signed_in.getheader("Set-Cookie") or "").split(";")[0].partition("=")[2]
        self.assertNotEqual(cookie, link)
        self.assertEqual(get("/me", cookie=cookie).status, 200)
        self.assertEqual(get(f"/admin/session?token={link}").status, 401)

    def test_database_file_private(self) -> None:
        """The SQLite control.db the process created is mode 0600."""
        mode = (self.workdir / "control.db").stat().st_mode & 0o777
        self.assertEqual(mode, 0o600)


class StartupTests(TestCase):
    """How the process refuses to run."""

    def run_twist(self, environ: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
        port = free_port()
        command = [str(TWIST), "svc-control", f"--listen=tcp:{port}:interface=127.0.0.1"]
        return subprocess.run(
            command,
            check=False,
            env={**os.environ, **environ},
            cwd=REPO,
            capture_output=True,
            timeout=60,
        )

    def test_bad_configuration(self) -> None:
        """A bad variable exits non-zero with a message naming it."""
        done = self.run_twist({"DATABASE_URL": "mysql://nowhere/db"})
        self.assertNotEqual(done.returncode, 0)
        self.assertIn(b"DATABASE_URL", done.stdout + done.stderr)

    def test_failed_start(self) -> None:
        """A database that cannot be opened stops the process with status 1."""
        done = self.run_twist(
            {
                "DATABASE_URL": "sqlite:////nonexistent-svc-dir/control.db",
                "SVC_CONTROL_PLANE_TOKEN": TOKEN,
            }
        )
        self.assertEqual(done.returncode, 1, done.stdout + done.stderr)
