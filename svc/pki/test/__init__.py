"""
Unit tests for svc.pki.
"""

import svc.testing.hypothesis_profile  # noqa: F401  (no timing-based checks)
