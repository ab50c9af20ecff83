"""
What C{GET /readyz} checks on a data-plane server
(C{docs/specifications/readiness.md}).

Three checks, in order:

  - C{storage}: each storage root (C{SVC_TENANTS_ROOT},
    C{SVC_METADATA_ROOT}) is a directory the process may write and enter;
    else C{storage_missing} or C{storage_not_writable} (looked at on the
    I/O worker);
  - C{credentials}: the server leaf is installed and not expired; else
    C{not_installed} (still waiting for the control plane to sign it) or
    C{expired} (renewal has failed for the leaf's whole last third);
  - C{listeners}: the frame and HTTPS listeners are open; else
    C{not_listening}.

L{DataPlaneReadiness} is told of credentials and listeners by the server
(L{svc.dataplane.tap.DataPlaneServer}) as they happen; it reads no global
state.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography import x509
from twisted.internet.defer import Deferred

from svc.web.readiness import Check, CheckResult, ReadinessProbe
from svc.worker import IWorker

STORAGE_MISSING = "storage_missing"
STORAGE_NOT_WRITABLE = "storage_not_writable"
NOT_INSTALLED = "not_installed"
EXPIRED = "expired"
NOT_LISTENING = "not_listening"


def storage_problem(roots: Iterable[Path]) -> CheckResult:
    """Why the roots cannot be used (blocking), or L{None}."""
    for root in roots:
        if not root.is_dir():
            return STORAGE_MISSING
        if not os.access(root, os.W_OK | os.X_OK):
            return STORAGE_NOT_WRITABLE
    return None


class DataPlaneReadiness:
    """
    The readiness of one data-plane server.

    @param roots: the storage roots.
    @param io: runs the storage look (it touches the disk).
    @param clock: the reactor: C{seconds()} for expiry, C{callLater} for
        the check timeout.
    """

    def __init__(self, roots: Iterable[Path], io: IWorker, clock: Any) -> None:
        self._roots = tuple(sorted(set(roots)))
        self._io = io
        self._clock = clock
        self._not_after: datetime | None = None
        self._listening = False
        self.probe = ReadinessProbe(
            [
                Check("storage", self._storage),
                Check("credentials", self._credentials),
                Check("listeners", self._listeners),
            ],
            clock,
        )

    def credentials_installed(self, cert: x509.Certificate) -> None:
        """The server now presents C{cert}."""
        self._not_after = cert.not_valid_after_utc

    def listening(self, listening: bool) -> None:
        """Whether both listeners are open."""
        self._listening = listening

    def _storage(self) -> Deferred[CheckResult]:
        roots = self._roots

        def look() -> CheckResult:
            return storage_problem(roots)

        return self._io.submit(look)

    def _credentials(self) -> CheckResult:
        if self._not_after is None:
            return NOT_INSTALLED
        if datetime.fromtimestamp(self._clock.seconds(), UTC) >= self._not_after:
            return EXPIRED
        return None

    def _listeners(self) -> CheckResult:
        return None if self._listening else NOT_LISTENING
