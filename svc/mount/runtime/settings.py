"""
The mount client's configuration: one frozen value built from C{SVC_*}
environment variables, overridden by C{twist svc-mount} options.

Variables (see ``docs/specifications/mount-runtime.md``): C{SVC_CONTROL_URL},
C{SVC_ENROLL_TOKEN}, C{SVC_MOUNT_POINT}, C{SVC_POLICY_FILE},
C{SVC_AUDIT_LOG}, C{SVC_CA_FILE}, C{SVC_CACHE_DIR}, C{SVC_MOUNT_ALLOW_OTHER},
C{SVC_MOUNT_FORCE}, C{SVC_FUSE_WORKERS}, C{SVC_DURABLE_CLOSE}.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import attrs

from svc.config import ConfigError, check_http_url, with_secret_files
from svc.mount.chunks.cache_policy import cache_root_from_environ
from svc.mount.core.fs_context import FSSettings

# The spec's default audit_log, written by the mount client and the server alike.
DEFAULT_AUDIT_LOG = "./audit.log"
# The default cache root is the spec's: $XDG_CACHE_HOME/svc, else $HOME/.cache/svc
# (svc.mount.chunks.cache_policy.cache_root_from_environ).
DEFAULT_OP_TIMEOUT = 30.0
"""Seconds a FUSE thread waits for a metadata operation or a read."""
DEFAULT_WRITEBACK_TIMEOUT = 600.0
"""Seconds a FUSE thread waits for flush, fsync, release or a truncation."""
DEFAULT_WORKERS = 2
"""llfuse worker threads: fewer cost less CPU per request, more let more
requests wait on the data plane at once (the trade, measured:
C{docs/configuration.md}, C{SVC_FUSE_WORKERS}; C{docs/decisions.md},
session 21)."""


@attrs.frozen
class BridgeTimeouts:
    """How long FUSE threads wait on the reactor, and kernel cache timeouts."""

    op_seconds: float = DEFAULT_OP_TIMEOUT
    writeback_seconds: float = DEFAULT_WRITEBACK_TIMEOUT
    entry_seconds: float = 300.0
    attr_seconds: float = 300.0


@attrs.frozen
class MountSettings:
    """
    Everything C{twist svc-mount} needs. The enrollment token is kept out of
    C{repr}.
    """

    control_url: str
    enroll_token: str = attrs.field(repr=False)
    mount_point: Path
    cache_dir: Path
    policy_file: Path | None = None
    audit_log: Path | None = None
    ca_file: Path | None = None
    allow_other: bool = False
    force: bool = False
    durable_close: bool = False
    """
    Every C{close}, C{unlink}, C{rmdir} and C{rename} waits for its answer
    (L{svc.mount.fs.FSSettings}).
    """
    start_wait: float = 60.0
    """
    Seconds a start-up call to the control plane (enrollment, the mount
    lease) keeps trying while it gets no usable answer
    (L{svc.mount.control.start_retry}), and the first data-plane connection
    while it cannot be made (L{ReconnectPolicy.start_wait}).
    """
    write_leases: bool = True
    """
    Files opened for writing take their path's data-plane write lease
    (L{svc.mount.fs.FSSettings}).
    """
    workers: int = DEFAULT_WORKERS
    timeouts: BridgeTimeouts = BridgeTimeouts()

    @property
    def fs_settings(self) -> FSSettings:
        """The filesystem core's tunables these settings choose."""
        return FSSettings(durable_close=self.durable_close, write_leases=self.write_leases)

    @property
    def spill_dir(self) -> Path:
        """Spill files live beside the chunk cache."""
        return self.cache_dir / "spill"

    @property
    def unsent_dir(self) -> Path:
        """Copies of changes the mount had to give up on (L{svc.mount.writeback.unsent})."""
        return self.cache_dir / "unsent"

    @property
    def outbox_dir(self) -> Path:
        """The outbox: its log and the chunks its entries hold (L{svc.mount.outbox})."""
        return self.cache_dir / "outbox"

    @property
    def chunk_dir(self) -> Path:
        """
        The chunk cache's root (the cache keeps C{chunks/<2 hex>/<hash>} and
        C{index.sqlite} under it, as the spec lays out).
        """
        return self.cache_dir


class SettingsError(ConfigError):
    """A required setting is missing or malformed (C{variable} names it)."""


def _default_cache_root(environ: Mapping[str, str]) -> Path:
    try:
        return cache_root_from_environ(environ)
    except ConfigError as error:
        raise SettingsError(error.variable, f"{error.problem} (or set SVC_CACHE_DIR)") from None


def _flag(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


def settings_from(
    environ: Mapping[str, str], overrides: Mapping[str, str | None] | None = None
) -> MountSettings:
    """
    Build L{MountSettings}: C{overrides} (option values keyed by variable
    name, L{None} meaning unset) win over C{environ}.

    The enroll token may also come from the file C{SVC_ENROLL_TOKEN_FILE}
    names (L{svc.config.with_secret_files}).

    @raise SettingsError: a required value is missing or a number is bad.
    """
    try:
        environ = with_secret_files(environ, ("SVC_ENROLL_TOKEN",))
    except ConfigError as error:
        raise SettingsError(error.variable, error.problem) from None
    merged: dict[str, str] = {k: v for k, v in environ.items() if k.startswith("SVC_")}
    for key, value in (overrides or {}).items():
        if value is not None:
            merged[key] = value

    def required(name: str) -> str:
        value = merged.get(name, "").strip()
        if not value:
            raise SettingsError(name, "is required")
        return value

    def optional_path(name: str) -> Path | None:
        value = merged.get(name, "").strip()
        return Path(value) if value else None

    try:
        workers = int(merged.get("SVC_FUSE_WORKERS", str(DEFAULT_WORKERS)))
    except ValueError:
        raise SettingsError("SVC_FUSE_WORKERS", "must be an integer") from None
    if workers < 1:
        raise SettingsError("SVC_FUSE_WORKERS", "must be at least 1")
    try:
        start_wait = float(merged.get("SVC_START_WAIT", "60"))
    except ValueError:
        raise SettingsError("SVC_START_WAIT", "must be a number of seconds") from None
    if not 0 <= start_wait <= 3600:
        raise SettingsError("SVC_START_WAIT", "must be between 0 and 3600 seconds")
    try:
        control_url = check_http_url("SVC_CONTROL_URL", required("SVC_CONTROL_URL"))
    except ConfigError as error:
        raise SettingsError(error.variable, error.problem) from None
    return MountSettings(
        control_url=control_url,
        enroll_token=required("SVC_ENROLL_TOKEN"),
        mount_point=Path(required("SVC_MOUNT_POINT")),
        cache_dir=optional_path("SVC_CACHE_DIR") or _default_cache_root(environ),
        policy_file=optional_path("SVC_POLICY_FILE"),
        audit_log=optional_path("SVC_AUDIT_LOG") or Path(DEFAULT_AUDIT_LOG),
        ca_file=optional_path("SVC_CA_FILE"),
        allow_other=_flag(merged.get("SVC_MOUNT_ALLOW_OTHER", "")),
        force=_flag(merged.get("SVC_MOUNT_FORCE", "")),
        durable_close=_flag(merged.get("SVC_DURABLE_CLOSE", "")),
        write_leases=_flag(merged.get("SVC_MOUNT_WRITE_LEASES") or "1"),
        workers=workers,
        start_wait=start_wait,
    )
