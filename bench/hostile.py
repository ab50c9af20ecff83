"""
The data-plane server under hostile peers: what they make it hold, and what
its other tenants see meanwhile.

    .venv/bin/python bench/hostile.py [--sections answer_memory]
        [--connections 16] [--requests 32] [--chunk-mib 16] [--flood-seconds 10]
        [--settle-seconds 6] [--io-threads 4]

One real C{twist svc-dataplane} process (L{tests.dataplane_harness}) on
loopback, a fresh state directory and PKI in a temporary directory; its
resident set is read from C{/proc/<pid>/status} (C{VmRSS}). The hostile
peers are blocking Python sockets (L{tests.hostile_clients}), so they
misbehave exactly as told; the well-behaved tenant is a blocking client
doing one call at a time.

Sections (C{--sections}, comma-separated, all by default), each a key of
the JSON object:

  - C{answer_memory}: one agent opens C{--connections} connections (all an
    agent may hold), sends C{--requests} pipelined C{chunk_get}s of a
    C{--chunk-mib} MiB chunk on each, and never reads. Reported: the
    server's RSS at base (settled, before), its peak during the flood, and
    after the flood's connections closed (settled); and the latency of
    another tenant's C{chunk_get} (1 MiB) plus C{ping}, measured the same way
    with no flood (the reference) and during it.

A new section is a function C{(Context) -> dict} added to L{SECTIONS}: it
gets the running server and may use the helpers here.

Prints one JSON object; the server process and temporary files are removed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from svc.dataplane.answer_budget import AnswerLimits
from tests.dataplane_harness import DataPlaneProcess, standard_server
from tests.hostile_clients import BlockingClient, Flooder, close_all, put_file, rss_bytes

MIB = 1024 * 1024


class Context:
    """What every section gets: the options, the server process, its PKI."""

    def __init__(self, options: argparse.Namespace, server: DataPlaneProcess) -> None:
        self.options = options
        self.server = server
        assert server.process is not None
        self.pid = server.process.pid

    def client(self, tenant: str, agent: str) -> BlockingClient:
        """A well-behaved blocking connection of C{tenant}/C{agent}."""
        pki = self.server.pki
        return BlockingClient(self.server.frame_address, pki.ssl_context(pki.agent(tenant, agent)))

    def rss_mib(self) -> float:
        """The server's resident set now, in MiB."""
        return rss_bytes(self.pid) / MIB

    def settled_rss_mib(self, seconds: float) -> float:
        """The least of a few RSS samples after C{seconds} without load."""
        time.sleep(seconds)
        samples = []
        for _ in range(5):
            samples.append(self.rss_mib())
            time.sleep(0.1)
        return min(samples)


def latency_summary(samples: Sequence[float]) -> dict[str, float]:
    """Milliseconds: median, 99th percentile (nearest rank), max, and the count."""
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, max(0, round(0.99 * len(ordered)) - 1))]
    return {
        "p50_ms": round(statistics.median(ordered) * 1000, 2),
        "p99_ms": round(p99 * 1000, 2),
        "max_ms": round(ordered[-1] * 1000, 2),
        "calls": len(ordered),
    }


def calls_for(
    seconds: float, call: Callable[[], object], during: Callable[[], object] | None = None
) -> list[float]:
    """Run C{call} back to back for C{seconds} (C{during} after each); each one's duration."""
    latencies = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.monotonic()
        call()
        latencies.append(time.monotonic() - started)
        if during is not None:
            during()
    return latencies


def answer_memory(context: Context) -> dict[str, Any]:
    """See the module docstring."""
    options = context.options
    setup = context.client("tenant-a", "flood-1")
    big = put_file(setup, "/flood-1/big", os.urandom(options.chunk_mib * MIB))
    setup.close()
    calm = context.client("tenant-b", "calm-1")
    small_data = os.urandom(MIB)
    small = put_file(calm, "/calm-1/small", small_data)

    def tenant_call() -> None:
        answer = calm.call("chunk_get", hash=small)
        if len(answer.raw) != len(small_data):
            raise RuntimeError("the other tenant got a wrong answer")
        calm.call("ping")

    reference = calls_for(min(options.flood_seconds, 5.0), tenant_call)
    base = context.settled_rss_mib(options.settle_seconds)

    pki = context.server.pki
    tls = pki.ssl_context(pki.agent("tenant-a", "flood-1"))
    flooders = [Flooder(context.server.frame_address, tls) for _ in range(options.connections)]
    try:
        for flooder in flooders:
            flooder.send("chunk_get", options.requests, hash=big)
        peak = [base]

        def sample() -> None:
            peak[0] = max(peak[0], context.rss_mib())

        during = calls_for(options.flood_seconds, tenant_call, sample)
        held = context.rss_mib()
    finally:
        close_all(flooders)
    after = context.settled_rss_mib(options.settle_seconds)
    calm.call("ping")
    calm.close()
    limits = AnswerLimits()
    return {
        "parameters": {
            "connections": options.connections,
            "requests_per_connection": options.requests,
            "chunk_mib": options.chunk_mib,
            "flood_s": options.flood_seconds,
            "settle_s": options.settle_seconds,
        },
        "answer_budgets_mib": {
            "per_connection": limits.per_connection // MIB,
            "per_agent": limits.per_agent // MIB,
            "server": limits.server // MIB,
        },
        "rss_mib": {
            "base": round(base, 1),
            "peak_during_flood": round(peak[0], 1),
            "at_end_of_flood": round(held, 1),
            "growth": round(peak[0] - base, 1),
            "after_close": round(after, 1),
            "after_close_above_base": round(after - base, 1),
        },
        "other_tenant_latency": {
            "call": "chunk_get of 1 MiB, then ping",
            "no_flood": latency_summary(reference),
            "during_flood": latency_summary(during),
        },
    }


SECTIONS: dict[str, Callable[[Context], dict[str, Any]]] = {
    "answer_memory": answer_memory,
}
"""The sections, in the order they run."""


def run(options: argparse.Namespace) -> dict[str, Any]:
    """Start the server, run the sections, stop it; the report."""
    scratch = Path(tempfile.mkdtemp(prefix="svc-bench-hostile-"))
    server = standard_server(scratch / "server", {"SVC_IO_THREADS": str(options.io_threads)})
    report: dict[str, Any] = {
        "benchmark": "hostile",
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "io_threads": options.io_threads,
    }
    try:
        server.start()
        context = Context(options, server)
        for name in options.sections:
            report[name] = SECTIONS[name](context)
    finally:
        report["server_exit"] = server.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return report


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated")
    parser.add_argument("--connections", type=int, default=16, help="flooding connections")
    parser.add_argument("--requests", type=int, default=32, help="chunk_gets per connection")
    parser.add_argument("--chunk-mib", type=int, default=16, help="size of the flooded chunk")
    parser.add_argument("--flood-seconds", type=float, default=10.0)
    parser.add_argument("--settle-seconds", type=float, default=6.0, help="wait before RSS reads")
    parser.add_argument("--io-threads", type=int, default=4, help="server chunk I/O threads")
    options = parser.parse_args(argv)
    options.sections = [name for name in options.sections.split(",") if name]
    unknown = [name for name in options.sections if name not in SECTIONS]
    if unknown:
        parser.error(f"unknown sections {unknown}; known: {list(SECTIONS)}")
    if min(options.connections, options.requests, options.io_threads) < 1:
        parser.error("connections, requests and io-threads must be positive")
    if not 1 <= options.chunk_mib <= 16:
        parser.error("chunk-mib must be 1 to 16")
    if options.flood_seconds <= 0 or options.settle_seconds < 0:
        parser.error("flood-seconds must be positive, settle-seconds not negative")
    return options


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark and print its JSON object."""
    options = parse(sys.argv[1:] if argv is None else argv)
    print(json.dumps(run(options), indent=2))


if __name__ == "__main__":
    main()
