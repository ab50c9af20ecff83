"""
System tests: real processes, real sockets, real files. Run with C{trial tests}.
"""

import svc.testing.hypothesis_profile  # noqa: F401  (no timing-based checks)
