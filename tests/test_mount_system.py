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
import sys
import tempfile
import time
from pathlib import Path

from twisted.trial.unittest import SkipTest, TestCase

from svc.quickstart import DEMO_AGENT, http
from tests.mount_harness import BIN, MOUNT_TIMEOUT, ROOT, skip_reason


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


class MountSystemTests(TestCase):
    """The mount client end to end, through the kernel."""

    def setUp(self) -> None:
        reason = skip_reason()
        if reason is not None:
            raise SkipTest(reason)
        self.tmp = Path(tempfile.mkdtemp(prefix="svc-mount-system-"))
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.stack = self.tmp / "stack"
        self.addCleanup(self.quickstart, "stop")
        started = self.quickstart("start")
        self.assertEqual(started.returncode, 0, started.stdout + started.stderr)
        self.state = json.loads((self.stack / "state.json").read_text())
        self.control_url = f"http://127.0.0.1:{self.state['control_port']}"
        self.mount_point = self.tmp / "mnt"
        self.mount_point.mkdir()

    def quickstart(self, command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "svc.quickstart", command, "--dir", str(self.stack)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=180,
            check=False,
        )

    def enroll_token(self) -> str:
        status, minted = http(
            "POST",
            self.control_url + f"/v1/agents/{DEMO_AGENT}/enroll-token",
            {},
            self.state["token"],
        )
        self.assertEqual(status, 200, minted)
        token: str = minted["token"]
        return token

    def mount(self, label: str) -> subprocess.Popen[bytes]:
        """Start twist svc-mount with a fresh cache; wait for the mount."""
        log = self.tmp / f"mount-{label}.log"
        environ = {
            **os.environ,
            "SVC_CONTROL_URL": self.control_url,
            "SVC_ENROLL_TOKEN": self.enroll_token(),
            "SVC_MOUNT_POINT": str(self.mount_point),
            "SVC_CACHE_DIR": str(self.tmp / f"cache-{label}"),
            "SVC_AUDIT_LOG": str(self.tmp / f"audit-{label}.jsonl"),
            "SVC_MOUNT_FORCE": "1",
        }
        with log.open("wb") as output:
            process = subprocess.Popen(
                [str(BIN / "twist"), "--log-format=text", "svc-mount"],
                env=environ,
                cwd=ROOT,
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        self.addCleanup(self.force_down, process)
        deadline = time.monotonic() + MOUNT_TIMEOUT
        while not os.path.ismount(self.mount_point):
            if process.poll() is not None or time.monotonic() > deadline:
                self.fail(f"no mount; log:\n{log.read_text(errors='replace')}")
            time.sleep(0.2)
        self.logs = log
        return process

    def force_down(self, process: subprocess.Popen[bytes]) -> None:
        """Cleanup: never leave a mount or a process behind."""
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        if os.path.ismount(self.mount_point):
            subprocess.run(["umount", "-l", str(self.mount_point)], check=False)

    def unmount(self, process: subprocess.Popen[bytes]) -> None:
        """SIGTERM: write back, unmount, release the lease, exit."""
        process.send_signal(signal.SIGTERM)
        process.wait(60)
        self.assertFalse(os.path.ismount(self.mount_point), self.logs.read_text())

    def sh(self, command: str) -> str:
        done = subprocess.run(
            ["sh", "-euc", command],
            cwd=self.mount_point,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        self.assertEqual(done.returncode, 0, f"{command}: {done.stderr}\n{self.logs.read_text()}")
        return done.stdout

    def test_tools_write_and_remount_reads_everything(self) -> None:
        """cp -r, echo, mkdir -p, mv, ln -s and sqlite3 survive a remount with an empty cache."""
        source = self.tmp / "tree"
        (source / "sub" / "deeper").mkdir(parents=True)
        (source / "a.txt").write_text("alpha\n")
        (source / "sub" / "b.bin").write_bytes(os.urandom(300_000))
        (source / "sub" / "deeper" / "c.txt").write_text("gamma " * 1000)

        process = self.mount("first")
        self.sh(f"cp -r {source} tree")
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
        self.unmount(process)

        self.mount("second")
        after = snapshot(self.mount_point)
        self.assertEqual(sorted(after), sorted(before))
        self.assertEqual(after, before)
        if shutil.which("sqlite3"):
            self.assertEqual(self.sh("sqlite3 db.sqlite 'select sum(x) from t'"), "6\n")


class MountStartFailureTests(TestCase):
    """
    A mount that cannot start says so with its exit status and leaves nothing mounted.
    """

    def setUp(self) -> None:
        reason = skip_reason()
        if reason is not None:
            raise SkipTest(reason)

    def test_unreachable_control_plane_exits_nonzero(self) -> None:
        """With no control plane to enroll with, twist svc-mount exits 1 and mounts nothing."""
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
        )
        result = subprocess.run(
            [str(BIN / "twist"), "svc-mount"],
            env=environ,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertFalse(os.path.ismount(mount_point))
        audit = [json.loads(line) for line in (work / "audit.log").read_text().splitlines()]
        self.assertIn(("enrollment", False), [(a["event"], a["allowed"]) for a in audit])


def unused_port() -> int:
    """A loopback port nothing listens on (bound once, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port
