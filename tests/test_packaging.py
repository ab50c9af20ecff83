"""
The package builds and installs the way a Twisted project must: a plain
(non-editable) install puts the plugin file where C{twist} finds it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from twisted.trial.unittest import TestCase

REPO = Path(__file__).resolve().parent.parent


def _site_packages() -> list[str]:
    """The running interpreter's site-packages directories (dependencies live there)."""
    return [p for p in sys.path if p.endswith("site-packages")]


class PlainInstallTests(TestCase):
    """
    Build a wheel, install it with no editable path, and ask twist for its plugins.
    """

    def setUp(self) -> None:
        self.work = Path(self.mktemp()).resolve()
        self.work.mkdir()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--no-build-isolation",
                "-q",
                "-w",
                str(self.work / "dist"),
                str(REPO),
            ],
            check=True,
            capture_output=True,
        )
        wheels = list((self.work / "dist").glob("svc-*.whl"))
        self.assertEqual(len(wheels), 1)
        self.wheel = wheels[0]

    def test_wheel_contents(self) -> None:
        """
        The wheel ships the plugin file without an __init__.py beside it,
        py.typed, and the files the control plane serves (dashboard, OpenAPI).
        """
        names = set(zipfile.ZipFile(self.wheel).namelist())
        self.assertIn("twisted/plugins/svc_plugins.py", names)
        self.assertNotIn("twisted/plugins/__init__.py", names)
        self.assertNotIn("twisted/__init__.py", names)
        self.assertIn("svc/py.typed", names)
        for served in ("dashboard/index.html", "dashboard/app.js", "dashboard/app.css"):
            self.assertIn(f"svc/control/{served}", names)
        self.assertIn("svc/control/openapi.json", names)
        self.assertFalse([n for n in names if "/test/" in n and n.startswith("tests/")])

    def test_twist_lists_three_plugins(self) -> None:
        """After a plain install, `twist --help` lists svc-control, svc-dataplane, svc-mount."""
        target = self.work / "target"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                "--target",
                str(target),
                str(self.wheel),
            ],
            check=True,
            capture_output=True,
        )
        # -S: no site processing, so the checkout's editable path (.pth) is not added;
        # only the installed wheel and the dependencies are importable.
        path = os.pathsep.join([str(target), *_site_packages()])
        code = (
            "import sys; sys.argv=['twist','--help'];"
            "from twisted.application.twist._twist import Twist; Twist.main(sys.argv)"
        )
        result = subprocess.run(
            [sys.executable, "-S", "-c", code],
            env={"PYTHONPATH": path, "PATH": os.environ.get("PATH", "")},
            cwd=str(self.work),
            capture_output=True,
            text=True,
            check=False,
        )
        self.assertEqual(result.returncode, 0, result.stderr)
        for name in ("svc-control", "svc-dataplane", "svc-mount"):
            self.assertIn(name, result.stdout)
        # The plugin must come from the installed copy, not the checkout.
        self.assertNotIn(str(REPO), result.stderr)
