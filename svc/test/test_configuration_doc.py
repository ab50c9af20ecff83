"""
Every C{SVC_*} environment variable the code reads is in the configuration
reference, C{docs/configuration.md}.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

ROOT = Path(__file__).resolve().parent.parent.parent
VARIABLE = re.compile(r"\ASVC_[A-Z0-9_]+\Z")


def variables_in_code() -> set[str]:
    """String constants that look like SVC_* variable names, outside tests."""
    found: set[str] = set()
    for source in (ROOT / "svc").rglob("*.py"):
        if "test" in source.relative_to(ROOT).parts[:-1]:
            continue
        for node in ast.walk(ast.parse(source.read_text(), str(source))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if VARIABLE.match(node.value):
                    found.add(node.value)
    return found


class ConfigurationReferenceTests(SynchronousTestCase):
    """
    The configuration reference names every variable the code reads.
    """

    def test_every_variable_documented(self) -> None:
        """Each SVC_* name in the code appears, in backticks, in docs/configuration.md."""
        documented = (ROOT / "docs" / "configuration.md").read_text()
        found = variables_in_code()
        self.assertGreater(len(found), 20)
        missing = sorted(v for v in found if f"`{v}`" not in documented)
        self.assertEqual(missing, [])
