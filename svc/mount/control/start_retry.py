"""
Start-up calls to the control plane that are tried again while it answers
"later": a sandbox starting while the control plane restarts (connection
refused, 503) or sheds load (429) should mount once it is back, not fail
at once. See ``docs/specifications/mount-runtime.md`` section 3.

L{refused_at_start} names the variable behind a refusal that ends the start
(a refused enroll token, a URL that is not the control plane's, a lease
another mount holds).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from svc.backoff import Backoff, RetryClock, retrying
from svc.mount.control.control_client import (
    ControlPlaneError,
    LeaseLive,
    RetryLater,
    Revoked,
    Unauthorized,
)
from svc.startup import StartError, describe

T = TypeVar("T")

START_WAIT = 60.0
"""How long a start-up call keeps trying, in seconds, by default (C{SVC_START_WAIT})."""

START_BACKOFF = Backoff(initial=0.5, maximum=5.0)
"""The pause after the first refusal (0.5 s), doubling up to 5 s (unless the
answer asks for longer)."""


def _retry_after(error: Exception) -> float | None:
    return error.retry_after if isinstance(error, RetryLater) else None


async def until_answered(
    clock: RetryClock,
    what: str,
    call: Callable[[], Awaitable[T]],
    *,
    wait: float = START_WAIT,
) -> T:
    """
    C{call()}, tried again after a L{RetryLater} (no answer, 429, 503) with
    L{START_BACKOFF} (at least the answer's C{Retry-After}) while the next
    try would still start within C{wait} seconds of the first; then the
    last error is raised. Any other error is raised at once.
    """
    return await retrying(
        clock,
        f"{what}: control plane not available",
        call,
        backoff=START_BACKOFF,
        retryable=lambda error: isinstance(error, RetryLater),
        give_up_after=wait,
        at_least=_retry_after,
    )


def refused_at_start(
    step: str, error: Exception, control_url: str, wait: float = START_WAIT
) -> StartError:
    """
    The start failure C{error} of C{step} (C{"enrollment"} or C{"mount
    lease"}) as one line naming what to fix.
    """
    if isinstance(error, StartError):
        return error
    if not isinstance(error, ControlPlaneError):
        return StartError(step, describe(error))
    if isinstance(error, RetryLater):
        if "certificate verify failed" in error.description:
            return StartError(
                "SVC_CA_FILE",
                f"the HTTPS certificate of {control_url} is not trusted ({error})",
                "set SVC_CA_FILE to the org root (or the CA) that signed it",
            )
        return StartError(
            "SVC_CONTROL_URL",
            f"no usable answer from {control_url} for {wait:g}s ({error})",
            "check that the control plane runs and that SVC_CONTROL_URL names it",
        )
    if error.status in (404, 405):
        return StartError(
            "SVC_CONTROL_URL",
            f"{control_url} answered {error}: not a control plane that enrolls agents",
            "set the base URL of the control plane (one with DATABASE_URL and an agent CA)",
        )
    if step == "enrollment" and isinstance(error, Unauthorized):
        return StartError(
            "SVC_ENROLL_TOKEN",
            f"the control plane refused it ({error})",
            "mint a fresh token (each start spends one)",
        )
    if isinstance(error, LeaseLive):
        return StartError(
            "SVC_MOUNT_FORCE",
            f"another enrollment of this agent holds the mount lease ({error})",
            "stop the other mount, or set SVC_MOUNT_FORCE=1 (--force) to take the lease over",
        )
    if isinstance(error, Revoked):
        return StartError(step, f"the agent's allocation is revoked ({error})")
    return StartError(step, f"the control plane at {control_url} refused it ({error})")
