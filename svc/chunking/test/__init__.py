"""
Tests for L{svc.chunking}.
"""

import svc.testing.hypothesis_profile  # noqa: F401  (no timing-based checks)
