"""
Tests for L{svc.version}: the C{--version} option of every entry point.
"""

from __future__ import annotations

import functools
import io
import re
import sys
from collections.abc import Callable

from twisted.trial.unittest import SynchronousTestCase

from svc import cli
from svc.control import tap as control_tap
from svc.dataplane import tap as dataplane_tap
from svc.mount import tap as mount_tap
from svc.version import UNKNOWN, exit_with_version, release, version_line

LINE = re.compile(r"(?P<program>svc[-a-z]*) (?P<release>\S+) \(Python [0-9.]+, Twisted [0-9.]+\)")


class VersionLineTests(SynchronousTestCase):
    """The line names the program, the release and the runtime."""

    def test_release_is_the_installed_one(self) -> None:
        """The release is the installed distribution's version (never unknown here)."""
        self.assertNotEqual(release(), UNKNOWN)
        self.assertRegex(release(), r"^[0-9]+\.[0-9]+")

    def test_line(self) -> None:
        """version_line is <program> <release> (Python x, Twisted y)."""
        match = LINE.fullmatch(version_line("svc-mount"))
        assert match is not None
        self.assertEqual(match["program"], "svc-mount")
        self.assertEqual(match["release"], release())

    def test_exit(self) -> None:
        """exit_with_version prints the line and exits 0."""
        out = io.StringIO()
        error = self.assertRaises(SystemExit, exit_with_version, "svc-x", out)
        self.assertEqual((error.code, out.getvalue()), (0, version_line("svc-x") + "\n"))


class EntryPointTests(SynchronousTestCase):
    """Every entry point answers --version, with no configuration at all."""

    def printed(self, run: Callable[[], object]) -> str:
        out = io.StringIO()
        self.patch(sys, "stdout", out)
        error = self.assertRaises(SystemExit, run)
        self.assertEqual(error.code, 0)
        return out.getvalue()

    def test_taps(self) -> None:
        """The three twist commands' --version print svc's release, not Twisted's."""
        for program, options in (
            ("svc-control", control_tap.Options({})),
            ("svc-dataplane", dataplane_tap.Options({})),
            ("svc-mount", mount_tap.Options({})),
        ):
            printed = self.printed(functools.partial(options.parseOptions, ["--version"]))
            self.assertEqual(printed, version_line(program) + "\n")

    def test_svc(self) -> None:
        """svc --version prints svc's line."""
        self.assertEqual(self.printed(lambda: cli.main(["--version"])), version_line("svc") + "\n")
