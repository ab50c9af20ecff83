"""
The local demo stack behind C{scripts/demo}: a control plane on SQLite and a
data-plane server as real C{twist} processes, a demo agent provisioned (and
given its enroll tokens) through the host SDK L{svc.sdk}, its enrollment and
mount lease, and a file written and read back over mutual TLS.

State lives in one directory (default C{.svc-demo} in the checkout): secrets,
databases, chunk store, logs, pid files and C{state.json}. C{stop} ends the
processes and leaves the data for the next start.

Usage::

    python -m svc.quickstart start [--dir DIR] [--no-mount]
    python -m svc.quickstart stop [--dir DIR]
    python -m svc.quickstart link [--dir DIR]

C{--no-mount} leaves the agent's disk unmounted (the system tests' harness
starts mounts of its own). The processes and the state directory are
L{svc.quickstart_stack.Stack}'s.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from svc.mount.runtime.mount_point import mount_point_problem, release_dead_mount
from svc.quickstart_stack import Stack, port_open
from svc.sdk import AgentEntity, Client, EnrollToken, SvcError

DEMO_OWNER = "demo-owner"
DEMO_AGENT = "demo-agent"
DEMO_GRANT = 1 << 30
START_TIMEOUT = 60.0


def _say(message: str) -> None:
    print(f"==> {message}", flush=True)


def http(
    method: str,
    url: str,
    body: Mapping[str, Any] | None = None,
    token: str | None = None,
) -> tuple[int, Any]:
    """
    One JSON request with the standard library; returns (status, decoded body).
    For the calls the host SDK does not make: health, enrollment, mount lease.
    """
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)  # noqa: S310
    request.add_header("Svc-API-Version", "1")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
            raw = response.read()
            return response.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as error:
        raw = error.read()
        return error.code, json.loads(raw) if raw else None


def sdk_client(stack: Stack, state: Mapping[str, Any], control_url: str) -> Client:
    """
    The host SDK's client for the demo control plane, with the service token.
    """
    return Client(control_url, state["token"], mount_root=str(stack.root / "mnt"))


def mint_enroll_token(client: Client) -> EnrollToken:
    """
    A fresh single-use enroll token for the demo agent, through the SDK.
    """
    try:
        return client.mint_enroll_token(DEMO_AGENT)
    except SvcError as error:
        raise SystemExit(f"enroll-token failed: {error}") from None


def wait_until(what: str, check: Any, timeout: float = START_TIMEOUT) -> Any:
    """
    Poll ``check`` until it returns something true, or fail naming ``what``.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            result = check()
        except (OSError, urllib.error.URLError):
            result = None
        if result:
            return result
        time.sleep(0.25)
    raise SystemExit(f"timed out waiting for {what}")


def start_processes(stack: Stack, state: dict[str, Any], control_env: dict[str, str]) -> str:
    """
    Start the control plane and the data plane; returns the control plane's URL.
    """
    control_url = f"http://127.0.0.1:{state['control_port']}"
    _say(f"starting the control plane on {control_url} (log: {stack.root / 'control.log'})")
    stack.spawn(
        "control",
        [
            stack._bin("twist"),
            "svc-control",
            "--listen",
            f"tcp:{state['control_port']}:interface=127.0.0.1",
        ],
        control_env,
    )
    wait_until("the control plane", lambda: http("GET", control_url + "/healthz")[0] == 200)
    start_dataplane(stack, state)
    return control_url


def start_dataplane(
    stack: Stack, state: Mapping[str, Any], environ: Mapping[str, str] | None = None
) -> int:
    """
    Start the data plane (also used by tests restarting it); C{environ}
    adds or overrides variables. Returns its pid.
    """
    _say(
        f"starting the data plane on 127.0.0.1:{state['dataplane_port']} "
        f"(log: {stack.root / 'dataplane.log'})"
    )
    return stack.spawn(
        "dataplane",
        [
            stack._bin("twist"),
            "svc-dataplane",
            "--listen",
            f"tcp:{state['dataplane_port']}:interface=127.0.0.1",
            "--http-listen",
            f"tcp:{state['dataplane_http_port']}:interface=127.0.0.1",
        ],
        {**stack.dataplane_environ(state), **(environ or {})},
    )


def enroll_and_mount(stack: Stack, state: dict[str, Any], control_url: str) -> None:
    """
    Provision the demo agent, enroll it, take its mount lease; saves the
    credentials and the session in the state directory.
    """
    # The frame listener opens only once the data plane holds its server
    # certificate, i.e. after it registered (its address) with the control plane.
    wait_until("the data plane", lambda: port_open(state["dataplane_port"]))
    client = sdk_client(stack, state, control_url)
    _say(f"provisioning owner {DEMO_OWNER!r} and agent {DEMO_AGENT!r}")
    try:
        entity = client.allocate_disk(DEMO_AGENT, DEMO_OWNER, DEMO_GRANT)
    except SvcError as error:
        if error.code != "grant_mismatch":
            raise SystemExit(f"provisioning failed: {error}") from None
        # The owner changed the demo agent's quota since (dashboard, SDK):
        # keep theirs rather than refuse to start.
        try:
            found = client.resolve("agent", DEMO_AGENT)
        except SvcError as again:
            raise SystemExit(f"provisioning failed: {again}") from None
        if not isinstance(found, AgentEntity):
            raise SystemExit(f"provisioning failed: {DEMO_AGENT!r} is not an agent") from None
        entity = found
        _say(f"agent {DEMO_AGENT!r} keeps the quota its owner set: {entity.grant_bytes} bytes")

    def enrolled() -> Any:
        minted = mint_enroll_token(client)
        status, enrollment = http("POST", control_url + "/agent/enroll", None, minted.token)
        if status == 503:
            return None  # the data plane has not registered yet
        if status != 200:
            raise SystemExit(f"enrollment failed: {status} {enrollment}")
        return enrollment

    _say("enrolling the agent (waits for the data plane to register)")
    enrollment = wait_until("enrollment", enrolled)
    credentials = stack.root / "agent"
    credentials.mkdir(mode=0o700, exist_ok=True)
    (credentials / "leaf.pem").write_text(enrollment["client_cert_pem"])
    (credentials / "key.pem").write_text(enrollment["client_key_pem"])
    (credentials / "key.pem").chmod(0o600)
    (credentials / "chain.pem").write_text(enrollment["ca_chain_pem"])
    _say(f"agent certificate serial {enrollment['serial']}, expires {enrollment['expires_at']}")
    mount_url = control_url + f"/allocations/{entity.allocation_id}/mount"
    proof = {"agent_fingerprint": enrollment["agent_fingerprint"]}
    status, lease = http("POST", mount_url, proof)
    if status == 409 and lease.get("error") == "lease_live":
        _say(
            "the previous demo run still holds the mount lease "
            f"(until {lease['lease_expires_at']}); taking it over with force"
        )
        status, lease = http("POST", mount_url, {**proof, "force": True})
    if status != 200:
        raise SystemExit(f"mount lease failed: {status} {lease}")
    _say(f"mount lease held until {lease['lease_expires_at']} (session {lease['session_id']})")
    state.update(
        allocation_id=entity.allocation_id,
        server_addr=enrollment["server_addr"],
        server_name=enrollment.get("server_name", "localhost"),
        session_id=lease["session_id"],
        agent_fingerprint=enrollment["agent_fingerprint"],
        mount_point=entity.virtual_path,
    )
    stack.save_state(state)


def fuse_available() -> str | None:
    """
    Why FUSE cannot be used here, or None when it can.
    """
    if not Path("/dev/fuse").exists():
        return "/dev/fuse is missing"
    if os.geteuid() != 0:
        return "mounting needs root in this demo"
    return None


def mount_disk(stack: Stack, state: dict[str, Any], control_url: str) -> str:
    """
    Start C{twist svc-mount} for the demo agent at its virtual path and use
    the disk with plain file I/O; returns the lines to print about it.
    """
    unavailable = fuse_available()
    if unavailable is not None:
        return f"The FUSE mount was skipped: {unavailable}."
    mount_point = Path(state["mount_point"])
    if os.path.ismount(mount_point):
        subprocess.run(["umount", "-l", str(mount_point)], check=False)  # noqa: S603, S607
    release_dead_mount(mount_point)  # the mount of a previous demo was killed
    mount_point.mkdir(parents=True, exist_ok=True)
    problem = mount_point_problem(mount_point)
    if problem is not None:
        raise SystemExit(f"cannot mount the agent's disk: {problem}")
    # The demo's own enrollment above held the lease; hand it to the mount.
    http(
        "DELETE",
        control_url + f"/allocations/{state['allocation_id']}/mount",
        {"agent_fingerprint": state["agent_fingerprint"]},
    )
    minted = mint_enroll_token(sdk_client(stack, state, control_url))
    _say(f"mounting the agent's disk at {mount_point} (log: {stack.root / 'mount.log'})")
    stack.spawn(
        "mount",
        [stack._bin("twist"), "svc-mount"],
        {
            **os.environ,
            "SVC_CONTROL_URL": control_url,
            "SVC_ENROLL_TOKEN": minted.token,
            "SVC_MOUNT_POINT": str(mount_point),
            "SVC_CACHE_DIR": str(stack.root / "cache"),
            "SVC_AUDIT_LOG": str(stack.root / "mount-audit.log"),
        },
    )
    wait_until(
        f"the mount (its log: {stack.root / 'mount.log'})", lambda: os.path.ismount(mount_point)
    )
    note = mount_point / "written-through-fuse.txt"
    note.write_text("This file was written with plain file I/O through the FUSE mount.\n")
    listing = sorted(p.name for p in mount_point.iterdir())
    _say(f"wrote {note.name} through the mount; the disk holds {listing}")
    return (
        f"  the agent's disk  {mount_point}   (mounted; try: ls -l {mount_point})\n"
        f"  mount audit log   {stack.root / 'mount-audit.log'}"
    )


def sign_in_link(stack: Stack, state: Mapping[str, Any], control_url: str) -> str:
    """
    A new single-use dashboard sign-in link for the demo owner
    (C{svc user seed}; the link is spent by its first use).
    """
    seeded = subprocess.run(  # noqa: S603 (our own svc binary)
        [stack._bin("svc"), "user", "seed", "--user", DEMO_OWNER, "--name", "Demo owner"],
        env=stack.control_environ(state),
        check=True,
        cwd=stack.root,
        capture_output=True,
        text=True,
    )
    return f"{control_url}/admin/session?token={seeded.stdout.strip()}"


def link(stack: Stack) -> int:
    """Print a fresh dashboard sign-in link for the running demo stack."""
    if not stack.running("control"):
        _say("the demo stack is not running: start it with scripts/demo")
        return 1
    state = stack.load_state()
    print(sign_in_link(stack, state, f"http://127.0.0.1:{state['control_port']}"), flush=True)
    return 0


def start(stack: Stack, *, mount: bool = True) -> int:
    """
    Bring the stack up, provision and enroll the demo agent, write a file;
    mount the agent's disk unless not C{mount} (harnesses that start mounts
    of their own).
    """
    stack.root.mkdir(parents=True, exist_ok=True)
    if stack.running("control") or stack.running("dataplane") or stack.running("mount"):
        _say("a demo stack is already running; stopping it first")
        stack.stop()
    state = stack.first_time_state()
    stack.save_state(state)
    control_env = stack.control_environ(state)
    (stack.root / "secrets").mkdir(mode=0o700, exist_ok=True)
    if not (stack.root / "secrets" / "ca" / "root" / "cert.pem").exists():
        _say("creating the certificate authority (svc ca init)")
        subprocess.run(  # noqa: S603 (our own svc binary)
            [stack._bin("svc"), "ca", "init"], env=control_env, check=True, cwd=stack.root
        )
    control_url = start_processes(stack, state, control_env)
    enroll_and_mount(stack, state, control_url)
    _say("writing /demo-agent/hello.txt through the data plane and reading it back")
    subprocess.run(  # noqa: S603 (this interpreter, our module)
        [sys.executable, "-m", "svc.quickstart_write", str(stack.root)],
        check=True,
    )
    mounted = (
        mount_disk(stack, state, control_url)
        if mount
        else "  the agent's disk  not mounted (--no-mount)"
    )
    dashboard = sign_in_link(stack, state, control_url)
    print(
        f"""
The demo stack is running (state in {stack.root}):
  dashboard       {dashboard}
                  (signed-in link for {DEMO_OWNER}, single use; a new one: scripts/demo link)
  control plane   {control_url}   (log {stack.root / "control.log"})
  data plane      {state["server_addr"]}   (log {stack.root / "dataplane.log"})
  audit log       {stack.root / "dataplane-audit.log"}
Try:
  .venv/bin/svc audit tail --file {stack.root / "dataplane-audit.log"} --limit 20
  curl -s {control_url}/healthz
{mounted}
Stop everything with: scripts/demo stop
""",
        flush=True,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="svc.quickstart")
    parser.add_argument("command", choices=["start", "stop", "link"])
    parser.add_argument("--dir", default=".svc-demo", help="state directory")
    parser.add_argument(
        "--no-mount", action="store_true", help="start: do not mount the agent's disk"
    )
    args = parser.parse_args(argv)
    stack = Stack(Path(args.dir))
    if args.command == "stop":
        stopped = stack.stop()
        _say("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
        return 0
    if args.command == "link":
        return link(stack)
    return start(stack, mount=not args.no_mount)


if __name__ == "__main__":
    sys.exit(main())
