"""
Hostile data-plane peers for system tests and C{bench/hostile.py}: blocking
Python sockets, no Twisted, so they misbehave exactly as told.

  - L{Flooder}: an admitted agent connection (Python C{ssl}) that sends
    pipelined requests it writes itself (L{svc.wire.frame.encode_frame}) and
    then never reads, so every answer the server makes stays on its side;
  - L{BareConnector}: plain TCP connections opened at a steady rate from a
    given source address, never starting TLS, left open until the server
    drops them;
  - L{rss_bytes}: a process's resident set (C{VmRSS} of C{/proc/<pid>/status}).
"""

from __future__ import annotations

import errno
import socket
import ssl
import threading
import time
from collections.abc import Iterable

from blake3 import blake3

from svc.wire.decoder import FrameDecoder
from svc.wire.frame import FRAMES_TO_CLIENT, Frame, FrameType, encode_frame

SERVER_NAME = "localhost"


def rss_bytes(pid: int) -> int:
    """The resident set size of process C{pid}, in bytes (C{VmRSS})."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def request_bytes(request_id: int, op: str, **fields: object) -> bytes:
    """One REQUEST frame, C{"op"} first in its payload map (wire.md section 3)."""
    frame = Frame(FrameType.REQUEST, request_id, {"op": op, **fields})
    return b"".join(bytes(part) for part in encode_frame(frame))


class BlockingClient:
    """
    A well-behaved agent connection, blocking: one request at a time, its
    answer read whole (for setting up data and measuring latency).
    """

    def __init__(
        self,
        address: tuple[str, int],
        context: ssl.SSLContext,
        *,
        source: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        raw = socket.create_connection(
            address, timeout=timeout, source_address=(source, 0) if source else None
        )
        self.sock = context.wrap_socket(raw, server_hostname=SERVER_NAME)
        self._decoder = FrameDecoder(accept=FRAMES_TO_CLIENT)
        self._frames: list[Frame] = []
        self.hello = self._next_frame()
        if self.hello.type is not FrameType.HELLO:
            raise ConnectionError(f"first frame is {self.hello.type.name}, not HELLO")
        self._next_id = 1

    def _next_frame(self) -> Frame:
        while not self._frames:
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("the server closed the connection")
            self._frames.extend(self._decoder.feed(data))
        return self._frames.pop(0)

    def call(self, op: str, raw: bytes = b"", **fields: object) -> Frame:
        """
        Send one request and return its RESPONSE frame.

        @raise RuntimeError: the server answered ERROR (its payload in the message).
        """
        request_id = self._next_id
        self._next_id += 1
        frame = Frame(FrameType.REQUEST, request_id, {"op": op, **fields}, raw)
        self.sock.sendall(b"".join(bytes(part) for part in encode_frame(frame)))
        while True:
            answer = self._next_frame()
            if answer.request_id != request_id:
                continue  # a push
            if answer.type is FrameType.ERROR:
                raise RuntimeError(f"{op} failed: {dict(answer.payload)}")
            return answer

    def close(self) -> None:
        self.sock.close()


def put_file(client: BlockingClient, path: str, data: bytes) -> str:
    """Store C{data} as one chunk and commit it at C{path}; the chunk's hash."""
    chunk_hash = blake3(data).hexdigest()
    client.call("chunk_put", data, hash=chunk_hash)
    client.call(
        "manifest_put",
        path=path,
        expected_version=0,
        chunks=[[chunk_hash, len(data)]],
        size=len(data),
        mode=0o644,
        mtime_ns=1,
    )
    return chunk_hash


class Flooder:
    """
    One agent connection that pipelines requests and never reads their
    answers. Its receive buffer is kept small (64 KiB) so the kernel holds
    little on its side; everything else the server produces for it stays
    in the server.
    """

    def __init__(
        self,
        address: tuple[str, int],
        context: ssl.SSLContext,
        *,
        source: str | None = None,
        timeout: float = 15.0,
    ) -> None:
        raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        raw.settimeout(timeout)
        if source is not None:
            raw.bind((source, 0))
        raw.connect(address)
        self.sock = context.wrap_socket(raw, server_hostname=SERVER_NAME)
        self.hello = self._read_hello()
        self._next_id = 1

    def _read_hello(self) -> Frame:
        decoder = FrameDecoder(accept=FRAMES_TO_CLIENT)
        while True:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed before HELLO")
            frames = decoder.feed(data)
            if frames:
                if frames[0].type is not FrameType.HELLO:
                    raise ConnectionError(f"first frame is {frames[0].type.name}, not HELLO")
                return frames[0]

    def send(self, op: str, count: int, **fields: object) -> None:
        """Send C{count} requests C{op} with C{fields}, back to back, without reading."""
        frames = []
        for _ in range(count):
            frames.append(request_bytes(self._next_id, op, **fields))
            self._next_id += 1
        self.sock.sendall(b"".join(frames))

    def close(self) -> None:
        """Drop the connection at once (no TLS close, no reading)."""
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
        except OSError:
            pass
        self.sock.close()


def close_all(flooders: Iterable[Flooder]) -> None:
    """L{Flooder.close} each of C{flooders}."""
    for flooder in flooders:
        flooder.close()


class BareConnector:
    """
    A thread opening C{rate} plain TCP connections per second to
    C{address} from C{source} for C{seconds}, never sending a byte; each is
    kept until the server closes it (or L{stop}). Counts what happened.

    @ivar opened: connections the kernel completed (the listen queue took them).
    @ivar failed: connection attempts that failed outright.
    @ivar closed_by_server: connections the server closed (EOF or reset seen).
    """

    def __init__(
        self, address: tuple[str, int], source: str, *, rate: float, seconds: float
    ) -> None:
        self._address = address
        self._source = source
        self._rate = rate
        self._seconds = seconds
        self._stopping = threading.Event()
        self._open: list[socket.socket] = []
        self.opened = 0
        self.failed = 0
        self.closed_by_server = 0
        self._thread = threading.Thread(target=self._run, name="bare-connector", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def stop(self) -> None:
        """Stop opening connections and close every one still open."""
        self._stopping.set()
        self._thread.join()

    @property
    def held(self) -> int:
        """Connections open now (as far as this side knows)."""
        return len(self._open)

    def _run(self) -> None:
        started = time.monotonic()
        sent = 0
        try:
            while not self._stopping.is_set():
                elapsed = time.monotonic() - started
                if elapsed >= self._seconds:
                    break
                due = int(elapsed * self._rate) + 1
                while sent < due:
                    sent += 1
                    self._connect_one()
                self._reap()
                self._stopping.wait(min(0.01, 1.0 / self._rate))
            self._stopping.wait()
        finally:
            for sock in self._open:
                sock.close()
            self._open.clear()

    def _connect_one(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((self._source, 0))
            sock.setblocking(False)
            sock.connect_ex(self._address)
        except OSError:
            sock.close()
            self.failed += 1
            return
        self._open.append(sock)
        self.opened += 1

    def _reap(self) -> None:
        """Close the connections the server has closed (EOF or reset)."""
        kept = []
        for sock in self._open:
            try:
                data = sock.recv(1)
            except (BlockingIOError, InterruptedError):
                kept.append(sock)
                continue
            except OSError as error:
                if error.errno == errno.ENOTCONN:  # still connecting
                    kept.append(sock)
                    continue
                data = b""
            if data:
                kept.append(sock)
                continue
            sock.close()
            self.closed_by_server += 1
        self._open = kept
