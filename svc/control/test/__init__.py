"""
Unit tests for svc.control.
"""

import svc.testing.hypothesis_profile  # noqa: F401  (no timing-based checks)
