"""
Shared plumbing for system tests through a real FUSE mount: the quickstart
stack (C{python -m svc.quickstart start}) with its own mount stopped, and
C{twist svc-mount} processes started by the test with their own cache, audit
log and (optionally) policy file. Cleanup always stops the stack and leaves
nothing mounted, then checks that every process logged JSON lines
(L{tests.json_logs}).
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from http.client import HTTPConnection
from pathlib import Path
from typing import Any, TypeVar

from blake3 import blake3
from twisted.internet import reactor
from twisted.trial.unittest import SkipTest, TestCase

from svc.dataplane_client.client import DataPlaneClient, connect_dataplane
from svc.pki.pem import cert_from_pem, certs_from_pem, key_from_pem
from svc.pki.tls import client_tls_options
from svc.quickstart import DEMO_AGENT, http, start_dataplane
from svc.quickstart_stack import Stack, run_quickstart
from tests.json_logs import JSON_LOGS, check_json_log, stack_logs

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
MOUNT_TIMEOUT = 60.0

T = TypeVar("T", bound="MountStackCase")


def skip_reason() -> str | None:
    """Why the real mount cannot run here (never skipped under CI)."""
    if os.environ.get("CI") == "true":
        return None
    if os.geteuid() != 0:
        return "mounting FUSE needs root here"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    return None


def lstat_tree(root: Path) -> dict[str, tuple[Any, ...]]:
    """
    Every path under C{root} (relative), with what C{os.lstat} shows of it:
    kind-and-permission mode, size, mtime in nanoseconds, and the symlink
    target, the sorted listing or the BLAKE3 of the bytes.
    """
    found: dict[str, tuple[Any, ...]] = {}
    for directory, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(directory, name)
            rel = os.path.relpath(path, root)
            st = os.lstat(path)
            if os.path.islink(path):
                content: Any = os.readlink(path)
            elif os.path.isdir(path):
                content = sorted(os.listdir(path))
            else:
                with open(path, "rb") as handle:
                    content = blake3(handle.read()).hexdigest()
            found[rel] = (st.st_mode, st.st_size, st.st_mtime_ns, content)
    return found


def audit_lines(path: Path) -> list[dict[str, Any]]:
    """The audit log's lines, decoded (empty when the file is missing)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


async def connect_enrolled(enrollment: dict[str, Any]) -> DataPlaneClient:
    """
    A data-plane connection with the credentials of an enrollment (the body
    of a C{POST /agent/enroll} answer), admitted by the server.
    """
    chain = certs_from_pem(enrollment["ca_chain_pem"].encode())
    tls = client_tls_options(
        cert_from_pem(enrollment["client_cert_pem"].encode()),
        key_from_pem(enrollment["client_key_pem"].encode()),
        chain[:-1],
        chain[-1],
        enrollment["server_name"],
    )
    host, port = enrollment["server_addr"].rsplit(":", 1)
    return await connect_dataplane(reactor, (host, int(port)), tls)


EVIDENCE_MARKERS = (
    "#warn]",
    "#error]",
    "#critical]",
    "never came",
    "Traceback",
    '"level":"warn"',
    '"level":"error"',
    '"level":"critical"',
    '"allowed":false',
)
"""
Log lines worth showing when a crash test fails (L{shows_evidence}): the
warnings, errors and settled outcomes of the processes' logs (JSON lines,
or text), and the audit logs' refusals.
"""

EVIDENCE_LINES = 60
"""At most this many such lines of each log are shown."""


def shows_evidence(test: Callable[[T], None]) -> Callable[[T], None]:
    """
    For a test of L{MountStackCase} whose failures depend on timing (crash
    and reconnect tests): when it fails, print what its logs hold worth
    seeing (each log's warnings, errors and settled outcomes, the last
    L{EVIDENCE_LINES} of them) before its temporary directory is removed,
    so that a failure in CI can be looked into from its output.
    """

    @functools.wraps(test)
    def run(self: T) -> None:
        try:
            test(self)
        except BaseException:
            _print_evidence(self.tmp)
            raise

    return run


def _print_evidence(tmp: Path) -> None:
    # os.walk, not glob: a dead mount under tmp (EIO on listing) is skipped, not raised
    # over the test's own failure.
    logs = [
        Path(folder) / name
        for folder, _dirs, names in os.walk(tmp)
        for name in names
        if name.endswith(".log")
    ]
    for log in sorted(logs):
        if not log.is_file():
            continue
        try:
            lines = log.read_text(errors="replace").splitlines()
        except OSError:
            continue
        worth = [line for line in lines if any(marker in line for marker in EVIDENCE_MARKERS)]
        if worth:
            print(f"--- {log.relative_to(tmp)}: {len(worth)} lines worth seeing, the last:")
            for line in worth[-EVIDENCE_LINES:]:
                print("    " + line[:400])


def port_open(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:C{port}."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


class Mount:
    """One C{twist svc-mount} process and its files."""

    def __init__(
        self, process: subprocess.Popen[bytes], log: Path, cache: Path, audit: Path
    ) -> None:
        self.process = process
        self.log = log
        self.cache = cache
        self.audit = audit

    def audit_lines(self) -> list[dict[str, Any]]:
        return audit_lines(self.audit)


class MountStackCase(TestCase):
    """
    Base class: C{setUp} starts the quickstart stack and stops its own mount;
    L{mount} starts a fresh C{twist svc-mount} at C{self.mount_point}.
    """

    def setUp(self) -> None:
        reason = skip_reason()
        if reason is not None:
            raise SkipTest(reason)
        self.tmp = Path(tempfile.mkdtemp(prefix="svc-mount-workloads-"))
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.stack = self.tmp / "stack"
        self.addCleanup(self.check_logs)
        self.addCleanup(self._stop_stack)
        # The stack without the demo's own mount: each test starts its own.
        started = run_quickstart("start", self.stack, environ=JSON_LOGS, options=["--no-mount"])
        self.assertEqual(started.returncode, 0, started.stdout + started.stderr)
        self.state = json.loads((self.stack / "state.json").read_text())
        self.control_url = f"http://127.0.0.1:{self.state['control_port']}"
        self.assertFalse(os.path.ismount(self.state["mount_point"]))
        self.mount_point = self.tmp / "mnt"
        self.mount_point.mkdir()
        self.mounts = 0

    # The stack

    def quickstart(self, command: str) -> subprocess.CompletedProcess[str]:
        return run_quickstart(command, self.stack, environ=JSON_LOGS)

    def check_logs(self) -> None:
        """Cleanup: the stack's three processes and every mount logged JSON lines."""
        check_json_log([*stack_logs(self.stack), *sorted(self.tmp.glob("mount-*.log"))])

    def _stop_stack(self) -> None:
        self.quickstart("stop")
        state_file = self.stack / "state.json"
        if state_file.exists():
            mount_point = json.loads(state_file.read_text()).get("mount_point")
            if mount_point and os.path.ismount(mount_point):
                subprocess.run(["umount", "-l", mount_point], check=False)

    def enroll_token(self) -> str:
        status, minted = http(
            "POST",
            self.control_url + f"/v1/agents/{DEMO_AGENT}/enroll-token",
            {},
            self.state["token"],
        )
        self.assertEqual(status, 200, minted)
        token: str = minted["token"]
        return token

    def enroll(self) -> dict[str, Any]:
        """Another enrollment of the demo agent (its certificate and the server's address)."""
        status, body = http("POST", self.control_url + "/agent/enroll", None, self.enroll_token())
        self.assertEqual(status, 200, body)
        enrollment: dict[str, Any] = body
        return enrollment

    def kill_dataplane(self) -> None:
        """SIGKILL the data-plane process and wait until its port is closed."""
        pid = int((self.stack / "dataplane.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while port_open(self.state["dataplane_port"]):
            self.assertLess(time.monotonic(), deadline, "the data plane's port stayed open")
            time.sleep(0.1)

    def start_dataplane(self, environ: dict[str, str] | None = None) -> None:
        """Start the data plane again (with C{environ} added) and wait for its frame port."""
        start_dataplane(Stack(self.stack), self.state, environ or {})
        deadline = time.monotonic() + 60
        while not port_open(self.state["dataplane_port"]):
            self.assertLess(time.monotonic(), deadline, "the data plane did not come back")
            time.sleep(0.1)

    # Mounts

    def mount(self, policy: dict[str, Any] | None = None, cache: Path | None = None) -> Mount:
        """
        Start twist svc-mount with a fresh audit log and a fresh cache (or
        C{cache}); wait for the mount.
        """
        self.mounts += 1
        label = str(self.mounts)
        log = self.tmp / f"mount-{label}.log"
        cache = cache or self.tmp / f"cache-{label}"
        audit = self.tmp / f"audit-{label}.jsonl"
        environ = {
            **os.environ,
            "SVC_CONTROL_URL": self.control_url,
            "SVC_ENROLL_TOKEN": self.enroll_token(),
            "SVC_MOUNT_POINT": str(self.mount_point),
            "SVC_CACHE_DIR": str(cache),
            "SVC_AUDIT_LOG": str(audit),
            "SVC_MOUNT_FORCE": "1",
            **JSON_LOGS,
        }
        if policy is not None:
            policy_file = self.tmp / f"policy-{label}.json"
            policy_file.write_text(json.dumps(policy))
            environ["SVC_POLICY_FILE"] = str(policy_file)
        with log.open("wb") as output:
            process = subprocess.Popen(
                [str(BIN / "twist"), "svc-mount"],
                env=environ,
                cwd=ROOT,
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        self.addCleanup(self._force_down, process)
        deadline = time.monotonic() + MOUNT_TIMEOUT
        while not os.path.ismount(self.mount_point):
            if process.poll() is not None or time.monotonic() > deadline:
                self.fail(f"no mount; log:\n{log.read_text(errors='replace')}")
            time.sleep(0.2)
        return Mount(process, log, cache, audit)

    def _force_down(self, process: subprocess.Popen[bytes]) -> None:
        """Cleanup: never leave a mount or a process behind."""
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        if os.path.ismount(self.mount_point):
            subprocess.run(["umount", "-l", str(self.mount_point)], check=False)

    def unmount(self, mount: Mount) -> None:
        """SIGTERM: write back, unmount, release the lease, exit."""
        mount.process.send_signal(signal.SIGTERM)
        code = mount.process.wait(120)
        log = mount.log.read_text(errors="replace")
        self.assertFalse(os.path.ismount(self.mount_point), log)
        # twist ends a SIGTERM'd run by re-raising the signal on itself.
        self.assertIn(code, (0, -signal.SIGTERM), log)

    def sh(self, command: str, mount: Mount | None = None, timeout: float = 180) -> str:
        done = subprocess.run(
            ["sh", "-euc", command],
            cwd=self.mount_point,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        log = mount.log.read_text(errors="replace") if mount else ""
        self.assertEqual(done.returncode, 0, f"{command}: {done.stdout}{done.stderr}\n{log}")
        return done.stdout

    # The data plane's HTTPS surface

    def dataplane_metrics(self) -> str:
        """C{/metrics} of the data plane, over HTTPS trusting the org root."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.load_verify_locations(cafile=str(self.stack / "dataplane-state" / "org-root.pem"))
        port = self.state["dataplane_http_port"]
        raw = socket.create_connection(("127.0.0.1", port), timeout=10)
        connection = HTTPConnection("localhost", port, timeout=10)
        connection.sock = context.wrap_socket(raw, server_hostname="localhost")
        try:
            connection.request("GET", "/metrics")
            response = connection.getresponse()
            body = response.read().decode()
            self.assertEqual(response.status, 200, body)
            return body
        finally:
            connection.close()

    def chunk_counter(self, state: str) -> float:
        """C{svc_chunks_total{state=...}} of the data plane (0 when absent)."""
        pattern = re.compile(
            r'^svc_chunks_total\{[^}]*state="' + re.escape(state) + r'"[^}]*\}\s+(\S+)', re.M
        )
        found = pattern.search(self.dataplane_metrics())
        return float(found.group(1)) if found else 0.0
