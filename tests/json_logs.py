"""
The system-test harnesses run C{twist svc-control}, C{svc-dataplane} and
C{svc-mount} with C{SVC_LOG_FORMAT=json}; at teardown each checks that every
line the process wrote is one plain JSON object (L{check_json_log}): parsed
line by line, and by C{jq -c .} as an operator's pipeline would.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

JSON_LOGS = {"SVC_LOG_FORMAT": "json"}
"""The environment that makes a process log JSON lines."""

HEAD = ("ts", "level", "system", "msg")
LEVELS = {"debug", "info", "warn", "error", "critical"}
ACCESS_LINE = re.compile(r"\A(GET|HEAD|POST|PUT|PATCH|DELETE|OPTIONS) /")
CHATTER = ("Starting factory", "Stopping factory")

JQ = shutil.which("jq")


def jq_required() -> bool:
    """Under CI a missing C{jq} fails the check instead of leaving it out."""
    return os.environ.get("CI") == "true"


def problems_in(path: Path) -> list[str]:
    """
    What is wrong with the log at C{path}: lines that are not one JSON
    object with C{ts}, C{level}, C{system} and C{msg} first, a 0x1E byte,
    C{unpersistable} placeholders, per-connection chatter at info, or a
    C{jq -c .} that disagrees.
    """
    data = path.read_bytes()
    found: list[str] = []
    if b"\x1e" in data:
        found.append("a 0x1E record separator")
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    else:
        found.append("the last line has no newline")
    for number, raw in enumerate(lines, 1):
        where = f"line {number}: {raw[:300]!r}"
        try:
            record = json.loads(raw.decode("utf-8"))
        except ValueError as e:
            found.append(f"{where}: not JSON ({e})")
            continue
        if not isinstance(record, dict) or tuple(record)[:4] != HEAD:
            found.append(f"{where}: not an object starting with {HEAD}")
            continue
        if record["level"] not in LEVELS:
            found.append(f"{where}: unknown level")
        if b"unpersistable" in raw:
            found.append(f"{where}: an unpersistable placeholder")
        message = str(record["msg"])
        if record["level"] != "debug" and (
            ACCESS_LINE.match(message) or message.startswith(CHATTER)
        ):
            found.append(f"{where}: per-connection chatter above debug")
    if JQ is not None:
        done = subprocess.run(
            [JQ, "-c", "."], input=data, capture_output=True, timeout=60, check=False
        )
        if done.returncode != 0:
            found.append(f"jq -c . failed: {done.stderr.decode(errors='replace')[:500]}")
        elif len(done.stdout.splitlines()) != len(lines):
            found.append(f"jq -c . read {len(done.stdout.splitlines())} values, not {len(lines)}")
    elif jq_required():
        found.append("jq is not installed (scripts/system-packages.txt)")
    return found


def stack_logs(root: Path) -> list[Path]:
    """
    The logs of the quickstart stack's processes under C{root}
    (L{svc.quickstart_stack.Stack.spawn} writes C{<name>.log}).
    """
    return [root / f"{name}.log" for name in ("control", "dataplane", "mount")]


def check_json_log(paths: Iterable[Path]) -> None:
    """
    Check every log in C{paths} that exists (L{problems_in}).

    @raise AssertionError: listing the problems of each log.
    """
    report = []
    for path in paths:
        if path.exists():
            report += [f"{path}: {problem}" for problem in problems_in(path)]
    if report:
        raise AssertionError("process logs that are not JSON lines:\n" + "\n".join(report))
