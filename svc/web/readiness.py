"""
Readiness: whether a process can do its work right now, as C{GET /readyz}
on both planes answers it (liveness stays C{GET /healthz}: the process
runs).

A process declares named checks (L{Check}): each is a callable returning
L{None} when the check passes, or a short reason code (C{snake_case}, never
an error text: the route is public) when it does not. L{ReadinessProbe}
runs them all, each bounded by a timeout (a check that does not answer in
time fails with C{timeout}; one that raises fails with its C{failure} code,
C{error} unless declared, and is logged), and logs a line each time a
check's verdict changes, not at every probe. A check declared advisory
(C{gating=False}) is reported but does not decide readiness. The answer is
a L{Readiness}:

    200 {"status": "ready", "checks": {"database": "ok", ...}}
    503 {"error": "temporarily_unavailable", "error_description": "not_ready",
         "status": "not_ready", "checks": {"database": "unreachable", ...}}

The 503 body is the control plane's error body with two more fields, so one
client rule reads both planes (C{docs/specifications/readiness.md}).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import attrs
from twisted.internet.defer import Deferred, TimeoutError
from twisted.logger import Logger

from svc.web.errors import TEMPORARILY_UNAVAILABLE, ApiError, JsonValue

OK = "ok"
TIMEOUT = "timeout"
ERROR = "error"
NOT_READY = "not_ready"

DEFAULT_CHECK_TIMEOUT = 5.0
"""Seconds one check may take before it counts as failed (C{timeout})."""

CheckResult = str | None
"""L{None}: the check passes; otherwise the reason code it fails with."""


@attrs.frozen
class Check:
    """
    One named readiness check (L{CheckResult}, or an awaitable of it).

    @ivar failure: the reason when the check raises.
    @ivar gating: whether a failure makes the process not ready.
    """

    name: str
    run: Callable[[], CheckResult | Awaitable[CheckResult]]
    failure: str = ERROR
    gating: bool = True


@attrs.frozen
class Readiness:
    """
    The verdict of every check, by name: C{ok} or the reason it failed;
    C{advisory} names the checks that do not decide readiness.
    """

    checks: Mapping[str, str]
    advisory: frozenset[str] = frozenset()

    @property
    def ready(self) -> bool:
        """Whether every gating check passed."""
        return all(
            verdict == OK for name, verdict in self.checks.items() if name not in self.advisory
        )

    def body(self) -> dict[str, JsonValue]:
        """The 200 body: C{{"status": "ready", "checks": {...}}}."""
        return {"status": "ready" if self.ready else NOT_READY, "checks": dict(self.checks)}

    def refusal(self) -> ApiError:
        """The 503 answer of a process that is not ready."""
        return ApiError(
            503,
            TEMPORARILY_UNAVAILABLE,
            NOT_READY,
            extra={"status": NOT_READY, "checks": dict(self.checks)},
        )


class ReadinessProbe:
    """
    Runs C{checks} in order (each at most C{timeout} seconds of C{clock}).

    @param clock: the reactor (C{callLater}) that times the checks.
    """

    _log = Logger()

    def __init__(
        self, checks: Sequence[Check], clock: Any, timeout: float = DEFAULT_CHECK_TIMEOUT
    ) -> None:
        names = [check.name for check in checks]
        if len(set(names)) != len(names):
            raise ValueError(f"check names repeat: {names}")
        self._checks = tuple(checks)
        self._clock = clock
        self._timeout = timeout
        self._last: dict[str, str] = {}

    def probe(self) -> Deferred[Readiness]:
        """Run every check; fires with their verdicts."""
        return Deferred.fromCoroutine(self._probe())

    async def _probe(self) -> Readiness:
        verdicts: dict[str, str] = {}
        for check in self._checks:
            verdicts[check.name] = await self._verdict(check)
        for name, verdict in verdicts.items():
            if self._last.get(name, OK) != verdict:
                self._log.info(
                    "readiness check {check}: {verdict}",
                    check=name,
                    verdict=verdict,
                )
        self._last = verdicts
        advisory = frozenset(check.name for check in self._checks if not check.gating)
        return Readiness(verdicts, advisory)

    async def _verdict(self, check: Check) -> str:
        async def run() -> CheckResult:
            result = check.run()
            if isinstance(result, Awaitable):
                return await result
            return result

        running = Deferred.fromCoroutine(run())
        running.addTimeout(self._timeout, self._clock)
        try:
            reason = await running
        except TimeoutError:
            return TIMEOUT
        except Exception as e:
            self._log.warn(
                "readiness check {check} failed: {error}",
                check=check.name,
                error=f"{type(e).__name__}: {e}",
            )
            return check.failure
        return OK if reason is None else reason
