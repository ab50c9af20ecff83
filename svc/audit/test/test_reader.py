"""
Tests for L{svc.audit.reader}: filters, last-N and following a file.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from svc.audit.reader import (
    LineFilter,
    LogFollower,
    ScanCounts,
    complete_lines,
    last_matching,
    matching_lines,
    parse_line,
)

LEASE = "0123456789abcdef0123456789abcdef"


def raw(event: str, **fields: object) -> bytes:
    return (json.dumps({"event": event, **fields}) + "\n").encode()


LINES = [
    raw("lease_grant", lease_id=LEASE, n=1),
    raw("read", n=2),
    raw("lease_release", lease_id=LEASE, n=3),
    raw("lease_grant", lease_id="ff", n=4),
    b"not json\n",
    raw("read", n=5),
    b"[1, 2]\n",
    b'{"event": "read", "n": 6, "bad": "\xff"}\n',
    raw("lease_grant", lease_id=LEASE, n=7),
]


def numbers(lines: list[bytes]) -> list[int]:
    return [json.loads(line)["n"] for line in lines]


class FilterTests(SynchronousTestCase):
    """
    L{LineFilter} and L{matching_lines}.
    """

    def select(self, line_filter: LineFilter) -> tuple[list[int], ScanCounts]:
        counts = ScanCounts()
        return numbers(list(matching_lines(LINES, line_filter, counts))), counts

    def test_no_filter(self) -> None:
        """Without filters every well-formed line matches."""
        self.assertEqual(self.select(LineFilter())[0], [1, 2, 3, 4, 5, 7])

    def test_events_or(self) -> None:
        """Several --event names match any of them."""
        found, _ = self.select(LineFilter(frozenset({"read", "lease_release"})))
        self.assertEqual(found, [2, 3, 5])

    def test_lease_id(self) -> None:
        """--lease-id keeps only lines carrying that lease id."""
        self.assertEqual(self.select(LineFilter(lease_id=LEASE))[0], [1, 3, 7])

    def test_and(self) -> None:
        """Event and lease-id filters AND together."""
        found, _ = self.select(LineFilter(frozenset({"lease_grant"}), LEASE))
        self.assertEqual(found, [1, 7])

    def test_malformed_counted(self) -> None:
        """Non-JSON, non-object and non-UTF-8 lines are skipped and counted."""
        _, counts = self.select(LineFilter())
        self.assertEqual((counts.lines, counts.malformed), (9, 3))

    def test_parse_line(self) -> None:
        """parse_line gives the object, or None for anything else."""
        self.assertEqual(parse_line(b'{"a":1}\n'), {"a": 1})
        self.assertIsNone(parse_line(b'"a"\n'))
        self.assertIsNone(parse_line(b"{\n"))

    def test_bad_lease_filter(self) -> None:
        """A lease-id filter must be lowercase hex."""
        self.assertRaises(ValueError, LineFilter, lease_id="XYZ")


class LastMatchingTests(SynchronousTestCase):
    """
    L{last_matching} and L{complete_lines}.
    """

    def test_last_n(self) -> None:
        """The last N matches, in file order."""
        counts = ScanCounts()
        self.assertEqual(numbers(last_matching(LINES, LineFilter(), 2, counts)), [5, 7])

    def test_limit_zero(self) -> None:
        """A limit of 0 prints nothing."""
        self.assertEqual(last_matching(LINES, LineFilter(), 0, ScanCounts()), [])

    def test_fewer_than_n(self) -> None:
        """Fewer matches than N gives them all."""
        found = last_matching(LINES, LineFilter(lease_id=LEASE), 10, ScanCounts())
        self.assertEqual(numbers(found), [1, 3, 7])

    def test_partial_last_line(self) -> None:
        """A trailing line without newline is not read and the position stays before it."""
        handle = io.BytesIO(raw("a", n=1) + b'{"event": "b"')
        self.assertEqual(numbers(list(complete_lines(handle))), [1])
        self.assertEqual(handle.tell(), len(raw("a", n=1)))


class FollowerTests(SynchronousTestCase):
    """
    L{LogFollower}: growth, partial lines, truncation, rotation.
    """

    def setUp(self) -> None:
        self.path = Path(self.mktemp())
        self.follower = LogFollower(str(self.path))
        self.addCleanup(self.follower.close)

    def append(self, data: bytes, path: Path | None = None) -> None:
        with open(path or self.path, "ab") as f:
            f.write(data)

    def test_starts_at_end(self) -> None:
        """Following starts after the lines already present."""
        self.append(raw("a", n=1))
        self.follower.open_at_end()
        self.assertEqual(self.follower.poll(), [])
        self.append(raw("a", n=2))
        self.assertEqual(numbers(self.follower.poll()), [2])

    def test_partial_line_completed_later(self) -> None:
        """A line written in two parts is read once, when complete."""
        self.follower.open_at_end()
        line = raw("a", n=1)
        self.append(line[:5])
        self.assertEqual(self.follower.poll(), [])
        self.append(line[5:])
        self.assertEqual(self.follower.poll(), [line])

    def test_missing_file_waited_for(self) -> None:
        """A log that does not exist yet is read from its start once it appears."""
        self.follower.open_at_end()
        self.assertEqual(self.follower.poll(), [])
        self.append(raw("a", n=1))
        self.assertEqual(numbers(self.follower.poll()), [1])

    def test_truncation(self) -> None:
        """After truncation the file is read again from its start."""
        self.append(raw("a", n=1) + raw("a", n=2))
        self.follower.open_at_end()
        self.path.write_bytes(b"")
        self.assertEqual(self.follower.poll(), [])
        self.append(raw("a", n=3))
        self.assertEqual(numbers(self.follower.poll()), [3])

    def test_rotation(self) -> None:
        """After a rename and a new file, the old tail then the new file are read."""
        self.append(raw("a", n=1))
        self.follower.open_at_end()
        self.append(raw("a", n=2))
        os.rename(self.path, str(self.path) + ".1")
        self.assertEqual(numbers(self.follower.poll()), [2])
        self.append(raw("a", n=3), Path(str(self.path) + ".1"))
        self.append(raw("a", n=4))
        self.assertEqual(numbers(self.follower.poll()), [3, 4])
        self.append(raw("a", n=5))
        self.assertEqual(numbers(self.follower.poll()), [5])
