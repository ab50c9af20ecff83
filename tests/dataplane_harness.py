"""
Real C{twist svc-dataplane} processes for system tests and benchmarks.

Three pieces, usable on their own:

  - L{DiskPKI}: a L{TestPKI} whose server leaf names C{localhost}, with the
    files a process or a Python C{ssl} client needs written to a directory
    (org root, server leaf and key, control certificate and key, and each
    agent credential on demand, bad variants included);
  - L{DataPlaneProcess}: one server process on free loopback ports, started
    with the static certificate files, waited for until C{/healthz}
    answers (30 s at most), its log (JSON lines, checked when it stops:
    L{tests.json_logs}) and audit log kept in its work directory; blocking
    HTTPS helpers for C{/healthz}, C{/metrics}, C{/audit} and
    C{/control/*};
  - L{connect_agent}: a real L{DataPlaneClient} (Twisted, the reactor given)
    for an agent credential.

Typical use::

    pki = DiskPKI.create(workdir / "pki")
    server = DataPlaneProcess(workdir, pki)
    server.start()
    try:
        client = await connect_agent(reactor, server, pki.agent("tenant-a", "agent-1"))
        ...
    finally:
        server.stop()

In trial tests, L{class_server} gives each test class one process (trial
has no C{setUpClass}): started on the class's first test, stopped when
another class asks for its own or when the test run exits. A process is
never left behind: it is stopped at exit, and it is killed by the kernel if
the process that started it dies (C{setpriv --pdeathsig}, where available).
"""

from __future__ import annotations

import atexit
import functools
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from prometheus_client.parser import text_string_to_metric_families
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IOpenSSLClientConnectionCreator
from twisted.internet.ssl import TLSVersion, optionsForClientTLS

from svc.dataplane_client.client import DataPlaneClient, connect_dataplane
from svc.pki.issuance import CertifiedKey
from svc.pki.names import format_serial
from svc.pki.pem import cert_to_pem, certs_to_pem, key_to_pem
from svc.testing.pki import TENANTS, AgentCredentials, TestPKI
from tests.json_logs import JSON_LOGS, check_json_log

T = TypeVar("T")
R = TypeVar("R")

REPO = Path(__file__).resolve().parent.parent
TWIST = Path(sys.executable).with_name("twist")
SERVER_NAME = "localhost"
"""The DNS SAN of the server leaf, and the name clients check."""
TRUST_DOMAIN = "svc.test"
SERVICE_TOKEN = "dataplane-system-test-token-" + "t" * 16
START_TIMEOUT = 30.0
STOP_TIMEOUT = 30.0
LOOPBACK = "127.0.0.1"

SETPRIV = shutil.which("setpriv")
"""util-linux C{setpriv}: runs the server with a parent-death signal."""


def free_ports(count: int) -> list[int]:
    """C{count} distinct loopback TCP ports that were free a moment ago."""
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind((LOOPBACK, 0))
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            probe.close()


class AgentFiles:
    """An agent credential on disk: the chain (leaf, then intermediates) and the key."""

    def __init__(self, chain: Path, key: Path) -> None:
        self.chain = chain
        self.key = key


class DiskPKI:
    """
    A L{TestPKI} plus a server leaf for L{SERVER_NAME}, written to
    C{directory}: C{root.pem}, C{server-cert.pem}, C{server-key.pem},
    C{control-cert.pem}, C{control-key.pem}; agent credentials are written
    on demand (L{files}) under C{agents/}.

    @ivar pki: the in-memory CA material (agents, bad variants).
    @ivar server: the server leaf and key.
    """

    def __init__(self, directory: Path, pki: TestPKI, server: CertifiedKey) -> None:
        self.directory = directory
        self.pki = pki
        self.server = server
        self.root_file = directory / "root.pem"
        self.server_cert_file = directory / "server-cert.pem"
        self.server_key_file = directory / "server-key.pem"
        self.control_cert_file = directory / "control-cert.pem"
        self.control_key_file = directory / "control-key.pem"

    @classmethod
    def create(
        cls,
        directory: Path,
        *,
        trust_domain: str = TRUST_DOMAIN,
        tenants: Iterable[str] = TENANTS,
    ) -> DiskPKI:
        """Issue everything at the current time and write the files."""
        pki = TestPKI.build(trust_domain=trust_domain, tenants=tuple(tenants))
        disk = cls(directory, pki, pki.server_leaf(SERVER_NAME))
        (directory / "agents").mkdir(parents=True, exist_ok=True)
        disk._write(disk.root_file, cert_to_pem(pki.root.cert))
        disk._write(disk.server_cert_file, cert_to_pem(disk.server.cert))
        disk._write(disk.server_key_file, key_to_pem(disk.server.key), 0o600)
        disk._write(disk.control_cert_file, cert_to_pem(pki.control.cert))
        disk._write(disk.control_key_file, key_to_pem(pki.control.key), 0o600)
        return disk

    @staticmethod
    def _write(path: Path, data: bytes, mode: int = 0o644) -> None:
        path.write_bytes(data)
        path.chmod(mode)

    @property
    def trust_domain(self) -> str:
        return self.pki.trust_domain

    # Credentials (in memory; see files() for disk)

    def agent(self, tenant_id: str, agent_id: str, user_id: str = "user-1") -> AgentCredentials:
        """A good agent credential."""
        return self.pki.agent(tenant_id, agent_id, user_id)

    def bad_agents(self) -> dict[str, AgentCredentials]:
        """One credential per admission rule it breaks (each would otherwise pass)."""
        pki = self.pki
        return {
            "other_root": pki.foreign_agent("tenant-a", "agent-1"),
            "tenant_only": pki.tenant_only_agent("tenant-a"),
            "cross_tenant_intermediate": pki.cross_tenant_agent("tenant-a", "agent-1", "tenant-b"),
            "wrong_trust_domain": pki.wrong_domain_agent("tenant-a", "agent-1", "evil.test"),
            "expired": pki.expired_agent("tenant-a", "agent-1"),
        }

    def files(self, credentials: AgentCredentials) -> AgentFiles:
        """Write C{credentials} (chain and key) under C{agents/}, named by serial."""
        name = format_serial(credentials.leaf.cert.serial_number)
        chain = self.directory / "agents" / f"{name}-chain.pem"
        key = self.directory / "agents" / f"{name}-key.pem"
        if not chain.exists():
            self._write(chain, certs_to_pem([credentials.leaf.cert, *credentials.chain]))
            self._write(key, key_to_pem(credentials.leaf.key), 0o600)
        return AgentFiles(chain, key)

    # TLS client settings

    def client_options(self, credentials: AgentCredentials) -> IOpenSSLClientConnectionCreator:
        """The data-plane client's TLS options for C{credentials} (Twisted)."""
        return credentials.client_options(SERVER_NAME)

    def no_certificate_options(self) -> IOpenSSLClientConnectionCreator:
        """A TLS 1.3 client trusting the org root that presents no certificate."""
        settings: dict[str, Any] = {"raiseMinimumTo": TLSVersion.TLSv1_3}
        return optionsForClientTLS(
            SERVER_NAME, trustRoot=self.pki.trust_root(), extraCertificateOptions=settings
        )

    def tls12_options(self, credentials: AgentCredentials) -> IOpenSSLClientConnectionCreator:
        """C{credentials} on a client that speaks at most TLS 1.2."""
        settings: dict[str, Any] = {
            "privateKey": credentials.leaf.key,
            "certificate": credentials.leaf.cert,
            "extraCertChain": list(credentials.chain),
            "lowerMaximumSecurityTo": TLSVersion.TLSv1_2,
        }
        return optionsForClientTLS(
            SERVER_NAME, trustRoot=self.pki.trust_root(), extraCertificateOptions=settings
        )

    def ssl_context(self, credentials: AgentCredentials | None = None) -> ssl.SSLContext:
        """
        A Python C{ssl} client context (TLS 1.3, trusting only the org root,
        checking L{SERVER_NAME}) presenting C{credentials}, or nothing.
        """
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.load_verify_locations(cafile=str(self.root_file))
        if credentials is not None:
            files = self.files(credentials)
            context.load_cert_chain(str(files.chain), str(files.key))
        return context

    def control_ssl_context(self) -> ssl.SSLContext:
        """A Python C{ssl} client context presenting the control-plane certificate."""
        context = self.ssl_context()
        context.load_cert_chain(str(self.control_cert_file), str(self.control_key_file))
        return context


def serial_of(credentials: AgentCredentials) -> str:
    """The canonical serial of an agent's leaf (as audit lines and deny-lists carry it)."""
    return format_serial(credentials.leaf.cert.serial_number)


def subject_of(credentials: AgentCredentials) -> str:
    """The RFC 4514 subject of an agent's leaf (the audit line's C{cert_subject})."""
    return credentials.leaf.cert.subject.rfc4514_string()


class HttpsAnswer:
    """A response of the HTTPS surface: status, headers and body."""

    def __init__(self, status: int, headers: Mapping[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)

    def __repr__(self) -> str:
        return f"<HttpsAnswer {self.status} {self.body[:200]!r}>"


class DataPlaneProcess:
    """
    One C{twist svc-dataplane} process on loopback, started from the
    L{DiskPKI}'s static files.

    Its work directory holds C{tenants/}, C{audit.log}, C{svc-dataplane-state/}
    (the kept deny-list) and one C{dataplane-<n>.log} per start. C{environ}
    adds (or overrides) variables of the process; inherited C{SVC_*}
    variables are dropped so the developer's own settings never leak in.
    The placement check is off (C{SVC_PLACEMENT_CHECK=off}) unless
    C{environ} turns it on.
    """

    def __init__(
        self,
        workdir: Path,
        pki: DiskPKI,
        environ: Mapping[str, str] | None = None,
        *,
        twist: Path = TWIST,
        operator_listener: bool = False,
    ) -> None:
        self.workdir = workdir
        self.operator_listener = operator_listener
        """Whether the process has C{--metrics-listen} (on C{metrics_port})."""
        self.metrics_port = 0
        self.pki = pki
        self.twist = twist
        self.tenants_root = workdir / "tenants"
        self.audit_log = workdir / "audit.log"
        self.extra_environ = dict(environ or {})
        self.process: subprocess.Popen[bytes] | None = None
        self.frame_port = 0
        self.http_port = 0
        self.starts = 0
        self.log_file = workdir / "dataplane-0.log"
        workdir.mkdir(parents=True, exist_ok=True)

    @property
    def environ(self) -> dict[str, str]:
        """The process's environment."""
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("SVC_")}
        return {
            **inherited,
            "SVC_TENANTS_ROOT": str(self.tenants_root),
            "SVC_AUDIT_LOG": str(self.audit_log),
            "SVC_TRUST_DOMAIN": self.pki.trust_domain,
            "SVC_CONTROL_PLANE_TOKEN": SERVICE_TOKEN,
            # No control plane places identities here: serve every admitted
            # one (tests/test_dataplane_placement.py turns the check on).
            "SVC_PLACEMENT_CHECK": "off",
            **JSON_LOGS,
            **self.extra_environ,
        }

    def command(self) -> list[str]:
        """
        The command line of the next start. With C{setpriv} available the
        server gets SIGKILL when the process that started it dies.
        """
        prefix = [SETPRIV, "--pdeathsig", "KILL", "--"] if SETPRIV is not None else []
        return [
            *prefix,
            str(self.twist),
            f"--log-file={self.log_file}",
            "svc-dataplane",
            f"--listen=tcp:{self.frame_port}:interface={LOOPBACK}",
            f"--http-listen=tcp:{self.http_port}:interface={LOOPBACK}",
            f"--cert={self.pki.server_cert_file}",
            f"--key={self.pki.server_key_file}",
            f"--root={self.pki.root_file}",
            *(
                [f"--metrics-listen=tcp:{self.metrics_port}:interface={LOOPBACK}"]
                if self.operator_listener
                else []
            ),
        ]

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def frame_address(self) -> tuple[str, int]:
        """Where agents connect."""
        return (LOOPBACK, self.frame_port)

    # Life cycle

    def start(self, timeout: float = START_TIMEOUT, attempts: int = 3) -> None:
        """
        Start on fresh free ports and wait until C{/healthz} answers; ports
        taken meanwhile by someone else are retried on new ones.

        @raise AssertionError: the process exited or did not answer in time
            (its log is in the message); it is killed first.
        """
        for attempt in range(attempts):
            self.frame_port, self.http_port, self.metrics_port = free_ports(3)
            self.starts += 1
            self.log_file = self.workdir / f"dataplane-{self.starts}.log"
            _RUNNING.add(self)
            with self.log_file.with_suffix(".stderr").open("wb") as stderr:
                self.process = subprocess.Popen(
                    self.command(),
                    env=self.environ,
                    cwd=self.workdir,
                    stdin=subprocess.DEVNULL,
                    stdout=stderr,
                    stderr=stderr,
                )
            try:
                self._wait_until_healthy(timeout)
                return
            except AssertionError:
                self.kill()
                if attempt + 1 < attempts and "Address already in use" in self.log_text():
                    continue
                raise

    def _wait_until_healthy(self, timeout: float) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(
                    f"svc-dataplane exited with {self.process.returncode}:\n{self.log_text()}"
                )
            try:
                if self.https("GET", "/healthz", timeout=1.0).status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"svc-dataplane did not answer /healthz in {timeout}s")

    def send_signal(self, signum: int) -> None:
        """Send C{signum} to the process."""
        if self.running:
            assert self.process is not None
            self.process.send_signal(signum)

    def stop(self, signum: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT) -> int | None:
        """
        Stop with C{signum} and wait (killing it after C{timeout}); the exit
        status, or L{None} if it never ran.

        @raise AssertionError: a line of its log is not plain JSON.
        """
        _RUNNING.discard(self)
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signum)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=timeout)
        self.check_log()
        return self.process.returncode

    def check_log(self) -> None:
        """Every log of every start is JSON lines (L{tests.json_logs.check_json_log})."""
        check_json_log(self.workdir / f"dataplane-{n}.log" for n in range(1, self.starts + 1))

    def wait(self, timeout: float = STOP_TIMEOUT) -> int:
        """
        Wait for the process to exit by itself (e.g. after a signal sent
        with L{send_signal}); its exit status. A clean stop on SIGTERM is
        C{-SIGTERM}: twist re-raises the signal once it has shut down.
        """
        assert self.process is not None
        status = self.process.wait(timeout=timeout)
        _RUNNING.discard(self)
        return status

    def kill(self) -> None:
        """SIGKILL and reap."""
        self.stop(signal.SIGKILL)

    # What it wrote

    def log_text(self) -> str:
        """The twist log of the current (or last) start, plus its stderr."""
        stderr = self.log_file.with_suffix(".stderr")
        parts = [p.read_text(errors="replace") for p in (self.log_file, stderr) if p.exists()]
        return "\n".join(parts)

    def audit_records(self) -> list[dict[str, Any]]:
        """Every complete line of the audit log, parsed (key order kept)."""
        if not self.audit_log.exists():
            return []
        data = self.audit_log.read_bytes()
        complete = data[: data.rfind(b"\n") + 1]
        return [json.loads(line) for line in complete.splitlines()]

    def wait_for_audit(
        self, predicate: Callable[[dict[str, Any]], bool], count: int = 1, timeout: float = 10.0
    ) -> list[dict[str, Any]]:
        """
        The audit records matching C{predicate} once there are at least
        C{count} (the writer thread appends shortly after each operation).

        @raise AssertionError: not enough within C{timeout} seconds.
        """
        deadline = time.monotonic() + timeout
        while True:
            found = [r for r in self.audit_records() if predicate(r)]
            if len(found) >= count or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        if len(found) < count:
            raise AssertionError(f"{len(found)} of {count} audit records within {timeout}s")
        return found

    # The HTTPS surface (blocking)

    def https(
        self,
        method: str,
        path: str,
        body: object = None,
        *,
        context: ssl.SSLContext | None = None,
        timeout: float = 10.0,
    ) -> HttpsAnswer:
        """
        One request to the HTTPS surface, as C{context}'s client (default:
        no client certificate). Never raises on status.
        """
        context = context or self.pki.ssl_context()
        raw = socket.create_connection((LOOPBACK, self.http_port), timeout=timeout)
        connection = http.client.HTTPConnection(SERVER_NAME, self.http_port, timeout=timeout)
        connection.sock = context.wrap_socket(raw, server_hostname=SERVER_NAME)
        try:
            headers = {}
            data = None
            if body is not None:
                data = json.dumps(body).encode()
                headers["Content-Type"] = "application/json"
            connection.request(method, path, body=data, headers=headers)
            response = connection.getresponse()
            return HttpsAnswer(response.status, dict(response.getheaders()), response.read())
        finally:
            connection.close()

    def operator(self, path: str, timeout: float = 10.0) -> HttpsAnswer:
        """One GET to the operator listener (plain HTTP; C{operator_listener} on)."""
        assert self.operator_listener, "the process has no operator listener"
        connection = http.client.HTTPConnection(LOOPBACK, self.metrics_port, timeout=timeout)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return HttpsAnswer(response.status, dict(response.getheaders()), response.read())
        finally:
            connection.close()

    def metrics_text(self) -> str:
        """The C{/metrics} exposition (from the operator listener when there is one)."""
        if self.operator_listener:
            answer = self.operator("/metrics")
        else:
            answer = self.https("GET", "/metrics")
        assert answer.status == 200, answer
        return answer.body.decode("utf-8")

    def push_revocations(self, serials: Iterable[str], *, lifetime: float = 3600.0) -> None:
        """
        Replace the deny-list with C{serials}, as the control plane does
        (C{PUT /control/cert-revocations} with the control certificate).
        """
        now = datetime.now(UTC)
        not_after = (now + timedelta(seconds=lifetime)).isoformat()
        body = {
            "revocations": [{"serial": s, "not_after": not_after} for s in serials],
            "generated_at": now.isoformat(),
        }
        answer = self.https(
            "PUT", "/control/cert-revocations", body, context=self.pki.control_ssl_context()
        )
        assert answer.status == 204, answer


def metric_sample(exposition: str, name: str, **labels: str) -> float | None:
    """One sample's value in a Prometheus exposition, or L{None} when absent."""
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return None


def connect_agent(
    reactor: Any,
    server: DataPlaneProcess,
    credentials: AgentCredentials,
    **options: Any,
) -> Deferred[DataPlaneClient]:
    """
    A real client connection for C{credentials}; fires once admitted
    (HELLO), fails with L{svc.dataplane_client.errors.AdmissionFailed}
    when dropped. C{options} go to L{connect_dataplane}.
    """
    return connect_with(reactor, server, server.pki.client_options(credentials), **options)


def connect_with(
    reactor: Any,
    server: DataPlaneProcess,
    creator: IOpenSSLClientConnectionCreator,
    **options: Any,
) -> Deferred[DataPlaneClient]:
    """A real client connection with any client TLS options (bad ones too)."""
    options.setdefault("hello_timeout", 15.0)
    options.setdefault("call_timeout", 30.0)
    return connect_dataplane(reactor, server.frame_address, creator, **options)


def raw_tls_socket(
    server: DataPlaneProcess, credentials: AgentCredentials, timeout: float = 10.0
) -> ssl.SSLSocket:
    """A blocking Python C{ssl} socket to the frame listener, handshake done."""
    raw = socket.create_connection(server.frame_address, timeout=timeout)
    return server.pki.ssl_context(credentials).wrap_socket(raw, server_hostname=SERVER_NAME)


def promtool_check(exposition: str) -> tuple[int, str] | None:
    """
    C{promtool check metrics} on C{exposition}: exit status and output;
    L{None} when promtool is not installed.
    """
    promtool = shutil.which("promtool")
    if promtool is None:
        return None
    done = subprocess.run(
        [promtool, "check", "metrics"],
        input=exposition.encode("utf-8"),
        capture_output=True,
        timeout=60,
        check=False,
    )
    return done.returncode, (done.stdout + done.stderr).decode("utf-8", "replace")


class _ClassServer:
    """
    The one shared process of the test class running now (see
    L{class_server}).
    """

    def __init__(self) -> None:
        self._owner: type | None = None
        self._server: DataPlaneProcess | None = None

    def get(self, case: Any, make: Callable[[Path], DataPlaneProcess]) -> DataPlaneProcess:
        owner = type(case)
        if self._owner is owner and self._server is not None and self._server.running:
            return self._server
        self.stop()
        server = make(Path(case.mktemp()).resolve())
        server.start()
        self._owner, self._server = owner, server
        return server

    def stop(self) -> None:
        server, self._server, self._owner = self._server, None, None
        if server is not None:
            server.stop()


_CLASS_SERVER = _ClassServer()


def class_server(case: Any, make: Callable[[Path], DataPlaneProcess]) -> DataPlaneProcess:
    """
    One server process per test class (trial has no C{setUpClass}): the
    running process of C{case}'s class, made with C{make(workdir)} and
    started on the class's first call. Trial runs a class's tests one
    after the other, so the process of the previous class is stopped when
    the next class asks for its own; the last one is stopped at exit.
    """
    return _CLASS_SERVER.get(case, make)


def standard_server(workdir: Path, environ: Mapping[str, str] | None = None) -> DataPlaneProcess:
    """A process with a fresh L{DiskPKI} in C{workdir/pki} and C{environ} added."""
    return DataPlaneProcess(workdir, DiskPKI.create(workdir / "pki"), environ)


def async_test(
    method: Callable[[T], Coroutine[Any, Any, None]],
) -> Callable[[T], Deferred[None]]:
    """A trial test written as C{async def}: returns its Deferred."""

    @functools.wraps(method)
    def run(self: T) -> Deferred[None]:
        return Deferred.fromCoroutine(method(self))

    return run


def bounded(waiting: Deferred[R], reactor: Any, seconds: float = 15.0) -> Deferred[R]:
    """C{waiting}, failing with C{TimeoutError} if it has not fired within C{seconds}."""
    return waiting.addTimeout(seconds, reactor)


class _Running(set[DataPlaneProcess]):
    """Processes started and not stopped yet: stopped at interpreter exit."""

    def stop_all(self) -> None:
        for server in list(self):
            server.stop(timeout=10.0)


_RUNNING = _Running()
atexit.register(_RUNNING.stop_all)
