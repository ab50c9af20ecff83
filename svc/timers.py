"""
The part of Twisted's C{IReactorTime} that code scheduling timeouts uses,
as typing protocols: a reactor or a test C{Clock} provides both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class Timer(Protocol):
    """The part of C{IDelayedCall} used: is it pending, stop it."""

    def active(self) -> bool:
        """Whether the call is still pending."""

    def cancel(self) -> None:
        """Stop the pending call."""


class TimerClock(Protocol):
    """The part of C{IReactorTime} used to schedule a call."""

    def callLater(
        self, delay: float, callable: Callable[..., object], *args: object, **kw: object
    ) -> Timer:
        """Call C{callable} after C{delay} seconds."""
