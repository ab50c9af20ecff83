"""
A real svc stack for the suites, started as the system tests start it
(C{tests/mount_harness.py}): the quickstart (C{python -m svc.quickstart
start}: control plane, data plane, the demo agent provisioned and enrolled)
with its own mount stopped, then C{twist svc-mount} processes of our own at
one mount point, each with a fresh cache directory, C{allow_other} (pjdfstest
switches to uid 65534; the mount always sets C{default_permissions}), JSON
logs, and an address-space cap (C{prlimit --as}), so that a mount that
allocates per logical byte (pjdfstest's C{ftruncate/12.t} truncates to about
1 PB) fails its test instead of taking the machine down.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from svc.quickstart import DEMO_AGENT, DEMO_GRANT, http
from svc.quickstart_stack import Stack, run_quickstart

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
MOUNT_TIMEOUT = 60.0
UNMOUNT_TIMEOUT = 300.0
"""Seconds a SIGTERM'd mount may take to write back, unmount and exit."""
LOG_LEVELS = ("warn", "error", "critical")


class StackError(Exception):
    """The stack or a mount did not start (the message holds the log to read)."""


def umount_lazy(path: Path) -> None:
    if os.path.ismount(path):
        subprocess.run(["umount", "-l", str(path)], check=False)


def _peak_memory_kib(pid: int) -> int | None:
    """C{VmHWM} (peak resident set) of a live process, in KiB."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return None


def log_counts(log: Path) -> dict[str, int]:
    """How many lines of a JSON-lines log are at warn, error and critical level."""
    counts = dict.fromkeys(LOG_LEVELS, 0)
    if not log.exists():
        return counts
    for line in log.read_text(errors="replace").splitlines():
        try:
            level = json.loads(line).get("level")
        except (ValueError, AttributeError):
            continue
        if level in counts:
            counts[level] += 1
    return counts


class Mount:
    """One capped C{twist svc-mount} process and its files."""

    def __init__(self, label: str, process: subprocess.Popen[bytes], log: Path) -> None:
        self.label = label
        self.process = process
        self.log = log
        self.peak_kib: int | None = None
        self.died: int | None = None
        """The exit status, when the process ended before it was asked to."""
        self.exit_status: int | None = None

    def alive(self) -> bool:
        return self.process.poll() is None

    def report(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "log": str(self.log),
            "died_before_unmount": self.died,
            "exit_status": self.exit_status,
            "peak_rss_mib": None if self.peak_kib is None else round(self.peak_kib / 1024, 1),
            "log_lines": log_counts(self.log),
        }


class ConformanceStack:
    """
    The quickstart stack under C{run/stack} and mounts at C{run/mnt}; logs,
    caches and audit logs of the mounts beside them.
    """

    def __init__(self, run: Path, memory_cap: int, grant_bytes: int) -> None:
        self.run = run
        self.stack = run / "stack"
        self.mount_point = run / "mnt"
        self.memory_cap = memory_cap
        self.grant_bytes = grant_bytes
        self.state: dict[str, Any] = {}
        self.mounts: list[Mount] = []

    @property
    def control_url(self) -> str:
        return f"http://127.0.0.1:{self.state['control_port']}"

    def quickstart(self, command: str) -> subprocess.CompletedProcess[str]:
        return run_quickstart(command, self.stack, environ={"SVC_LOG_FORMAT": "json"}, timeout=300)

    def start(self) -> None:
        """Start the quickstart stack, stop its mount, give the demo agent our grant."""
        started = self.quickstart("start")
        if started.returncode != 0:
            raise StackError(f"quickstart start failed:\n{started.stdout}{started.stderr}")
        self.state = json.loads((self.stack / "state.json").read_text())
        self._stop_quickstart_mount()
        if self.grant_bytes > DEMO_GRANT:  # as a host would, with set_disk_quota
            status, body = http(
                "PATCH",
                self.control_url + f"/v1/entities/agent/{DEMO_AGENT}",
                {"grant_bytes": self.grant_bytes},
                self.state["token"],
            )
            if status != 200:
                raise StackError(f"raising the demo agent's grant failed: {status} {body}")
        self.mount_point.mkdir(exist_ok=True)

    def _stop_quickstart_mount(self) -> None:
        Stack(self.stack).stop_process("mount")
        umount_lazy(Path(self.state["mount_point"]))

    def mount(self, label: str) -> Mount:
        """A fresh capped C{twist svc-mount} with an empty cache C{run/cache-LABEL}."""
        status, minted = http(
            "POST",
            self.control_url + f"/v1/agents/{DEMO_AGENT}/enroll-token",
            {},
            self.state["token"],
        )
        if status != 200:
            raise StackError(f"enroll-token failed: {status} {minted}")
        log = self.run / f"mount-{label}.log"
        environ = {
            **os.environ,
            "SVC_CONTROL_URL": self.control_url,
            "SVC_ENROLL_TOKEN": minted["token"],
            "SVC_MOUNT_POINT": str(self.mount_point),
            "SVC_CACHE_DIR": str(self.run / f"cache-{label}"),
            "SVC_AUDIT_LOG": str(self.run / f"audit-{label}.jsonl"),
            "SVC_MOUNT_FORCE": "1",
            "SVC_MOUNT_ALLOW_OTHER": "1",
            "SVC_LOG_FORMAT": "json",
        }
        with log.open("wb") as output:
            process = subprocess.Popen(
                ["prlimit", f"--as={self.memory_cap}", str(BIN / "twist"), "svc-mount"],
                env=environ,
                cwd=ROOT,
                stdout=output,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        mounted = Mount(label, process, log)
        self.mounts.append(mounted)
        deadline = time.monotonic() + MOUNT_TIMEOUT
        while not os.path.ismount(self.mount_point):
            if process.poll() is not None or time.monotonic() > deadline:
                self._force_down(mounted)
                raise StackError(f"no mount; its log {log}:\n{log.read_text(errors='replace')}")
            time.sleep(0.2)
        return mounted

    def unmount(self, mount: Mount) -> None:
        """SIGTERM: the mount writes back, unmounts, releases its lease and exits."""
        if mount.alive():
            mount.peak_kib = _peak_memory_kib(mount.process.pid)
        self._force_down(mount)

    def _force_down(self, mount: Mount) -> None:
        if not mount.alive():
            mount.died = mount.process.returncode
        else:
            mount.process.send_signal(signal.SIGTERM)
            try:
                mount.process.wait(UNMOUNT_TIMEOUT)
            except subprocess.TimeoutExpired:
                mount.process.kill()
                mount.process.wait(30)
        mount.exit_status = mount.process.returncode
        umount_lazy(self.mount_point)

    def stop_mounts(self) -> None:
        """Every mount down and nothing mounted at the mount point."""
        for mount in self.mounts:
            if mount.exit_status is None:
                self._force_down(mount)
        umount_lazy(self.mount_point)

    def stop(self) -> None:
        """Every mount down, the stack stopped, nothing left mounted."""
        self.stop_mounts()
        if self.state:
            self.quickstart("stop")
            mount_point = self.state.get("mount_point")
            if mount_point:
                umount_lazy(Path(mount_point))
