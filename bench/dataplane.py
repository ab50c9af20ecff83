"""
Data-plane throughput and latency over mutual TLS 1.3 loopback, next to raw
TLS 1.3 and local-disk references measured in the same run.

    .venv/bin/python bench/dataplane.py [--rounds 3] [--chunks 48] [--window 8]
        [--io-threads 4] [--small-ops 1000] [--connections 64] [--duration 5]
        [--fairness-pings 2000] [--no-memory]

The server runs in a separate process (C{bench/dataplane_server.py}): the real
L{DataPlaneService} stack over a fresh store in a temporary directory, plus a
trivial raw-TLS message server on a second port with the same TLS options.
This process is the client, on the real reactor, with L{DataPlaneClient} for
the data plane and a minimal Twisted TLS protocol for the reference. All
certificates are ed25519 from one L{TestPKI}; every connection is TLS 1.3 with
client certificates.

Measured, MB = 10**6 bytes:

1. Per round (C{--rounds}, medians reported): C{--chunks} distinct random
   4 MiB chunks, C{--window} requests in flight on one connection:
   - raw TLS upload (4 MiB messages, each acknowledged) and download
     (4 MiB answers to small requests);
   - C{chunk_put} of the chunks (the store hashes and fsyncs each one) and
     C{chunk_get} of the same chunks (page cache warm, re-hashed by the
     server);
   - the disk reference: write, fsync, rename, fsync directory of the same
     bytes (C{svc.durable.write_file_atomically}), one at a time and
     C{min(window, io-threads)} at a time, the concurrency the store gets.
2. Latency, sequential, of C{head_file} and C{manifest_get} of a small file
   and of C{small_file_commit} (a new 4 KiB chunk's C{chunk_put} and the
   C{manifest_put} creating a file, pipelined: what a mount's close of a new
   small file waits for) (C{--small-ops} each, after a warm-up) next to a
   128-byte raw TLS echo.
3. Fairness (C{bench/fairness.py}): the first connection's C{ping} latency
   (C{--fairness-pings} sequential pings) on an idle server, then while an
   agent of another tenant floods its own connection from a process of its
   own (C{bench/flood.py}): 20,000 pipelined pings at a time, then
   C{manifest_put} maps as expensive to decode as the operation allows.
4. C{--connections} connections of distinct agents of one tenant, each
   looping C{head_file}/C{manifest_get} on its own file for C{--duration}
   seconds (one request in flight per connection); the reference is the same
   number of raw TLS connections looping the echo.
5. The memory figures of a hostile agent (C{bench/hostile.py}, section
   C{answer_memory}, run after this server has stopped, against a real
   C{twist svc-dataplane}): the server's RSS at base, at the peak of one
   agent's flood of unread C{chunk_get}s on all its connections, and after
   they closed (C{--no-memory} skips it).

CPU use of client and server per phase (fraction of one core) is reported
too: client and server share the machine's cores. Prints one JSON object;
temporary files and the server process are removed at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import select
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.interfaces import IOpenSSLClientConnectionCreator
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.internet.task import react
from twisted.python.failure import Failure

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dataplane_server import (
    ACK,
    DATA,
    DOWNLOAD,
    ECHO,
    HEADER,
    ROOT_CERT,
    SERVER_CERT,
    SERVER_KEY,
    UPLOAD,
    MessageReader,
    message,
)
from fairness import fairness_phase

from svc.dataplane_client.client import DataPlaneClient, connect_dataplane
from svc.durable import write_file_atomically
from svc.frame_tls import frame_tls_factory, write_frame
from svc.pki.pem import cert_to_pem, key_to_pem
from svc.store.chunks import chunk_hash
from svc.testing.pki import AgentCredentials, TestPKI

T = TypeVar("T")

MIB = 1024 * 1024
CHUNK_SIZE = 4 * MIB
TENANT = "tenant-a"
FLOOD_TENANT = "tenant-b"
SMALL_FILE_SIZE = 4096
ECHO_BODY = b"x" * 128
TARGET_RATIO = 0.7
SERVER_SCRIPT = Path(__file__).resolve().parent / "dataplane_server.py"
HOSTILE_SCRIPT = Path(__file__).resolve().parent / "hostile.py"
READY_TIMEOUT = 60.0
STOP_TIMEOUT = 15.0
WARM_UP_CALLS = 50
WARM_UP_SECONDS = 0.5


# -- the server process ------------------------------------------------------


class ServerProcess:
    """The child running C{dataplane_server.py}; ends when its stdin closes."""

    def __init__(self, pki_dir: Path, root: Path, io_threads: int) -> None:
        """Start the child and wait for its ports."""
        self._process = subprocess.Popen(
            [
                sys.executable,
                str(SERVER_SCRIPT),
                "--pki",
                str(pki_dir),
                "--root",
                str(root),
                "--io-threads",
                str(io_threads),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert self._process.stdout is not None
        ready, _, _ = select.select([self._process.stdout], [], [], READY_TIMEOUT)
        line = self._process.stdout.readline() if ready else b""
        if not line:
            self.stop()
            raise RuntimeError("the data-plane server did not start")
        announce = json.loads(line)
        self.dataplane_port: int = announce["dataplane_port"]
        self.raw_port: int = announce["raw_port"]
        self._ticks = os.sysconf("SC_CLK_TCK")

    def lag(self) -> dict[str, float]:
        """The server reactor's lag since the previous call (p50, p99, max ms)."""
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.write(b"lag\n")
        self._process.stdin.flush()
        return dict(json.loads(self._process.stdout.readline()))

    def cpu_seconds(self) -> float:
        """User plus system CPU time of the child so far (all its threads)."""
        fields = Path(f"/proc/{self._process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / self._ticks

    def stop(self) -> dict[str, Any]:
        """
        Close its stdin, wait for it to finish (killing it if it does not);
        returns its exit code and its last JSON line.
        """
        if self._process.stdin is not None and not self._process.stdin.closed:
            self._process.stdin.close()
        try:
            self._process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        assert self._process.stdout is not None
        lines = self._process.stdout.read().splitlines()
        self._process.stdout.close()
        farewell = json.loads(lines[-1]) if lines else {}
        return {"exit_code": self._process.returncode, **farewell}


class CpuMeter:
    """CPU used by this process and the server over one phase."""

    def __init__(self, server: ServerProcess) -> None:
        self._server = server
        self.phases: dict[str, list[dict[str, float]]] = {}

    async def measure(self, phase: str, work: Awaitable[T]) -> T:
        """Run C{work} and record both processes' CPU use per wall second."""
        wall, client, server = time.perf_counter(), time.process_time(), self._server.cpu_seconds()
        result = await work
        elapsed = time.perf_counter() - wall
        self.phases.setdefault(phase, []).append(
            {
                "client": (time.process_time() - client) / elapsed,
                "server": (self._server.cpu_seconds() - server) / elapsed,
            }
        )
        return result

    def summary(self) -> dict[str, dict[str, float]]:
        """Median client and server CPU (fraction of one core) per phase."""
        return {
            phase: {
                side: round(statistics.median(sample[side] for sample in samples), 2)
                for side in ("client", "server")
            }
            for phase, samples in self.phases.items()
        }


# -- the raw TLS reference client -------------------------------------------


class RawClient(Protocol):
    """
    The client of C{dataplane_server.RawServerProtocol}: requests are
    answered in order; large answer bodies are counted, not kept.
    """

    def __init__(self) -> None:
        self._waiting: deque[Deferred[bytes]] = deque()
        self._reader = MessageReader(self._answer, frozenset({DATA}))
        self.connected_once: Deferred[None] = Deferred()

    def connectionMade(self) -> None:
        self.connected_once.callback(None)

    def _tls(self) -> Any:
        return self.transport

    def request(self, parts: Sequence[bytes]) -> Deferred[bytes]:
        """Send one message (its buffers); fires with the answer's body."""
        answer: Deferred[bytes] = Deferred()
        self._waiting.append(answer)
        write_frame(self._tls(), list(parts))
        return answer

    def upload(self, data: bytes) -> Deferred[bytes]:
        """Send C{data} as one message; fires when it was acknowledged."""
        return self.request([HEADER.pack(UPLOAD, len(data)), data])

    def download(self, size: int) -> Deferred[bytes]:
        """Ask for C{size} bytes; fires when they all arrived."""
        return self.request([message(DOWNLOAD, struct.pack(">I", size))])

    def echo(self, body: bytes) -> Deferred[bytes]:
        """Send C{body}; fires with it once echoed."""
        return self.request([message(ECHO, body)])

    def dataReceived(self, data: bytes) -> None:
        self._reader.feed(data)

    def _answer(self, kind: bytes, length: int, body: bytes) -> None:
        if kind not in (ACK, DATA, ECHO):
            raise ValueError(f"unexpected raw answer {kind!r}")
        self._waiting.popleft().callback(body)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        waiting, self._waiting = self._waiting, deque()
        for answer in waiting:
            answer.errback(reason)

    def close(self) -> None:
        """Close TLS and the connection."""
        self._tls().loseConnection()


async def connect_raw(reactor: Any, port: int, tls: IOpenSSLClientConnectionCreator) -> RawClient:
    """A raw TLS connection whose handshake has completed (one echo done)."""
    protocol = RawClient()
    wrapped: Any = Factory.forProtocol(lambda: protocol)
    endpoint: Any = TCP4ClientEndpoint(reactor, "127.0.0.1", port)
    await endpoint.connect(frame_tls_factory(tls, is_client=True, wrapped=wrapped, clock=reactor))
    await protocol.echo(ECHO_BODY)
    return protocol


# -- measuring ---------------------------------------------------------------


def _defer(coroutine: Awaitable[T]) -> Deferred[T]:
    async def run() -> T:
        return await coroutine

    return Deferred.fromCoroutine(run())


async def pipelined(count: int, window: int, start: Callable[[int], Awaitable[object]]) -> float:
    """
    Run C{start(0)} ... C{start(count - 1)} with at most C{window} in flight.

    @return: the elapsed wall time in seconds.
    """
    indices = iter(range(count))

    async def lane() -> None:
        for index in indices:
            await start(index)

    began = time.perf_counter()
    await gatherResults([_defer(lane()) for _ in range(min(window, count))])
    return time.perf_counter() - began


async def closed_loop(
    lanes: Sequence[Callable[[int], Awaitable[object]]], duration: float
) -> float:
    """
    Each lane calls its function (with its running count) in a loop, one call
    in flight, until C{duration} seconds passed.

    @return: completed calls per second over the whole run.
    """
    done = 0
    deadline = time.perf_counter() + duration

    async def loop(call: Callable[[int], Awaitable[object]]) -> None:
        nonlocal done
        n = 0
        while time.perf_counter() < deadline:
            await call(n)
            n += 1
        done += n

    began = time.perf_counter()
    await gatherResults([_defer(loop(lane)) for lane in lanes])
    return done / (time.perf_counter() - began)


def percentile(samples: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def latency_summary(samples: Sequence[float]) -> dict[str, float]:
    """p50 and p99 in milliseconds."""
    return {
        "p50_ms": round(percentile(samples, 0.50), 3),
        "p99_ms": round(percentile(samples, 0.99), 3),
    }


def mb_per_s(total_bytes: int, seconds: float) -> float:
    """10**6 bytes per second."""
    return total_bytes / seconds / 1e6


def disk_reference(directory: Path, chunks: Sequence[tuple[str, bytes]], threads: int) -> float:
    """
    Seconds to write every chunk durably (temp file, fsync, rename, fsync
    directory) into an empty C{directory}, C{threads} at a time; the files
    are removed afterwards.
    """
    directory.mkdir()
    began = time.perf_counter()
    if threads == 1:
        for name, data in chunks:
            write_file_atomically(directory / name, data)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda item: write_file_atomically(directory / item[0], item[1]), chunks))
    elapsed = time.perf_counter() - began
    shutil.rmtree(directory)
    return elapsed


def random_chunks(count: int) -> list[tuple[str, bytes]]:
    """C{count} distinct random chunks of L{CHUNK_SIZE} with their hashes."""
    chunks = []
    for _ in range(count):
        data = os.urandom(CHUNK_SIZE)
        chunks.append((chunk_hash(data), data))
    return chunks


# -- the data-plane side -----------------------------------------------------


async def connect_agent(
    reactor: Any, port: int, agent_id: str, credentials: AgentCredentials
) -> tuple[DataPlaneClient, str]:
    """
    An admitted connection of agent C{agent_id}, with a small file committed
    on its disk; returns the client and the file's path.
    """
    client = await connect_dataplane(
        reactor, ("127.0.0.1", port), credentials.client_options(), call_timeout=300.0
    )
    path = f"/{agent_id}/small.bin"
    data = os.urandom(SMALL_FILE_SIZE)
    name = chunk_hash(data)
    await client.call("chunk_put", {"hash": name}, data)
    reply = await client.call(
        "manifest_put",
        {
            "path": path,
            "expected_version": 0,
            "chunks": [[name, len(data)]],
            "size": len(data),
            "mode": 0o644,
            "mtime_ns": time.time_ns(),
        },
    )
    if not reply.payload.get("created"):
        raise RuntimeError(f"{path} not created: {dict(reply.payload)}")
    return client, path


def small_op(client: DataPlaneClient, path: str, op: str) -> Callable[[], Deferred[Any]]:
    """A call of C{op} (head_file or manifest_get) on C{path}."""
    payload: Mapping[str, object] = {"path": path}
    return lambda: client.call(op, payload)


def small_commit(client: DataPlaneClient, directory: str) -> Callable[[], Deferred[Any]]:
    """
    What closing a new small file costs the mount: C{chunk_put} of a new
    C{SMALL_FILE_SIZE} chunk and the C{manifest_put} creating a new file,
    sent back to back on the connection (the server runs the put after the
    chunk is stored); fires when both are answered.
    """
    serial = iter(range(1 << 62))

    def call() -> Deferred[Any]:
        data = os.urandom(SMALL_FILE_SIZE)
        name = chunk_hash(data)
        put = client.call("chunk_put", {"hash": name}, data)
        created = client.call(
            "manifest_put",
            {
                "path": f"{directory}/c{next(serial)}",
                "expected_version": 0,
                "chunks": [[name, len(data)]],
                "size": len(data),
                "mode": 0o644,
                "mtime_ns": time.time_ns(),
            },
        )
        return gatherResults([put, created])

    return call


# -- the run -----------------------------------------------------------------


def write_pki(pki: TestPKI, directory: Path) -> None:
    """The server leaf, its key and the org root, as the server reads them."""
    directory.mkdir()
    (directory / SERVER_CERT).write_bytes(cert_to_pem(pki.server.cert))
    (directory / SERVER_KEY).write_bytes(key_to_pem(pki.server.key))
    (directory / ROOT_CERT).write_bytes(cert_to_pem(pki.root.cert))


async def throughput_rounds(
    options: argparse.Namespace,
    client: DataPlaneClient,
    raw: RawClient,
    meter: CpuMeter,
    scratch: Path,
) -> dict[str, list[float]]:
    """
    The MB/s samples of every contender, one per round. Each pair (ours and
    its reference) runs back to back, in alternating order from round to
    round, so drift on a noisy machine hits both alike.
    """
    samples: dict[str, list[float]] = {}
    window = options.window
    disk_threads = min(window, options.io_threads)
    for round_number in range(options.rounds):
        chunks = random_chunks(options.chunks)
        count, total = len(chunks), len(chunks) * CHUNK_SIZE

        async def put(index: int, chunks: list[tuple[str, bytes]] = chunks) -> None:
            name, data = chunks[index]
            reply = await client.call("chunk_put", {"hash": name}, data)
            if reply.payload.get("hash") != name:
                raise RuntimeError(f"chunk_put answered {dict(reply.payload)}")

        async def get(index: int, chunks: list[tuple[str, bytes]] = chunks) -> None:
            # Timed: only the length is checked here; every byte is compared
            # after the timed phase (verify_gets), so the reference and ours
            # do the same work on the client while the clock runs.
            name, data = chunks[index]
            reply = await client.call("chunk_get", {"hash": name})
            if len(reply.raw) != len(data):
                raise RuntimeError(f"chunk_get returned {len(reply.raw)} bytes for {name}")

        async def upload(index: int, chunks: list[tuple[str, bytes]] = chunks) -> None:
            await raw.upload(chunks[index][1])

        async def download(index: int) -> None:
            await raw.download(CHUNK_SIZE)

        pairs: list[list[tuple[str, Callable[[int], Awaitable[None]]]]] = [
            [("raw_tls_upload", upload), ("chunk_put", put)],
            [("raw_tls_download", download), ("chunk_get", get)],
        ]
        for pair_number, pair in enumerate(pairs):
            if round_number % 2:
                pair.reverse()
            for name, start in pair:
                seconds = await meter.measure(name, pipelined(count, window, start))
                samples.setdefault(name, []).append(mb_per_s(total, seconds))
                if name == "chunk_get":
                    await verify_gets(client, chunks)
            if pair_number == 0:
                for name, threads in (("disk_sequential", 1), ("disk_parallel", disk_threads)):
                    directory = scratch / f"{name}-{round_number}"
                    seconds = disk_reference(directory, chunks, threads)
                    samples.setdefault(name, []).append(mb_per_s(total, seconds))
    return samples


async def verify_gets(client: DataPlaneClient, chunks: Sequence[tuple[str, bytes]]) -> None:
    """Untimed: fetch every chunk again and compare all its bytes."""
    for name, data in chunks:
        reply = await client.call("chunk_get", {"hash": name})
        if reply.raw != data:
            raise RuntimeError(f"chunk_get returned other bytes for {name}")


async def latency_phase(
    options: argparse.Namespace,
    client: DataPlaneClient,
    path: str,
    raw: RawClient,
    meter: CpuMeter,
) -> dict[str, list[float]]:
    """
    Milliseconds per call of C{head_file}, C{manifest_get}, C{small_file_commit}
    and the raw echo,
    interleaved (one of each per turn) so all three see the same machine.
    """
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "head_file": small_op(client, path, "head_file"),
        "manifest_get": small_op(client, path, "manifest_get"),
        "small_file_commit": small_commit(client, path.rpartition("/")[0]),
        "raw_tls_echo": lambda: raw.echo(ECHO_BODY),
    }

    async def turns(count: int) -> dict[str, list[float]]:
        samples: dict[str, list[float]] = {name: [] for name in calls}
        for _ in range(count):
            for name, call in calls.items():
                began = time.perf_counter()
                await call()
                samples[name].append((time.perf_counter() - began) * 1000.0)
        return samples

    await turns(WARM_UP_CALLS)
    return await meter.measure("latency", turns(options.small_ops))


async def concurrency_phase(
    options: argparse.Namespace,
    clients: Sequence[tuple[DataPlaneClient, str]],
    raws: Sequence[RawClient],
    meter: CpuMeter,
) -> dict[str, list[float]]:
    """
    Ops/s of every connection looping small operations (alternately
    C{head_file} and C{manifest_get} of its own file), and of as many raw
    connections looping the echo; C{--loop-repeats} times each, alternating.
    """
    ops = ("head_file", "manifest_get")

    def lane(client: DataPlaneClient, path: str) -> Callable[[int], Awaitable[object]]:
        payload = {"path": path}
        return lambda n: client.call(ops[n % 2], payload)

    def raw_lane(raw: RawClient) -> Callable[[int], Awaitable[object]]:
        return lambda n: raw.echo(ECHO_BODY)

    loops = {
        "dataplane": [lane(client, path) for client, path in clients],
        "raw_tls_echo": [raw_lane(raw) for raw in raws],
    }
    samples: dict[str, list[float]] = {name: [] for name in loops}
    for lanes in loops.values():
        await closed_loop(lanes, WARM_UP_SECONDS)
    for _ in range(options.loop_repeats):
        for name, lanes in loops.items():
            ops_s = await meter.measure(f"concurrent_{name}", closed_loop(lanes, options.duration))
            samples[name].append(ops_s)
    return samples


async def run(reactor: Any, options: argparse.Namespace) -> None:
    """Start the server, measure everything, print the JSON, clean up."""
    began = time.perf_counter()
    scratch = Path(tempfile.mkdtemp(prefix="svc-bench-dataplane-"))
    server: ServerProcess | None = None
    clients: list[tuple[DataPlaneClient, str]] = []
    raws: list[RawClient] = []
    try:
        pki = TestPKI.build(tenants=(TENANT, FLOOD_TENANT))
        write_pki(pki, scratch / "pki")
        (scratch / "server").mkdir()
        server = ServerProcess(scratch / "pki", scratch / "server", options.io_threads)
        meter = CpuMeter(server)
        agents = {f"agent-{i}": pki.agent(TENANT, f"agent-{i}") for i in range(options.connections)}

        def dial(agent_id: str) -> Deferred[tuple[DataPlaneClient, str]]:
            assert server is not None
            return _defer(connect_agent(reactor, server.dataplane_port, agent_id, agents[agent_id]))

        def dial_raw(agent_id: str) -> Deferred[RawClient]:
            assert server is not None
            tls = agents[agent_id].client_options()
            return _defer(connect_raw(reactor, server.raw_port, tls))

        first = next(iter(agents))
        clients.append(await dial(first))
        raws.append(await dial_raw(first))
        (client, path), raw = clients[0], raws[0]

        throughput = await throughput_rounds(options, client, raw, meter, scratch)
        latencies = await latency_phase(options, client, path, raw, meter)

        fairness = await fairness_phase(
            reactor,
            server.dataplane_port,
            server.lag,
            client,
            pki.agent(FLOOD_TENANT, "flooder"),
            scratch,
            options.fairness_pings,
        )

        others = list(agents)[1:]
        clients.extend(await gatherResults([dial(agent_id) for agent_id in others]))
        raws.extend(await gatherResults([dial_raw(agent_id) for agent_id in others]))
        concurrent = await concurrency_phase(options, clients, raws, meter)

        await gatherResults([client.close() for client, _ in clients])
        clients = []
        for raw in raws:
            raw.close()
        raws = []
        stopped, server = server.stop(), None
        report = build_report(options, throughput, latencies, concurrent, meter)
        report["fairness"] = fairness
        if options.memory:
            report["hostile_memory"] = hostile_memory()
        report["server"] = stopped
        report["elapsed_s"] = round(time.perf_counter() - began, 1)
        print(json.dumps(report))
    finally:
        for raw in raws:
            raw.close()
        for client, _ in clients:
            client.close()
        if server is not None:
            server.stop()
        shutil.rmtree(scratch, ignore_errors=True)


def hostile_memory() -> dict[str, Any]:
    """
    The memory figures of issue 34, item 4: C{bench/hostile.py}'s
    C{answer_memory} section, run as its own process against a real
    C{twist svc-dataplane} (after this benchmark's server has stopped).
    """
    done = subprocess.run(
        [sys.executable, str(HOSTILE_SCRIPT), "--sections", "answer_memory"],
        capture_output=True,
        check=True,
        timeout=900,
    )
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def build_report(
    options: argparse.Namespace,
    samples: dict[str, list[float]],
    latencies: dict[str, list[float]],
    concurrent: dict[str, list[float]],
    meter: CpuMeter,
) -> dict[str, Any]:
    """The JSON object: medians, references, ratios, machine facts."""
    median = {key: statistics.median(values) for key, values in samples.items()}
    concurrent_ops = statistics.median(concurrent["dataplane"])
    concurrent_raw = statistics.median(concurrent["raw_tls_echo"])
    put_ceiling = min(median["raw_tls_upload"], median["disk_parallel"])
    return {
        "benchmark": "dataplane",
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "parameters": {
            "chunk_mib": CHUNK_SIZE // MIB,
            "chunks_per_round": options.chunks,
            "rounds": options.rounds,
            "window": options.window,
            "io_threads": options.io_threads,
            "disk_parallel_threads": min(options.window, options.io_threads),
            "small_ops": options.small_ops,
            "connections": options.connections,
            "duration_s": options.duration,
            "loop_repeats": options.loop_repeats,
        },
        "raw_tls_upload_mb_s": round(median["raw_tls_upload"], 1),
        "raw_tls_download_mb_s": round(median["raw_tls_download"], 1),
        "chunk_put_mb_s": round(median["chunk_put"], 1),
        "chunk_get_mb_s": round(median["chunk_get"], 1),
        "disk_write_fsync_rename_mb_s": round(median["disk_sequential"], 1),
        "disk_write_fsync_rename_parallel_mb_s": round(median["disk_parallel"], 1),
        "target_ratio": TARGET_RATIO,
        "chunk_put_ratio_vs_raw_tls": round(median["chunk_put"] / median["raw_tls_upload"], 3),
        "chunk_get_ratio_vs_raw_tls": round(median["chunk_get"] / median["raw_tls_download"], 3),
        "chunk_put_ratio_vs_disk_parallel": round(median["chunk_put"] / median["disk_parallel"], 3),
        "chunk_put_ceiling_mb_s": round(put_ceiling, 1),
        "chunk_put_ratio_vs_ceiling": round(median["chunk_put"] / put_ceiling, 3),
        "latency": {name: latency_summary(values) for name, values in latencies.items()},
        "concurrent": {
            "connections": options.connections,
            "dataplane_ops_s": round(concurrent_ops),
            "raw_tls_echo_ops_s": round(concurrent_raw),
            "ratio": round(concurrent_ops / concurrent_raw, 3),
            "samples_ops_s": {k: [round(v) for v in values] for k, values in concurrent.items()},
        },
        "cpu_cores_used": meter.summary(),
        "samples_mb_s": {key: [round(v, 1) for v in values] for key, values in samples.items()},
    }


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--chunks", type=int, default=48, help="4 MiB chunks per round")
    parser.add_argument("--window", type=int, default=8, help="requests in flight")
    parser.add_argument("--io-threads", type=int, default=4, help="server chunk I/O threads")
    parser.add_argument("--small-ops", type=int, default=1000)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per closed loop")
    parser.add_argument("--loop-repeats", type=int, default=2, help="closed loops of each kind")
    parser.add_argument(
        "--fairness-pings", type=int, default=2000, help="victim pings per fairness state"
    )
    parser.add_argument(
        "--no-memory",
        dest="memory",
        action="store_false",
        help="skip the hostile memory figures (bench/hostile.py answer_memory)",
    )
    options = parser.parse_args(argv)
    if min(options.rounds, options.chunks, options.window, options.io_threads) < 1:
        parser.error("rounds, chunks, window and io-threads must be positive")
    if min(options.small_ops, options.connections, options.loop_repeats) < 1:
        parser.error("small-ops, connections and loop-repeats must be positive")
    if options.duration <= 0:
        parser.error("duration must be positive")
    return options


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark on the real reactor."""
    options = parse(sys.argv[1:] if argv is None else argv)
    react(lambda reactor: Deferred.fromCoroutine(run(reactor, options)))


if __name__ == "__main__":
    main()
