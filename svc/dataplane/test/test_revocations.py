"""
Tests for L{svc.dataplane.revocations}: the deny-list file, merging, ageing
and the start-up load and pull.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from svc.control.test.test_enrollment_support import capture_logs
from svc.dataplane.revocations import (
    DENY_LIST_FILE,
    DenyListFile,
    DenyListFileError,
    DenyListUnavailable,
    Revocations,
    parse_deny_list,
    render_deny_list,
)
from svc.pki.identity import DenyList
from svc.testing.worker import ImmediateWorker

NOW = datetime(2026, 11, 22, 19, 0, tzinfo=UTC)
LATER = NOW + timedelta(hours=1)


class DenyListFormatTests(SynchronousTestCase):
    """
    The C{deny-list.json} document.
    """

    def test_round_trip(self) -> None:
        """A rendered list parses back; entries sorted by serial, versioned, Z timestamps."""
        deny = DenyList.of([("b2", LATER), ("a1", NOW + timedelta(microseconds=5))])
        raw = render_deny_list(deny, NOW)
        self.assertEqual(
            json.loads(raw),
            {
                "version": 1,
                "saved_at": "2026-11-22T19:00:00Z",
                "revocations": [
                    {"serial": "a1", "not_after": "2026-11-22T19:00:00.000005Z"},
                    {"serial": "b2", "not_after": "2026-11-22T20:00:00Z"},
                ],
            },
        )
        self.assertEqual(parse_deny_list(raw, "f"), deny)

    def test_malformed(self) -> None:
        """Anything but the documented format is refused, naming the file."""
        entry = {"serial": "a1", "not_after": "2026-11-22T20:00:00Z"}
        for document in (
            b"{",
            b"[]",
            json.dumps({"version": 2, "revocations": []}).encode(),
            json.dumps({"version": 1}).encode(),
            json.dumps({"version": 1, "revocations": [1]}).encode(),
            json.dumps({"version": 1, "revocations": [{"serial": "a1"}]}).encode(),
            json.dumps({"version": 1, "revocations": [{**entry, "serial": "A1"}]}).encode(),
            json.dumps(
                {"version": 1, "revocations": [{**entry, "not_after": "2026-11-22T20:00:00"}]}
            ).encode(),
            json.dumps({"version": 1, "revocations": [{**entry, "not_after": "soon"}]}).encode(),
        ):
            error = self.assertRaises(DenyListFileError, parse_deny_list, document, "dl.json")
            self.assertIn("dl.json", str(error))

    def test_file(self) -> None:
        """No file is None; a stored list loads back; the file is 0600 in a 0700 directory."""
        state = Path(self.mktemp()) / "state"
        file = DenyListFile(state)
        self.assertIsNone(file.load())
        deny = DenyList.of([("a1", LATER)])
        file.store(deny, NOW)
        self.assertEqual(file.load(), deny)
        self.assertEqual((state / DENY_LIST_FILE).stat().st_mode & 0o777, 0o600)
        self.assertEqual(state.stat().st_mode & 0o777, 0o700)


def pulling(answer: Deferred[DenyList]) -> Callable[[], Deferred[DenyList]]:
    """A pull that answers C{answer}."""
    return lambda: answer


class RevocationsFixture:
    """A L{Revocations} over a temporary state directory, recording installs."""

    def __init__(self, case: SynchronousTestCase, state: Path | None = None) -> None:
        self.case = case
        self.state = state or Path(case.mktemp())
        self.clock = Clock()
        self.clock.advance(NOW.timestamp())
        self.installed: list[DenyList] = []
        self.file = DenyListFile(self.state)
        self.revocations = Revocations(
            self.file, ImmediateWorker(), self.clock, self.installed.append
        )

    def start(self, pull: Deferred[DenyList] | None) -> None:
        started = self.revocations.start(None if pull is None else pulling(pull))
        self.case.successResultOf(Deferred.fromCoroutine(started))


class MergeTests(SynchronousTestCase):
    """
    L{Revocations.merge}: union, ageing, install and keep on disk.
    """

    def setUp(self) -> None:
        self.f = RevocationsFixture(self)

    def test_left_out_serial_stays(self) -> None:
        """A serial a later push does not name stays denied, on disk too."""
        r = self.f.revocations
        self.successResultOf(r.merge(DenyList.of([("a1", LATER)])))
        self.successResultOf(r.merge(DenyList.of([("b2", LATER)])))
        expected = DenyList.of([("a1", LATER), ("b2", LATER)])
        self.assertEqual(r.current, expected)
        self.assertEqual(self.f.installed[-1], expected)
        self.assertEqual(self.f.file.load(), expected)

    def test_ages_out(self) -> None:
        """An entry is dropped once its not_after has passed (at the next merge)."""
        r = self.f.revocations
        self.successResultOf(r.merge(DenyList.of([("a1", NOW + timedelta(seconds=30))])))
        self.f.clock.advance(30)
        self.successResultOf(r.merge(DenyList()))
        self.assertEqual(r.current, DenyList())
        self.assertEqual(self.f.file.load(), DenyList())

    def test_unchanged_not_installed_or_written(self) -> None:
        """Merging nothing new installs nothing and leaves the file alone."""
        r = self.f.revocations
        self.successResultOf(r.merge(DenyList.of([("a1", LATER)])))
        self.f.file.path.unlink()
        self.successResultOf(r.merge(DenyList.of([("a1", LATER)])))
        self.assertEqual(len(self.f.installed), 1)
        self.assertFalse(self.f.file.path.exists())

    def test_write_failure(self) -> None:
        """A list that cannot be written fails the merge but stays in force."""
        self.f.state.parent.mkdir(parents=True, exist_ok=True)
        self.f.state.write_text("not a directory")
        failure = self.failureResultOf(self.f.revocations.merge(DenyList.of([("a1", LATER)])))
        failure.trap(OSError)
        self.assertIn("a1", self.f.revocations.current)


class StartTests(SynchronousTestCase):
    """
    L{Revocations.start}: the kept list, then the control plane's set.
    """

    def kept(self, deny: DenyList) -> Path:
        state = Path(self.mktemp())
        DenyListFile(state).store(deny, NOW)
        return state

    def test_kept_list_loaded(self) -> None:
        """Without a control plane the kept list is installed; expired entries dropped."""
        state = self.kept(DenyList.of([("a1", LATER), ("e1", NOW)]))
        f = RevocationsFixture(self, state)
        f.start(None)
        self.assertEqual(f.revocations.current, DenyList.of([("a1", LATER)]))
        self.assertEqual(f.installed, [DenyList.of([("a1", LATER)])])

    def test_pulled_set_merged(self) -> None:
        """The pulled set is merged with the kept list and written."""
        f = RevocationsFixture(self, self.kept(DenyList.of([("a1", LATER)])))
        f.start(succeed(DenyList.of([("b2", LATER)])))
        expected = DenyList.of([("a1", LATER), ("b2", LATER)])
        self.assertEqual(f.revocations.current, expected)
        self.assertEqual(f.file.load(), expected)

    def test_unreachable_control_plane(self) -> None:
        """A failed pull starts with the kept list, and says so in the log."""
        f = RevocationsFixture(self, self.kept(DenyList.of([("a1", LATER)])))
        logged = capture_logs(self)
        f.start(fail(TimeoutError("no answer in 10 s")))
        self.assertEqual(f.revocations.current, DenyList.of([("a1", LATER)]))
        self.assertTrue(
            any("could not pull" in str(event.get("log_format")) for event in logged), logged
        )

    def test_no_kept_list(self) -> None:
        """A first start with nothing kept and no control plane has an empty list."""
        f = RevocationsFixture(self)
        f.start(None)
        self.assertEqual(f.revocations.current, DenyList())

    def test_unreadable_kept_list_replaced_by_pull(self) -> None:
        """A corrupt kept list is replaced by the pulled set."""
        state = Path(self.mktemp())
        state.mkdir()
        (state / DENY_LIST_FILE).write_text("{")
        f = RevocationsFixture(self, state)
        f.start(succeed(DenyList.of([("b2", LATER)])))
        self.assertEqual(f.file.load(), DenyList.of([("b2", LATER)]))

    def test_unreadable_kept_list_without_pull_refuses(self) -> None:
        """A corrupt kept list with nothing to replace it refuses the start."""
        state = Path(self.mktemp())
        state.mkdir()
        (state / DENY_LIST_FILE).write_text("{")
        for pull in (None, fail(TimeoutError("no answer"))):
            f = RevocationsFixture(self, state)
            started = Deferred.fromCoroutine(
                f.revocations.start(None if pull is None else pulling(pull))
            )
            self.failureResultOf(started, DenyListUnavailable)
