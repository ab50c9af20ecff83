"""
The Hypothesis profile every test package loads (its C{__init__} imports
this module): no check that depends on how fast the machine is.

Hypothesis by default fails a test whose single example takes over 200 ms
(C{deadline}) or whose input generation is slow (the C{too_slow} health
check). On a loaded two-core machine, or under C{trial -j}, both fire on
tests that are correct; unit tests must never depend on timing. The
examples, their number and the other health checks are unchanged.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

PROFILE = "svc-untimed"

settings.register_profile(
    PROFILE,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(PROFILE)
