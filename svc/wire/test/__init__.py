"""
Unit tests for svc.wire.
"""

import svc.testing.hypothesis_profile  # noqa: F401  (no timing-based checks)
