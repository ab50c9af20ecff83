"""
C{svc audit tail}: print and follow the local audit log.

Flags (filters AND together): C{--event NAME} (repeatable; any listed name
matches; a name the specification does not have is a usage error),
C{--lease-id HEX} (only lines carrying that C{lease_id}),
C{--limit N} (print the last N matching lines), C{--follow} (keep streaming
new matching lines; the default when neither C{--limit} nor C{--follow} is
given, starting at the end of the file; with C{--limit}, after the last N),
C{--file PATH} (default C{$SVC_AUDIT_LOG}, else C{./audit.log}). Matching
lines are printed unchanged. Malformed lines are skipped and counted on
stderr. Exit status 0, or 1 when the log cannot be read without C{--follow}.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import BinaryIO, TextIO

from svc.audit.names import EventName
from svc.audit.reader import (
    LineFilter,
    LogFollower,
    ScanCounts,
    complete_lines,
    last_matching,
    matching_lines,
)
from svc.audit.sink import DEFAULT_AUDIT_LOG
from svc.config import env_str, process_environ

POLL_INTERVAL = 0.25
"""Seconds between looks at the file while following."""


def _limit(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return value


def _lease_id(text: str) -> str:
    value = text.lower()
    if not value or any(c not in "0123456789abcdef" for c in value):
        raise argparse.ArgumentTypeError(f"not a hex lease id: {text!r}")
    return value


def _event(text: str) -> str:
    if text not in _EVENT_NAMES:
        raise argparse.ArgumentTypeError(
            f"no such audit event: {text!r} (one of: {', '.join(sorted(_EVENT_NAMES))})"
        )
    return text


_EVENT_NAMES = frozenset(name.value for name in EventName)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add C{svc audit tail} to the C{svc} command."""
    audit = subparsers.add_parser("audit", help="read the local audit log")
    commands = audit.add_subparsers(dest="audit_command", required=True)
    tail = commands.add_parser("tail", help="print and follow audit lines", description=__doc__)
    tail.add_argument(
        "--event",
        action="append",
        default=[],
        type=_event,
        metavar="NAME",
        help="repeatable event filter (an event name of the specification)",
    )
    tail.add_argument("--lease-id", type=_lease_id, metavar="HEX", help="lease id filter")
    tail.add_argument("--limit", type=_limit, metavar="N", help="print the last N matching lines")
    tail.add_argument("--follow", action="store_true", help="keep streaming new lines")
    tail.add_argument(
        "--file",
        metavar="PATH",
        help=f"audit log (default $SVC_AUDIT_LOG or {DEFAULT_AUDIT_LOG})",
    )
    tail.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    status = run_tail(args, process_environ(), sys.stdout.buffer, sys.stderr)
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (``| head``): keep the exit quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return status


class _Output:
    """Writes matching lines and reports malformed ones."""

    def __init__(self, out: BinaryIO, err: TextIO, counts: ScanCounts) -> None:
        self.out = out
        self.err = err
        self.counts = counts
        self._reported = 0

    def lines(self, raws: list[bytes]) -> None:
        if raws:
            self.out.write(b"".join(raws))
            self.out.flush()
        if self.counts.malformed > self._reported:
            self._reported = self.counts.malformed
            self.err.write(f"svc audit tail: skipped {self.counts.malformed} malformed line(s)\n")
            self.err.flush()


def run_tail(
    args: argparse.Namespace,
    environ: Mapping[str, str],
    out: BinaryIO,
    err: TextIO,
    *,
    sleep: Callable[[float], None] = time.sleep,
    max_polls: int | None = None,
) -> int:
    """
    Run C{svc audit tail} with parsed C{args}. C{sleep} and C{max_polls}
    (stop following after that many polls) exist for tests.
    """
    path = args.file or env_str(environ, "SVC_AUDIT_LOG", DEFAULT_AUDIT_LOG)
    line_filter = LineFilter(frozenset(args.event), args.lease_id)
    follow = args.follow or args.limit is None
    counts = ScanCounts()
    output = _Output(out, err, counts)
    follower = LogFollower(path)
    try:
        if args.limit is not None:
            try:
                handle: BinaryIO = open(path, "rb")
            except OSError as e:
                if not follow or not isinstance(e, FileNotFoundError):
                    err.write(f"svc audit tail: cannot read {path}: {e.strerror}\n")
                    return 1
            else:
                output.lines(last_matching(complete_lines(handle), line_filter, args.limit, counts))
                if follow:
                    follower.open_at(handle)
                else:
                    handle.close()
        else:
            follower.open_at_end()
        if follow:
            _follow(follower, line_filter, output, sleep, max_polls)
    except (KeyboardInterrupt, BrokenPipeError):
        pass
    finally:
        follower.close()
    return 0


def _follow(
    follower: LogFollower,
    line_filter: LineFilter,
    output: _Output,
    sleep: Callable[[float], None],
    max_polls: int | None,
) -> None:
    polls = 0
    while max_polls is None or polls < max_polls:
        output.lines(list(matching_lines(follower.poll(), line_filter, output.counts)))
        polls += 1
        if max_polls is None or polls < max_polls:
            sleep(POLL_INTERVAL)
