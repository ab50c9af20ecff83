"""
The data-plane server's configuration, checked once at start
(C{docs/configuration.md}).

L{DataPlaneSettings.from_environ} reads the C{SVC_*} environment variables;
L{TapConfig.load} adds the command-line options (listen endpoints, static
certificate files) and what must be read at start (the certificate files,
the path policies, the control plane's CA file). Both raise
L{svc.config.ConfigError} naming the variable or option at fault, which
C{twist svc-dataplane} turns into a usage error (exit status 64).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path

import attrs
from twisted.internet.endpoints import serverFromString
from twisted.internet.testing import MemoryReactor

from svc.audit.sink import DEFAULT_AUDIT_LOG
from svc.config import (
    ConfigError,
    check_http_url,
    env_int,
    env_optional,
    env_path,
    env_str,
    secret_source,
    with_secret_files,
)
from svc.dataplane.answer_budget import MIB, AnswerLimits
from svc.dataplane.factory import (
    DEFAULT_HANDSHAKE_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_CONNECTIONS_PER_AGENT,
    DEFAULT_MAX_PENDING_CONNECTIONS,
    DEFAULT_MAX_PENDING_PER_ADDRESS,
)
from svc.dataplane.gc_loop import DEFAULT_GC_INTERVAL
from svc.dataplane.servercert import (
    Registration,
    ServerCertificateError,
    ServerCredentials,
    load_static_credentials,
)
from svc.metrics import PathLabels
from svc.pki import names, server_identity
from svc.pki.chain import verify_chain
from svc.pki.errors import InvalidName, PKIError
from svc.policy import PolicyError, PolicyTable, load_policy_directory
from svc.store.chunks import MAX_CHUNK_SIZE
from svc.store.footprint import (
    DEFAULT_RETENTION_FACTOR,
    DEFAULT_UNGRANTED_BYTES,
    FootprintPolicy,
    parse_factor,
)
from svc.store.lease_values import LeaseTimings
from svc.store.retention import RetentionPolicy
from svc.web.clients import check_ca_file

DEFAULT_LISTEN = "tcp:7443:interface=127.0.0.1"
DEFAULT_HTTP_LISTEN = "tcp:7444:interface=127.0.0.1"

DEFAULT_SERVER_FQDN = "localhost"
DEFAULT_STATE_DIR = "./svc-dataplane-state"
DEFAULT_IO_THREADS = 4
MAX_IO_THREADS = 64
DEFAULT_IDLE_TIMEOUT_SECONDS = 300
MAX_CONNECTION_LIMIT = 1_000_000
DEFAULT_CHUNK_GRACE_SECONDS = int(RetentionPolicy().chunk_grace_seconds)
DEFAULT_JOURNAL_RETENTION_SECONDS = int(RetentionPolicy().journal_retention_seconds)
MAX_SECONDS = 10 * 365 * 24 * 3600
DEFAULT_CONTROL_QUERY_TIMEOUT_SECONDS = 10
MAX_CONTROL_QUERY_TIMEOUT_SECONDS = 300
DEFAULT_PLACEMENT_MISS_TTL_SECONDS = 10
MAX_PLACEMENT_MISS_TTL_SECONDS = 3600
MAX_HANDSHAKE_TIMEOUT_SECONDS = 300
MAX_ANSWER_MEMORY_MIB = 1 << 20
MAX_BYTES = 2**62

MINIMUM_SERVICE_TOKEN_LENGTH = 32
"""The control plane's rule for the shared service token (the same token
must be accepted by both planes: the session key is derived from it)."""

_TOKEN68 = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_ADDRESS = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):[0-9]{1,5}")
_WILDCARD_INTERFACES = frozenset({"", "0.0.0.0", "::"})  # noqa: S104 (not binding)
FILES = "--cert/--key/--root"


@attrs.frozen
class DataPlaneSettings:
    """
    Everything C{twist svc-dataplane} reads from the environment. The
    service token stays out of C{repr}.

    @ivar control_url: base URL of the control plane (server-certificate
        signing); L{None} when the server runs from given certificate files.
    @ivar advertise_addr: C{host:port} agents dial; L{None}: derived from
        C{--listen}.
    @ivar http_advertise_addr: C{host:port} of the HTTPS surface; L{None}:
        derived from C{--http-listen}.
    """

    tenants_root: Path
    metadata_root: Path
    audit_log: Path
    trust_domain: str
    control_plane_token: str = attrs.field(repr=False)
    control_url: str | None = None
    ca_file: Path | None = None
    advertise_addr: str | None = None
    http_advertise_addr: str | None = None
    server_fqdn: str = DEFAULT_SERVER_FQDN
    state_dir: Path = Path(DEFAULT_STATE_DIR)
    policy_dir: Path | None = None
    gc_interval_seconds: int = int(DEFAULT_GC_INTERVAL)
    gc_dry_run: bool = False
    retention: RetentionPolicy = attrs.field(factory=RetentionPolicy)
    lease_timings: LeaseTimings = attrs.field(factory=LeaseTimings)
    io_threads: int = DEFAULT_IO_THREADS
    idle_timeout_seconds: int = DEFAULT_IDLE_TIMEOUT_SECONDS
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_connections_per_agent: int = DEFAULT_MAX_CONNECTIONS_PER_AGENT
    control_query_timeout_seconds: int = DEFAULT_CONTROL_QUERY_TIMEOUT_SECONDS
    """Bound of each question to the control plane (start-up revocation pull,
    placement look-ups)."""
    placement_check: bool = True
    """Serve only identities placed on this server (off: static certificates only)."""
    placement_miss_ttl_seconds: int = DEFAULT_PLACEMENT_MISS_TTL_SECONDS
    """How long a "not placed" (or unanswered) placement look-up is remembered."""
    max_pending_connections: int = DEFAULT_MAX_PENDING_CONNECTIONS
    max_pending_per_address: int = DEFAULT_MAX_PENDING_PER_ADDRESS
    handshake_timeout_seconds: int = int(DEFAULT_HANDSHAKE_TIMEOUT)
    answer_limits: AnswerLimits = attrs.field(factory=AnswerLimits)
    metrics_path_labels: PathLabels = PathLabels.HASH
    """What C{svc_lease_held}'s C{path} label carries (C{SVC_METRICS_PATH_LABELS})."""
    replace_server_key: str | None = None
    """The identity key of a registration this server may replace
    (C{SVC_REPLACE_SERVER_KEY}; L{None}: it replaces none)."""

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> DataPlaneSettings:
        """
        Read and check the variables (the service token also from
        C{SVC_CONTROL_PLANE_TOKEN_FILE}).

        @raise ConfigError: naming the variable at fault.
        """
        environ = with_secret_files(environ, ("SVC_CONTROL_PLANE_TOKEN",))
        tenants_root = env_path(environ, "SVC_TENANTS_ROOT")
        metadata_root = (
            env_path(environ, "SVC_METADATA_ROOT")
            if env_optional(environ, "SVC_METADATA_ROOT")
            else tenants_root
        )
        return cls(
            tenants_root=tenants_root,
            metadata_root=metadata_root,
            audit_log=env_path(environ, "SVC_AUDIT_LOG", DEFAULT_AUDIT_LOG),
            trust_domain=_checked(
                "SVC_TRUST_DOMAIN", names.check_trust_domain, env_str(environ, "SVC_TRUST_DOMAIN")
            ),
            control_plane_token=_service_token(environ),
            control_url=_control_url(environ),
            ca_file=_optional_path(environ, "SVC_CA_FILE"),
            advertise_addr=_address(environ, "SVC_ADVERTISE_ADDR"),
            http_advertise_addr=_address(environ, "SVC_HTTP_ADVERTISE_ADDR"),
            server_fqdn=_checked(
                "SVC_SERVER_FQDN",
                names.check_fqdn,
                env_str(environ, "SVC_SERVER_FQDN", DEFAULT_SERVER_FQDN),
            ),
            state_dir=env_path(environ, "SVC_STATE_DIR", DEFAULT_STATE_DIR),
            policy_dir=_optional_path(environ, "SVC_POLICY_DIR"),
            gc_interval_seconds=env_int(
                environ,
                "SVC_GC_INTERVAL_SECONDS",
                int(DEFAULT_GC_INTERVAL),
                minimum=1,
                maximum=MAX_SECONDS,
            ),
            gc_dry_run=_boolean(environ, "SVC_GC_DRY_RUN"),
            retention=RetentionPolicy(
                chunk_grace_seconds=float(
                    env_int(
                        environ,
                        "SVC_CHUNK_GRACE_SECONDS",
                        DEFAULT_CHUNK_GRACE_SECONDS,
                        minimum=0,
                        maximum=MAX_SECONDS,
                    )
                ),
                journal_retention_seconds=float(
                    env_int(
                        environ,
                        "SVC_JOURNAL_RETENTION_SECONDS",
                        DEFAULT_JOURNAL_RETENTION_SECONDS,
                        minimum=0,
                        maximum=MAX_SECONDS,
                    )
                ),
                footprint=_footprint_policy(environ),
            ),
            lease_timings=LeaseTimings.from_environ(environ),
            io_threads=env_int(
                environ, "SVC_IO_THREADS", DEFAULT_IO_THREADS, minimum=1, maximum=MAX_IO_THREADS
            ),
            idle_timeout_seconds=env_int(
                environ,
                "SVC_IDLE_TIMEOUT_SECONDS",
                DEFAULT_IDLE_TIMEOUT_SECONDS,
                minimum=1,
                maximum=MAX_SECONDS,
            ),
            max_connections=env_int(
                environ,
                "SVC_MAX_CONNECTIONS",
                DEFAULT_MAX_CONNECTIONS,
                minimum=1,
                maximum=MAX_CONNECTION_LIMIT,
            ),
            max_connections_per_agent=env_int(
                environ,
                "SVC_MAX_CONNECTIONS_PER_AGENT",
                DEFAULT_MAX_CONNECTIONS_PER_AGENT,
                minimum=1,
                maximum=MAX_CONNECTION_LIMIT,
            ),
            control_query_timeout_seconds=env_int(
                environ,
                "SVC_CONTROL_QUERY_TIMEOUT_SECONDS",
                DEFAULT_CONTROL_QUERY_TIMEOUT_SECONDS,
                minimum=1,
                maximum=MAX_CONTROL_QUERY_TIMEOUT_SECONDS,
            ),
            placement_check=_boolean(environ, "SVC_PLACEMENT_CHECK", default=True),
            placement_miss_ttl_seconds=env_int(
                environ,
                "SVC_PLACEMENT_MISS_TTL_SECONDS",
                DEFAULT_PLACEMENT_MISS_TTL_SECONDS,
                minimum=1,
                maximum=MAX_PLACEMENT_MISS_TTL_SECONDS,
            ),
            max_pending_connections=env_int(
                environ,
                "SVC_MAX_PENDING_CONNECTIONS",
                DEFAULT_MAX_PENDING_CONNECTIONS,
                minimum=1,
                maximum=MAX_CONNECTION_LIMIT,
            ),
            max_pending_per_address=env_int(
                environ,
                "SVC_MAX_PENDING_PER_ADDRESS",
                DEFAULT_MAX_PENDING_PER_ADDRESS,
                minimum=1,
                maximum=MAX_CONNECTION_LIMIT,
            ),
            handshake_timeout_seconds=env_int(
                environ,
                "SVC_HANDSHAKE_TIMEOUT_SECONDS",
                int(DEFAULT_HANDSHAKE_TIMEOUT),
                minimum=1,
                maximum=MAX_HANDSHAKE_TIMEOUT_SECONDS,
            ),
            answer_limits=_answer_limits(environ),
            metrics_path_labels=_path_labels(environ),
            replace_server_key=_replace_server_key(environ),
        )


@attrs.frozen
class TapConfig:
    """
    Everything C{twist svc-dataplane} checked at start: the settings, the
    endpoint strings, the static credentials or else the registration
    for control-plane signing, and the path policies.

    @ivar metrics_listen: the operator listener (plain HTTP: C{/metrics},
        C{/healthz}, C{/readyz}); L{None}: none, C{/metrics} stays on the
        HTTPS surface.
    """

    settings: DataPlaneSettings
    listen: str
    http_listen: str
    static_credentials: ServerCredentials | None
    registration: Registration | None
    policies: PolicyTable = attrs.field(factory=PolicyTable)
    metrics_listen: str | None = None

    @classmethod
    def load(
        cls,
        environ: Mapping[str, str],
        *,
        listen: str = DEFAULT_LISTEN,
        http_listen: str = DEFAULT_HTTP_LISTEN,
        cert: str | None = None,
        key: str | None = None,
        root: str | None = None,
        metrics_listen: str | None = None,
    ) -> TapConfig:
        """
        Check the options and the environment; read the certificate files
        and the policies (blocking).

        @raise ConfigError: naming the option or variable at fault.
        """
        listen = _stream_endpoint(listen, "--listen")
        http_listen = _stream_endpoint(http_listen, "--http-listen")
        if metrics_listen is not None:
            metrics_listen = _stream_endpoint(metrics_listen, "--metrics-listen")
        settings = DataPlaneSettings.from_environ(environ)
        static = _static_credentials(cert, key, root)
        if static is None and not settings.placement_check:
            raise ConfigError(
                "SVC_PLACEMENT_CHECK",
                f"may be off only with {FILES}: a server with a control plane always"
                " serves only the identities placed on it",
            )
        registration = None
        if static is None:
            if settings.control_url is None:
                raise ConfigError(
                    "SVC_CONTROL_URL", "is required unless --cert, --key and --root are given"
                )
            if settings.ca_file is not None:
                check_ca_file(settings.ca_file)
            fqdn = settings.server_fqdn
            registration = Registration(
                fqdn=fqdn,
                advertise_addr=settings.advertise_addr
                or _advertised(listen, fqdn, "--listen", "SVC_ADVERTISE_ADDR"),
                http_addr=settings.http_advertise_addr
                or _advertised(http_listen, fqdn, "--http-listen", "SVC_HTTP_ADVERTISE_ADDR"),
                trust_domain=settings.trust_domain,
                replaces=settings.replace_server_key,
            )
        policies = PolicyTable()
        if settings.policy_dir is not None:
            try:
                policies = load_policy_directory(settings.policy_dir)
            except PolicyError as e:
                raise ConfigError("SVC_POLICY_DIR", str(e)) from None
        return cls(settings, listen, http_listen, static, registration, policies, metrics_listen)


_ANSWER_VARIABLES = (
    ("SVC_ANSWER_MEMORY_PER_CONNECTION_MIB", AnswerLimits().per_connection),
    ("SVC_ANSWER_MEMORY_PER_AGENT_MIB", AnswerLimits().per_agent),
    ("SVC_ANSWER_MEMORY_MIB", AnswerLimits().server),
)


def _answer_limits(environ: Mapping[str, str]) -> AnswerLimits:
    """
    The answer budgets (L{svc.dataplane.answer_budget}), in MiB: each at
    least one largest chunk (16), each level at least the one below (an
    unset one defaults to that when it is larger than its own default).
    """
    values = []
    below = MAX_CHUNK_SIZE // MIB
    for variable, default in _ANSWER_VARIABLES:
        value = env_int(
            environ,
            variable,
            max(default // MIB, below),
            minimum=below,
            maximum=MAX_ANSWER_MEMORY_MIB,
        )
        values.append(value * MIB)
        below = value
    return AnswerLimits(*values)


def _stream_endpoint(description: str, option: str) -> str:
    if description.split(":", 1)[0].lower() in ("ssl", "tls"):
        raise ConfigError(option, "give a plain stream endpoint; the server adds TLS")
    try:
        serverFromString(MemoryReactor(), description)  # type: ignore[no-untyped-call]
    except Exception as e:
        raise ConfigError(option, f"not a server endpoint: {description!r} ({e})") from None
    return description


def _advertised(description: str, fqdn: str, option: str, variable: str) -> str:
    """C{host:port} derived from a TCP endpoint string (interface, else the FQDN)."""
    endpoint = serverFromString(MemoryReactor(), description)  # type: ignore[no-untyped-call]
    port = getattr(endpoint, "_port", None)
    interface = getattr(endpoint, "_interface", None)
    if not isinstance(port, int) or port == 0 or not isinstance(interface, str):
        raise ConfigError(
            variable, f"is required when {option} is not a TCP endpoint with a fixed port"
        )
    host = fqdn if interface in _WILDCARD_INTERFACES else interface
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _static_credentials(
    cert: str | None, key: str | None, root: str | None
) -> ServerCredentials | None:
    given = (cert, key, root)
    if not any(given):
        return None
    if cert is None or key is None or root is None:
        raise ConfigError(FILES, "must be given together")
    try:
        credentials = load_static_credentials(Path(cert), Path(key), Path(root))
        verify_chain(credentials.cert, [], credentials.root, datetime.now(UTC))
    except OSError as e:
        raise ConfigError(FILES, f"cannot read {e.filename}: {e.strerror}") from None
    except (PKIError, ServerCertificateError) as e:
        raise ConfigError(FILES, str(e)) from None
    return credentials


def _replace_server_key(environ: Mapping[str, str]) -> str | None:
    value = env_optional(environ, "SVC_REPLACE_SERVER_KEY")
    if value is None:
        return None
    try:
        return server_identity.check_key_text(value.strip().lower())
    except InvalidName:
        raise ConfigError(
            "SVC_REPLACE_SERVER_KEY",
            "must be the 64 hex digits of the identity key the control plane reported"
            " in its refusal (fqdn_registered)",
        ) from None


def _checked(variable: str, check: Callable[[str], str], value: str) -> str:
    try:
        return check(value)
    except InvalidName as e:
        raise ConfigError(variable, str(e)) from None


def _optional_path(environ: Mapping[str, str], variable: str) -> Path | None:
    return env_path(environ, variable) if env_optional(environ, variable) else None


def _service_token(environ: Mapping[str, str]) -> str:
    token = env_optional(environ, "SVC_CONTROL_PLANE_TOKEN")
    if token is None:
        raise ConfigError(
            "SVC_CONTROL_PLANE_TOKEN",
            "is required: mount session ids are verified with a key derived from it",
        )
    variable = secret_source(environ, "SVC_CONTROL_PLANE_TOKEN")
    if len(token) < MINIMUM_SERVICE_TOKEN_LENGTH:
        raise ConfigError(variable, f"must be at least {MINIMUM_SERVICE_TOKEN_LENGTH} characters")
    if not token.isascii() or _TOKEN68.fullmatch(token) is None:
        raise ConfigError(
            variable,
            "must use only A-Z a-z 0-9 - . _ ~ + / (and trailing =), to fit a Bearer header",
        )
    return token


def _control_url(environ: Mapping[str, str]) -> str | None:
    raw = env_optional(environ, "SVC_CONTROL_URL")
    return None if raw is None else check_http_url("SVC_CONTROL_URL", raw)


def _address(environ: Mapping[str, str], variable: str) -> str | None:
    raw = env_optional(environ, variable)
    if raw is None:
        return None
    if _ADDRESS.fullmatch(raw) is None or not 1 <= int(raw.rsplit(":", 1)[1]) <= 65535:
        raise ConfigError(variable, f"must be host:port (IPv6 in brackets), got {raw!r}")
    return raw


def _footprint_policy(environ: Mapping[str, str]) -> FootprintPolicy:
    """C{SVC_RETENTION_FACTOR} and C{SVC_UNGRANTED_FOOTPRINT_BYTES} (storage-engine.md)."""
    factor = DEFAULT_RETENTION_FACTOR
    raw = env_optional(environ, "SVC_RETENTION_FACTOR")
    if raw is not None:
        try:
            factor = parse_factor(raw)
        except ValueError as e:
            raise ConfigError("SVC_RETENTION_FACTOR", str(e)) from None
    ungranted = env_int(
        environ,
        "SVC_UNGRANTED_FOOTPRINT_BYTES",
        DEFAULT_UNGRANTED_BYTES,
        minimum=0,
        maximum=MAX_BYTES,
    )
    return FootprintPolicy(retention_factor=factor, ungranted_bytes=ungranted)


def _path_labels(environ: Mapping[str, str]) -> PathLabels:
    raw = env_str(environ, "SVC_METRICS_PATH_LABELS", PathLabels.HASH.value).strip().lower()
    try:
        return PathLabels(raw)
    except ValueError:
        choices = "/".join(mode.value for mode in PathLabels)
        raise ConfigError("SVC_METRICS_PATH_LABELS", f"must be {choices}, got {raw!r}") from None


def _boolean(environ: Mapping[str, str], variable: str, default: bool = False) -> bool:
    raw = environ.get(variable, "").strip().lower()
    if raw == "":
        return default
    if raw in _FALSE:
        return False
    if raw in _TRUE:
        return True
    raise ConfigError(variable, f"must be 1/0, true/false, yes/no or on/off, got {raw!r}")
