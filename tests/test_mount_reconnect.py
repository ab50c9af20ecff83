"""
A real mount outlives its data-plane connections: a data-plane process
killed and started again, and the server's idle timeout, each end the
connection; the mount reconnects on its next request, and a write made
while the data plane is down waits for it instead of failing. Atomic saves
whose answers the crash took (handed off: ``mount-consistency.md`` 2.6) end
where the program put them. A data-plane process that stops answering
(SIGSTOP) holds neither the mount nor its programs for long, and a change
its program was told had failed is never made afterwards. Changes the mount
has to give up at shutdown are copied to its own disk first.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from blake3 import blake3

from tests.mount_harness import Mount, MountStackCase, lstat_tree, shows_evidence

IDLE_SECONDS = 2
"""The restarted data plane's idle timeout (SVC_IDLE_TIMEOUT_SECONDS)."""

WORKLOAD = Path(__file__).with_name("crash_workload.py")
"""The program changing a tree while the data plane is killed."""

SAVES = 40
"""Files the saver keeps saving atomically, pass after pass."""

SAVER = """
import json, os, sys, time
folder, stop = sys.argv[1], sys.argv[2]
os.makedirs(folder, exist_ok=True)
generation = failures = 0

def save(name, body):
    # As an editor does: a temporary file, then a rename over the real one;
    # a failed save (an answer the crash took) is tried again.
    global failures
    for attempt in range(20):
        try:
            with open(f"{folder}/{name}.tmp", "wb") as out:
                out.write(body)
            os.rename(f"{folder}/{name}.tmp", f"{folder}/{name}")
            return
        except OSError:
            failures += 1
            time.sleep(0.2)
    raise SystemExit(f"{name}: could not be saved")

while not os.path.exists(stop):
    generation += 1
    for index in range(int(sys.argv[3])):
        save(f"f{index}", f"pass {generation} file {index}\\n".encode() * 64)
    save("generation", str(generation).encode())
print(json.dumps({"generation": generation, "failures": failures}))
"""
"""A program saving files atomically until a stop file appears."""


WRITE_AND_CLOSE = """
import errno, sys
try:
    with open(sys.argv[1], "w") as out:
        out.write("kept through the outage\\n")
except OSError as error:
    print(errno.errorcode[error.errno])
else:
    print("closed")
"""
"""Writes a file and prints how its close ended (an errno's name, or C{closed})."""


class MountReconnectTests(MountStackCase):
    """
    The mount keeps working across data-plane restarts and idle timeouts.
    """

    def start_dataplane(self, environ: dict[str, str] | None = None) -> None:
        """Start it again with a short idle timeout."""
        super().start_dataplane({"SVC_IDLE_TIMEOUT_SECONDS": str(IDLE_SECONDS)})

    @shows_evidence
    def test_writes_survive_restart_outage_and_idle_timeout(self) -> None:
        """Data written before, during and after an outage and an idle period is all there."""
        mount = self.mount()
        self.sh("mkdir work && echo before > work/before.txt && cat work/before.txt", mount)

        self.kill_dataplane()
        # A write while the data plane is down waits for it (close commits).
        writer = subprocess.Popen(
            ["sh", "-euc", "echo during > work/during.txt"], cwd=self.mount_point
        )
        time.sleep(1.5)
        self.assertIsNone(writer.poll(), "the close waited for the data plane")
        self.start_dataplane()
        self.assertEqual(writer.wait(60), 0, mount.log.read_text(errors="replace"))

        self.sh("echo after > work/after.txt", mount)
        time.sleep(IDLE_SECONDS * 2)  # the server ends the idle connection
        self.sh("echo idle > work/idle.txt && cat work/before.txt work/after.txt", mount)
        self.unmount(mount)

        log = mount.log.read_text(errors="replace")
        self.assertIn("data-plane connection ended", log)
        self.assertIn("GOAWAY idle_timeout", log)

        fresh = self.mount(cache=self.tmp / "fresh-cache")
        contents = {
            name: (self.mount_point / "work" / f"{name}.txt").read_text()
            for name in ("before", "during", "after", "idle")
        }
        self.assertEqual(
            contents,
            {"before": "before\n", "during": "during\n", "after": "after\n", "idle": "idle\n"},
        )
        self.unmount(fresh)

    def file_kept_through_an_outage(self) -> Mount:
        """
        A fresh mount; the data plane killed; C{work/kept.txt} written and
        closed (the close reports EIO) and kept by its release.
        """
        mount = self.mount()
        self.sh("mkdir work", mount)
        self.kill_dataplane()
        written = subprocess.run(
            [sys.executable, "-c", WRITE_AND_CLOSE, str(self.mount_point / "work" / "kept.txt")],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        self.assertEqual(written.stdout.strip(), "EIO", written.stderr)
        deadline = time.monotonic() + 60
        while "are kept and written back" not in mount.log.read_text(errors="replace"):
            self.assertLess(time.monotonic(), deadline, "the release did not keep the file")
            time.sleep(0.2)
        return mount

    @shows_evidence
    def test_changes_kept_through_an_outage_reach_the_data_plane_after_it(self) -> None:
        """
        A file closed while the data plane is down for longer than a call
        waits for a connection: the close reports the failure, but the
        release keeps the changes instead of discarding them, and they are
        committed once the data plane is back, with the mount still up.
        """
        mount = self.file_kept_through_an_outage()
        self.start_dataplane()
        deadline = time.monotonic() + 90
        while not any(
            line["event"] == "flush" and line["path"] == "/work/kept.txt" and line["allowed"]
            for line in mount.audit_lines()
        ):
            self.assertLess(time.monotonic(), deadline, "the kept file was not written back")
            time.sleep(0.2)
        self.unmount(mount)
        fresh = self.mount(cache=self.tmp / "fresh-cache")
        self.assertEqual(
            (self.mount_point / "work" / "kept.txt").read_text(), "kept through the outage\n"
        )
        self.unmount(fresh)

    def timed_mkdir(self, path: str) -> tuple[str, float]:
        """C{mkdir} in the mount: how it ended (C{made} or the errno's name) and its seconds."""
        started = time.monotonic()
        try:
            os.mkdir(self.mount_point / path)
        except OSError as error:
            return errno.errorcode[error.errno or 0], time.monotonic() - started
        return "made", time.monotonic() - started

    @shows_evidence
    def test_stopped_dataplane_neither_holds_the_mount_nor_runs_failed_changes(self) -> None:
        """
        The data-plane process stops (SIGSTOP: its kernel still acknowledges
        every packet) right after an `rm` handed off: the mount finds the
        connection silent and ends it; each `mkdir`, which waits for the
        `rm` to settle, fails EIO (once the server cannot be asked, at once),
        while cached files stay readable; and once the server resumes, the
        `rm` is settled as run and none of the failed `mkdir`s is made.
        """
        mount = self.mount()
        self.sh("mkdir work && echo x > work/gone.txt && echo kept > work/kept.txt", mount)
        for name in ("gone.txt", "kept.txt"):  # their commits answered: nothing in flight
            fd = os.open(self.mount_point / "work" / name, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        pid = int((self.stack / "dataplane.pid").read_text())
        os.kill(pid, signal.SIGSTOP)
        try:
            (self.mount_point / "work" / "gone.txt").unlink()
            ended = [self.timed_mkdir(f"work/late{n}") for n in range(3)]
            self.assertEqual([how for how, _ in ended], ["EIO", "EIO", "EIO"], ended)
            self.assertLess(ended[2][1], 25.0, f"the third mkdir waited its timeout: {ended}")
            self.assertEqual((self.mount_point / "work" / "kept.txt").read_text(), "kept\n")
        finally:
            os.kill(pid, signal.SIGCONT)
        deadline = time.monotonic() + 60
        while self.timed_mkdir("work/after")[0] != "made":
            self.assertLess(time.monotonic(), deadline, "the mount did not recover")
            time.sleep(0.5)
        self.unmount(mount)
        log = mount.log.read_text(errors="replace")
        self.assertIn("data-plane server silent for", log)
        fresh = self.mount(cache=self.tmp / "fresh-cache")
        self.assertEqual(sorted(os.listdir(self.mount_point / "work")), ["after", "kept.txt"])
        self.unmount(fresh)

    def kept_file_on_the_next_mount(self, mount: Mount) -> None:
        """
        C{mount} is gone with C{work/kept.txt} still kept: with the data
        plane back, the next mount on its cache sends the recorded content
        before it serves, nothing was copied under <cache>/unsent, and a
        fresh client reads the content from the data plane.
        """
        self.start_dataplane()
        again = self.mount(cache=mount.cache)
        kept = self.mount_point / "work" / "kept.txt"
        self.assertEqual(kept.read_text(), "kept through the outage\n")
        self.unmount(again)
        self.assertEqual([p for p in (mount.cache / "unsent").rglob("*") if p.is_file()], [])
        fresh = self.mount(cache=self.tmp / "fresh-cache")
        self.assertEqual(kept.read_text(), "kept through the outage\n")
        self.unmount(fresh)

    @shows_evidence
    def test_changes_kept_at_shutdown_are_sent_by_the_next_mount(self) -> None:
        """
        The data plane is still down when the mount stops: the file kept
        through the outage cannot be written back, so its changes stay
        recorded in the mount's outbox (the log says so), and the next mount
        on that cache sends them once the data plane is back.
        """
        mount = self.file_kept_through_an_outage()
        self.unmount(mount)
        self.assertIn(
            "stay in the outbox, and the next mount on this cache sends them",
            mount.log.read_text(errors="replace"),
        )
        self.kept_file_on_the_next_mount(mount)

    @shows_evidence
    def test_a_file_kept_through_an_outage_survives_the_mount_being_killed(self) -> None:
        """
        A file kept through an outage lives in the mount's memory and spill
        files, and is recorded in its outbox before the warning that it is
        kept: a SIGKILL of the mount leaves the record, which the next mount
        on that cache sends.
        """
        mount = self.file_kept_through_an_outage()
        os.kill(mount.process.pid, signal.SIGKILL)
        mount.process.wait(30)
        subprocess.run(["umount", "-l", str(self.mount_point)], check=False)
        self.kept_file_on_the_next_mount(mount)

    def assert_saved(self, folder: Path) -> None:
        """Every file holds the last whole pass's content; no temporary file is left."""
        generation = int((folder / "generation").read_text())
        names = sorted(path.name for path in folder.iterdir())
        self.assertEqual(names, sorted(["generation", *(f"f{i}" for i in range(SAVES))]))
        for index in range(SAVES):
            self.assertEqual(
                (folder / f"f{index}").read_bytes(),
                f"pass {generation} file {index}\n".encode() * 64,
                f"f{index}",
            )

    @shows_evidence
    def test_atomic_saves_survive_data_plane_crashes(self) -> None:
        """
        A program saves files atomically (write C{x.tmp}, rename it over
        C{x}) while the data plane is killed and started again three times.
        Each crash takes the answers of the commits and renames in flight;
        the mount asks the server what ran, sends again or replays what did
        not. Afterwards every file holds the last pass's content and no
        temporary file is left, on this mount and on a fresh one.
        """
        mount = self.mount()
        folder = self.mount_point / "saves"
        stop = self.tmp / "stop"
        saver = subprocess.Popen(
            [sys.executable, "-c", SAVER, str(folder), str(stop), str(SAVES)],
            stdout=subprocess.PIPE,
        )
        try:
            self.crash_dataplane_three_times()
            # The pass the last crash interrupted is the last one: its saves
            # were handed off when the crash took their answers.
        finally:
            stop.touch()
            out, _ = saver.communicate(timeout=120)
        self.assertEqual(saver.returncode, 0, mount.log.read_text(errors="replace"))
        self.assertGreater(json.loads(out)["generation"], 1)
        self.assert_saved(folder)
        self.unmount(mount)
        fresh = self.mount(cache=self.tmp / "fresh-cache")
        self.assert_saved(Path(self.mount_point / "saves"))
        self.unmount(fresh)

    def crash_dataplane_three_times(self) -> None:
        """Every 2 seconds, kill the data plane with SIGKILL and start it again; three times."""
        for _ in range(3):
            time.sleep(2)
            self.kill_dataplane()
            self.start_dataplane()

    def picture_of(self, root: Path) -> dict[str, str]:
        """What the tree under C{root} holds, as L{tests.crash_workload} pictures it."""
        found: dict[str, str] = {}
        for directory, dirnames, filenames in os.walk(root):
            for name in dirnames:
                found[os.path.relpath(os.path.join(directory, name), root)] = "dir"
            for name in filenames:
                path = Path(directory, name)
                found[os.path.relpath(path, root)] = blake3(path.read_bytes()).hexdigest()
        return found

    @shows_evidence
    def test_tools_changes_survive_data_plane_crashes(self) -> None:
        """
        A program creating, rewriting, saving, renaming and removing files
        and directories while the data plane is killed three times: what it
        believes the tree holds (each call that returned success, and what it
        saw after a call that failed) is what the mount shows, and a fresh
        mount shows the same tree, attributes included.
        """
        mount = self.mount()
        root = self.mount_point / "work"
        stop = self.tmp / "stop-tools"
        result = self.tmp / "workload.json"
        workload = subprocess.Popen(
            [sys.executable, str(WORKLOAD), str(root), str(stop), "7", str(result)]
        )
        try:
            self.crash_dataplane_three_times()
        finally:
            stop.touch()
            workload.wait(120)
        self.assertEqual(workload.returncode, 0, mount.log.read_text(errors="replace"))
        report = json.loads(result.read_text())
        self.assertGreater(report["operations"], 100)
        self.assertEqual(self.picture_of(root), report["picture"])
        live = lstat_tree(root)
        self.unmount(mount)
        fresh = self.mount(cache=self.tmp / "fresh-tools-cache")
        self.assertEqual(lstat_tree(self.mount_point / "work"), live)
        self.unmount(fresh)
