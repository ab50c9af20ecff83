"""
A hostile data-plane client for C{bench/dataplane.py}'s fairness phase, run as
a process of its own so its work does not slow the measuring client.

    .venv/bin/python bench/flood.py --port N --chain FILE --key FILE --root FILE
        --mode pings|decode-limit [--batch 20000]

It connects over mutual TLS 1.3 (Python's C{ssl}, a blocking socket), waits
for HELLO, then floods until its standard input closes:

 - C{pings}: C{--batch} ping REQUESTs written back to back in one go (far past
   C{max_in_flight}: the server answers the excess C{EAGAIN}, which still costs
   it a decode and an answer each), then reads until every one is answered,
   and again;
 - C{decode-limit}: C{manifest_put} REQUESTs each as expensive to decode as
   the operation's declared limits allow (a map of 12000 chunk entries,
   about 930 KB), 32 at a time, reading the answers, and again;
 - C{busy}: the reference: no connection, the same kind of work (decoding
   frames) in a loop, to load the machine as a flooder does.

It reads everything the server sends, so the server is never held back by
back-pressure: this measures how much of the reactor one connection can take.
On exit it prints one JSON line: frames sent, answers read, seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import ssl
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from svc.testing.pki import SERVER_NAME
from svc.wire.decoder import FrameDecoder
from svc.wire.frame import FRAMES_TO_CLIENT, HEADER, HEADER_SIZE, Frame, FrameType, encode_frame

MANIFEST_CHUNKS = 12000
DECODE_LIMIT_BATCH = 32


def connect(port: int, chain: str, key: str, root: str) -> ssl.SSLSocket:
    """A TLS 1.3 connection admitted by the server (HELLO read)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.load_verify_locations(root)
    context.load_cert_chain(chain, key)
    raw = socket.create_connection(("127.0.0.1", port))
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    tls = context.wrap_socket(raw, server_hostname=SERVER_NAME)
    read_frame(tls)  # HELLO
    return tls


def read_exact(tls: ssl.SSLSocket, count: int) -> bytes:
    """C{count} bytes from C{tls}."""
    data = bytearray()
    while len(data) < count:
        piece = tls.recv(count - len(data))
        if not piece:
            raise ConnectionError("server closed the connection")
        data += piece
    return bytes(data)


def read_frame(tls: ssl.SSLSocket) -> int:
    """Read one frame; its type."""
    header = read_exact(tls, HEADER_SIZE)
    _magic, _version, kind, _f, _r, _id, payload, raw = HEADER.unpack(header)
    read_exact(tls, payload + raw)
    return int(kind)


def frames(payloads: list[dict[str, object]], first_id: int) -> bytes:
    """The REQUEST frames of C{payloads}, ids from C{first_id}, back to back."""
    out = bytearray()
    for offset, payload in enumerate(payloads):
        for part in encode_frame(Frame(FrameType.REQUEST, first_id + offset, payload)):
            out += part
    return bytes(out)


def flood(tls: ssl.SSLSocket, mode: str, batch: int, stop: threading.Event) -> dict[str, float]:
    """
    Flood until C{stop} is set, in one thread: write the burst as the socket
    takes it and read every answer as it comes, so neither side ever waits
    on the other; the next burst starts once the last is answered.
    """
    if mode == "pings":
        burst = frames([{"op": "ping"}] * batch, 1)
        count = batch
    else:
        entry = ["ab" * 32, 1]
        put = {
            "op": "manifest_put",
            "path": "/agent-x/f",
            "expected_version": 0,
            "chunks": [entry] * MANIFEST_CHUNKS,
            "size": MANIFEST_CHUNKS,
            "mode": 0o644,
            "mtime_ns": 0,
        }
        burst = frames([put] * DECODE_LIMIT_BATCH, 1)
        count = DECODE_LIMIT_BATCH
    decoder = FrameDecoder(accept=FRAMES_TO_CLIENT)
    tls.setblocking(False)
    pending = memoryview(b"")
    sent = answered = 0
    began = time.perf_counter()
    while not stop.is_set():
        if not pending and answered >= sent:
            pending = memoryview(burst)
            sent += count
        readable, writable, _ = select.select([tls], [tls] if pending else [], [], 1.0)
        if writable:
            try:
                pending = pending[tls.send(pending[: 256 * 1024]) :]
            except (ssl.SSLWantWriteError, ssl.SSLWantReadError):
                pass
        while readable or tls.pending():
            readable = []
            try:
                data = tls.recv(1 << 20)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                break
            if not data:
                raise ConnectionError("server closed the connection")
            answered += len(decoder.feed(data))
    return {"sent": sent, "answered": answered, "seconds": round(time.perf_counter() - began, 2)}


def busy(stop: threading.Event) -> dict[str, float]:
    """The reference: encode and decode frames locally, as busily as a flood, until told."""
    burst = frames([{"op": "ping"}] * 2000, 1)
    decoder = FrameDecoder()
    rounds = 0
    began = time.perf_counter()
    while not stop.is_set():
        decoder.feed(burst)
        rounds += 1
    return {"rounds": rounds, "seconds": round(time.perf_counter() - began, 2)}


def main() -> None:
    """Parse, connect, flood until standard input closes, report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--chain", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--root", required=True)
    parser.add_argument("--mode", choices=("busy", "pings", "decode-limit"), required=True)
    parser.add_argument("--batch", type=int, default=20000)
    options = parser.parse_args()
    tls = (
        None
        if options.mode == "busy"
        else connect(options.port, options.chain, options.key, options.root)
    )
    stop = threading.Event()

    def watch_stdin() -> None:
        while True:
            ready, _, _ = select.select([sys.stdin], [], [], 1.0)
            if ready and not os.read(sys.stdin.fileno(), 4096):
                break
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    print(json.dumps({"ready": True}), flush=True)
    if tls is None:
        result = busy(stop)
    else:
        result = flood(tls, options.mode, options.batch, stop)
        tls.close()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
