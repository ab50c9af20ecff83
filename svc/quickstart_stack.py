"""
The demo stack's processes and files (L{Stack}): its state directory, the
environment of each process, starting, finding and stopping them; and
L{run_quickstart}, how the system tests and the benchmarks drive
C{python -m svc.quickstart}. The steps of a start are in L{svc.quickstart}.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from svc.mount.runtime.mount_point import release_dead_mount

TRUST_DOMAIN = "svc.local"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        # As Twisted's listeners do, so a port in TIME_WAIT counts as free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def port_open(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", port)) == 0


class Stack:
    """
    The demo's processes and files under ``root``.
    """

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.state_file = self.root / "state.json"

    # State

    def load_state(self) -> dict[str, Any]:
        if self.state_file.exists():
            state: dict[str, Any] = json.loads(self.state_file.read_text())
            return state
        return {}

    def save_state(self, state: Mapping[str, Any]) -> None:
        self.state_file.write_text(json.dumps(state, indent=2) + "\n")
        self.state_file.chmod(0o600)

    def first_time_state(self) -> dict[str, Any]:
        state = self.load_state()
        if "token" not in state:
            state.update(
                token=secrets.token_urlsafe(32),
                kek=base64.b64encode(secrets.token_bytes(32)).decode(),
            )
        for key in ("control_port", "dataplane_port", "dataplane_http_port"):
            # Keep the ports of an earlier run: placement remembers the data
            # plane's address. Pick a new one only when the old one is taken.
            if key not in state or not _port_free(state[key]):
                state[key] = _free_port()
        return state

    # Environment

    def control_environ(self, state: Mapping[str, Any]) -> dict[str, str]:
        return {
            **os.environ,
            "DATABASE_URL": f"sqlite://{self.root / 'control.db'}",
            "SVC_CONTROL_PLANE_TOKEN": state["token"],
            "SVC_SECRETS_DIR": str(self.root / "secrets"),
            "SVC_CA_KEK": state["kek"],
            "SVC_TRUST_DOMAIN": TRUST_DOMAIN,
            "SVC_ORG_NAME": "svc demo",
            "SVC_MOUNT_PREFIX": str(self.root / "mnt"),
            # Plain HTTP on 127.0.0.1: the session cookie cannot be Secure.
            "SVC_DEV_MODE": "1",
        }

    def dataplane_environ(self, state: Mapping[str, Any]) -> dict[str, str]:
        return {
            **os.environ,
            "SVC_TENANTS_ROOT": str(self.root / "tenants"),
            "SVC_STATE_DIR": str(self.root / "dataplane-state"),
            "SVC_AUDIT_LOG": str(self.root / "dataplane-audit.log"),
            "SVC_TRUST_DOMAIN": TRUST_DOMAIN,
            "SVC_CONTROL_URL": f"http://127.0.0.1:{state['control_port']}",
            "SVC_CONTROL_PLANE_TOKEN": state["token"],
            "SVC_ADVERTISE_ADDR": f"127.0.0.1:{state['dataplane_port']}",
            "SVC_SERVER_FQDN": "localhost",
        }

    # Processes

    def _bin(self, name: str) -> str:
        return str(Path(sys.executable).with_name(name))

    def spawn(self, name: str, argv: list[str], environ: Mapping[str, str]) -> int:
        log = (self.root / f"{name}.log").open("ab")
        process = subprocess.Popen(  # noqa: S603 (our own twist binary)
            argv,
            env=dict(environ),
            cwd=self.root,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        (self.root / f"{name}.pid").write_text(str(process.pid))
        return process.pid

    def running(self, name: str) -> int | None:
        """
        The pid of this stack's process C{name}, if it runs. A pid file
        whose process is gone, or is now another program (the pid was
        reused, say after a reboot), counts as not running: stopping the
        demo must never signal a stranger.
        """
        pid_file = self.root / f"{name}.pid"
        try:
            pid = int(pid_file.read_text())
            os.kill(pid, 0)
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return None
        # An exiting process (a zombie until reaped) has no command line any
        # more: still ours until it is gone. Signals cannot harm one.
        if command and f"svc-{name}".encode() not in command.split(b"\0"):
            return None
        return pid

    def stop_process(self, name: str) -> bool | None:
        """
        SIGTERM this stack's process C{name} and wait for it to exit (60 s
        for the mount, which flushes first; 20 s otherwise), then SIGKILL
        it. L{None} if it was not running, else whether it exited on
        SIGTERM. Its pid file is removed.
        """
        pid = self.running(name)
        if pid is None:
            return None
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + (60 if name == "mount" else 20)
        while time.monotonic() < deadline and self.running(name) is not None:
            time.sleep(0.1)
        exited = self.running(name) is None
        if not exited:
            os.kill(pid, signal.SIGKILL)
        (self.root / f"{name}.pid").unlink(missing_ok=True)
        return exited

    def stop(self) -> list[str]:
        stopped = []
        # The mount first: it flushes, unmounts and releases its lease, which
        # needs both planes still running.
        for name in ("mount", "dataplane", "control"):
            if self.stop_process(name) is not None:
                stopped.append(name)
        mount_point = self.load_state().get("mount_point")
        if mount_point:
            # A mount process killed without unmounting leaves a dead mount.
            release_dead_mount(Path(mount_point))
        return stopped


def run_quickstart(
    command: str,
    directory: Path,
    *,
    environ: Mapping[str, str] | None = None,
    timeout: float = 180,
    options: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    """
    C{python -m svc.quickstart COMMAND --dir DIRECTORY [OPTIONS]} in a child process,
    from the repository's root, with C{environ} added to this process's
    environment; its output captured, its exit status not checked. How
    the system tests and the benchmarks drive the demo stack.
    """
    return subprocess.run(  # noqa: S603 (our own interpreter and module)
        [sys.executable, "-m", "svc.quickstart", command, "--dir", str(directory), *options],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
        env={**os.environ, **(environ or {})},
        timeout=timeout,
        check=False,
    )
