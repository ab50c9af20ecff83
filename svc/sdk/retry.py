"""
Retry helpers: which failures are worth another attempt, and how long to
wait before it.

The SDK never retries on its own: only the caller knows whether replaying a
request is safe and how many attempts it can afford. A typical loop::

    for attempt in itertools.count(1):
        try:
            return client.usage("acme")
        except SvcError as error:
            if attempt == 5 or not is_retryable(error):
                raise
            time.sleep(retry_delay(error, attempt))
"""

from __future__ import annotations

import math
import random
import re
import time
from collections.abc import Callable
from datetime import UTC
from email.utils import parsedate_to_datetime

from svc.sdk.errors import Headers, InvalidResponse, SvcError, TransportError, VersionSkewError

RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504})
"""The statuses worth retrying (service specification, "Client SDK behaviour")."""

DEFAULT_BASE = 0.5
"""Seconds of backoff after the first failed attempt."""
DEFAULT_CAP = 30.0
"""The most seconds of backoff (and of jitter)."""
_MAX_EXPONENT = 62

_DELTA_SECONDS = re.compile(r"[0-9]+")


def is_retryable(error_or_status: SvcError | int) -> bool:
    """
    Whether another attempt may succeed.

    True for the statuses L{RETRYABLE_STATUSES} (an C{int} or an error
    carrying one) and for a L{TransportError} (no answer, including a
    timeout). False for every other status, a L{VersionSkewError} and an
    L{InvalidResponse}.
    """
    if isinstance(error_or_status, bool):
        raise TypeError("a status is an int, not a bool")
    if isinstance(error_or_status, int):
        return error_or_status in RETRYABLE_STATUSES
    if isinstance(error_or_status, VersionSkewError | InvalidResponse):
        return False
    if isinstance(error_or_status, TransportError):
        return True
    return error_or_status.status in RETRYABLE_STATUSES


def parse_retry_after(value: str, now: float) -> float | None:
    """
    The seconds a C{Retry-After} value asks to wait, at C{now} (POSIX
    seconds): C{delta-seconds} (ASCII digits) or an HTTP-date (a date in the
    past is 0). L{None} for anything else.
    """
    value = value.strip()
    if _DELTA_SECONDS.fullmatch(value):
        return float(int(value))
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if moment.tzinfo is None:  # "-0000": UTC by RFC 5322
        moment = moment.replace(tzinfo=UTC)
    return max(0.0, moment.timestamp() - now)


def retry_after(error: SvcError | Headers, *, now: Callable[[], float] = time.time) -> float | None:
    """
    The seconds the answer's C{Retry-After} header asks to wait, or L{None}
    when there is none (or it cannot be read).
    """
    headers = error if isinstance(error, Headers) else error.headers
    value = headers.get("Retry-After")
    return None if value is None else parse_retry_after(value, now())


def backoff(attempt: int, *, base: float = DEFAULT_BASE, cap: float = DEFAULT_CAP) -> float:
    """
    The exponential backoff after attempt number C{attempt} (1 for the
    first): C{min(cap, base * 2 ** (attempt - 1))}.
    """
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
        raise ValueError(f"attempt counts from 1, got {attempt!r}")
    if not (math.isfinite(base) and math.isfinite(cap) and base >= 0 and cap >= 0):
        raise ValueError("base and cap must be finite and not negative")
    return min(cap, base * 2.0 ** min(attempt - 1, _MAX_EXPONENT))


def retry_delay(
    error: SvcError,
    attempt: int,
    *,
    base: float = DEFAULT_BASE,
    cap: float = DEFAULT_CAP,
    rng: Callable[[], float] = random.random,
    now: Callable[[], float] = time.time,
) -> float:
    """
    Seconds to wait before the next attempt, after attempt number
    C{attempt} (1 for the first) failed with C{error}.

    With C{b = backoff(attempt, base=base, cap=cap)} and C{r = rng()} in
    [0, 1):

      - when the answer carries a non-zero C{Retry-After} of C{s} seconds:
        C{s + r * b} (never less than asked; not capped);
      - otherwise C{b / 2 + r * b / 2} ("equal jitter": between half the
        backoff and the backoff).
    """
    step = backoff(attempt, base=base, cap=cap)
    jitter = rng()
    if not 0.0 <= jitter < 1.0:
        raise ValueError(f"rng must return a number in [0, 1), got {jitter!r}")
    asked = retry_after(error, now=now)
    if asked:
        return asked + jitter * step
    return step / 2 + jitter * step / 2


__all__ = [
    "DEFAULT_BASE",
    "DEFAULT_CAP",
    "RETRYABLE_STATUSES",
    "backoff",
    "is_retryable",
    "parse_retry_after",
    "retry_after",
    "retry_delay",
]
