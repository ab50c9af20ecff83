"""
The documented expected pjdfstest failures: the table in C{docs/conformance.md}
between the markers C{<!-- expected-failures:start -->} and
C{<!-- expected-failures:end -->}. Pure: text in, values out.

Each row is C{| `file` | subtests | reason |}: the test file relative to
pjdfstest's C{tests/} directory, the failing subtests (numbers and ranges
such as C{3, 7-9}, or C{all}), and why they fail on an svc mount.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import attrs

START = "<!-- expected-failures:start -->"
END = "<!-- expected-failures:end -->"

_ROW = re.compile(r"^\|\s*`(?P<file>[^`]+)`\s*\|(?P<subtests>[^|]*)\|(?P<reason>.*)\|\s*$")


class TableError(ValueError):
    """The expected-failure table is missing or has a malformed row."""


@attrs.frozen
class Expected:
    """One row: a test file, its failing subtests (L{None}: all of them), why."""

    file: str
    subtests: frozenset[int] | None
    reason: str

    def covers(self, file: str, number: int) -> bool:
        return self.file == file and (self.subtests is None or number in self.subtests)


def parse_subtests(text: str) -> frozenset[int] | None:
    """C{"3, 7-9"} as {3, 7, 8, 9}; C{"all"} as L{None}."""
    text = text.strip()
    if text.lower() == "all":
        return None
    numbers: set[int] = set()
    for raw in text.split(","):
        part = raw.strip()
        if not part:
            continue
        low, _, high = part.partition("-")
        if not low.strip().isdigit() or (high and not high.strip().isdigit()):
            raise TableError(f"subtests {text!r}: {part!r} is not a number or a range")
        first = int(low)
        last = int(high) if high else first
        if last < first:
            raise TableError(f"subtests {text!r}: the range {part!r} runs backwards")
        numbers.update(range(first, last + 1))
    if not numbers:
        raise TableError("a row names no subtests")
    return frozenset(numbers)


def parse_table(document: str) -> list[Expected]:
    """The rows of the expected-failure table of C{document}."""
    lines = document.splitlines()
    try:
        start = lines.index(START)
        end = lines.index(END, start)
    except ValueError:
        raise TableError(f"no table between {START} and {END}") from None
    rows: list[Expected] = []
    for line in lines[start + 1 : end]:
        row = _ROW.match(line.strip())
        if row is None:
            continue  # the header, its rule, blank lines
        rows.append(
            Expected(
                file=row.group("file").strip(),
                subtests=parse_subtests(row.group("subtests")),
                reason=row.group("reason").strip(),
            )
        )
    return rows


class ExpectedFailures:
    """Look-ups in the table: is a failure documented, and why."""

    def __init__(self, rows: Iterable[Expected]) -> None:
        self.rows = list(rows)

    def reason(self, file: str, number: int) -> str | None:
        """The documented reason for subtest C{number} of C{file}, or L{None}."""
        for row in self.rows:
            if row.covers(file, number):
                return row.reason
        return None

    def unused(self, failed: set[tuple[str, int]], files_run: set[str]) -> list[str]:
        """
        Rows naming subtests that passed in this run (of files that ran):
        C{file: numbers}, so the table can be trimmed.
        """
        stale: list[str] = []
        for row in self.rows:
            if row.file not in files_run:
                continue
            if row.subtests is None:
                if not any(file == row.file for file, _ in failed):
                    stale.append(f"{row.file}: all")
                continue
            passing = sorted(n for n in row.subtests if (row.file, n) not in failed)
            if passing:
                stale.append(f"{row.file}: {', '.join(map(str, passing))}")
        return stale
