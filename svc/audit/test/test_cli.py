"""
Tests for L{svc.audit.cli}: C{svc audit tail} end to end on a real file,
following with an injected sleep instead of time passing.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
from collections.abc import Callable, Sequence
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from svc.audit.cli import register, run_tail

LEASE = "00ff00ff00ff00ff00ff00ff00ff00ff"


def raw(event: str, n: int, **fields: object) -> bytes:
    return (json.dumps({"event": event, "n": n, **fields}, separators=(",", ":")) + "\n").encode()


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="svc")
    register(top.add_subparsers(dest="command", required=True))
    return top


class TailTests(SynchronousTestCase):
    """
    C{svc audit tail}.
    """

    def setUp(self) -> None:
        self.path = Path(self.mktemp())
        self.out = io.BytesIO()
        self.err = io.StringIO()

    def append(self, *lines: bytes) -> None:
        with open(self.path, "ab") as f:
            f.write(b"".join(lines))

    def tail(
        self,
        *argv: str,
        environ: dict[str, str] | None = None,
        sleep: Callable[[float], None] = lambda _s: None,
        max_polls: int | None = 3,
    ) -> int:
        args = parser().parse_args(["audit", "tail", *argv])
        if environ is None:
            environ = {"SVC_AUDIT_LOG": str(self.path)}
        return run_tail(args, environ, self.out, self.err, sleep=sleep, max_polls=max_polls)

    def printed(self) -> list[int]:
        return [json.loads(line)["n"] for line in self.out.getvalue().splitlines()]

    def test_registers_subcommand(self) -> None:
        """register adds `audit tail` with a run function returning an int."""
        self.append(raw("read", 1))
        args = parser().parse_args(["audit", "tail", "--limit", "1", "--file", str(self.path)])
        self.assertTrue(callable(args.run))
        self.assertEqual(args.event, [])
        self.assertIsNone(args.lease_id)

    def test_limit_with_filters(self) -> None:
        """--limit prints the last N lines passing every filter, unchanged."""
        self.append(
            raw("lease_grant", 1, lease_id=LEASE),
            raw("read", 2),
            raw("lease_release", 3, lease_id=LEASE),
            raw("lease_grant", 4, lease_id="ab"),
            raw("lease_grant", 5, lease_id=LEASE),
        )
        status = self.tail(
            "--limit",
            "2",
            "--event",
            "lease_grant",
            "--event",
            "lease_release",
            "--lease-id",
            LEASE.upper(),
        )
        self.assertEqual(status, 0)
        self.assertEqual(self.printed(), [3, 5])
        self.assertEqual(
            self.out.getvalue(),
            raw("lease_release", 3, lease_id=LEASE) + raw("lease_grant", 5, lease_id=LEASE),
        )

    def test_limit_does_not_follow(self) -> None:
        """--limit alone prints and returns without polling."""
        self.append(raw("read", 1))
        polls: list[float] = []
        self.assertEqual(self.tail("--limit", "5", sleep=polls.append, max_polls=None), 0)
        self.assertEqual((self.printed(), polls), ([1], []))

    def test_malformed_reported(self) -> None:
        """Malformed lines are skipped with a count on stderr; status stays 0."""
        self.append(raw("read", 1), b"garbage\n", b"{\n", raw("read", 2))
        self.assertEqual(self.tail("--limit", "10"), 0)
        self.assertEqual(self.printed(), [1, 2])
        self.assertIn("skipped 2 malformed line(s)", self.err.getvalue())

    def test_missing_file(self) -> None:
        """Without --follow an unreadable log is exit status 1 with a message."""
        self.assertEqual(self.tail("--limit", "1"), 1)
        self.assertIn(str(self.path), self.err.getvalue())

    def test_file_flag_over_environment(self) -> None:
        """--file wins over SVC_AUDIT_LOG."""
        self.append(raw("read", 1))
        status = self.tail(
            "--limit", "1", "--file", str(self.path), environ={"SVC_AUDIT_LOG": "/nonexistent"}
        )
        self.assertEqual((status, self.printed()), (0, [1]))

    def test_follow_is_default(self) -> None:
        """Without --limit or --follow, new matching lines are streamed from the end."""
        self.append(raw("read", 1))
        feed = [[raw("read", 2), raw("open", 3)], [raw("read", 4)]]

        def sleep(_seconds: float) -> None:
            if feed:
                self.append(*feed.pop(0))

        self.assertEqual(self.tail("--event", "read", sleep=sleep, max_polls=3), 0)
        self.assertEqual(self.printed(), [2, 4])

    def test_limit_then_follow(self) -> None:
        """--limit with --follow prints the last N, then streams new lines once each."""
        self.append(raw("read", 1), raw("read", 2), b'{"event":"read","n":3')
        feed: list[Sequence[bytes]] = [[b"}\n", raw("read", 4)]]

        def sleep(_seconds: float) -> None:
            if feed:
                self.append(*feed.pop(0))

        self.assertEqual(self.tail("--limit", "1", "--follow", sleep=sleep, max_polls=2), 0)
        self.assertEqual(self.printed(), [2, 3, 4])

    def test_bad_flags(self) -> None:
        """A non-hex lease id, a negative limit or an unknown event name is a usage error."""
        usage = io.StringIO()
        with contextlib.redirect_stderr(usage):
            self.assertRaises(SystemExit, self.tail, "--lease-id", "xyz")
            self.assertRaises(SystemExit, self.tail, "--limit", "-1")
            self.assertRaises(SystemExit, self.tail, "--event", "flsuh", "--limit", "1")
        self.assertIn("not a hex lease id", usage.getvalue())
        self.assertIn("must not be negative", usage.getvalue())
        self.assertIn("no such audit event: 'flsuh'", usage.getvalue())
