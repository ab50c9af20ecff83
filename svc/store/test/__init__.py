"""
Unit tests for svc.store.
"""

import svc.testing.hypothesis_profile  # noqa: F401  (no timing-based checks)
