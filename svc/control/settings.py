"""
The control plane's settings, read once from the environment.

L{ControlSettings.from_environ} validates every variable and refuses a bad
or inconsistent configuration with a L{ConfigError} naming the variable, so
the process never starts half-configured. Every variable and its default is
documented in C{docs/configuration.md} ("Control plane").
"""

from __future__ import annotations

import base64
import binascii
import enum
import posixpath
import re
from collections.abc import Callable, Mapping
from pathlib import Path

import attrs

from svc.config import (
    ConfigError,
    env_int,
    env_optional,
    env_path,
    env_str,
    secret_source,
    with_secret_files,
)
from svc.control.store.url import SQLiteUrl, parse_database_url
from svc.pki import names
from svc.pki.errors import InvalidName

DEFAULT_MOUNT_PREFIX = "/mnt/svc"
DEFAULT_ORG_NAME = "svc"
DEFAULT_TENANT_CLAIM = "tenant"
DEFAULT_MAX_BODY_BYTES = 64 * 1024
DEFAULT_ENROLL_TOKEN_TTL_SECONDS = 3600
DEFAULT_ENROLL_RATE_LIMIT = "5/60"
MINIMUM_SERVICE_TOKEN_LENGTH = 32
MINIMUM_KEK_BYTES = 32
MAXIMUM_KEK_BYTES = 1023

_TOKEN68 = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
_RATE = re.compile(r"([0-9]+)/([0-9]+)")
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_IDENTITY_OPTIONALS = (
    "SVC_IDENTITY_PUBLIC_KEY_FILE",
    "SVC_IDENTITY_ISSUER",
    "SVC_IDENTITY_TENANT_CLAIM",
    "SVC_IDENTITY_TENANT_ALLOWLIST",
)


class SecretsBackend(enum.Enum):
    """Where the agent CA's keys live."""

    FILESYSTEM = "filesystem"
    POSTGRES = "postgres"


class DatabaseKind(enum.Enum):
    """The control-plane database engine named by C{DATABASE_URL}."""

    SQLITE = "sqlite"
    POSTGRES = "postgres"


@attrs.frozen
class RateLimit:
    """At most C{count} attempts per C{window_seconds}."""

    count: int
    window_seconds: int


@attrs.frozen
class IdentitySettings:
    """
    Host JWT verification (present only when C{SVC_IDENTITY_AUDIENCE} is
    set); C{tenant_allowlist} is never empty.
    """

    audience: str
    public_key_file: Path
    issuer: str | None
    tenant_claim: str
    tenant_allowlist: frozenset[str]


@attrs.frozen
class ControlSettings:
    """
    Everything C{twist svc-control} is configured with. Secrets
    (C{database_url}, which may hold a password, C{control_plane_token},
    C{ca_kek}) are kept out of C{repr}.
    """

    database_url: str | None = attrs.field(repr=False)
    control_plane_token: str | None = attrs.field(repr=False)
    secrets_dir: Path | None
    secrets_backend: SecretsBackend
    ca_kek: bytes | None = attrs.field(repr=False)
    trust_domain: str | None
    org_name: str
    mount_prefix: str
    identity: IdentitySettings | None
    max_body_bytes: int
    enroll_token_ttl_seconds: int
    enroll_rate_limit: RateLimit
    tenant_allowlist: frozenset[str] | None
    """Tenants that may get a tenant intermediate; L{None}: every tenant."""
    dev_mode: bool

    @property
    def database_kind(self) -> DatabaseKind | None:
        """The engine C{DATABASE_URL} names, or L{None} without a database."""
        return None if self.database_url is None else _database_kind(self.database_url)

    @property
    def agent_ca_configured(self) -> bool:
        """
        Whether an agent CA is configured: the filesystem CA at
        C{SVC_SECRETS_DIR}, or the in-database CA (C{SVC_SECRETS_BACKEND=postgres}).
        """
        if self.secrets_backend is SecretsBackend.POSTGRES:
            return True
        return self.secrets_dir is not None

    def virtual_path(self, agent_id: str) -> str:
        """
        The agent-visible mount path: C{<SVC_MOUNT_PREFIX>/agents/<agent_id>}.
        """
        return posixpath.join(self.mount_prefix, "agents", agent_id)

    def tenant_may_have_intermediate(self, tenant_id: str) -> bool:
        """
        Whether the operator allowlist lets C{tenant_id} get a (lazily
        created) tenant intermediate.
        """
        return self.tenant_allowlist is None or tenant_id in self.tenant_allowlist

    @classmethod
    def from_environ(
        cls,
        environ: Mapping[str, str],
        read_file: Callable[[Path], bytes] = Path.read_bytes,
    ) -> ControlSettings:
        """
        Read and validate the control plane's variables from C{environ}.

        @param read_file: reads the secret files (C{SVC_CONTROL_PLANE_TOKEN_FILE},
            C{SVC_CA_KEK_FILE}, C{DATABASE_URL_FILE}; injected for tests).
        @raise ConfigError: naming the variable at fault.
        """
        environ = with_secret_files(environ, read_file=read_file)
        database_url = env_optional(environ, "DATABASE_URL")
        database_kind = None if database_url is None else _database_kind(database_url)
        backend = _secrets_backend(environ, database_kind)
        secrets_dir = (
            env_path(environ, "SVC_SECRETS_DIR")
            if env_optional(environ, "SVC_SECRETS_DIR")
            else None
        )
        if secrets_dir is not None and secrets_dir.exists() and not secrets_dir.is_dir():
            raise ConfigError("SVC_SECRETS_DIR", f"{secrets_dir} is not a directory")
        dev_mode = _boolean(environ, "SVC_DEV_MODE")
        ca_configured = backend is SecretsBackend.POSTGRES or secrets_dir is not None

        token = env_optional(environ, "SVC_CONTROL_PLANE_TOKEN")
        if token is not None:
            _check_service_token(token, secret_source(environ, "SVC_CONTROL_PLANE_TOKEN"))
        elif database_url is not None or ca_configured:
            raise ConfigError(
                "SVC_CONTROL_PLANE_TOKEN",
                "is required when DATABASE_URL or an agent CA is configured",
            )

        kek = _kek(environ)
        if kek is None and ca_configured and not dev_mode:
            raise ConfigError(
                "SVC_CA_KEK", "is required when an agent CA is configured (or set SVC_DEV_MODE=1)"
            )

        trust_domain = env_optional(environ, "SVC_TRUST_DOMAIN")
        if trust_domain is not None:
            _checked("SVC_TRUST_DOMAIN", names.check_trust_domain, trust_domain)
        elif ca_configured:
            raise ConfigError("SVC_TRUST_DOMAIN", "is required when an agent CA is configured")

        tenant_allowlist = None
        if "SVC_TENANT_ALLOWLIST" in environ:
            tenant_allowlist = _id_list(environ, "SVC_TENANT_ALLOWLIST")

        return cls(
            database_url=database_url,
            control_plane_token=token,
            secrets_dir=secrets_dir,
            secrets_backend=backend,
            ca_kek=kek,
            trust_domain=trust_domain,
            org_name=_checked(
                "SVC_ORG_NAME", names.check_org, env_str(environ, "SVC_ORG_NAME", DEFAULT_ORG_NAME)
            ),
            mount_prefix=_mount_prefix(environ),
            identity=_identity(environ),
            max_body_bytes=env_int(
                environ,
                "SVC_MAX_BODY_BYTES",
                DEFAULT_MAX_BODY_BYTES,
                minimum=1024,
                maximum=16 * 1024 * 1024,
            ),
            enroll_token_ttl_seconds=env_int(
                environ,
                "SVC_ENROLL_TOKEN_TTL_SECONDS",
                DEFAULT_ENROLL_TOKEN_TTL_SECONDS,
                minimum=60,
                maximum=7 * 24 * 3600,
            ),
            enroll_rate_limit=_rate_limit(environ, "SVC_ENROLL_RATE_LIMIT"),
            tenant_allowlist=tenant_allowlist,
            dev_mode=dev_mode,
        )


def _database_kind(url: str) -> DatabaseKind:
    # One parser decides what a DATABASE_URL means: the store's.
    parsed = parse_database_url(url)
    return DatabaseKind.SQLITE if isinstance(parsed, SQLiteUrl) else DatabaseKind.POSTGRES


def _secrets_backend(
    environ: Mapping[str, str], database_kind: DatabaseKind | None
) -> SecretsBackend:
    raw = env_str(environ, "SVC_SECRETS_BACKEND", SecretsBackend.FILESYSTEM.value)
    try:
        backend = SecretsBackend(raw)
    except ValueError:
        raise ConfigError(
            "SVC_SECRETS_BACKEND", f"must be 'filesystem' or 'postgres', got {raw!r}"
        ) from None
    if backend is SecretsBackend.POSTGRES and database_kind is not DatabaseKind.POSTGRES:
        raise ConfigError("SVC_SECRETS_BACKEND", "'postgres' requires a postgres DATABASE_URL")
    return backend


def _check_service_token(token: str, variable: str = "SVC_CONTROL_PLANE_TOKEN") -> None:
    if len(token) < MINIMUM_SERVICE_TOKEN_LENGTH:
        raise ConfigError(
            variable,
            f"must be at least {MINIMUM_SERVICE_TOKEN_LENGTH} characters",
        )
    if not token.isascii() or _TOKEN68.fullmatch(token) is None:
        raise ConfigError(
            variable,
            "must use only A-Z a-z 0-9 - . _ ~ + / (and trailing =), to fit a Bearer header",
        )


def _kek(environ: Mapping[str, str]) -> bytes | None:
    inline = env_optional(environ, "SVC_CA_KEK")
    if inline is None:
        return None
    return _decode_kek(secret_source(environ, "SVC_CA_KEK"), inline)


def _decode_kek(variable: str, text: str) -> bytes:
    padded = text + "=" * (-len(text) % 4)
    try:
        if "-" in text or "_" in text:
            kek = base64.urlsafe_b64decode(padded.encode("ascii"))
        else:
            kek = base64.b64decode(padded.encode("ascii"), validate=True)
    except (binascii.Error, ValueError, UnicodeEncodeError):
        raise ConfigError(variable, "must be base64 (value not shown)") from None
    if not MINIMUM_KEK_BYTES <= len(kek) <= MAXIMUM_KEK_BYTES:
        raise ConfigError(
            variable,
            f"must decode to {MINIMUM_KEK_BYTES}-{MAXIMUM_KEK_BYTES} bytes, got {len(kek)}",
        )
    return kek


def _mount_prefix(environ: Mapping[str, str]) -> str:
    value = env_str(environ, "SVC_MOUNT_PREFIX", DEFAULT_MOUNT_PREFIX)
    canonical = (
        value.startswith("/")
        and not value.startswith("//")
        and value != "/"
        and posixpath.normpath(value) == value
    )
    if not canonical:
        raise ConfigError(
            "SVC_MOUNT_PREFIX",
            f"must be a canonical absolute path other than '/', got {value!r}",
        )
    return value


def _identity(environ: Mapping[str, str]) -> IdentitySettings | None:
    audience = env_optional(environ, "SVC_IDENTITY_AUDIENCE")
    if audience is None:
        stray = [name for name in _IDENTITY_OPTIONALS if env_optional(environ, name)]
        if stray:
            raise ConfigError(
                "SVC_IDENTITY_AUDIENCE",
                f"is not set, so host JWTs are disabled, but {', '.join(stray)} is set",
            )
        return None
    if "SVC_IDENTITY_TENANT_ALLOWLIST" not in environ:
        raise ConfigError(
            "SVC_IDENTITY_TENANT_ALLOWLIST",
            "is required when SVC_IDENTITY_AUDIENCE is set; the verifier refuses to start",
        )
    return IdentitySettings(
        audience=audience,
        public_key_file=env_path(environ, "SVC_IDENTITY_PUBLIC_KEY_FILE"),
        issuer=env_optional(environ, "SVC_IDENTITY_ISSUER"),
        tenant_claim=env_str(environ, "SVC_IDENTITY_TENANT_CLAIM", DEFAULT_TENANT_CLAIM),
        tenant_allowlist=_id_list(environ, "SVC_IDENTITY_TENANT_ALLOWLIST"),
    )


def _id_list(environ: Mapping[str, str], variable: str) -> frozenset[str]:
    entries = [entry.strip() for entry in environ.get(variable, "").split(",")]
    ids = frozenset(entry for entry in entries if entry)
    if not ids:
        raise ConfigError(variable, "is an empty list; list at least one tenant id")
    for tenant_id in ids:
        _checked(variable, names.check_id, tenant_id)
    return ids


def _checked(variable: str, check: Callable[[str], str], value: str) -> str:
    try:
        return check(value)
    except InvalidName as e:
        raise ConfigError(variable, str(e)) from None


def _boolean(environ: Mapping[str, str], variable: str) -> bool:
    raw = environ.get(variable, "").strip().lower()
    if raw == "" or raw in _FALSE:
        return False
    if raw in _TRUE:
        return True
    raise ConfigError(variable, f"must be 1/0, true/false, yes/no or on/off, got {raw!r}")


def _rate_limit(environ: Mapping[str, str], variable: str) -> RateLimit:
    raw = env_str(environ, variable, DEFAULT_ENROLL_RATE_LIMIT).strip()
    match = _RATE.fullmatch(raw)
    if match is None:
        raise ConfigError(variable, f"must be <count>/<seconds>, e.g. 5/60, got {raw!r}")
    count, window = int(match.group(1)), int(match.group(2))
    if not 1 <= count <= 10_000 or not 1 <= window <= 86_400:
        raise ConfigError(variable, "count must be 1-10000 and seconds 1-86400")
    return RateLimit(count=count, window_seconds=window)
