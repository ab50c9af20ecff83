"""
Running the outside suites in a directory of a mount, each with its output
kept in a log file: pjdfstest through C{prove -r -v}, fsx for a seed, and
fsstress. A run that outlives its timeout is killed with its whole process
group (a test waiting on a hung mount would otherwise wait for ever).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .tap import FileResult, parse_prove

FSX_OK = re.compile(r"All (\d+) operations completed A-OK!")
_FSX_REMARK = re.compile(r"^main: (.*)$")


def run_logged(
    argv: Sequence[str], cwd: Path, log: Path, timeout: float, stderr_log: Path | None = None
) -> tuple[int | None, float]:
    """
    Run C{argv} in C{cwd}, its output to C{log} (its standard error to
    C{stderr_log} when given, else to C{log} as well); the exit status
    (L{None}: killed at C{timeout} seconds) and the seconds it took.
    """
    start = time.monotonic()
    with log.open("wb") as out:
        err = stderr_log.open("wb") if stderr_log is not None else None
        try:
            process = subprocess.Popen(
                list(argv),
                cwd=cwd,
                stdout=out,
                stderr=err if err is not None else subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            try:
                status: int | None = process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                status = None
        finally:
            if err is not None:
                err.close()
    return status, round(time.monotonic() - start, 1)


def run_pjdfstest(
    tests: Path, subset: Sequence[str], workdir: Path, logs: Path, timeout: float
) -> tuple[list[FileResult], dict[str, Any]]:
    """
    C{prove -r -v TESTS} (or only the C{subset} of paths under C{tests}) in
    C{workdir}, a fresh directory (on the mount): every test file's results,
    and how the run went (exit status, seconds, logs).
    """
    workdir.mkdir(mode=0o755)
    log = logs / "pjdfstest.log"
    stderr_log = logs / "pjdfstest.stderr.log"
    paths = [str(tests / part) for part in subset] if subset else [str(tests)]
    status, seconds = run_logged(["prove", "-r", "-v", *paths], workdir, log, timeout, stderr_log)
    results = parse_prove(log.read_text(errors="replace").splitlines(), str(tests))
    return results, {
        "prove_exit_status": status,
        "timed_out": status is None,
        "seconds": seconds,
        "log": str(log),
        "stderr_log": str(stderr_log),
    }


def run_fsx(
    fsx: Path, target: Path, seed: int, ops: int, logs: Path, timeout: float
) -> dict[str, Any]:
    """
    C{fsx -N OPS -S SEED TARGET}, its own files (C{.fsxlog}, C{.fsxgood})
    in C{logs}: whether it ended with C{All OPS operations completed A-OK!},
    and what it said it turned off at start.
    """
    log = logs / f"fsx-{seed}.log"
    status, seconds = run_logged(
        [str(fsx), "-N", str(ops), "-S", str(seed), "-P", str(logs), str(target)],
        logs,
        log,
        timeout,
    )
    text = log.read_text(errors="replace")
    done = FSX_OK.search(text)
    ok = status == 0 and done is not None and int(done.group(1)) == ops
    lines = text.splitlines()
    return {
        "ok": ok,
        "exit_status": status,
        "timed_out": status is None,
        "seconds": seconds,
        "remarks": [m.group(1) for line in lines if (m := _FSX_REMARK.match(line))],
        "last_lines": [] if ok else lines[-15:],
        "log": str(log),
    }


def run_fsstress(
    fsstress: Path, target: Path, ops: int, procs: int, seed: int, logs: Path, timeout: float
) -> dict[str, Any]:
    """C{fsstress -d TARGET -n OPS -p PROCS -s SEED}: how it ended."""
    log = logs / "fsstress.log"
    status, seconds = run_logged(
        [
            str(fsstress),
            "-d",
            str(target),
            "-n",
            str(ops),
            "-p",
            str(procs),
            "-s",
            str(seed),
        ],
        logs,
        log,
        timeout,
    )
    lines = log.read_text(errors="replace").splitlines()
    return {
        "exit_status": status,
        "timed_out": status is None,
        "seconds": seconds,
        "last_lines": lines[-10:],
        "log": str(log),
    }
