"""
The fairness phase of C{bench/dataplane.py} (issue 34, item 3): how much one
hostile connection slows another tenant's requests.

A victim connection (agent of one tenant) times sequential C{ping}s: first on
an otherwise idle server, then while a flooding process (C{bench/flood.py},
an agent of another tenant, on its own connection and its own process) sends
either 20,000 pipelined pings at a time or C{manifest_put} maps as expensive
to decode as that operation's limits allow, reading every answer so the server
is never held back by back-pressure. The reference, measured in the same
run: the victim's latency while a process as busy as a flooder burns a CPU
without talking to the server (on a 2-CPU machine the three processes share
the CPUs, which alone delays the victim). Reported: the victim's p50 and p99
in each state, the server reactor's lag (how late a call due every 2 ms ran:
the longest any turn held the reactor), and how many frames the flooder got
through per second.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from svc.dataplane_client.client import DataPlaneClient
from svc.pki.pem import cert_to_pem, certs_to_pem, key_to_pem
from svc.testing.pki import AgentCredentials

FLOOD_SCRIPT = Path(__file__).resolve().parent / "flood.py"
FLOOD_MODES = ("busy", "pings", "decode-limit")
"""C{busy} is the reference: a process as busy as a flooder that never talks to the server."""
WARM_UP_SECONDS = 1.0
READY_TIMEOUT = 30.0


def percentile(samples: Sequence[float], fraction: float) -> float:
    """The C{fraction} percentile (nearest rank) of C{samples}."""
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))
    return ordered[index]


def summary(samples: Sequence[float]) -> dict[str, float]:
    """p50 and p99 in milliseconds."""
    return {
        "p50_ms": round(percentile(samples, 0.50), 3),
        "p99_ms": round(percentile(samples, 0.99), 3),
    }


def write_credentials(credentials: AgentCredentials, directory: Path) -> list[str]:
    """The flooder's chain, key and root as files; C{--chain --key --root} arguments."""
    directory.mkdir(parents=True, exist_ok=True)
    chain, key, root = directory / "chain.pem", directory / "key.pem", directory / "root.pem"
    chain.write_bytes(certs_to_pem([credentials.leaf.cert, *credentials.chain]))
    key.write_bytes(key_to_pem(credentials.leaf.key))
    root.write_bytes(cert_to_pem(credentials.root))
    return ["--chain", str(chain), "--key", str(key), "--root", str(root)]


class Flood:
    """One running C{flood.py} process."""

    def __init__(self, port: int, files: list[str], mode: str) -> None:
        self._process = subprocess.Popen(
            [sys.executable, str(FLOOD_SCRIPT), "--port", str(port), "--mode", mode, *files],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert self._process.stdout is not None
        ready, _, _ = select.select([self._process.stdout], [], [], READY_TIMEOUT)
        if not ready or not self._process.stdout.readline():
            self.stop()
            raise RuntimeError(f"the {mode} flood did not start")

    def stop(self) -> dict[str, Any]:
        """End the flood; its counts."""
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.close()
        try:
            self._process.wait(30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        lines = self._process.stdout.read().splitlines()
        self._process.stdout.close()
        return json.loads(lines[-1]) if lines else {"exit_code": self._process.returncode}


async def pings(client: DataPlaneClient, count: int) -> list[float]:
    """Milliseconds per C{ping}, C{count} of them one after the other."""
    samples = []
    for _ in range(count):
        began = time.perf_counter()
        await client.call("ping")
        samples.append((time.perf_counter() - began) * 1000.0)
    return samples


async def sleep(reactor: Any, seconds: float) -> None:
    """Let C{seconds} pass on the reactor."""
    from twisted.internet.task import deferLater  # noqa: PLC0415

    await deferLater(reactor, seconds, lambda: None)


async def fairness_phase(
    reactor: Any,
    port: int,
    server_lag: Callable[[], dict[str, float]],
    victim: DataPlaneClient,
    flooder: AgentCredentials,
    scratch: Path,
    count: int,
) -> dict[str, Any]:
    """The victim's ping latency unloaded and under each flood; the floods' rates."""
    files = write_credentials(flooder, scratch / "flooder")
    await pings(victim, min(count, 200))  # warm up
    server_lag()
    report: dict[str, Any] = {
        "unloaded": {**summary(await pings(victim, count)), "server_reactor_lag": server_lag()}
    }
    for mode in FLOOD_MODES:
        flood = Flood(port, files, mode)
        try:
            await sleep(reactor, WARM_UP_SECONDS)
            server_lag()
            samples = await pings(victim, count)
            lag = server_lag()
        finally:
            counts = flood.stop()
        seconds = counts.get("seconds") or 1.0
        name = (
            "busy_machine_reference" if mode == "busy" else f"under_{mode.replace('-', '_')}_flood"
        )
        report[name] = {**summary(samples), "server_reactor_lag": lag}
        if mode != "busy":
            report[name]["flood_frames_answered_per_s"] = round(counts.get("answered", 0) / seconds)
    report["victim_pings"] = count
    return report
