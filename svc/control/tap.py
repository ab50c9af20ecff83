"""
C{twist svc-control}: options and service construction.

    twist svc-control [--listen STRPORT ...] [--tls-listen STRPORT ...]

C{--listen} serves plain HTTP (default C{tcp:8080:interface=127.0.0.1}; TLS
is terminated at the edge in a hosted deployment). C{--tls-listen} serves
HTTPS on a stream endpoint with the control plane's own certificate (an
ECDSA P-256 leaf for C{SVC_CONTROL_FQDN} signed by the org root at start, or
the operator's C{SVC_CONTROL_TLS_CERT_FILE}/C{SVC_CONTROL_TLS_KEY_FILE}; see
L{svc.control.tls_listener}) and I{asks} for, but does not require, a client
certificate verified against the org root: an agent presenting its leaf
there is identified by it on the mount routes.
Everything else comes from the environment (L{ControlSettings} and
L{TapSettings}); a bad value refuses to start naming the variable (one
line, exit status 64: L{svc.startup}).

L{ControlPlaneService} opens the store (applying migrations), opens the agent
CA, builds the app with every route, listens, and runs the push loop; a
failure to start is one line naming the variable or resource at fault and
ends the process with exit status 1. Stopping closes the listeners, waits
for the push round in progress and closes the store.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import attrs
from twisted.application.service import IService, MultiService
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.endpoints import serverFromString
from twisted.internet.task import LoopingCall
from twisted.internet.testing import MemoryReactor
from twisted.logger import Logger
from twisted.protocols.tls import TLSMemoryBIOFactory
from twisted.python import usage
from twisted.web.server import Site

from svc.config import ConfigError, env_int, env_optional, env_path, env_str
from svc.control.app import build_control_app
from svc.control.ca import AgentCAProvider
from svc.control.dashboard import dashboard_routes
from svc.control.dataplane_client import (
    DEFAULT_CALL_TIMEOUT_SECONDS,
    ControlCertificateIssuer,
    ControlCertificateKeeper,
    DataPlaneClient,
    mtls_http_client,
)
from svc.control.enrollment import EnrollmentDeps
from svc.control.http_site import ControlSite
from svc.control.journal_access import DataPlaneJournal
from svc.control.owner_auth import OwnerAuthenticator
from svc.control.readiness import readiness_probe, readiness_routes
from svc.control.revocation_push import DEFAULT_PUSH_INTERVAL_SECONDS, ControlPushLoop
from svc.control.routes_access import AccessDeps, access_routes
from svc.control.routes_dataplane import DataPlaneQueryDeps, dataplane_query_routes
from svc.control.routes_enrollment import enrollment_authenticators, enrollment_routes
from svc.control.routes_entities import EntityDeps, entity_routes
from svc.control.routes_fleet import FleetDeps, fleet_routes
from svc.control.routes_journal import JournalDeps, journal_routes
from svc.control.routes_mounts import DEFAULT_MOUNT_LEASE_TTL_SECONDS, MountDeps, mount_routes
from svc.control.routes_owner import OwnerDeps, owner_routes
from svc.control.routing import AuthKind, Feature, Route
from svc.control.settings import ControlSettings
from svc.control.store import open_store
from svc.control.store.interface import ControlStore
from svc.control.tls_listener import (
    CERT_FILE_VARIABLE,
    KEY_FILE_VARIABLE,
    OptionalClientCertificateOptions,
    ServingCertificate,
    issue_serving_certificate,
    load_serving_certificate,
)
from svc.pki import names
from svc.pki.errors import InvalidName
from svc.sessions import session_key
from svc.startup import LISTEN_FIX, StartError, blame, end_start, refusing
from svc.version import exit_with_version
from svc.web.readiness import ReadinessProbe
from svc.worker import ThreadWorker

DEFAULT_LISTEN = "tcp:8080:interface=127.0.0.1"
DEFAULT_CONTROL_FQDN = "localhost"
TLS_RENEWAL_CHECK_SECONDS = 3600

_log = Logger()


def _ca_resource(settings: ControlSettings) -> tuple[str, str]:
    """The variable to blame when the agent CA cannot be opened, and the fix."""
    if settings.agent_ca_configured and settings.secrets_dir is None:
        return ("SVC_SECRETS_BACKEND", "check the CA tables of the postgres DATABASE_URL")
    return (
        "SVC_SECRETS_DIR",
        "it must be the directory 'svc ca init' wrote, readable by this user",
    )


@attrs.frozen
class TapSettings:
    """
    The process settings L{ControlSettings} does not cover (see
    C{docs/configuration.md}).
    """

    mount_lease_ttl_seconds: int = DEFAULT_MOUNT_LEASE_TTL_SECONDS
    push_interval_seconds: int = DEFAULT_PUSH_INTERVAL_SECONDS
    dataplane_timeout_seconds: int = int(DEFAULT_CALL_TIMEOUT_SECONDS)
    control_fqdn: str = DEFAULT_CONTROL_FQDN
    tls_cert_file: Path | None = None
    """The operator's certificate chain for C{--tls-listen} (with C{tls_key_file})."""
    tls_key_file: Path | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> TapSettings:
        """
        Read and check the variables.

        @raise ConfigError: naming the variable at fault.
        """
        cert_file = env_optional(environ, CERT_FILE_VARIABLE)
        key_file = env_optional(environ, KEY_FILE_VARIABLE)
        if (cert_file is None) != (key_file is None):
            missing = KEY_FILE_VARIABLE if key_file is None else CERT_FILE_VARIABLE
            raise ConfigError(
                missing, f"set both {CERT_FILE_VARIABLE} and {KEY_FILE_VARIABLE}, or neither"
            )
        fqdn = env_str(environ, "SVC_CONTROL_FQDN", DEFAULT_CONTROL_FQDN)
        try:
            fqdn = names.check_fqdn(fqdn)
        except InvalidName as e:
            raise ConfigError("SVC_CONTROL_FQDN", str(e)) from None
        return cls(
            mount_lease_ttl_seconds=env_int(
                environ,
                "SVC_MOUNT_LEASE_TTL_SECONDS",
                DEFAULT_MOUNT_LEASE_TTL_SECONDS,
                minimum=10,
                maximum=3600,
            ),
            push_interval_seconds=env_int(
                environ,
                "SVC_REVOCATION_PUSH_INTERVAL_SECONDS",
                DEFAULT_PUSH_INTERVAL_SECONDS,
                minimum=1,
                maximum=3600,
            ),
            dataplane_timeout_seconds=env_int(
                environ,
                "SVC_DATAPLANE_CALL_TIMEOUT_SECONDS",
                int(DEFAULT_CALL_TIMEOUT_SECONDS),
                minimum=1,
                maximum=300,
            ),
            control_fqdn=fqdn,
            tls_cert_file=None if cert_file is None else env_path(environ, CERT_FILE_VARIABLE),
            tls_key_file=None if key_file is None else env_path(environ, KEY_FILE_VARIABLE),
        )


class Options(usage.Options):
    """
    Command-line options for C{twist svc-control}; configuration is read
    from the environment here, so a bad value is a usage error.
    """

    synopsis = "[--listen STRPORT ...] [--tls-listen STRPORT ...]"

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._environ = os.environ if environ is None else environ
        self["listen"] = []
        self["tls_listen"] = []

    def opt_listen(self, description: str) -> None:
        """
        Serve plain HTTP on this endpoint (repeatable; default
        tcp:8080:interface=127.0.0.1).
        """
        self["listen"].append(description)

    def opt_tls_listen(self, description: str) -> None:
        """
        Serve HTTPS on this stream endpoint, asking agents for their client
        certificate (repeatable; needs an agent CA).
        """
        self["tls_listen"].append(description)

    opt_l = opt_listen

    def opt_version(self) -> None:
        """Print the svc release and exit (before the environment is read)."""
        exit_with_version("svc-control")

    def postOptions(self) -> None:
        with refusing(self, "svc-control", self._environ):
            for option, key in (("--listen", "listen"), ("--tls-listen", "tls_listen")):
                for description in self[key]:
                    _check_endpoint(description, option)
            if not self["listen"] and not self["tls_listen"]:
                self["listen"] = [DEFAULT_LISTEN]
            self["settings"] = settings = ControlSettings.from_environ(self._environ)
            self["tap_settings"] = TapSettings.from_environ(self._environ)
            if self["tls_listen"] and not (
                settings.agent_ca_configured and settings.database_url is not None
            ):
                raise ConfigError(
                    "--tls-listen",
                    "needs DATABASE_URL and an agent CA (SVC_SECRETS_DIR or "
                    "SVC_SECRETS_BACKEND=postgres) to issue the control plane's server certificate",
                )


def _check_endpoint(description: str, option: str) -> None:
    try:
        serverFromString(MemoryReactor(), description)  # type: ignore[no-untyped-call]
    except Exception as e:
        raise ConfigError(option, f"not a server endpoint: {description!r} ({e})") from None


def makeService(options: Options) -> IService:
    """The control plane as one service on the global reactor."""
    from twisted.internet import reactor  # noqa: PLC0415 (installed by twist by now)

    service: Any = ControlPlaneService(
        options["settings"],
        options["tap_settings"],
        options["listen"],
        options["tls_listen"],
        reactor,
    )
    return cast(IService, service)


class ControlPlaneService(MultiService):
    """
    The whole control plane; see the module docstring.

    @param reactor: the reactor (time, threads, listening, TLS clients).
    """

    def __init__(
        self,
        settings: ControlSettings,
        tap_settings: TapSettings,
        listen: list[str],
        tls_listen: list[str],
        reactor: Any,
        *,
        exit_on_failure: bool = True,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._settings = settings
        self._tap = tap_settings
        self._listen = listen
        self._tls_listen = tls_listen
        self._reactor = reactor
        self._worker = ThreadWorker(reactor, "svc-control-ca", threads=1)
        self._store: ControlStore | None = None
        self._provider: AgentCAProvider | None = None
        self._tls_options: OptionalClientCertificateOptions | None = None
        self._tls_renewal = LoopingCall(
            lambda: Deferred.fromCoroutine(self.check_tls_certificate())
        )
        self._exit_on_failure = exit_on_failure
        self._ports: list[Any] = []
        self.started: Deferred[None] | None = None
        """Fires once listening (fails if the start failed); set by C{startService}."""
        self.keeper: ControlCertificateKeeper | None = None

    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]
        self.started = Deferred.fromCoroutine(self._start())
        if self._exit_on_failure:
            self.started.addErrback(self._start_failed)

    @property
    def addresses(self) -> list[Any]:
        """The addresses listened on (plain listeners first)."""
        return [port.getHost() for port in self._ports]

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self._reactor.seconds(), UTC)

    async def _start(self) -> None:
        settings, reactor = self._settings, self._reactor
        routes: list[Route] = []
        authenticators: dict[Any, Any] = {}
        if settings.database_url is not None:
            if settings.control_plane_token is None:  # from_environ requires it with a database
                raise ConfigError("SVC_CONTROL_PLANE_TOKEN", "is required with DATABASE_URL")
            with blame(
                "DATABASE_URL",
                "check that the database is running and that DATABASE_URL names it"
                " (a SQLite file's directory must exist and be writable)",
            ):
                store = self._store = await open_store(
                    settings.database_url,
                    reactor,
                    session_key=session_key(settings.control_plane_token),
                )
            routes, authenticators = await self._database_routes(store)
        routes.extend(readiness_routes(self._readiness_probe()))
        with blame("SVC_IDENTITY_PUBLIC_KEY_FILE"):
            app = build_control_app(
                settings,
                reactor.seconds,
                routes,
                authenticators,
                ready=self._ready,
            )
        site = ControlSite(app.resource(), settings.max_body_bytes, reactor=reactor)
        for description in self._listen:
            with blame(f"--listen {description}", LISTEN_FIX):
                endpoint: Any = serverFromString(reactor, description)  # type: ignore[no-untyped-call]
                port = await endpoint.listen(site)
            self._listened(port, "http")
        if self._tls_listen:
            await self._listen_tls(site)
        _log.info("svc-control ready", svc_control_ready=True)

    async def _database_routes(self, store: ControlStore) -> tuple[list[Route], dict[Any, Any]]:
        settings, reactor = self._settings, self._reactor
        with blame(*_ca_resource(settings)):
            provider = await AgentCAProvider.opened(settings, store, self._worker)
        self._provider = provider
        keeper = None
        if settings.agent_ca_configured:
            issuer = ControlCertificateIssuer(provider, settings, store, self._worker)
            keeper = self.keeper = ControlCertificateKeeper(issuer, self._now)
        client = DataPlaneClient(
            keeper.current if keeper is not None else lambda: None,
            mtls_http_client(reactor),
            reactor,
            float(self._tap.dataplane_timeout_seconds),
        )
        pushes = ControlPushLoop(
            store, reactor, client, keeper, interval=self._tap.push_interval_seconds
        )
        enrollment = EnrollmentDeps.build(store, provider, settings, reactor.seconds, pushes)
        owner = OwnerAuthenticator(store, reactor.seconds)
        routes = [
            *entity_routes(EntityDeps(store, settings, reactor, client, pushes)),
            *access_routes(AccessDeps(store, reactor)),
            *mount_routes(
                MountDeps(
                    store,
                    reactor,
                    pushes,
                    timedelta(seconds=self._tap.mount_lease_ttl_seconds),
                )
            ),
            *enrollment_routes(enrollment),
            *dataplane_query_routes(DataPlaneQueryDeps(store, reactor.seconds)),
            *fleet_routes(FleetDeps(store, reactor, client)),
            *dashboard_routes(),
            *owner_routes(OwnerDeps(store, settings, reactor, client, pushes)),
            *journal_routes(
                JournalDeps(
                    store, DataPlaneJournal(store, client, reactor), reactor, owner.still_valid
                )
            ),
        ]
        pushes.setServiceParent(self)  # type: ignore[no-untyped-call]
        authenticators: dict[Any, Any] = dict(enrollment_authenticators(enrollment))
        authenticators[AuthKind.ADMIN_SESSION] = owner
        return routes, authenticators

    def _readiness_probe(self) -> ReadinessProbe:
        """The checks of C{GET /readyz} (L{svc.control.readiness})."""
        provider, keeper = self._provider, self.keeper
        configured = provider is not None and self._settings.agent_ca_configured
        return readiness_probe(
            self._store,
            provider.get if configured and provider is not None else None,
            lambda: None if keeper is None else keeper.current(),
            self._reactor,
        )

    def _ready(self, feature: Feature) -> bool:
        if feature is Feature.AGENT_CA:
            return self.keeper is not None and self.keeper.current() is not None
        return True

    async def _listen_tls(self, site: Site) -> None:
        ca = None if self._provider is None else await self._provider.get()
        if ca is None:
            raise StartError(
                "--tls-listen", "there is no org root to sign its certificate", "run 'svc ca init'"
            )
        with blame("--tls-listen"):
            serving = await self._serving_certificate(ca)
        options = self._tls_options = OptionalClientCertificateOptions(serving, ca.root)
        wrapped: Any = site
        factory = TLSMemoryBIOFactory(cast(Any, options), False, wrapped)
        for description in self._tls_listen:
            with blame(f"--tls-listen {description}", LISTEN_FIX):
                endpoint: Any = serverFromString(self._reactor, description)  # type: ignore[no-untyped-call]
                port = await endpoint.listen(factory)
            self._listened(port, "https")
        self._tls_renewal.clock = self._reactor
        self._tls_renewal.start(TLS_RENEWAL_CHECK_SECONDS, now=False)

    async def _serving_certificate(self, ca: Any) -> ServingCertificate:
        """The operator's certificate if configured, else a freshly issued one."""
        tap = self._tap
        if tap.tls_cert_file is not None and tap.tls_key_file is not None:
            return load_serving_certificate(tap.tls_cert_file, tap.tls_key_file)
        return await issue_serving_certificate(ca, tap.control_fqdn, self._now())

    async def check_tls_certificate(self) -> None:
        """
        The hourly check: re-read the operator's files and serve them if
        they changed, or issue a new certificate once two thirds of the
        issued one's life have passed.
        """
        options = self._tls_options
        if options is None or self._provider is None:
            return
        operator = self._tap.tls_cert_file is not None
        if not operator and self._now() < options.serving.renew_at:
            return
        try:
            ca = await self._provider.get()
            if ca is None:
                return
            serving = await self._serving_certificate(ca)
            if serving.chain != options.serving.chain:
                options.replace(serving)
                _log.info(
                    "control-plane TLS certificate {change}",
                    change="reloaded from its files" if operator else "renewed",
                )
        except Exception:
            _log.failure("control-plane TLS certificate renewal failed; retrying later")

    def _listened(self, port: Any, scheme: str) -> None:
        self._ports.append(port)
        address = port.getHost()
        _log.info(
            "listening on {scheme}://{host}:{port}",
            scheme=scheme,
            host=getattr(address, "host", address),
            port=getattr(address, "port", ""),
        )

    def _start_failed(self, failure: Any) -> None:
        end_start(self._reactor, "svc-control", failure)

    def stopService(self) -> Deferred[None]:
        return Deferred.fromCoroutine(self._stop())

    async def _stop(self) -> None:
        if self.started is not None and not self.started.called:
            self.started.cancel()
        if self._tls_renewal.running:
            self._tls_renewal.stop()
        ports, self._ports = self._ports, []
        await DeferredList([port.stopListening() for port in ports], consumeErrors=True)
        await super().stopService()  # type: ignore[no-untyped-call]
        if self._store is not None:
            store, self._store = self._store, None
            await store.close()
        self._worker.stop()
