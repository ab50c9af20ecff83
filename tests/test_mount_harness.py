"""Tests for the system tests' own plumbing (L{tests.mount_harness}) that need no mount."""

from __future__ import annotations

import io
import shutil
import tempfile
from collections.abc import Callable
from contextlib import redirect_stdout
from pathlib import Path
from typing import cast

from twisted.trial.unittest import SynchronousTestCase

from tests.mount_harness import EVIDENCE_LINES, MountStackCase, shows_evidence


class _Case:
    """Stands for a L{MountStackCase}: only its C{tmp} is read."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp


class ShowsEvidenceTests(SynchronousTestCase):
    """L{shows_evidence} prints what the logs hold worth seeing when a test fails."""

    def setUp(self) -> None:
        self.tmp = Path(tempfile.mkdtemp())
        self.addCleanup(shutil.rmtree, self.tmp, True)
        lines = [f"2026-11-28T00:00:00+0000 [svc.mount.x#info] fine {n}" for n in range(5)]
        lines += [f"2026-11-28T00:00:01+0000 [svc.mount.x#warn] odd {n}" for n in range(70)]
        (self.tmp / "stack").mkdir()
        (self.tmp / "stack" / "dataplane.log").write_text("\n".join(lines) + "\n")

    def run_test(self, body: Callable[[], None]) -> str:
        """Run C{body} as a decorated test of a case whose C{tmp} is ours; what it printed."""

        def test(case: MountStackCase) -> None:
            body()

        decorated = shows_evidence(test)
        out = io.StringIO()
        with redirect_stdout(out):
            try:
                decorated(cast(MountStackCase, _Case(self.tmp)))
            except AssertionError:
                pass
        return out.getvalue()

    def test_failure_prints_the_last_warnings_of_each_log(self) -> None:
        def fails() -> None:
            raise AssertionError("picture mismatch")

        printed = self.run_test(fails).splitlines()
        self.assertEqual(printed[0], "--- stack/dataplane.log: 70 lines worth seeing, the last:")
        self.assertEqual(len(printed), 1 + EVIDENCE_LINES)
        self.assertTrue(printed[-1].endswith("odd 69"))
        self.assertNotIn("fine", "\n".join(printed))

    def test_success_prints_nothing(self) -> None:
        self.assertEqual(self.run_test(lambda: None), "")
