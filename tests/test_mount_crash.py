"""
The mount client killed mid-work (C{kill -9}): what the data plane keeps is
a prefix of what the program did. A close and a rename return once their
requests are sent (``docs/specifications/mount-consistency.md`` 2.5, 2.6),
in order on one connection, and the data plane runs them in that order; so
after the crash every file holds one whole version, and the files a program
saved one after another show the saves up to some point and none after it.
A new mount on the same cache directory (left as the crash left it) shows
exactly that.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from tests.mount_harness import MountStackCase, shows_evidence

FILES = 40
"""Files the saver saves atomically, one after another, pass after pass."""

SAVER = """
import os, sys
folder = sys.argv[1]
os.makedirs(folder, exist_ok=True)
generation = 0
while True:
    generation += 1
    for index in range(int(sys.argv[2])):
        with open(f"{folder}/f{index}.tmp", "wb") as out:
            out.write(f"pass {generation} file {index}\\n".encode() * 64)
        os.rename(f"{folder}/f{index}.tmp", f"{folder}/f{index}")
    with open(f"{folder}/generation.tmp", "w") as out:
        out.write(str(generation))
    os.rename(f"{folder}/generation.tmp", f"{folder}/generation")
"""
"""A program saving files atomically until its mount goes away under it."""


SQLITE_WRITER = """
import sqlite3, sys
database, journal, synchronous, progress = sys.argv[1:5]
connection = sqlite3.connect(database, isolation_level=None)
connection.execute(f"PRAGMA journal_mode={journal}")
connection.execute(f"PRAGMA synchronous={synchronous}")
connection.execute("CREATE TABLE IF NOT EXISTS rows (id INTEGER PRIMARY KEY, body BLOB)")
with open(progress, "a") as out:
    row = 0
    while True:
        row += 1
        connection.execute("BEGIN")
        body = bytes([row % 251]) * (100 + row % 3000)
        connection.execute("INSERT INTO rows VALUES (?, ?)", (row, body))
        if row % 7 == 0:
            connection.execute("DELETE FROM rows WHERE id = ?", (row - 5,))
            connection.execute("INSERT INTO rows VALUES (?, ?)", (row - 5, b"again" * 50))
        connection.execute("COMMIT")
        out.write(f"{row}\\n")
        out.flush()
"""
"""A program committing one row per transaction until its mount goes away under it."""


def content(generation: int, index: int) -> bytes:
    return f"pass {generation} file {index}\n".encode() * 64


class MountCrashTests(MountStackCase):
    """A mount killed while a program saves files through it."""

    def killed_under(
        self, program: str, *arguments: str, folder: Path | None = None
    ) -> tuple[Path, int | None]:
        """
        Start a mount (making C{folder} on it, if given), run C{program}
        with C{arguments} on it for 4 seconds, then kill the mount with
        C{SIGKILL} and unmount it: the crashed mount's cache directory, and
        the program's exit status (its mount gone, it stops).
        """
        mount = self.mount()
        if folder is not None:
            folder.mkdir()
        running = subprocess.Popen(
            [sys.executable, "-c", program, *arguments],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            time.sleep(4)
        finally:
            os.kill(mount.process.pid, signal.SIGKILL)
            mount.process.wait(30)
            running.wait(60)
            subprocess.run(["umount", "-l", str(self.mount_point)], check=False)
        return mount.cache, running.returncode

    def pass_of(self, path: Path, index: int) -> int:
        """The pass whose whole content C{path} holds (a torn file fails the test)."""
        data = path.read_bytes()
        first = data.split(b"\n", 1)[0].decode()
        generation = int(first.split()[1])
        self.assertEqual(data, content(generation, index), f"{path.name} is torn")
        return generation

    @shows_evidence
    def test_saves_are_kept_up_to_a_point(self) -> None:
        """
        Every file holds one whole version; the files of the pass the crash
        interrupted are saved up to some file and not after it; the only
        temporary file left, if any, is the next one's, whole.
        """
        folder = self.mount_point / "saves"
        cache, status = self.killed_under(SAVER, str(folder), str(FILES))
        self.assertNotEqual(status, 0, "its mount is gone: it fails")

        again = self.mount(cache=cache)
        names = set(os.listdir(folder))
        done = int((folder / "generation").read_text()) if "generation" in names else 0
        self.assertGreater(done, 0, "the saver ran long enough for a whole pass")
        passes = [self.pass_of(folder / f"f{index}", index) for index in range(FILES)]
        # A prefix of the interrupted pass (done + 1), the rest as the last whole pass left it.
        saved = sum(1 for generation in passes if generation == done + 1)
        self.assertEqual(passes, [done + 1] * saved + [done] * (FILES - saved))
        temporary = sorted(name for name in names if name.endswith(".tmp"))
        if temporary:
            expected = "generation.tmp" if saved == FILES else f"f{saved}.tmp"
            self.assertEqual(temporary, [expected])
            if saved < FILES:
                self.assertEqual(self.pass_of(folder / expected, saved), done + 1)
        self.unmount(again)

    @shows_evidence
    def test_a_file_closed_empty_survives_a_kill_before_its_release(self) -> None:
        """
        A new file closed empty (C{touch}) sends nothing at its close: its
        commit waits for the release. A twin descriptor (C{dup}) keeps the
        release from coming; the mount is killed then. The close recorded
        the file in the outbox, so the next mount on the same cache makes it
        (``mount-outbox.md`` section 8).
        """
        mount = self.mount()
        folder = self.mount_point / "new"
        folder.mkdir()  # listed whole: a file created in it is the mount's alone
        descriptor = os.open(folder / "f", os.O_WRONLY | os.O_CREAT, 0o644)
        twin = os.dup(descriptor)
        os.close(descriptor)  # FUSE's flush; its release waits for the twin
        try:
            os.kill(mount.process.pid, signal.SIGKILL)
            mount.process.wait(30)
        finally:
            try:
                os.close(twin)
            except OSError:
                pass  # its mount is gone
            subprocess.run(["umount", "-l", str(self.mount_point)], check=False)
        again = self.mount(cache=mount.cache)
        self.assertEqual(os.listdir(folder), ["f"])
        self.assertEqual((folder / "f").read_bytes(), b"")
        self.unmount(again)

    @shows_evidence
    def test_sqlite_survives_with_a_prefix_of_its_transactions(self) -> None:
        """
        SQLite on the mount, killed mid-work in its default mode (rollback
        journal, synchronous FULL) and in WAL with synchronous NORMAL: on a
        new mount, recovery leaves a database whose integrity check passes
        and whose rows are those of a prefix of the transactions; with FULL,
        at least every transaction whose COMMIT returned (each waited for
        its fsyncs, committed on the data plane).
        """
        for journal, synchronous in (("DELETE", "FULL"), ("WAL", "NORMAL")):
            with self.subTest(journal=journal):
                self.sqlite_crash(journal, synchronous)

    def sqlite_crash(self, journal: str, synchronous: str) -> None:
        folder = self.mount_point / f"db-{journal.lower()}"
        progress = self.tmp / f"progress-{journal.lower()}"
        database = folder / "agent.db"
        cache, _status = self.killed_under(
            SQLITE_WRITER, str(database), journal, synchronous, str(progress), folder=folder
        )
        reported = int(progress.read_text().split()[-1])
        self.assertGreater(reported, 10, "the writer committed some transactions")

        again = self.mount(cache=cache)
        connection = sqlite3.connect(database)
        try:
            self.assertEqual(connection.execute("PRAGMA integrity_check").fetchall(), [("ok",)])
            rows = dict(connection.execute("SELECT id, body FROM rows").fetchall())
        finally:
            connection.close()
        last = max(rows, default=0)
        self.assertEqual(sorted(rows), list(range(1, last + 1)), "a prefix of the transactions")
        for row, body in rows.items():
            if row + 5 <= last and (row + 5) % 7 == 0:
                self.assertEqual(body, b"again" * 50, row)
            else:
                self.assertEqual(body, bytes([row % 251]) * (100 + row % 3000), row)
        if synchronous == "FULL":
            self.assertGreaterEqual(last, reported, "every COMMIT that returned is kept")
        self.unmount(again)
