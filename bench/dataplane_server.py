"""
The server process of C{bench/dataplane.py}: the real data-plane stack plus a
raw TLS 1.3 reference server, on loopback, in a process of its own.

    .venv/bin/python bench/dataplane_server.py --pki DIR --root DIR
        [--trust-domain svc.test] [--io-threads 4]

Builds what C{twist svc-dataplane} runs: a L{DataPlaneService} over a
L{StorageEngine} in C{--root} (real L{ThreadWorker}s: one per SQLite database
and a shared chunk I/O pool of C{--io-threads}), the audit sink appending to
C{<root>/audit.jsonl}, and a L{DataPlaneFactory} behind L{SwappableServerTLS}
with L{TLSAdmission}. The server leaf, its key and the org root are read from
C{--pki} (L{SERVER_CERT}, L{SERVER_KEY}, L{ROOT_CERT}, written by the parent).

Beside it, on a second port and with the same server TLS options (ed25519,
TLS 1.3 only, client certificate required), L{RawServerProtocol} speaks a
trivial message protocol (L{MessageReader}) so the parent can measure what
Twisted's TLS alone moves over loopback. It writes the way frame connections
do (L{svc.frame_tls}: unbuffered TLS, large bodies never joined),
so the reference is the best this TLS stack does, not a copying one.

Once both ports listen it prints one JSON line, C{{"dataplane_port": ...,
"raw_port": ...}}, and serves until its standard input closes; then it stops
gracefully and prints a last JSON line with the audit sink's counts. Each
line C{lag} on its standard input is answered with a JSON line of the
reactor's lag since the previous one (L{LagMeter}).
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.endpoints import TCP4ServerEndpoint
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.stdio import StandardIO
from twisted.internet.task import react
from twisted.python.failure import Failure

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from svc.audit.sink import JsonlAuditSink
from svc.dataplane.admission import SwappableServerTLS, TLSAdmission
from svc.dataplane.factory import DataPlaneFactory, ServerLimits, listen_dataplane
from svc.dataplane.service import DataPlaneService
from svc.dataplane.tap import SWITCH_INTERVAL
from svc.frame_tls import frame_tls_factory, write_frame
from svc.metrics import DataPlaneMetrics
from svc.pki.identity import DenyList
from svc.pki.pem import cert_from_pem, key_from_pem
from svc.pki.tls import server_tls_options
from svc.sessions import session_key
from svc.store.engine import StorageEngine, StorageRoots
from svc.worker import ThreadWorker

SERVER_CERT = "server.pem"
SERVER_KEY = "server.key"
ROOT_CERT = "root.pem"

MIB = 1024 * 1024

LAG_INTERVAL = 0.002
"""Seconds between the reactor-lag probes."""

HEADER = struct.Struct(">cI")
"""A raw-protocol message header: kind (one byte), then body length."""

UPLOAD = b"U"
"""Client to server: a body to swallow; answered by L{ACK}."""
ACK = b"A"
DOWNLOAD = b"D"
"""Client to server: a 4-byte size; answered by L{DATA} with that many bytes."""
DATA = b"R"
ECHO = b"E"
"""Either way: a small body, sent back unchanged by the server."""

MAX_DOWNLOAD = 16 * MIB
MAX_SMALL_BODY = 64 * 1024


class MessageReader:
    """
    Splits a byte stream into raw-protocol messages without copying large
    bodies: bodies of the kinds in C{counted} are only counted (their
    handler gets C{b""}), the others are collected.
    """

    def __init__(
        self, on_message: Callable[[bytes, int, bytes], None], counted: frozenset[bytes]
    ) -> None:
        """
        @param on_message: called with C{(kind, length, body)} per message.
        @param counted: kinds whose body is skipped rather than kept.
        """
        self._on_message = on_message
        self._counted = counted
        self._header = bytearray()
        self._kind = b""
        self._length = 0
        self._remaining = -1  # -1: reading a header
        self._body = bytearray()

    def feed(self, data: bytes) -> None:
        """Consume C{data}, calling the handler for every completed message."""
        view = memoryview(data)
        while view:
            if self._remaining < 0:
                need = HEADER.size - len(self._header)
                self._header += view[:need]
                view = view[need:]
                if len(self._header) < HEADER.size:
                    return
                kind, length = HEADER.unpack(self._header)
                self._header.clear()
                if kind not in self._counted and length > MAX_SMALL_BODY:
                    raise ValueError(f"{kind!r} body of {length} bytes is too large")
                self._kind, self._length, self._remaining = kind, length, length
            take = min(self._remaining, len(view))
            if self._kind not in self._counted:
                self._body += view[:take]
            view = view[take:]
            self._remaining -= take
            if self._remaining == 0:
                self._finish()

    def _finish(self) -> None:
        body = bytes(self._body)
        self._body.clear()
        self._remaining = -1
        self._on_message(self._kind, self._length, body)


def message(kind: bytes, body: bytes = b"") -> bytes:
    """The header of a message of C{kind} carrying C{body}, plus the body."""
    return HEADER.pack(kind, len(body)) + body


class RawServerProtocol(Protocol):
    """
    The raw TLS reference server: swallows uploads, serves downloads from one
    prebuilt random buffer, echoes small messages.
    """

    def __init__(self, payload: bytes) -> None:
        self._payload = payload
        self._reader = MessageReader(self._message, frozenset({UPLOAD}))

    def dataReceived(self, data: bytes) -> None:
        try:
            self._reader.feed(data)
        except ValueError:
            self._tls().abortConnection()

    def _tls(self) -> Any:
        return self.transport

    def _message(self, kind: bytes, length: int, body: bytes) -> None:
        transport = self._tls()
        if kind == UPLOAD:
            transport.write(HEADER.pack(ACK, 0))
        elif kind == DOWNLOAD and length == 4:
            (size,) = struct.unpack(">I", body)
            if size > MAX_DOWNLOAD:
                transport.abortConnection()
                return
            data = self._payload if size == len(self._payload) else self._payload[:size]
            write_frame(transport, [HEADER.pack(DATA, size), data])
        elif kind == ECHO:
            transport.write(message(ECHO, body))
        else:
            transport.abortConnection()


class _StdinWatcher(Protocol):
    """Fires C{closed} when the parent closes our standard input."""

    def __init__(self) -> None:
        self.closed: Deferred[None] = Deferred()

        self.lag: LagMeter | None = None
        self._line = b""

    def dataReceived(self, data: bytes) -> None:
        # Each line "lag" asks for the reactor lag seen since the last one.
        self._line += data
        while b"\n" in self._line:
            line, self._line = self._line.split(b"\n", 1)
            if line.strip() == b"lag" and self.lag is not None:
                sys.stdout.write(json.dumps(self.lag.take()) + "\n")
                sys.stdout.flush()

    def connectionLost(self, reason: Failure | None = None) -> None:
        if not self.closed.called:
            self.closed.callback(None)


class LagMeter:
    """
    How late the reactor runs a call due every L{LAG_INTERVAL} seconds: the
    longest any one turn held it, as every connection waiting behind that
    turn sees it (the fairness of issue 34, item 3, measured in the server).
    """

    def __init__(self, reactor: Any) -> None:
        self._reactor = reactor
        self._samples: list[float] = []
        self._due = 0.0

    def start(self) -> None:
        self._due = time.perf_counter() + LAG_INTERVAL
        self._reactor.callLater(LAG_INTERVAL, self._tick)

    def _tick(self) -> None:
        now = time.perf_counter()
        self._samples.append(max(0.0, now - self._due) * 1000.0)
        self._due = now + LAG_INTERVAL
        self._reactor.callLater(LAG_INTERVAL, self._tick)

    def take(self) -> dict[str, float]:
        """p50, p99 and max lag in milliseconds since the last call; resets."""
        samples, self._samples = sorted(self._samples), []
        if not samples:
            return {"p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}

        def at(fraction: float) -> float:
            return round(samples[min(len(samples) - 1, int(fraction * len(samples)))], 3)

        return {"p50_ms": at(0.5), "p99_ms": at(0.99), "max_ms": round(samples[-1], 3)}


async def serve(reactor: Any, options: argparse.Namespace) -> None:
    """
    Build the stack, listen, announce the ports, serve until stdin closes,
    then close the engine and the audit log.
    """
    pki = Path(options.pki)
    root = Path(options.root)
    server_cert = cert_from_pem((pki / SERVER_CERT).read_bytes())
    server_key = key_from_pem((pki / SERVER_KEY).read_bytes())
    org_root = cert_from_pem((pki / ROOT_CERT).read_bytes())
    tls_options = server_tls_options(server_cert, server_key, org_root)

    audit = JsonlAuditSink(root / "audit.jsonl", reactor)
    audit.start()
    io_worker = ThreadWorker(reactor, "dataplane-io", threads=options.io_threads)
    io_worker.start()
    store_root = root / "store"
    store_root.mkdir()
    service = DataPlaneService(
        lambda on_revoke, on_event: StorageEngine(
            StorageRoots.single(store_root),
            reactor,
            lambda name: ThreadWorker(reactor, name, threads=1),
            io_worker,
            on_revoke,
            on_event,
        ),
        audit_emit=audit.emit,
        metrics=DataPlaneMetrics(CollectorRegistry()),
        clock=reactor,
        session_key=session_key("bench-service-token"),
        io_worker=io_worker,
    )
    deny_list = DenyList()
    factory = DataPlaneFactory(
        service,
        TLSAdmission(org_root, options.trust_domain, lambda: deny_list),
        reactor,
        # Every client of the benchmark dials from 127.0.0.1, many at once.
        ServerLimits(max_pending_per_address=1024),
        decode_worker=ThreadWorker(reactor, "dataplane-decode", threads=1),
    )
    tls = SwappableServerTLS(tls_options)
    dataplane_port: Any = await listen_dataplane(reactor, "tcp:0:interface=127.0.0.1", factory, tls)

    payload = os.urandom(4 * MIB)
    raw_factory: Any = Factory.forProtocol(lambda: RawServerProtocol(payload))
    creator: Any = tls_options
    raw_endpoint: Any = TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1")  # type: ignore[no-untyped-call]
    raw_port: Any = await raw_endpoint.listen(
        frame_tls_factory(creator, is_client=False, wrapped=raw_factory, clock=reactor)
    )

    watcher = _StdinWatcher()
    watcher.lag = LagMeter(reactor)
    watcher.lag.start()
    StandardIO(watcher, reactor=reactor)  # type: ignore[no-untyped-call]
    announce = {
        "dataplane_port": dataplane_port.getHost().port,
        "raw_port": raw_port.getHost().port,
        "pid": os.getpid(),
    }
    sys.stdout.write(json.dumps(announce) + "\n")
    sys.stdout.flush()

    await watcher.closed
    await maybeDeferred(raw_port.stopListening)
    await maybeDeferred(dataplane_port.stopListening)
    await factory.stop_serving()
    await service.engine.close()
    await audit.stop()
    farewell = {"audit_lines_written": audit.written, "audit_lines_dropped": audit.dropped}
    sys.stdout.write(json.dumps(farewell) + "\n")
    sys.stdout.flush()


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pki", required=True, help="directory with the server PEM files")
    parser.add_argument("--root", required=True, help="empty directory for store and audit")
    parser.add_argument("--trust-domain", default="svc.test")
    parser.add_argument("--io-threads", type=int, default=4)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """Serve on the real reactor until standard input closes."""
    options = parse(sys.argv[1:] if argv is None else argv)
    sys.setswitchinterval(SWITCH_INTERVAL)  # as twist svc-dataplane runs
    react(lambda reactor: Deferred.fromCoroutine(serve(reactor, options)))


if __name__ == "__main__":
    main()
