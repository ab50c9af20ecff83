"""
``twist svc-mount``: options and service construction.

L{Options} reads each option from its C{SVC_*} variable unless given; a bad
variable or option (the mount point and the policy file are checked then
too, before the enrollment spends the token) refuses to start with status
64, in one line naming the variable at fault (L{svc.startup}).
L{makeService} builds the L{MountService} (L{svc.mount.runtime.service}: start-up,
upkeep and shutdown) over the global reactor.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from twisted.application.service import IService
from twisted.python import usage

from svc.config import ConfigError, process_environ
from svc.mount.runtime.mount_point import mount_point_problem, release_dead_mount
from svc.mount.runtime.service import MountService
from svc.mount.runtime.settings import MountSettings, settings_from
from svc.policy import PolicyError, load_policy_file
from svc.startup import refusing
from svc.version import exit_with_version
from svc.web.clients import check_ca_file

OPTION_VARIABLES = {
    "control-url": "SVC_CONTROL_URL",
    "enroll-token": "SVC_ENROLL_TOKEN",
    "mount-point": "SVC_MOUNT_POINT",
    "policy-file": "SVC_POLICY_FILE",
    "audit-log": "SVC_AUDIT_LOG",
    "ca-file": "SVC_CA_FILE",
    "cache-dir": "SVC_CACHE_DIR",
    "workers": "SVC_FUSE_WORKERS",
    "start-wait": "SVC_START_WAIT",
}


class Options(usage.Options):
    """
    Command-line options for ``twist svc-mount``; each defaults to its
    C{SVC_*} environment variable.
    """

    optParameters = [
        [name, None, None, f"(default: ${variable})"] for name, variable in OPTION_VARIABLES.items()
    ]
    optFlags = [
        ["allow-other", None, "Let other users use the mount ($SVC_MOUNT_ALLOW_OTHER)."],
        ["force", None, "Take the mount lease over from another enrollment ($SVC_MOUNT_FORCE)."],
        [
            "durable-close",
            None,
            "Make every close, unlink, rmdir and rename wait for its answer ($SVC_DURABLE_CLOSE).",
        ],
        [
            "no-write-leases",
            None,
            "Take no data-plane write leases for files opened for writing"
            " ($SVC_MOUNT_WRITE_LEASES=0).",
        ],
    ]

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]

        self._environ = dict(process_environ()) if environ is None else environ
        self.settings: MountSettings | None = None

    def opt_version(self) -> None:
        """Print the svc release and exit (before the environment is read)."""
        exit_with_version("svc-mount")

    def postOptions(self) -> None:
        with refusing(self, "svc-mount", self._environ):
            self._check()

    def _check(self) -> None:
        overrides: dict[str, str | None] = {
            variable: self[name] for name, variable in OPTION_VARIABLES.items()
        }
        if self["allow-other"]:
            overrides["SVC_MOUNT_ALLOW_OTHER"] = "1"
        if self["force"]:
            overrides["SVC_MOUNT_FORCE"] = "1"
        if self["durable-close"]:
            overrides["SVC_DURABLE_CLOSE"] = "1"
        if self["no-write-leases"]:
            overrides["SVC_MOUNT_WRITE_LEASES"] = "0"
        self.settings = settings = settings_from(self._environ, overrides)
        # Before enrolling, which spends the token. A killed svc mount leaves
        # its dead mount behind: clear it, as a restart should just work.
        release_dead_mount(settings.mount_point)
        problem = mount_point_problem(settings.mount_point)
        if problem is not None:
            raise ConfigError("SVC_MOUNT_POINT", problem)
        if settings.policy_file is not None:
            try:
                load_policy_file(settings.policy_file)
            except PolicyError as error:
                raise ConfigError("SVC_POLICY_FILE", str(error)) from None
        if settings.ca_file is not None:
            check_ca_file(settings.ca_file)


def makeService(options: Options) -> IService:
    """The mount service over the global reactor."""
    from twisted.internet import reactor  # noqa: PLC0415 (installed by twist by now)

    assert options.settings is not None
    service: Any = MountService(reactor, options.settings)
    return cast(IService, service)


__all__ = ["Options", "Path", "makeService"]
