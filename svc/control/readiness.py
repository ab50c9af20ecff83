"""
The control plane's C{GET /readyz} (C{docs/specifications/readiness.md}):
public, always mounted, beside the liveness route C{GET /healthz}.

Checks, each only where this process is configured for it:

  - C{database} (with C{DATABASE_URL}): a read of the store answers;
    else C{unreachable} (or C{timeout});
  - C{agent_ca} (with an agent CA): the org root exists and the control
    certificate is issued; else C{not_initialised} (run C{svc ca init}) or
    C{no_control_certificate};
  - C{dataplane} (with C{DATABASE_URL}; advisory): at least one data-plane
    server is registered; else C{none_registered}. Advisory, it is reported
    but never makes the process not ready: data-plane servers register
    through the control plane, so a load balancer that routed only to ready
    control planes would keep the first one from ever registering.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from svc.control.http import Call
from svc.control.routing import AuthKind, HandlerResult, Route
from svc.control.store.interface import ControlStore
from svc.web.readiness import Check, CheckResult, ReadinessProbe

UNREACHABLE = "unreachable"
NOT_INITIALISED = "not_initialised"
NO_CONTROL_CERTIFICATE = "no_control_certificate"
NONE_REGISTERED = "none_registered"


def control_checks(
    store: ControlStore | None,
    org_root: Callable[[], Awaitable[object | None]] | None,
    control_certificate: Callable[[], object | None],
) -> list[Check]:
    """
    The checks of a control plane with C{store} (L{None}: no database) and,
    when an agent CA is configured, C{org_root} (the CA, L{None} before
    C{svc ca init}) and C{control_certificate} (the current one, or
    L{None}).
    """
    checks: list[Check] = []
    if store is not None:

        async def database() -> CheckResult:
            await store.list_servers()
            return None

        checks.append(Check("database", database, failure=UNREACHABLE))
    if org_root is not None:

        async def agent_ca() -> CheckResult:
            if await org_root() is None:
                return NOT_INITIALISED
            return None if control_certificate() is not None else NO_CONTROL_CERTIFICATE

        checks.append(Check("agent_ca", agent_ca))
    if store is not None:

        async def dataplane() -> CheckResult:
            return None if await store.list_servers() else NONE_REGISTERED

        checks.append(Check("dataplane", dataplane, failure=UNREACHABLE, gating=False))
    return checks


def readiness_routes(probe: ReadinessProbe) -> list[Route]:
    """C{GET /readyz}: 200 when ready, else 503 naming the failing checks."""

    async def readyz(call: Call) -> HandlerResult:
        readiness = await probe.probe()
        if not readiness.ready:
            raise readiness.refusal()
        return readiness.body()

    return [Route("GET", "/readyz", AuthKind.PUBLIC, readyz)]


def readiness_probe(
    store: ControlStore | None,
    org_root: Callable[[], Awaitable[object | None]] | None,
    control_certificate: Callable[[], object | None],
    clock: Any,
) -> ReadinessProbe:
    """The probe of L{control_checks}, timed by C{clock}."""
    return ReadinessProbe(control_checks(store, org_root, control_certificate), clock)
