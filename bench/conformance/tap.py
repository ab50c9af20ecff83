"""
The per-file results of C{prove -v} (Perl's TAP harness, verbose) over
pjdfstest's C{tests/} tree: which subtests of each test file passed, which
failed and with what message, and which never ran. Pure: text in, values out.

What C{prove -v} prints for each file, its standard output not being a
terminal::

    /abs/path/tests/chmod/00.t ......
    1..119
    ok 1
    not ok 2 - tried 'chmod ...', expected 0, got EPERM
    ...
    Failed 1/119 subtests

followed, after the last file, by C{Test Summary Report} and C{Result:}
lines. A line neither a plan nor a test line (a diagnostic, prove's own
remarks such as C{Dubious, test returned 1}) is kept as a note of the file
it follows. As TAP says, C{not ok N # TODO ...} is no failure (pjdfstest
marks a few behaviours it allows on Linux this way).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import attrs

_HEADER = re.compile(r"^(?P<path>\S+\.t) \.+ ?$")
_PLAN = re.compile(r"^1\.\.(?P<count>\d+)")
_TEST = re.compile(r"^(?P<not>not )?ok (?P<number>\d+)\b(?P<rest>.*)$")
_DIRECTIVE = re.compile(r"#\s*(TODO|SKIP)\b", re.IGNORECASE)
_END = ("Test Summary Report", "Files=", "Result:", "All tests successful.")
_MAX_NOTES = 5


@attrs.frozen
class Failure:
    """One subtest that did not pass: its number and what pjdfstest said."""

    number: int
    detail: str


@attrs.frozen
class FileResult:
    """
    One test file: C{name} relative to the C{tests/} directory (C{chmod/00.t}),
    its plan (L{None} when it printed none), the subtests that passed and
    those that failed. Subtests the plan announced that never printed a line
    (the script stopped early) count as failed with the detail C{not run}.
    """

    name: str
    planned: int | None
    passed: int
    failures: tuple[Failure, ...]
    notes: tuple[str, ...] = ()

    @property
    def failed(self) -> int:
        """How many subtests failed (a file without a plan counts one)."""
        if self.planned is None:
            return max(1, len(self.failures))
        return len(self.failures)

    @property
    def subtests(self) -> int:
        """How many subtests the file has: its plan, else what it printed."""
        return self.planned if self.planned is not None else self.passed + self.failed


class _FileBuilder:
    def __init__(self, name: str) -> None:
        self.name = name
        self.planned: int | None = None
        self.passed: set[int] = set()
        self.failed: dict[int, str] = {}
        self.notes: list[str] = []

    def line(self, line: str) -> None:
        plan = _PLAN.match(line)
        if plan and self.planned is None:
            self.planned = int(plan.group("count"))
            return
        test = _TEST.match(line)
        if test:
            number = int(test.group("number"))
            rest = test.group("rest").strip()
            if test.group("not") and not _DIRECTIVE.search(rest):
                self.failed[number] = rest.removeprefix("-").strip()
            else:
                self.passed.add(number)
            return
        stripped = line.strip()
        if stripped and stripped != "ok" and len(self.notes) < _MAX_NOTES:
            self.notes.append(stripped)

    def build(self) -> FileResult:
        failures = dict(self.failed)
        if self.planned is not None:
            for number in range(1, self.planned + 1):
                if number not in self.passed and number not in failures:
                    failures[number] = "not run"
        passed = len(self.passed - failures.keys())
        return FileResult(
            name=self.name,
            planned=self.planned,
            passed=passed,
            failures=tuple(Failure(n, failures[n]) for n in sorted(failures)),
            notes=tuple(self.notes),
        )


def test_name(path: str, tests_root: str) -> str:
    """C{path} as prove printed it, relative to C{tests_root} when under it."""
    root = tests_root.rstrip("/") + "/"
    return path[len(root) :] if path.startswith(root) else path


def parse_prove(lines: Iterable[str], tests_root: str) -> list[FileResult]:
    """
    Every test file of a C{prove -v} run's standard output, in the order run;
    names are relative to C{tests_root} (the C{tests} directory given to prove).
    """
    results: list[FileResult] = []
    current: _FileBuilder | None = None
    for raw in lines:
        line = raw.rstrip("\n")
        header = _HEADER.match(line)
        if header:
            if current is not None:
                results.append(current.build())
            current = _FileBuilder(test_name(header.group("path"), tests_root))
            continue
        if current is not None and line.startswith(_END):
            results.append(current.build())
            current = None
            continue
        if current is not None:
            current.line(line)
    if current is not None:
        results.append(current.build())
    return results
