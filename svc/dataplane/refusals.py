"""
Logging refusals at a bounded rate: a flood of refused connections or
requests must not flood the operator log. The first refusal is logged, then
one in every L{LOG_EVERY}; each logged line says how many there were.
"""

from __future__ import annotations

import attrs

LOG_EVERY = 1000
"""Refusals between two logged lines."""


@attrs.define
class RefusalCount:
    """How many refusals of one kind there were, and whether to log this one."""

    every: int = LOG_EVERY
    count: int = 0

    def due(self) -> bool:
        """Count one refusal; whether it is one to log (the first, then every C{every})."""
        self.count += 1
        return self.count % self.every == 1 or self.every == 1
