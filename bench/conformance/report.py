"""
The JSON summary's pjdfstest part, and the verdict of a whole run. Pure:
results in, plain data out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from .expected import ExpectedFailures
from .tap import FileResult

_LONG_WORD = re.compile(r"[^\s']{81,}")


def shorten(detail: str) -> str:
    """
    A failure's detail with each word over 80 bytes cut to its first 32 and
    its length (pjdfstest's path-length tests name paths of 4,095 bytes; the
    log keeps them whole).
    """
    return _LONG_WORD.sub(lambda word: f"{word[0][:32]}...({len(word[0])} bytes)", detail)


def pjdfstest_summary(
    results: Sequence[FileResult],
    expected: ExpectedFailures,
    local: Sequence[FileResult] | None = None,
) -> dict[str, Any]:
    """
    Counts over all test files, and each failing file's failed subtests with
    what pjdfstest said, whether the documented table expects the failure,
    and its documented reason; with C{local} (the same tests run in a local
    directory), whether each failure is seen there too.
    """
    failed_locally = (
        None
        if local is None
        else {(r.name, f.number) for r in local for f in r.failures}
        | {(r.name, 0) for r in local if r.planned is None}
    )
    failures: dict[str, Any] = {}
    failed_pairs: set[tuple[str, int]] = set()
    unexpected = 0
    for result in results:
        if result.failed == 0:
            continue
        subtests = []
        if result.planned is None and not result.failures:
            # No plan, no test line: the script failed before its first subtest.
            reason = expected.reason(result.name, 0)
            subtests.append(
                {
                    "subtest": 0,
                    "detail": "no plan: " + "; ".join(result.notes),
                    "expected": reason is not None,
                    "reason": reason,
                }
            )
            if failed_locally is not None:
                subtests[-1]["fails_locally"] = (result.name, 0) in failed_locally
            failed_pairs.add((result.name, 0))
            unexpected += reason is None
        for failure in result.failures:
            reason = expected.reason(result.name, failure.number)
            failed_pairs.add((result.name, failure.number))
            unexpected += reason is None
            subtests.append(
                {
                    "subtest": failure.number,
                    "detail": shorten(failure.detail),
                    "expected": reason is not None,
                    "reason": reason,
                }
            )
            if failed_locally is not None:
                subtests[-1]["fails_locally"] = (result.name, failure.number) in failed_locally
        failures[result.name] = {
            "planned": result.planned,
            "passed": result.passed,
            "failed": result.failed,
            "failures": subtests,
        }
    files_run = {result.name for result in results}
    summary: dict[str, Any] = {
        "files": len(results),
        "files_failed": len(failures),
        "subtests": sum(result.subtests for result in results),
        "passed": sum(result.passed for result in results),
        "failed": sum(result.failed for result in results),
        "unexpected_failures": unexpected,
        "failures_by_file": failures,
        "documented_but_passed": expected.unused(failed_pairs, files_run),
    }
    if local is not None:
        summary["local_reference"] = {
            "passed": sum(result.passed for result in local),
            "failed": sum(result.failed for result in local),
        }
    return summary


def verdict(summary: dict[str, Any]) -> list[str]:
    """Why the run failed (nothing when it passed), from the summary's suites."""
    problems: list[str] = []
    pjdfstest = summary.get("pjdfstest")
    if pjdfstest is not None:
        if pjdfstest["unexpected_failures"]:
            problems.append(
                f"pjdfstest: {pjdfstest['unexpected_failures']} failures not in the documented list"
            )
        if pjdfstest["files"] == 0 or pjdfstest["run"]["timed_out"]:
            problems.append("pjdfstest: the run did not complete")
    fsx = summary.get("fsx")
    if fsx is not None and fsx["failed"]:
        problems.append(f"fsx: {fsx['failed']} of {len(fsx['seeds'])} seeds not A-OK")
    fsstress = summary.get("fsstress")
    if fsstress is not None and not fsstress["tree_identical"]:
        problems.append("fsstress: the tree a fresh mount shows differs")
    for mount in summary.get("mounts", []):
        # twist ends a SIGTERM'd run by raising the signal on itself again.
        if mount["died_before_unmount"] is not None or mount["exit_status"] not in (0, -15):
            problems.append(
                f"mount {mount['label']}: exited with {mount['exit_status']}"
                + (" before it was stopped" if mount["died_before_unmount"] is not None else "")
            )
    problems.extend(summary.get("errors", []))
    return problems
