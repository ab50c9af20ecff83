"""
One backoff for every retry of the server processes: how long to wait after
the n-th failure in a row (L{Backoff}), and the loop that tries a call again
while its error is worth another try (L{retrying}).

A pause grows by C{factor} from C{initial} up to C{maximum}; C{jitter}
takes up to that fraction off each pause at random (a fleet restarted
together spreads out), and a server's C{Retry-After} is a floor. Errors that
cannot fix themselves (a refused credential, a malformed URL) are not
retried: the caller's C{retryable} says which are.

Users: the data-plane server's certificate requests
(L{svc.dataplane.servercert}), the mount's start-up calls to the control
plane (L{svc.mount.control.start_retry}) and its data-plane connections
(L{svc.dataplane_client.reconnecting}). The client SDK keeps its own
(C{svc.sdk.retry}: stdlib only, a public formula; C{docs/decisions.md}).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import attrs
from twisted.internet.task import deferLater
from twisted.logger import Logger

T = TypeVar("T")

_log = Logger()

_MAX_EXPONENT = 64


def _positive(instance: object, attribute: Any, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{attribute.name} must be a positive number, got {value!r}")


def _growth(instance: object, attribute: Any, value: float) -> None:
    if not (math.isfinite(value) and value >= 1):
        raise ValueError(f"factor must be at least 1, got {value!r}")


def _fraction(instance: object, attribute: Any, value: float) -> None:
    if not 0 <= value < 1:
        raise ValueError(f"jitter must be in [0, 1), got {value!r}")


@attrs.frozen
class Backoff:
    """
    The pause after the n-th failed attempt in a row:
    C{min(maximum, initial * factor ** (n - 1))}, less up to C{jitter} of
    itself at random, and never below a floor the answer asked for.
    """

    initial: float = attrs.field(validator=_positive)
    maximum: float = attrs.field(validator=_positive)
    factor: float = attrs.field(default=2.0, validator=_growth)
    jitter: float = attrs.field(default=0.0, validator=_fraction)

    def __attrs_post_init__(self) -> None:
        if self.maximum < self.initial:
            raise ValueError(f"maximum {self.maximum} is below initial {self.initial}")

    def delay(self, failures: int, draw: float = 0.0, at_least: float | None = None) -> float:
        """
        Seconds to wait after C{failures} failed attempts in a row (1 for
        the first); C{draw} is a random number in [0, 1) (0: no jitter),
        C{at_least} a C{Retry-After}.
        """
        if failures < 1:
            raise ValueError(f"failures count from 1, got {failures}")
        if not 0 <= draw < 1:
            raise ValueError(f"draw must be in [0, 1), got {draw!r}")
        exponent = min(failures - 1, _MAX_EXPONENT)
        base = min(self.maximum, self.initial * self.factor**exponent)
        return max(base * (1 - self.jitter * draw), at_least or 0.0)


class RetryClock(Protocol):
    """The part of C{IReactorTime} L{retrying} uses (a reactor or a C{Clock})."""

    def seconds(self) -> float:
        """Now, in seconds."""

    def callLater(
        self, delay: float, callable: Callable[..., object], *args: object, **kw: object
    ) -> Any:
        """Call C{callable} after C{delay} seconds."""


def _no_floor(error: Exception) -> float | None:
    return None


def _no_jitter() -> float:
    return 0.0


async def retrying(
    clock: RetryClock,
    what: str,
    call: Callable[[], Awaitable[T]],
    *,
    backoff: Backoff,
    retryable: Callable[[Exception], bool],
    give_up_after: float | None = None,
    at_least: Callable[[Exception], float | None] = _no_floor,
    draw: Callable[[], float] = _no_jitter,
) -> T:
    """
    C{call()}; after an error C{retryable} accepts, C{call()} again after
    C{backoff}'s pause (at least C{at_least(error)}), as long as the next
    try would start within C{give_up_after} seconds of the first (L{None}:
    forever). Then the last error is raised; any other error is raised at
    once. Each retry is logged as a warning naming C{what}.
    """
    deadline = None if give_up_after is None else clock.seconds() + give_up_after
    failures = 0
    while True:
        try:
            return await call()
        except Exception as error:
            if not retryable(error):
                raise
            failures += 1
            delay = backoff.delay(failures, draw(), at_least(error))
            if deadline is not None and clock.seconds() + delay > deadline:
                raise
            _log.warn(
                "{what} (attempt {attempt}: {error}); trying again in {delay:.2f}s",
                what=what,
                attempt=failures,
                error=str(error) or type(error).__name__,
                delay=delay,
            )
            await deferLater(clock, delay)  # type: ignore[arg-type]
