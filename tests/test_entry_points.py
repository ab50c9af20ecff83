"""
The installed entry points answer C{--version} as real processes, with no
configuration in the environment: C{svc}, C{twist svc-control},
C{twist svc-dataplane}, C{twist svc-mount}.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from twisted.trial.unittest import TestCase

from svc.version import version_line

BIN = Path(sys.executable).parent


class VersionTests(TestCase):
    """Each command prints its line and exits 0, whatever the environment lacks."""

    def test_every_entry_point(self) -> None:
        """svc --version and twist svc-* --version print svc's release and exit 0."""
        commands = {
            "svc": [str(BIN / "svc"), "--version"],
            "svc-control": [str(BIN / "twist"), "svc-control", "--version"],
            "svc-dataplane": [str(BIN / "twist"), "svc-dataplane", "--version"],
            "svc-mount": [str(BIN / "twist"), "svc-mount", "--version"],
        }
        for program, command in commands.items():
            done = subprocess.run(
                command,
                env={"PATH": os.environ.get("PATH", "")},
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            self.assertEqual(
                (done.returncode, done.stdout), (0, version_line(program) + "\n"), done.stderr
            )
