"""
Reading an audit log back: parsing lines, the filters of C{svc audit tail},
the last N matches of a file, and following a file that grows, is truncated
or is rotated.

A line is the text up to and including a C{"\\n"}; trailing bytes without a
newline are a line still being written and are not read until it is
complete. A line that is not UTF-8 or not a JSON object is malformed: it is
skipped and counted, never fatal.
"""

from __future__ import annotations

import json
import os
import re
from collections import deque
from collections.abc import Iterable, Iterator
from typing import BinaryIO

import attrs

_LEASE_ID = re.compile(r"\A[0-9a-f]+\Z")


def parse_line(raw: bytes) -> dict[str, object] | None:
    """
    The JSON object of one line (with or without its newline), or L{None}
    when the line is malformed.
    """
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _events(value: Iterable[str]) -> frozenset[str]:
    return frozenset(value)


def _lease_id(_i: object, _a: attrs.Attribute[str | None], value: str | None) -> None:
    if value is not None and not _LEASE_ID.match(value):
        raise ValueError(f"lease id must be lowercase hex, got {value!r}")


@attrs.frozen
class LineFilter:
    """
    The filters of C{svc audit tail}, ANDed: C{events} (empty: any event;
    otherwise the line's C{event} is one of them) and C{lease_id} (the line
    carries a C{lease_id} equal to it; lines without one never match).
    """

    events: frozenset[str] = attrs.field(factory=frozenset, converter=_events)
    lease_id: str | None = attrs.field(default=None, validator=_lease_id)

    def matches(self, line: dict[str, object]) -> bool:
        """Whether the parsed C{line} passes every filter."""
        if self.events and line.get("event") not in self.events:
            return False
        return self.lease_id is None or line.get("lease_id") == self.lease_id


@attrs.define
class ScanCounts:
    """How many complete lines were read and how many were malformed."""

    lines: int = 0
    malformed: int = 0


def matching_lines(
    raw_lines: Iterable[bytes], line_filter: LineFilter, counts: ScanCounts
) -> Iterator[bytes]:
    """
    The lines of C{raw_lines} (each newline-terminated) that parse and pass
    C{line_filter}, unchanged; C{counts} is updated as they are read.
    """
    for raw in raw_lines:
        counts.lines += 1
        line = parse_line(raw)
        if line is None:
            counts.malformed += 1
        elif line_filter.matches(line):
            yield raw


def last_matching(
    raw_lines: Iterable[bytes], line_filter: LineFilter, limit: int, counts: ScanCounts
) -> list[bytes]:
    """The last C{limit} lines of C{raw_lines} passing C{line_filter}."""
    if limit < 0:
        raise ValueError(f"limit must not be negative, got {limit}")
    kept: deque[bytes] = deque(maxlen=limit)
    kept.extend(matching_lines(raw_lines, line_filter, counts))
    return list(kept)


def complete_lines(handle: BinaryIO) -> Iterator[bytes]:
    """
    The newline-terminated lines of C{handle} from its position on; the
    position is left after the last complete line.
    """
    position = handle.tell()
    for raw in handle:
        if not raw.endswith(b"\n"):
            break
        position += len(raw)
        yield raw
    handle.seek(position)


def _identity(stat: os.stat_result) -> tuple[int, int]:
    return (stat.st_dev, stat.st_ino)


class LogFollower:
    """
    Reads the complete lines appended to a log since the last call, across
    truncation (the file shrank below the read position: read again from
    its start) and rotation (the path now names another file: finish the
    old file, then read the new one from its start). A missing file is
    waited for. Each L{poll} does the I/O of one look; the caller sleeps.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._handle: BinaryIO | None = None

    def open_at_end(self) -> None:
        """Start at the current end of the file (if it exists)."""
        if self._open() and self._handle is not None:
            self._handle.seek(0, os.SEEK_END)

    def open_at(self, handle: BinaryIO) -> None:
        """Continue from C{handle}'s position (after printing the last N)."""
        self._close()
        self._handle = handle

    def close(self) -> None:
        """Close the file being followed."""
        self._close()

    def poll(self) -> list[bytes]:
        """The complete lines that appeared since the last poll."""
        if self._handle is None:
            if not self._open():
                return []
        assert self._handle is not None
        handle = self._handle
        if os.fstat(handle.fileno()).st_size < handle.tell():
            handle.seek(0)
        lines = list(complete_lines(handle))
        try:
            current = _identity(os.stat(self.path))
        except FileNotFoundError:
            return lines
        if current != _identity(os.fstat(handle.fileno())):
            lines.extend(complete_lines(handle))
            self._close()
            if self._open():
                assert self._handle is not None
                lines.extend(complete_lines(self._handle))
        return lines

    def _open(self) -> bool:
        try:
            self._handle = open(self.path, "rb")
        except FileNotFoundError:
            self._handle = None
            return False
        return True

    def _close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
