"""
The mount killed with C{kill -9} at random moments, round after round,
while a program rewrites files and journals, on the local disk, what each
C{close} and each C{fsync} returned (issue 35's acceptance line). After
each kill a new mount must show every file holding exactly one whole
version of it (no torn file, no file mixing versions), and at least:

 - on the I{same} cache directory: the last version whose C{close} (or
   C{fsync}) returned success;
 - from a I{fresh} client (a new cache directory): the last version whose
   C{fsync} returned success.

The writer's versions only go forward, round after round, so a file that
went back to an older version is seen too. The writer's mount uses one
cache directory throughout; the fresh client is a mount of its own, started
after each kill and stopped before the next round.

A close that returns before the data plane answered its commit has
recorded the commit in the mount's outbox first, and the next mount on the
same cache sends it before it serves (``mount-outbox.md`` section 8).
"""

from __future__ import annotations

import inspect
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import attrs
from twisted.trial.unittest import FailTest

from tests.mount_harness import Mount, MountStackCase, shows_evidence

ROUNDS = int(os.environ.get("SVC_KILL9_ROUNDS", "20"))
"""Kills per test (at least 20 for issue 35)."""

SLEEP = (0.2, 1.5)
"""The writer runs this many seconds (uniform, seeded) before the mount is killed."""

SMALL = ("s0", "s1", "s2", "s3")
"""Files of 64 to 192 bytes: one write each."""

LARGE = ("l0", "l1", "l2", "l3")
"""Files of 192 to 217 KiB: four writes each, so a kill can land between them."""

LINE = 64
"""Every line of a version is this long, newline included."""

WRITE_PIECE = 64 << 10
"""The writer writes a version in pieces of this size."""


def line_count(name: str, version: int) -> int:
    """How many lines version C{version} of file C{name} has."""
    if name.startswith("s"):
        return 1 + version % 3
    return 3072 + (version * 37) % 400


def version_bytes(name: str, version: int) -> bytes:
    """Version C{version} of file C{name}: lines naming the file, the version and the line."""
    return b"".join(
        f"{name} v{version} line {k}".ljust(LINE - 1, ".").encode() + b"\n"
        for k in range(line_count(name, version))
    )


def stamp() -> str:
    """The time of day (UTC, milliseconds), as the logs' C{ts} shows it."""
    now = time.time()
    return time.strftime("%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}"


WRITER = (
    f"import time\nLINE = {LINE}\nPIECE = {WRITE_PIECE}\n"
    + inspect.getsource(line_count)
    + inspect.getsource(version_bytes)
    + inspect.getsource(stamp)
    + """
import errno, os, sys

folder, journal_path, first = sys.argv[1], sys.argv[2], int(sys.argv[3])
names = sys.argv[4].split(",")
journal = os.open(journal_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


def note(text):
    os.write(journal, f"{stamp()} {text}\\n".encode())
    os.fsync(journal)


def call(what, function, *arguments):
    # The journal says "ok" only once the call has returned without an error.
    note(f"-> {what}")
    try:
        result = function(*arguments)
    except OSError as error:
        note(f"{what} {errno.errorcode.get(error.errno, error.errno)}")
        if error.errno == errno.ENOTCONN:
            raise SystemExit(3)
        return None
    note(f"{what} ok")
    return True if result is None else result


def write_all(fd, data):
    done = 0
    while done < len(data):
        done += os.write(fd, data[done:done + PIECE])


version = first
while True:
    for index, name in enumerate(names):
        tag = f"{name} v{version}"
        note(f"begin {tag}")
        fd = call(f"opened {tag}", os.open, f"{folder}/{name}", os.O_WRONLY | os.O_TRUNC)
        if fd is None:
            continue
        wrote = call(f"wrote {tag}", write_all, fd, version_bytes(name, version))
        if wrote and (version + index) % 2 == 0:
            call(f"fsynced {tag}", os.fsync, fd)
        call(f"closed {tag}", os.close, fd)
    version += 1
"""
)
"""
Rewrites every file named in argv[4] in turn, version after version from
argv[3] (open with O_TRUNC, write, fsync every other version, close),
journaling each call before it and how it ended after it in argv[2],
each line fsynced, until a call fails ENOTCONN (its mount is gone).
"""


class ClosedVersionLost(FailTest):
    """A file is older than the last version whose close returned success (issue 35)."""


FIRST_LINE = re.compile(r"\A(\S+) v(\d+) line 0\.*\Z")
JOURNAL_LINE = re.compile(r"\A\S+ (begin|opened|wrote|fsynced|closed) (\S+) v(\d+)(?: (\S+))?\Z")
"""A journal line: the time, the call, the file, the version and how the call ended."""


@attrs.frozen
class Journal:
    """What the writer's journal says about each file, over every round so far."""

    lines: list[str]

    @classmethod
    def read(cls, path: Path) -> Journal:
        return cls(path.read_text().splitlines())

    def calls(self) -> list[tuple[str, str, int, str | None]]:
        """Every call journaled: its name, the file, the version and how it ended."""
        matches = (JOURNAL_LINE.match(line) for line in self.lines)
        return [(m[1], m[2], int(m[3]), m[4]) for m in matches if m]

    def last(self, call: str, name: str, outcome: str | None = "ok") -> int:
        """The highest version of C{name} whose C{call} ended with C{outcome} (-1 if none)."""
        versions = [v for c, n, v, o in self.calls() if (c, n, o) == (call, name, outcome)]
        return max(versions, default=-1)

    def tail(self, name: str) -> str:
        """The last lines about C{name}, and the last lines of all."""
        about = [line for line in self.lines if f" {name} v" in line]
        heading = f"journal, the last lines about {name}:"
        return "\n".join([heading, *about[-12:], "journal, the end:", *self.lines[-12:]])


def version_of(name: str, data: bytes) -> str | int:
    """The version of file C{name} that C{data} wholly is, or what is wrong with it."""
    if not data:
        return "empty"
    first = data[:LINE].rstrip(b"\n").decode(errors="replace")
    match = FIRST_LINE.match(first)
    if match is None or match[1] != name:
        return f"torn: {len(data)} bytes, the first line is {first!r}"
    version = int(match[2])
    expected = version_bytes(name, version)
    if data == expected:
        return version
    start = next(
        start
        for start in range(0, max(len(data), len(expected)), LINE)
        if data[start : start + LINE] != expected[start : start + LINE]
    )
    return (
        f"torn or mixed: {len(data)} bytes (v{version} has {len(expected)}),"
        f" the first line {first!r}, line {start // LINE} {data[start : start + LINE]!r}"
    )


class MountKill9Tests(MountStackCase):
    """Rounds of C{kill -9} of the mount under a writer journaling its closes and fsyncs."""

    def setUp(self) -> None:
        super().setUp()
        self.seed = int(os.environ.get("SVC_KILL9_SEED", "0")) or random.randrange(1, 1 << 31)
        self.random = random.Random(self.seed)
        self.folder = self.mount_point / "kill9"
        self.journal = self.tmp / "journal.txt"

    def note(self, text: str) -> None:
        """A line of the test's own in the journal."""
        with self.journal.open("a") as journal:
            journal.write(f"{stamp()} {text}\n")

    def first_versions(self) -> None:
        """Version 0 of every file, fsynced, so that every file always has a version."""
        self.folder.mkdir()
        for name in SMALL + LARGE:
            self.note(f"begin {name} v0")
            fd = os.open(self.folder / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, version_bytes(name, 0))
                os.fsync(fd)
            finally:
                os.close(fd)
            self.note(f"fsynced {name} v0 ok")
            self.note(f"closed {name} v0 ok")

    def write_and_kill(self, mount: Mount, round: int) -> float:
        """
        Start the writer on C{mount}, kill the mount with SIGKILL after a
        random while, then the writer (if its next call did not end it),
        and unmount lazily: the while.
        """
        first = 1 + max(version for _, _, version, _ in Journal.read(self.journal).calls())
        self.note(f"round {round} (seed {self.seed}): the writer starts at v{first}")
        errors = self.tmp / f"writer-{round}.err"
        with errors.open("wb") as stderr:
            writer = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    WRITER,
                    str(self.folder),
                    str(self.journal),
                    str(first),
                    ",".join(SMALL + LARGE),
                ],
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        self.addCleanup(writer.wait, 30)
        self.addCleanup(writer.kill)
        pause = self.random.uniform(*SLEEP)
        try:
            time.sleep(pause)
            if writer.poll() is not None:
                self.fail(f"the writer ended early: {errors.read_text(errors='replace')}")
        finally:
            os.kill(mount.process.pid, signal.SIGKILL)
            self.note(f"killed the mount (pid {mount.process.pid}) after {pause:.2f} s")
            mount.process.wait(30)
            try:
                writer.wait(15)  # its next call fails ENOTCONN
            except subprocess.TimeoutExpired:
                writer.kill()
                writer.wait(30)
            subprocess.run(["umount", "-l", str(self.mount_point)], check=False)
        return pause

    def check(self, round: int, pause: float, closes: bool) -> None:
        """
        Every file holds one whole version, not newer than the last one
        begun, nor older than the last one whose fsync (or, if C{closes},
        close) returned success.
        """
        journal = Journal.read(self.journal)
        client = "the same cache" if closes else "a fresh client"
        lost: list[str] = []
        for name in SMALL + LARGE:
            found = version_of(name, (self.folder / name).read_bytes())
            fsynced, closed = journal.last("fsynced", name), journal.last("closed", name)
            where = (
                f"after round {round} (seed {self.seed}, killed after {pause:.2f} s),"
                f" seen from {client}, {name}"
            )
            if isinstance(found, str):
                self.fail(f"{where} is {found}\n{journal.tail(name)}")
            if found > journal.last("begin", name, None):
                self.fail(f"{where} is v{found}, never written\n{journal.tail(name)}")
            if found < fsynced:
                self.fail(f"{where} is v{found}, v{fsynced} was fsynced\n{journal.tail(name)}")
            if closes and found < closed:
                lost.append(f"{where} is v{found}, v{closed} was closed\n{journal.tail(name)}")
        if lost:  # after every file was checked for the failures not expected today
            raise ClosedVersionLost("\n".join(lost))

    def rounds(self, fresh: bool) -> None:
        """
        L{ROUNDS} rounds: the writer on a mount with the same cache
        directory each round, the mount killed, and the files checked by
        the next round's mount or, if C{fresh}, by a mount with a new cache
        first.
        """
        cache = self.tmp / "cache-writer"
        mount = self.mount(cache=cache)
        self.first_versions()
        for round in range(ROUNDS):
            pause = self.write_and_kill(mount, round)
            if fresh:
                checker = self.mount()
                self.check(round, pause, closes=False)
                self.unmount(checker)
            mount = self.mount(cache=cache)
            if not fresh:
                self.check(round, pause, closes=True)
        self.unmount(mount)
        outcomes = Counter(
            f"{call} {how}" for call, _, _, how in Journal.read(self.journal).calls()
        )
        print(f"seed {self.seed}, the calls' outcomes: {dict(outcomes)}")
        self.assertGreater(outcomes["closed ok"], len(SMALL + LARGE) + ROUNDS, "the writer ran")

    @shows_evidence
    def test_closed_content_survives_kill_9_on_the_same_cache(self) -> None:
        """
        After each kill, a mount on the same cache shows every file as one
        whole version, no older than the last one whose close (or fsync)
        returned success.
        """
        self.rounds(fresh=False)

    @shows_evidence
    def test_fsynced_content_survives_kill_9_on_a_fresh_client(self) -> None:
        """
        After each kill, a mount with a new cache shows every file as one
        whole version, no older than the last one whose fsync returned
        success.
        """
        self.rounds(fresh=True)
