"""
A per-key sliding-window rate limiter, in memory.

Enrollment is rate-limited per enroll token (spec "Enrollment security rules"
2): at most C{count} attempts per C{window_seconds} for one key (the token's
SHA-256; renewals use the leaf serial). The limiter is pure: the caller
passes the current time, so tests drive it with plain numbers or a
L{twisted.internet.task.Clock}.

An attempt is allowed when fewer than C{count} allowed attempts of the key
fall in the last C{window_seconds} (the window is C{(now - window, now]});
a refused attempt is not counted, so a client that waits C{retry_after}
seconds always gets through. C{retry_after} is the whole number of seconds
until the oldest counted attempt leaves the window, at least 1.

Memory is bounded: at most C{max_keys} keys are tracked, the least recently
used one being forgotten first; keys whose attempts have all left the window
are dropped as they are met. Forgetting a key only ever lets its owner in
sooner, never later. The state is per process: several control-plane
processes each allow C{count} per window.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque

import attrs

from svc.control.settings import RateLimit

DEFAULT_MAX_KEYS = 100_000
"""Keys tracked at most; beyond it the least recently used is forgotten."""


@attrs.frozen
class RateDecision:
    """
    Whether one attempt may go ahead; when not, C{retry_after} is the number
    of seconds to wait (at least 1), else 0.
    """

    allowed: bool
    retry_after: int = 0


ALLOWED = RateDecision(allowed=True)


class SlidingWindowLimiter:
    """
    At most C{count} attempts per key in any C{window_seconds}.

    @raise ValueError: C{count}, C{window_seconds} or C{max_keys} is not
        positive.
    """

    def __init__(self, count: int, window_seconds: float, max_keys: int = DEFAULT_MAX_KEYS) -> None:
        if count < 1 or window_seconds <= 0 or max_keys < 1:
            raise ValueError("count, window_seconds and max_keys must be positive")
        self.count = count
        self.window_seconds = window_seconds
        self.max_keys = max_keys
        self._attempts: OrderedDict[str, deque[float]] = OrderedDict()

    @classmethod
    def from_setting(
        cls, limit: RateLimit, max_keys: int = DEFAULT_MAX_KEYS
    ) -> SlidingWindowLimiter:
        """
        The limiter for a configured C{<count>/<seconds>} (e.g.
        C{SVC_ENROLL_RATE_LIMIT}).
        """
        return cls(limit.count, limit.window_seconds, max_keys)

    def __len__(self) -> int:
        """The number of keys currently tracked."""
        return len(self._attempts)

    def attempt(self, key: str, now: float) -> RateDecision:
        """
        Record an attempt for C{key} at C{now} if it is allowed, and say
        whether it is.
        """
        self._drop_one_stale(now)
        attempts = self._attempts.get(key)
        if attempts is None:
            attempts = deque()
            self._attempts[key] = attempts
        else:
            self._attempts.move_to_end(key)
        horizon = now - self.window_seconds
        while attempts and attempts[0] <= horizon:
            attempts.popleft()
        if len(attempts) < self.count:
            attempts.append(now)
            self._bound()
            return ALLOWED
        wait = attempts[0] + self.window_seconds - now
        return RateDecision(allowed=False, retry_after=max(1, math.ceil(wait)))

    def _drop_one_stale(self, now: float) -> None:
        """
        Forget the least recently used key if none of its attempts is in the
        window any more (amortised clean-up, one key per attempt).
        """
        if not self._attempts:
            return
        oldest_key = next(iter(self._attempts))
        attempts = self._attempts[oldest_key]
        if not attempts or attempts[-1] <= now - self.window_seconds:
            del self._attempts[oldest_key]

    def _bound(self) -> None:
        while len(self._attempts) > self.max_keys:
            self._attempts.popitem(last=False)
