"""
Unit tests for the svc package's top-level modules.
"""

import svc.testing.hypothesis_profile  # noqa: F401  (no timing-based checks)
