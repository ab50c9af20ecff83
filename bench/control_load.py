"""
The second and third processes of C{bench/control.py}.

    .venv/bin/python bench/control_load.py load --port P --path /healthz
        [--method GET] [--concurrency 16] [--duration 5] [--tokens-file F]
    .venv/bin/python bench/control_load.py serve-bare --port P

C{load} is the load generator: C{--concurrency} threads, each with one
persistent HTTP/1.1 connection to 127.0.0.1 (C{http.client}), one request
in flight per thread. Without C{--tokens-file} every thread repeats the
request for C{--duration} seconds; with it, each line of the file is one
enroll token and every token is sent once as C{Authorization: Bearer}
(threads take them from a shared queue until none is left). Prints one JSON
object: requests, statuses, elapsed seconds, requests per second, latency
percentiles (milliseconds, client side, connect excluded) and this process's
CPU use, so a load generator that is itself the bottleneck shows.

C{serve-bare} is the reference server: a bare Klein app with one route,
C{GET /healthz} answering C{{"status": "ok"}} as the control plane does,
on the real reactor, in a plain C{twisted.web} C{Site}. It prints C{ready}
once listening.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import queue
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from klein import Klein
from twisted.internet import reactor as _reactor
from twisted.web.server import Request, Site

reactor: Any = _reactor


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile of already sorted values (0 when empty)."""
    if not sorted_values:
        return 0.0
    rank = max(1, min(len(sorted_values), round(fraction * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


def read_tokens(path: str | None) -> queue.SimpleQueue[str] | None:
    """The non-empty lines of C{path} as a queue (L{None} without a path)."""
    if not path:
        return None
    tokens: queue.SimpleQueue[str] = queue.SimpleQueue()
    with open(path, encoding="ascii") as lines:
        for line in lines:
            if line.strip():
                tokens.put(line.strip())
    return tokens


def summary(
    latencies: list[float], statuses: Counter[int], errors: int, elapsed: float, cpu: float
) -> dict[str, Any]:
    """The JSON-ready result of one load run."""
    latencies.sort()
    return {
        "requests": len(latencies),
        "statuses": {str(code): count for code, count in sorted(statuses.items())},
        "connection_errors": errors,
        "elapsed_s": round(elapsed, 3),
        "rps": round(len(latencies) / elapsed, 1) if elapsed else 0.0,
        "p50_ms": round(percentile(latencies, 0.50) * 1000, 2),
        "p90_ms": round(percentile(latencies, 0.90) * 1000, 2),
        "p99_ms": round(percentile(latencies, 0.99) * 1000, 2),
        "max_ms": round(latencies[-1] * 1000, 2) if latencies else 0.0,
        "load_cpu_cores": round(cpu / elapsed, 2) if elapsed else 0.0,
    }


def run_load(args: argparse.Namespace) -> dict[str, Any]:
    """Drive the server; the summary as a JSON-ready dict."""
    tokens = read_tokens(args.tokens_file)
    latencies: list[list[float]] = [[] for _ in range(args.concurrency)]
    statuses: list[Counter[int]] = [Counter() for _ in range(args.concurrency)]
    errors: list[int] = [0] * args.concurrency
    start_barrier = threading.Barrier(args.concurrency + 1)
    deadline = [0.0]

    def worker(index: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", args.port, timeout=30)
        connection.connect()
        mine, counts = latencies[index], statuses[index]
        start_barrier.wait()
        while True:
            headers = {}
            if tokens is not None:
                try:
                    headers["Authorization"] = "Bearer " + tokens.get_nowait()
                except queue.Empty:
                    break
            elif time.perf_counter() >= deadline[0]:
                break
            began = time.perf_counter()
            try:
                connection.request(args.method, args.path, headers=headers)
                response = connection.getresponse()
                response.read()
            except (OSError, http.client.HTTPException):
                errors[index] += 1
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", args.port, timeout=30)
                continue
            mine.append(time.perf_counter() - began)
            counts[response.status] += 1
        connection.close()

    threads = [
        threading.Thread(target=worker, args=(index,), daemon=True)
        for index in range(args.concurrency)
    ]
    for thread in threads:
        thread.start()
    cpu_before = os.times()
    began = time.perf_counter()
    deadline[0] = began + args.duration
    start_barrier.wait()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    cpu_after = os.times()
    status_total: Counter[int] = Counter()
    for counts in statuses:
        status_total.update(counts)
    cpu = (cpu_after.user - cpu_before.user) + (cpu_after.system - cpu_before.system)
    result = summary(
        [value for values in latencies for value in values],
        status_total,
        sum(errors),
        elapsed,
        cpu,
    )
    return {"concurrency": args.concurrency, **result}


def serve_bare(port: int) -> None:
    """Serve the bare Klein app on 127.0.0.1:C{port} until killed."""
    app = Klein()

    @app.route("/healthz", methods=["GET"])
    def healthz(request: Request) -> bytes:
        request.setHeader(b"Content-Type", b"application/json")  # type: ignore[no-untyped-call]
        return b'{"status": "ok"}'

    site = Site(app.resource())  # type: ignore[no-untyped-call]
    site.noisy = False
    reactor.listenTCP(port, site, interface="127.0.0.1")
    reactor.callWhenRunning(lambda: print("ready", flush=True))
    reactor.run()


def main(argv: Sequence[str] | None = None) -> int:
    """C{load} or C{serve-bare}."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    load = commands.add_parser("load")
    load.add_argument("--port", type=int, required=True)
    load.add_argument("--path", default="/healthz")
    load.add_argument("--method", default="GET")
    load.add_argument("--concurrency", type=int, default=16)
    load.add_argument("--duration", type=float, default=5.0)
    load.add_argument("--tokens-file")
    bare = commands.add_parser("serve-bare")
    bare.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    if args.command == "serve-bare":
        serve_bare(args.port)
        return 0
    json.dump(run_load(args), sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
