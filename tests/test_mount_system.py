"""
The acceptance test of the mount client: the real stack (``python -m
svc.quickstart start``), ``twist svc-mount`` as a process, ordinary tools
writing through the kernel, an unmount by SIGTERM and a remount with an
empty cache that must show every byte again.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from twisted.trial.unittest import SkipTest, TestCase

from tests.mount_harness import BIN, MountStackCase, audit_lines, skip_reason


def snapshot(root: Path) -> dict[str, tuple[str, bytes]]:
    """Every path under C{root}: its kind and its bytes (or symlink target)."""
    found: dict[str, tuple[str, bytes]] = {}
    for directory, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(directory) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                found[rel] = ("link", os.readlink(path).encode())
            elif path.is_dir():
                found[rel] = ("dir", b"")
            else:
                found[rel] = ("file", path.read_bytes())
    return found


class MountSystemTests(MountStackCase):
    """The mount client end to end, through the kernel."""

    def test_tools_write_and_remount_reads_everything(self) -> None:
        """cp -r, echo, mkdir -p, mv, ln -s and sqlite3 survive a remount with an empty cache."""
        source = self.tmp / "tree"
        (source / "sub" / "deeper").mkdir(parents=True)
        (source / "a.txt").write_text("alpha\n")
        (source / "sub" / "b.bin").write_bytes(os.urandom(300_000))
        (source / "sub" / "deeper" / "c.txt").write_text("gamma " * 1000)

        first = self.mount()
        self.sh(f"cp -r {source} tree", first)
        self.sh("echo hello > hello.txt")
        self.sh("mkdir -p x/y/z && echo deep > x/y/z/f")
        self.sh("mv hello.txt x/moved.txt")
        self.sh("ln -s x/moved.txt link")
        self.assertEqual(self.sh("cat link"), "hello\n")
        self.assertEqual(
            (self.mount_point / "tree" / "sub" / "b.bin").read_bytes(),
            (source / "sub" / "b.bin").read_bytes(),
        )
        if shutil.which("sqlite3"):
            self.sh("sqlite3 db.sqlite 'create table t(x); insert into t values (1),(2),(3);'")
            self.assertEqual(self.sh("sqlite3 db.sqlite 'select sum(x) from t'"), "6\n")
        before = snapshot(self.mount_point)
        self.assertIn("x/moved.txt", before)
        self.unmount(first)

        self.mount()
        after = snapshot(self.mount_point)
        self.assertEqual(sorted(after), sorted(before))
        self.assertEqual(after, before)
        if shutil.which("sqlite3"):
            self.assertEqual(self.sh("sqlite3 db.sqlite 'select sum(x) from t'"), "6\n")

    def test_sighup_reopens_the_audit_log(self) -> None:
        """After rename + SIGHUP the mount keeps serving; later lines go to a new file."""
        mount = self.mount()
        self.sh("echo one > one.txt", mount)
        self.wait_for_flush(mount.audit, "one.txt")
        rotated = mount.audit.with_name("rotated.jsonl")
        mount.audit.rename(rotated)
        mount.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while "reopening the audit log" not in mount.log.read_text(errors="replace"):
            self.assertLess(time.monotonic(), deadline, "no reopen logged")
            time.sleep(0.1)
        self.sh("echo two > two.txt", mount)
        self.wait_for_flush(mount.audit, "two.txt")
        self.assertTrue(os.path.ismount(self.mount_point))
        self.assertIsNone(mount.process.poll())
        flushed = {
            Path(line["path"]).name for line in audit_lines(rotated) if line["event"] == "flush"
        }
        self.assertIn("one.txt", flushed)
        self.assertNotIn("two.txt", flushed)
        self.unmount(mount)

    def wait_for_flush(self, audit: Path, name: str) -> None:
        """Wait until C{audit} has a C{flush} line for a file called C{name}."""
        deadline = time.monotonic() + 30
        while not any(
            line["event"] == "flush" and Path(line["path"]).name == name
            for line in audit_lines(audit)
        ):
            self.assertLess(time.monotonic(), deadline, f"no flush line for {name}")
            time.sleep(0.1)


class MountStartFailureTests(TestCase):
    """
    A mount that cannot start says so with its exit status and leaves nothing mounted.
    """

    def setUp(self) -> None:
        reason = skip_reason()
        if reason is not None:
            raise SkipTest(reason)

    def test_unreachable_control_plane_exits_nonzero(self) -> None:
        """
        With no control plane to enroll with, twist svc-mount exits 1 after
        its start wait (here 3 s, C{SVC_START_WAIT}) and mounts nothing.
        """
        work = Path(self.mktemp()).resolve()
        mount_point = work / "mnt"
        mount_point.mkdir(parents=True)
        environ = {k: v for k, v in os.environ.items() if not k.startswith("SVC_")}
        environ.update(
            SVC_CONTROL_URL=f"http://127.0.0.1:{unused_port()}",
            SVC_ENROLL_TOKEN="no-such-token",
            SVC_MOUNT_POINT=str(mount_point),
            SVC_CACHE_DIR=str(work / "cache"),
            SVC_AUDIT_LOG=str(work / "audit.log"),
            SVC_START_WAIT="3",
        )
        started = time.monotonic()
        result = subprocess.run(
            [str(BIN / "twist"), "svc-mount"],
            env=environ,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertIn("for 3s", result.stdout + result.stderr)
        self.assertLess(time.monotonic() - started, 45, "it waited the default 60 s")
        self.assertFalse(os.path.ismount(mount_point))
        audit = [json.loads(line) for line in (work / "audit.log").read_text().splitlines()]
        self.assertIn(("enrollment", False), [(a["event"], a["allowed"]) for a in audit])


def unused_port() -> int:
    """A loopback port nothing listens on (bound once, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port
