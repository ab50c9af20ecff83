"""
Control-plane enrollment rate and latency, and C{GET /healthz} against a bare
Klein app, measured in the same run.

    .venv/bin/python bench/control.py [--tokens 400] [--concurrency 8]
        [--sequential-tokens 100] [--health-concurrency 16] [--health-duration 5]

Sets up, in a temporary directory (removed at the end):

  1. C{svc ca init} (C{.venv/bin/svc}) for a filesystem CA with a KEK;
  2. a real C{twist svc-control} process on SQLite, plain HTTP on loopback;
  3. a fake data-plane server in this process (a TLS 1.3 HTTPS server that
     requires the control certificate and answers 204), registered through
     C{POST /control/sign-server-cert} so placement succeeds and the grant
     each enrollment queues (C{PUT /control/quotas}) is delivered;
  4. C{--tokens + --sequential-tokens + 1} agents of one tenant provisioned
     (C{POST /v1/entities}) and an enroll token minted for each
     (C{POST /v1/agents/{id}/enroll-token}); one enrollment warms up (it
     creates the tenant intermediate).

Then, from a second process (C{bench/control_load.py load}, threads with
persistent C{http.client} connections):

  - C{enroll}: the C{--tokens} tokens spent by C{--concurrency} clients
    (enrollments per second, latency percentiles);
  - C{enroll_sequential}: C{--sequential-tokens} tokens by one client (the
    unloaded latency);
  - C{healthz_control} and C{healthz_bare}: C{GET /healthz} for
    C{--health-duration} seconds with C{--health-concurrency} clients,
    against the control plane and against a bare Klein app
    (C{bench/control_load.py serve-bare}, a third process), one after the
    other.

Prints one JSON object. The control plane's CPU use per phase (fraction of
one core, from C{/proc}) is reported with each phase; the load generator
reports its own. Client, server and the fake data plane share the machine's
cores.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import http.server
import json
import os
import platform
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.x509.oid import NameOID

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
LOAD = REPO / "bench" / "control_load.py"
TOKEN = "bench-control-service-token-" + "b" * 20
KEK = base64.b64encode(b"bench-control-kek-0123456789abcd").decode()
DATAPLANE_FQDN = "dp.bench.test"
START_TIMEOUT = 30.0


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class Control:
    """A persistent HTTP connection to the control plane (set-up calls only)."""

    def __init__(self, port: int) -> None:
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def call(self, method: str, path: str, body: object = None, token: str = TOKEN) -> Any:
        """One request; its JSON answer. Anything but 200 is an error."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {token}"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        self.connection.request(method, path, body=data, headers=headers)
        response = self.connection.getresponse()
        raw = response.read()
        if response.status != 200:
            raise RuntimeError(f"{method} {path}: {response.status} {raw!r}")
        return json.loads(raw)


class FakeDataPlane:
    """The HTTPS control surface of a data-plane server: counts requests, answers 204."""

    def __init__(
        self, port: int, cert_pem: str, key_pem: bytes, root_pem: str, workdir: Path
    ) -> None:
        self.paths: dict[str, int] = {}
        cert_file, key_file = workdir / "dp-cert.pem", workdir / "dp-key.pem"
        cert_file.write_text(cert_pem)
        key_file.write_bytes(key_pem)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.load_cert_chain(cert_file, key_file)
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cadata=root_pem)
        paths, lock = self.paths, threading.Lock()

        class Handler(http.server.BaseHTTPRequestHandler):
            def _handle(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with lock:
                    paths[self.path] = paths.get(self.path, 0) + 1
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_PUT = do_POST = do_GET = _handle

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port: int = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def register_dataplane(control: Control, workdir: Path) -> FakeDataPlane:
    """Register the fake data plane on a free port and start it there."""
    key = Ed25519PrivateKey.generate()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, DATAPLANE_FQDN)])
    csr = x509.CertificateSigningRequestBuilder().subject_name(name).sign(key, None)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    port = free_port()
    body = {
        "csr_pem": csr.public_bytes(serialization.Encoding.PEM).decode(),
        "fqdn": DATAPLANE_FQDN,
        "advertise_addr": f"127.0.0.1:{port}",
        "http_addr": f"127.0.0.1:{port}",
        "capacity": 10,
    }
    answer = control.call("POST", "/control/sign-server-cert", body)
    return FakeDataPlane(port, answer["cert_pem"], key_pem, answer["root_ca_pem"], workdir)


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process C{pid} so far (Linux C{/proc})."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_healthy(port: int, process: subprocess.Popen[bytes], log: Path | None) -> None:
    """Wait until C{GET /healthz} answers 200."""
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited: {log.read_text() if log else ''}")
        try:
            probe = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            probe.request("GET", "/healthz")
            if probe.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"server did not start: {log.read_text() if log else ''}")


def load(port: int, server_pid: int, *extra: str) -> dict[str, Any]:
    """Run the load generator against C{port}; its JSON plus the server's CPU use."""
    command = [sys.executable, str(LOAD), "load", "--port", str(port), *extra]
    cpu_before = process_cpu_seconds(server_pid)
    done = subprocess.run(command, check=True, capture_output=True, cwd=REPO)
    result: dict[str, Any] = json.loads(done.stdout)
    # The server idles while the load process starts and stops, so its CPU
    # time over the load's own measuring window is its load there.
    used = process_cpu_seconds(server_pid) - cpu_before
    result["server_cpu_cores"] = round(used / result["elapsed_s"], 2)
    return result


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Set up, measure, tear down; the JSON result."""
    secrets_dir = workdir / "secrets"
    secrets_dir.mkdir()
    environ = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{workdir}/control.db",
        "SVC_CONTROL_PLANE_TOKEN": TOKEN,
        "SVC_SECRETS_DIR": str(secrets_dir),
        "SVC_CA_KEK": KEK,
        "SVC_TRUST_DOMAIN": "bench.test",
        "SVC_ORG_NAME": "Bench",
        "SVC_REVOCATION_PUSH_INTERVAL_SECONDS": "3600",
    }
    subprocess.run(
        [str(BIN / "svc"), "ca", "init"], check=True, env=environ, cwd=REPO, capture_output=True
    )
    port, bare_port = free_port(), free_port()
    log = workdir / "control.log"
    control_process = subprocess.Popen(
        [
            str(BIN / "twist"),
            "--log-format=text",
            f"--log-file={log}",
            "svc-control",
            f"--listen=tcp:{port}:interface=127.0.0.1",
        ],
        env=environ,
        cwd=REPO,
    )
    bare_process: subprocess.Popen[bytes] | None = None
    plane: FakeDataPlane | None = None
    try:
        wait_healthy(port, control_process, log)
        control = Control(port)
        plane = register_dataplane(control, workdir)
        agents = 1 + args.tokens + args.sequential_tokens
        setup_began = time.perf_counter()
        tokens = []
        for n in range(agents):
            agent = {"type": "agent", "id": f"agent-{n}", "owner": "bench", "grant_bytes": 2**30}
            control.call("POST", "/v1/entities", agent)
            tokens.append(control.call("POST", f"/v1/agents/agent-{n}/enroll-token")["token"])
        setup_s = time.perf_counter() - setup_began
        control.call("POST", "/agent/enroll", token=tokens[0])
        concurrent_file, sequential_file = workdir / "tokens", workdir / "tokens-sequential"
        concurrent_file.write_text("\n".join(tokens[1 : 1 + args.tokens]) + "\n")
        sequential_file.write_text("\n".join(tokens[1 + args.tokens :]) + "\n")
        enroll = ["--method", "POST", "--path", "/agent/enroll"]
        results: dict[str, Any] = {}
        results["enroll"] = load(
            port,
            control_process.pid,
            *enroll,
            "--concurrency",
            str(args.concurrency),
            "--tokens-file",
            str(concurrent_file),
        )
        results["enroll_sequential"] = load(
            port,
            control_process.pid,
            *enroll,
            "--concurrency",
            "1",
            "--tokens-file",
            str(sequential_file),
        )
        health = [
            "--concurrency",
            str(args.health_concurrency),
            "--duration",
            str(args.health_duration),
        ]
        results["healthz_control"] = load(port, control_process.pid, *health)
        bare_process = subprocess.Popen(
            [sys.executable, str(LOAD), "serve-bare", "--port", str(bare_port)],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
        )
        wait_healthy(bare_port, bare_process, None)
        results["healthz_bare"] = load(bare_port, bare_process.pid, *health)
        quota_puts = plane.paths.get("/control/quotas", 0)
    finally:
        for process in (control_process, bare_process):
            if process is not None and process.poll() is None:
                process.terminate()
                process.wait(timeout=30)
        if plane is not None:
            plane.stop()
    control_rps = results["healthz_control"]["rps"]
    bare_rps = results["healthz_bare"]["rps"]
    return {
        "benchmark": "control",
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "database": "sqlite (WAL, synchronous=FULL)",
        "enroll_per_s": results["enroll"]["rps"],
        "enroll_p99_ms": results["enroll"]["p99_ms"],
        "enroll_sequential_per_s": results["enroll_sequential"]["rps"],
        "enroll_sequential_p99_ms": results["enroll_sequential"]["p99_ms"],
        "healthz_control_rps": control_rps,
        "healthz_bare_klein_rps": bare_rps,
        "healthz_ratio": round(control_rps / bare_rps, 3) if bare_rps else None,
        "quota_puts_delivered": quota_puts,
        "setup_provision_and_mint_s": round(setup_s, 2),
        "phases": results,
    }


def main() -> int:
    """Parse, run in a temporary directory, print the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--sequential-tokens", type=int, default=100)
    parser.add_argument("--health-concurrency", type=int, default=16)
    parser.add_argument("--health-duration", type=float, default=5.0)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="svc-bench-control-"))
    try:
        result = run(args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
