"""
Unit tests for svc.dataplane.
"""

import svc.testing.hypothesis_profile  # noqa: F401  (no timing-based checks)
