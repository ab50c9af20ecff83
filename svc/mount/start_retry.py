"""
Start-up calls to the control plane that are tried again while it answers
"later": a sandbox starting while the control plane restarts (connection
refused, 503) or sheds load (429) should mount once it is back, not fail
at once. See ``docs/specifications/mount-runtime.md`` section 3.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from twisted.internet.task import deferLater
from twisted.logger import Logger

from svc.mount.control_client import RetryLater

T = TypeVar("T")

_log = Logger()

START_WAIT = 60.0
"""How long a start-up call keeps trying, in seconds."""

FIRST_PAUSE = 0.5
"""The pause after the first refusal; it doubles up to L{MAX_PAUSE}."""

MAX_PAUSE = 5.0
"""The longest pause between two tries (unless the answer asks for longer)."""


async def until_answered(
    clock: Any,
    what: str,
    call: Callable[[], Awaitable[T]],
    *,
    wait: float = START_WAIT,
) -> T:
    """
    C{call()}, tried again after a L{RetryLater} (no answer, 429, 503) with
    a doubling pause (at least the answer's C{Retry-After}) while the next
    try would still start within C{wait} seconds of the first; then the
    last error is raised. Any other error is raised at once.
    """
    deadline = clock.seconds() + wait
    pause = FIRST_PAUSE
    attempt = 0
    while True:
        attempt += 1
        try:
            return await call()
        except RetryLater as error:
            delay = max(pause, error.retry_after or 0.0)
            if clock.seconds() + delay > deadline:
                raise
            _log.warn(
                "{what}: control plane not available (attempt {attempt}: {error});"
                " trying again in {delay}s",
                what=what,
                attempt=attempt,
                error=error,
                delay=delay,
            )
            await deferLater(clock, delay)
            pause = min(pause * 2, MAX_PAUSE)
