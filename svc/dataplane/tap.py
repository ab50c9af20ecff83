"""
C{twist svc-dataplane}: options and service construction.

    twist svc-dataplane [--listen STRPORT] [--http-listen STRPORT]
                        [--metrics-listen STRPORT]
                        [--cert FILE --key FILE --root FILE]

C{--listen} is the frame listener (mutual TLS 1.3, default
C{tcp:7443:interface=127.0.0.1}), C{--http-listen} the HTTPS surface
(C{/healthz}, C{/readyz}, C{/metrics}, C{/audit}, C{/control/*}; default
C{tcp:7444:interface=127.0.0.1}). Both take plain stream endpoints: the
server adds TLS itself, with its server leaf. That leaf comes either from
the three given files (C{--cert --key --root}: tests, the embedded
development stack; never renewed) or from the control plane
(C{SVC_CONTROL_URL}, signed with the service token, kept in
C{SVC_STATE_DIR} and renewed in place). C{--metrics-listen} (none by
default) is the operator listener, plain HTTP (C{/metrics}, C{/healthz},
C{/readyz}: L{svc.dataplane.http_operator}); with it C{/metrics} leaves
the HTTPS surface agents reach. Everything else comes from the
environment (L{DataPlaneSettings}); a bad value or option refuses to start
(one line, exit status 64: L{svc.startup}) naming the variable or option.

L{DataPlaneServer} starts, in order: the operator listener, the storage
roots, the audit sink (and
its SIGHUP reopen), the server-certificate component; once that has
installed credentials and this start's registration with the control plane
has been answered (a refusal -- the FQDN registered under another identity
key, another trust domain -- ends the process, then or whenever a later
registration is refused), the deny-list (kept in C{SVC_STATE_DIR}, merged with
the control plane's current set: L{svc.dataplane.revocations}), the frame
listener and the HTTPS listener, then the GC loop. A failure to start is
one line naming the variable or resource at fault and ends the process with
status 1 (a control plane that refuses the service token or the
registration ends it at once; one that does not answer is asked again).
While it runs, the large buffers kept for reuse (chunk reads, request
bodies) that stayed unused for L{BUFFER_TRIM_INTERVAL} seconds are freed.
Stopping (SIGTERM/SIGINT) closes both listeners, sends GOAWAY to every
connection and waits for them to drain, stops the GC loop and the
certificate component, closes the storage engine and flushes the audit log
last.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any, cast

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from prometheus_client import CollectorRegistry
from twisted.application.service import IService, MultiService, Service
from twisted.internet.defer import CancelledError, Deferred, DeferredList, maybeDeferred
from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import ITransport
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.protocols.tls import TLSMemoryBIOFactory
from twisted.python import usage
from twisted.python.failure import Failure

from svc.audit.sink import AuditLogService, InstallSignal, JsonlAuditSink
from svc.dataplane.admission import SwappableServerTLS, TLSAdmission
from svc.dataplane.control_queries import ControlQueries
from svc.dataplane.factory import DataPlaneFactory, ServerLimits, listen_dataplane
from svc.dataplane.gc_loop import GarbageCollectionLoop
from svc.dataplane.http import DataPlaneHttp
from svc.dataplane.http_auth import http_tls_options
from svc.dataplane.http_operator import OperatorHttp, QuietSite
from svc.dataplane.placements import PlacementRecord, Placements
from svc.dataplane.readiness import DataPlaneReadiness
from svc.dataplane.revocations import DenyListFile, Revocations
from svc.dataplane.servercert import (
    CredentialFiles,
    RegistrationRefused,
    ServerCertificate,
    SignServerCertCall,
    StaticServerCertificate,
)
from svc.dataplane.service import DataPlaneService, EventCallback, RevokeCallback
from svc.dataplane.settings import DEFAULT_HTTP_LISTEN, DEFAULT_LISTEN, TapConfig
from svc.durable import make_directories
from svc.metrics import DataPlaneMetrics, PathLabelPolicy
from svc.pki.errors import AdmissionRefused, RefusalReason
from svc.pki.identity import AgentIdentity, DenyList
from svc.pki.tls import server_tls_options
from svc.sessions import session_key
from svc.startup import FAILED_STATUS, LISTEN_FIX, StartError, blame, end_start, refusing
from svc.store.engine import StorageEngine, StorageRoots
from svc.version import exit_with_version
from svc.web.clients import control_plane_http_client
from svc.worker import IWorker, ThreadWorker

HELLO_SERVER_NAME = "svc-dataplane"

SWITCH_INTERVAL = 0.001
"""
Seconds a thread of the data-plane process may hold the interpreter before
another that waits gets it (CPython's default is 0.005). Large request
payloads are decoded on a worker thread; with the default, the reactor
thread waited up to 5 ms for it at each turn. Measured with
C{bench/dataplane.py} (fairness, a flood of maximal C{manifest_put}s):
another tenant's ping p99 9 ms and the reactor's lag p99 8 ms at 0.001,
against 15 and 16 ms at 0.005, with no loss of chunk throughput.
"""

BUFFER_TRIM_INTERVAL = 2.0
"""
Seconds between trims of the reused chunk and request buffers: one idle
through a whole interval is freed, so the memory of a burst goes back to
the system two to four seconds after it.
"""

_log = Logger()


class Options(usage.Options):
    """
    Command-line options for C{twist svc-dataplane}; the environment is read
    here too, so a bad variable is a usage error (exit status 64).
    """

    synopsis = "[--listen STRPORT] [--http-listen STRPORT] [--cert FILE --key FILE --root FILE]"

    optParameters = [
        ["listen", "l", DEFAULT_LISTEN, "Frame listener: a plain stream endpoint (TLS is added)."],
        ["http-listen", None, DEFAULT_HTTP_LISTEN, "HTTPS surface: a plain stream endpoint."],
        ["cert", None, None, "Server leaf PEM (with --key and --root: no control-plane signing)."],
        ["key", None, None, "Server leaf's private key PEM (PKCS#8, unencrypted)."],
        ["root", None, None, "Org root PEM: trust anchor for client certificates."],
        [
            "metrics-listen",
            None,
            None,
            "Operator listener, plain HTTP (/metrics, /healthz, /readyz); /metrics then"
            " leaves the HTTPS surface.",
        ],
    ]

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._environ = os.environ if environ is None else environ

    def opt_version(self) -> None:
        """Print the svc release and exit (before the environment is read)."""
        exit_with_version("svc-dataplane")

    def postOptions(self) -> None:
        with refusing(self, "svc-dataplane", self._environ):
            self["config"] = TapConfig.load(
                self._environ,
                listen=self["listen"],
                http_listen=self["http-listen"],
                cert=self["cert"],
                key=self["key"],
                root=self["root"],
                metrics_listen=self["metrics-listen"],
            )


def makeService(options: Options) -> IService:
    """The data-plane server as one service on the global reactor."""
    from twisted.internet import reactor  # noqa: PLC0415 (installed by twist by now)

    sys.setswitchinterval(SWITCH_INTERVAL)
    service: Any = DataPlaneServer(options["config"], reactor)
    return cast(IService, service)


class RenewableAdmission:
    """
    The admission check (L{TLSAdmission}) against whichever org root the
    server certificate component installed last.
    """

    def __init__(self, trust_domain: str, deny_list: Callable[[], DenyList]) -> None:
        self._trust_domain = trust_domain
        self._deny_list = deny_list
        self._check: TLSAdmission | None = None

    def use_org_root(self, root: x509.Certificate) -> None:
        """Judge connections accepted from now on against C{root}."""
        self._check = TLSAdmission(root, self._trust_domain, self._deny_list)

    def __call__(self, transport: ITransport) -> AgentIdentity:
        if self._check is None:
            raise AdmissionRefused(RefusalReason.CHAIN_MISMATCH, "no org root installed yet")
        return self._check(transport)


class DataPlaneServer(MultiService):
    """
    The whole data-plane server; see the module docstring. Its children (the
    audit log, the certificate component, the GC loop) are started and
    stopped by it in a fixed order, not all at once.

    @param reactor: the reactor (time, threads, listening, TLS).
    @param install_signal: installs the SIGHUP handler (L{None}: none).
    @param exit_on_failure: end the process when the start fails.
    """

    def __init__(
        self,
        config: TapConfig,
        reactor: Any,
        *,
        install_signal: InstallSignal | None = signal.signal,
        exit_on_failure: bool = True,
        limits: ServerLimits | None = None,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        settings = config.settings
        self._config = config
        self._reactor = reactor
        self._exit_on_failure = exit_on_failure
        self._io = ThreadWorker(reactor, "svc-dataplane-io", threads=settings.io_threads)
        # Large request payloads are decoded here, off the reactor.
        self._decode = ThreadWorker(reactor, "svc-dataplane-decode", threads=1)
        self.registry = CollectorRegistry()
        self.metrics = DataPlaneMetrics(
            self.registry,
            PathLabelPolicy.of(settings.metrics_path_labels, settings.control_plane_token),
        )
        self.readiness = DataPlaneReadiness(
            (settings.tenants_root, settings.metadata_root), self._io, reactor
        )
        self.audit = AuditLogService(
            JsonlAuditSink(settings.audit_log, reactor),
            reactor=reactor,
            install_signal=install_signal,
        )
        self.audit.setServiceParent(self)  # type: ignore[no-untyped-call]
        self.queries = self._control_queries()
        self.placements = self._placements()
        self.service = DataPlaneService(
            self._new_engine,
            audit_emit=self.audit.sink.emit,
            metrics=self.metrics,
            clock=reactor,
            session_key=session_key(settings.control_plane_token),
            io_worker=self._io,
            policy_for=config.policies.lookup,
            placements=self.placements,
            answer_limits=settings.answer_limits,
        )
        self._admission = RenewableAdmission(settings.trust_domain, lambda: self.service.deny_list)
        self.revocations = Revocations(
            DenyListFile(settings.state_dir), self._io, reactor, self.service.set_deny_list
        )
        self.factory = DataPlaneFactory(
            self.service,
            self._admission,
            reactor,
            limits
            or ServerLimits(
                server_name=HELLO_SERVER_NAME,
                idle_timeout=float(settings.idle_timeout_seconds),
                max_connections=settings.max_connections,
                max_connections_per_agent=settings.max_connections_per_agent,
                max_pending_connections=settings.max_pending_connections,
                max_pending_per_address=settings.max_pending_per_address,
                handshake_timeout=float(settings.handshake_timeout_seconds),
            ),
            decode_worker=self._decode,
            metrics=self.metrics,
        )
        self.certificate = self._certificate_component()
        self.certificate.setServiceParent(self)  # type: ignore[no-untyped-call]
        self.gc = GarbageCollectionLoop(
            self.service.engine,
            reactor,
            self.audit.sink.emit,
            interval=float(settings.gc_interval_seconds),
            dry_run=settings.gc_dry_run,
        )
        self.gc.setServiceParent(self)  # type: ignore[no-untyped-call]
        self.http: DataPlaneHttp | None = None
        self._frame_tls: SwappableServerTLS | None = None
        self._http_tls: SwappableServerTLS | None = None
        self._ports: list[Any] = []
        self._operator_port: Any = None
        self._trim = LoopingCall(self.trim_buffers)
        self._trim.clock = reactor
        self._serving = False
        self.started: Deferred[None] | None = None
        """Fires once both listeners are open (with C{exit_on_failure} off,
        fails if the start failed)."""

    def _new_engine(self, on_revoke: RevokeCallback, on_event: EventCallback) -> StorageEngine:
        settings, reactor = self._config.settings, self._reactor

        def new_worker(name: str) -> IWorker:
            return ThreadWorker(reactor, f"svc-dataplane-{name}", threads=1)

        return StorageEngine(
            StorageRoots(settings.tenants_root, settings.metadata_root),
            reactor,
            new_worker,
            self._io,
            on_revoke,
            on_event,
            retention=settings.retention,
            lease_timings=settings.lease_timings,
            observer=self.metrics,
        )

    def _control_queries(self) -> ControlQueries | None:
        """The questions to the control plane (L{None} with static credentials)."""
        settings = self._config.settings
        if self._config.static_credentials is not None or settings.control_url is None:
            return None
        return ControlQueries(
            control_plane_http_client(self._reactor, settings.ca_file),
            settings.control_url,
            settings.control_plane_token,
            settings.server_fqdn,
            self._reactor,
            float(settings.control_query_timeout_seconds),
        )

    def _placements(self) -> Placements | None:
        """The placement check (L{None} when C{SVC_PLACEMENT_CHECK} is off)."""
        settings = self._config.settings
        if not settings.placement_check:
            return None
        queries = self.queries
        return Placements(
            PlacementRecord(settings.metadata_root, self._io),
            self._reactor,
            None if queries is None else queries.placed,
            miss_ttl=float(settings.placement_miss_ttl_seconds),
        )

    def _certificate_component(self) -> ServerCertificate | StaticServerCertificate:
        config, settings = self._config, self._config.settings
        if config.static_credentials is not None:
            return StaticServerCertificate(config.static_credentials, self.install_credentials)
        assert config.registration is not None and settings.control_url is not None
        signer = SignServerCertCall(
            control_plane_http_client(self._reactor, settings.ca_file),
            settings.control_url,
            settings.control_plane_token,
            self._reactor,
        )
        return ServerCertificate(
            registration=config.registration,
            signer=signer,
            files=CredentialFiles(settings.state_dir),
            clock=self._reactor,
            io=self._io,
            on_new_certificate=self.install_credentials,
            on_refused=self._registration_refused,
        )

    def install_credentials(
        self, cert: x509.Certificate, key: Ed25519PrivateKey, root: x509.Certificate
    ) -> None:
        """
        Install new server credentials (the certificate component's
        C{on_new_certificate}): TLS options and admission root for every
        connection accepted from now on; live connections keep theirs.
        """
        frame_options = server_tls_options(cert, key, root)
        http_options = http_tls_options(cert, key, root)
        self._admission.use_org_root(root)
        self.readiness.credentials_installed(cert)
        if self._frame_tls is None or self._http_tls is None:
            self._frame_tls = SwappableServerTLS(frame_options)
            self._http_tls = SwappableServerTLS(http_options)
        else:
            self._frame_tls.swap(frame_options)
            self._http_tls.swap(http_options)
        if self.http is not None:
            self.http.use_org_root(root)

    @property
    def frame_tls(self) -> SwappableServerTLS | None:
        """The frame listener's TLS options (L{None} before credentials)."""
        return self._frame_tls

    @property
    def http_tls(self) -> SwappableServerTLS | None:
        """The HTTPS listener's TLS options (L{None} before credentials)."""
        return self._http_tls

    @property
    def addresses(self) -> list[Any]:
        """The addresses listened on: the frame listener, then HTTPS."""
        return [port.getHost() for port in self._ports]

    @property
    def operator_address(self) -> Any:
        """The operator listener's address (L{None} without C{--metrics-listen})."""
        return None if self._operator_port is None else self._operator_port.getHost()

    # Starting

    def startService(self) -> None:
        Service.startService(self)  # type: ignore[no-untyped-call]
        self.started = Deferred.fromCoroutine(self._start())
        if self._exit_on_failure:
            self.started.addErrback(self._start_failed)

    async def _start(self) -> None:
        settings, reactor = self._config.settings, self._reactor
        if self._config.metrics_listen is not None:
            await self._listen_operator(self._config.metrics_listen)
        roots = {
            settings.metadata_root: "SVC_METADATA_ROOT",
            settings.tenants_root: "SVC_TENANTS_ROOT",
        }
        for root, variable in roots.items():
            with blame(variable, f"make {root} a directory this user may create and write"):
                await self._io.submit(partial(make_directories, root))
        with blame("SVC_AUDIT_LOG", "its directory must exist and be writable by this user"):
            self.audit.startService()
        if self.placements is None:
            _log.warn(
                "SVC_PLACEMENT_CHECK is off: every admitted identity is served,"
                " whatever owner its leaf names (tests and benchmarks only)"
            )
        _log.info(
            "svc-dataplane starting: server certificate {source}",
            source="from the given files"
            if self._config.static_credentials is not None
            else f"signed by {settings.control_url}",
        )
        self.certificate.startService()
        with blame("SVC_STATE_DIR", "it must be a directory this user may write"):
            try:
                credentials = await self.certificate.ready()
                await self.certificate.registered()
            except RegistrationRefused as refused:
                raise StartError(refused.variable, str(refused)) from refused
        assert self._frame_tls is not None and self._http_tls is not None
        queries = self.queries
        with blame(
            "SVC_STATE_DIR",
            f"repair or remove {Path(settings.state_dir) / 'deny-list.json'}, or let the"
            " control plane answer (SVC_CONTROL_URL)",
        ):
            await self.revocations.start(None if queries is None else queries.revocations)
        http = self.http = DataPlaneHttp(
            engine=self.service.engine,
            registry=self.registry,
            audit_log=settings.audit_log,
            emit=self.audit.sink.emit,
            current_deny_list=lambda: self.service.deny_list,
            merge_deny_list=self.revocations.merge,
            org_root=credentials.root,
            trust_domain=settings.trust_domain,
            now=reactor.seconds,
            io=self._io,
            clock=reactor,
            metrics=self.metrics,
            announce=self.service.announce,
            placements=self.placements,
            serve_metrics=self._config.metrics_listen is None,
            readiness=self.readiness.probe,
            sweep=self.gc.sweep_now,
            fence=self.service.fence_sessions,
        )
        with blame(f"--listen {self._config.listen}", LISTEN_FIX):
            port = await listen_dataplane(
                reactor, self._config.listen, self.factory, self._frame_tls
            )
        self._listened(port, "frames (mTLS)")
        site = QuietSite(http.resource())  # type: ignore[no-untyped-call]
        creator: Any = self._http_tls
        wrapped: Any = site
        https = TLSMemoryBIOFactory(creator, False, wrapped)
        with blame(f"--http-listen {self._config.http_listen}", LISTEN_FIX):
            endpoint: Any = serverFromString(reactor, self._config.http_listen)  # type: ignore[no-untyped-call]
            https_port = await endpoint.listen(https)
        self._listened(https_port, "HTTPS")
        self.readiness.listening(True)
        self.gc.startService()
        self._trim.start(BUFFER_TRIM_INTERVAL, now=False)
        self._serving = True
        _log.info("svc-dataplane ready", svc_dataplane_ready=True)

    def trim_buffers(self) -> None:
        """Free the reused buffers idle since the previous trim (L{BUFFER_TRIM_INTERVAL})."""
        freed = self.factory.trim_buffers() + self.service.engine.read_buffers.trim()
        if freed:
            _log.debug("freed {count} idle buffers", count=freed)

    async def _listen_operator(self, description: str) -> None:
        """Open the operator listener (plain HTTP: metrics and probes)."""
        operator = OperatorHttp(self.registry, self.readiness.probe)
        with blame(f"--metrics-listen {description}", LISTEN_FIX):
            self._operator_port = port = await operator.listen(self._reactor, description)
        self._log_listening(port, "metrics and probes (plain HTTP)")

    def _listened(self, port: Any, what: str) -> None:
        self._ports.append(port)
        self._log_listening(port, what)

    def _log_listening(self, port: Any, what: str) -> None:
        address = port.getHost()
        _log.info(
            "listening for {what} on {host}:{port}",
            what=what,
            host=getattr(address, "host", address),
            port=getattr(address, "port", ""),
        )

    def _registration_refused(self, error: RegistrationRefused) -> None:
        """The control plane refused this server after it started: stop serving."""
        if self._serving:
            _log.critical("{error}", error=str(error))
            if self._exit_on_failure:
                self._exit_failed()
        # Before that, the start fails with it (the component's registered()).

    def _start_failed(self, failure: Failure) -> None:
        if failure.check(CancelledError) and not self.running:  # type: ignore[no-untyped-call]
            return  # stopped while starting
        end_start(self._reactor, "svc-dataplane", failure)

    def _exit_failed(self) -> None:
        """End the process with L{FAILED_STATUS} (the reason is logged)."""
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        self._reactor.addSystemEventTrigger("after", "shutdown", os._exit, FAILED_STATUS)
        self._reactor.stop()

    # Stopping

    def stopService(self) -> Deferred[None]:
        Service.stopService(self)  # type: ignore[no-untyped-call]
        return Deferred.fromCoroutine(self._stop())

    async def _stop(self) -> None:
        if self.started is not None and not self.started.called:
            self.started.cancel()
        if self._trim.running:
            self._trim.stop()
        ports, self._ports = self._ports, []
        self.readiness.listening(False)
        if self._operator_port is not None:
            ports.append(self._operator_port)
            self._operator_port = None
        await DeferredList([port.stopListening() for port in ports], consumeErrors=True)
        steps: list[tuple[str, Callable[[], object]]] = [
            ("draining connections", self.factory.stop_serving),
            ("stopping the GC loop", lambda: _stop_child(self.gc)),
            ("stopping the server certificate", lambda: _stop_child(self.certificate)),
            ("closing the storage engine", self.service.engine.close),
            ("flushing the audit log", lambda: _stop_child(self.audit)),
        ]
        for what, step in steps:
            try:
                await maybeDeferred(step)
            except Exception:
                _log.failure("svc-dataplane stop: {what} failed", what=what)
        _log.info("svc-dataplane stopped")


def _stop_child(service: Service) -> object:
    if not service.running:
        return None
    stopped: object = service.stopService()  # type: ignore[no-untyped-call]
    return stopped
