"""
The incremental frame decoder: bytes in, whole L{Frame}s out.

It takes data split anywhere (mid-header, mid-payload, many frames at once),
rejects every malformed input with L{CodecError} and nothing else, decides a
frame's size from its header before it buffers any of the body, and copies a
large raw segment at most once, into an immutable C{bytes} object of its own
(so a consumer such as the chunk store or the client's reply can keep it
without a second copy).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

from svc.buffer_pool import BufferPool, Loan
from svc.wire.errors import CodecError
from svc.wire.frame import (
    HEADER_SIZE,
    MAGIC,
    MAX_PAYLOAD_SIZE,
    MAX_RAW_SIZE,
    Buffer,
    Frame,
    FrameHeader,
    FrameType,
    PackedFrame,
    read_header,
)
from svc.wire.payload import unpack_payload

_U32_MAX = 2**32 - 1

LEND_RAW_FROM = 128 * 1024
"""
With a pool (C{raw_buffers}), raw segments of at least this many bytes that
arrive in pieces are copied into a lent buffer as they arrive, rather than
kept as pieces and joined into a new C{bytes} object at the end.
"""

Received = Frame | PackedFrame
"""What the decoder gives: a frame, or one whose payload it left packed."""

KEEP_AS_VIEW = 8192
"""
Body pieces at least this long are kept as views of the data fed until the
body is complete; shorter ones are copied together. A body of C{n} bytes is
then held in at most about C{2 * n / KEEP_AS_VIEW + 1} pieces.
"""


class FrameDecoder:
    """
    Turns a received byte stream into frames.

    Feed it everything a connection receives, in order. After it has raised
    L{CodecError} once it is failed: every later L{feed} raises again, and the
    connection must be dropped. Frames completed earlier in the same L{feed}
    call as the error are not returned.

    Memory: at most L{HEADER_SIZE} bytes of an incomplete header, then the
    pieces of the announced body received so far (the size is checked
    against the limits first), kept as views of the data fed and joined once
    when the body is complete. A frame that arrives whole inside one L{feed}
    is decoded without copying its body; its raw segment then shares memory
    with the data fed. Either way the raw segment is a read-only view of a
    C{bytes} object: nothing can change it.
    """

    def __init__(
        self,
        *,
        max_payload: int = MAX_PAYLOAD_SIZE,
        max_raw: int = MAX_RAW_SIZE,
        accept: Iterable[FrameType] = tuple(FrameType),
        raw_buffers: BufferPool | None = None,
        packed: Iterable[FrameType] = (),
    ) -> None:
        """
        @param max_payload: the largest msgpack payload accepted, in bytes
            (default 1 MiB); 1 .. 2**32-1.
        @param max_raw: the largest raw segment accepted, in bytes (default
            16 MiB); 0 .. 2**32-1.
        @param accept: the frame types this side may receive (see
            L{svc.wire.frame.FRAMES_TO_CLIENT} and C{FRAMES_TO_SERVER});
            any other type is a L{CodecError}. Default: all.
        @param raw_buffers: where to assemble large raw segments (at least
            L{LEND_RAW_FROM} bytes, at most the pool's buffer size) that
            arrive in pieces: such a frame's C{raw} is a read-only view of a
            lent buffer and its C{release_raw} gives the buffer back.
            Without a pool every raw segment is its own C{bytes} object.
        @param packed: frame types whose payload is left undecoded: those
            come out as L{PackedFrame}s (a server decodes a request's payload
            within its operation's limits, L{svc.wire.contract}).
        """
        if not 1 <= max_payload <= _U32_MAX:
            raise ValueError(f"max_payload {max_payload} not in 1..2**32-1")
        if not 0 <= max_raw <= _U32_MAX:
            raise ValueError(f"max_raw {max_raw} not in 0..2**32-1")
        self._max_payload = max_payload
        self._max_raw = max_raw
        self._accept = frozenset(accept)
        self._raw_buffers = raw_buffers
        self._packed = frozenset(packed)
        self._backlog: deque[memoryview] = deque()
        self._header_bytes = bytearray()
        self._current: FrameHeader | None = None
        self._pieces: list[memoryview] = []
        self._small = bytearray()
        self._filled = 0
        self._loan: Loan | None = None
        self._payload = bytearray()
        self._error: CodecError | None = None

    @property
    def buffered(self) -> int:
        """
        The bytes of the incomplete frame received so far, header included
        (not the size of the body buffer reserved for it).
        """
        if self._current is None:
            return len(self._header_bytes)
        return HEADER_SIZE + self._filled

    @property
    def failed(self) -> bool:
        """Whether this decoder has rejected its input."""
        return self._error is not None

    def receive_target(self) -> memoryview | None:
        """
        Where the next bytes of the stream may be written directly, if
        anywhere: the rest of a raw segment being assembled in a lent
        buffer, short of its last byte (the byte that completes the frame
        goes through L{feed}). Write into it, release it, then call
        L{received_into}.
        """
        loan, header = self._loan, self._current
        if loan is None or header is None or self._error is not None or self._backlog:
            return None
        cut = header.payload_length
        at = self._filled
        remaining = cut + header.raw_length - at - 1
        if at < cut or remaining <= 0:
            return None
        offset = at - cut
        with memoryview(loan.buffer) as whole:
            return whole[offset : offset + remaining]

    def received_into(self, count: int) -> None:
        """C{count} bytes were written at the start of L{receive_target}'s view."""
        self._filled += count

    @property
    def pending(self) -> int:
        """Bytes fed (L{push}) and not yet looked at by L{next_frame}."""
        return sum(len(view) for view in self._backlog)

    def feed(self, data: Buffer) -> list[Frame]:
        """
        Take the next bytes of the stream and return the frames they complete,
        in order (often none, possibly many). For a decoder that leaves no
        frame type packed (a decoder that does uses L{push} and
        L{next_frame}).

        @raise CodecError: if the stream is malformed, or was before.
        """
        self.push(data)
        frames: list[Frame] = []
        while (frame := self.next_frame()) is not None:
            assert isinstance(frame, Frame), "a decoder with packed frames is read by next_frame"
            frames.append(frame)
        return frames

    def push(self, data: Buffer) -> None:
        """
        Take the next bytes of the stream without decoding them yet: frames
        come out of L{next_frame}, one at a time, when the reader wants them.

        @raise CodecError: if the stream was malformed before.
        """
        if self._error is not None:
            raise CodecError(f"decoder already failed: {self._error.reason}")
        if not isinstance(data, bytes):
            # A raw segment may be a view of the data fed: own it.
            data = bytes(data)
        if data:
            self._backlog.append(memoryview(data))

    def next_frame(self) -> Received | None:
        """
        The next frame the bytes pushed so far complete, or L{None} when they
        complete none (the rest is kept for the next call).

        @raise CodecError: if the stream is malformed, or was before.
        """
        if self._error is not None:
            raise CodecError(f"decoder already failed: {self._error.reason}")
        backlog = self._backlog
        try:
            while backlog:
                view = backlog[0]
                frame, used = self._step(view)
                if used == len(view):
                    backlog.popleft()
                else:
                    backlog[0] = view[used:]
                if frame is not None:
                    return frame
        except CodecError as e:
            self._error = e
            self._backlog.clear()
            self._header_bytes.clear()
            self._pieces = []
            self._small = bytearray()
            self._filled = 0
            self._current = None
            if self._loan is not None:
                self._loan.give_back()
                self._loan = None
            self._payload = bytearray()
            raise
        return None

    def _step(self, view: memoryview) -> tuple[Received | None, int]:
        """Decode from C{view} until one frame completes; the frame and the bytes used."""
        position = 0
        end = len(view)
        while position < end:
            header = self._current
            if header is None:
                if self._header_bytes or end - position < HEADER_SIZE:
                    take = min(HEADER_SIZE - len(self._header_bytes), end - position)
                    self._header_bytes += view[position : position + take]
                    position += take
                    if len(self._header_bytes) < HEADER_SIZE:
                        # Refuse a stranger (an HTTP client, say) at once.
                        if not MAGIC.startswith(self._header_bytes[: len(MAGIC)]):
                            raise CodecError(f"bad magic {bytes(self._header_bytes[:4])!r}")
                        break
                    header = self._check_header(read_header(self._header_bytes))
                    self._header_bytes.clear()
                else:
                    header_view = view[position : position + HEADER_SIZE]
                    header = self._check_header(read_header(header_view))
                    position += HEADER_SIZE
                size = header.payload_length + header.raw_length
                if end - position >= size:
                    frame = self._finish(header, view[position : position + size])
                    return frame, position + size
                self._current = header
                self._pieces = []
                self._filled = 0
                pool = self._raw_buffers
                if pool is not None and LEND_RAW_FROM <= header.raw_length <= pool.size:
                    self._loan = pool.lend()
            else:
                size = header.payload_length + header.raw_length
                take = min(size - self._filled, end - position)
                if self._loan is None:
                    self._keep(view[position : position + take])
                else:
                    self._copy_lent(header, self._loan, view[position : position + take])
                self._filled += take
                position += take
                if self._filled == size:
                    return self._complete(header), position
        return None, position

    def _complete(self, header: FrameHeader) -> Received:
        """The frame whose body has just been received in full; resets the body state."""
        loan, payload = self._loan, self._payload
        self._current = None
        self._filled = 0
        self._loan = None
        self._payload = bytearray()
        if loan is None:
            self._pieces.append(memoryview(self._small))
            pieces = self._pieces
            self._pieces = []
            self._small = bytearray()
            return self._assemble(header, pieces)
        try:
            return self._frame(header, bytes(payload), loan.view(header.raw_length), loan.give_back)
        except CodecError:
            loan.give_back()
            raise

    def _copy_lent(self, header: FrameHeader, loan: Loan, part: memoryview) -> None:
        """
        Copy the next C{part} of a body whose raw segment goes into C{loan}:
        the payload into a small buffer, the raw bytes straight into the
        lent buffer, so nothing received is held past this call (holding
        the pieces of a 4 MiB body, then freeing them together, makes
        C{malloc} return and re-fault memory for every frame).
        """
        cut = header.payload_length
        at = self._filled
        if at < cut:
            count = min(cut - at, len(part))
            self._payload += part[:count]
            part = part[count:]
            at += count
        if part:
            offset = at - cut
            loan.buffer[offset : offset + len(part)] = part

    def _keep(self, piece: memoryview) -> None:
        """
        Keep a piece of the body: a large one as a view (the data fed is
        immutable bytes), a small one copied into the run of small ones, so
        a peer sending a body a byte at a time costs bytes, not a view per
        byte.
        """
        if len(piece) < KEEP_AS_VIEW:
            self._small += piece
            return
        if self._small:
            self._pieces.append(memoryview(bytes(self._small)))
            self._small.clear()
        self._pieces.append(piece)

    def _check_header(self, header: FrameHeader) -> FrameHeader:
        if header.type not in self._accept:
            raise CodecError(f"{header.type.name} frame not accepted on this side")
        if header.payload_length > self._max_payload:
            raise CodecError(
                f"payload of {header.payload_length} bytes is over the limit of {self._max_payload}"
            )
        if header.raw_length > self._max_raw:
            raise CodecError(
                f"raw segment of {header.raw_length} bytes is over the limit of {self._max_raw}"
            )
        return header

    def _assemble(self, header: FrameHeader, pieces: list[memoryview]) -> Received:
        """
        The frame whose body arrived in C{pieces}: the payload and the raw
        segment are joined I{separately}, so the raw segment is a view of a
        C{bytes} object of exactly its own bytes, which a consumer keeps whole
        without a second copy (L{svc.wire.frame.raw_bytes}).
        """
        cut = header.payload_length
        payload: list[memoryview] = []
        raw: list[memoryview] = []
        seen = 0
        for piece in pieces:
            if seen >= cut:
                raw.append(piece)
            elif seen + len(piece) <= cut:
                payload.append(piece)
            else:
                payload.append(piece[: cut - seen])
                raw.append(piece[cut - seen :])
            seen += len(piece)
        joined: Buffer = memoryview(b"".join(raw)) if header.raw_length else b""
        return self._frame(header, b"".join(payload), joined, None)

    def _finish(self, header: FrameHeader, body: memoryview) -> Received:
        raw: Buffer = body[header.payload_length :] if header.raw_length else b""
        return self._frame(header, body[: header.payload_length], raw, None)

    def _frame(
        self,
        header: FrameHeader,
        payload: bytes | memoryview,
        raw: Buffer,
        release: Callable[[], None] | None,
    ) -> Received:
        """The frame of C{header}: packed if its type is one this decoder leaves packed."""
        if header.type in self._packed:
            return PackedFrame(
                header.type, header.request_id, bytes(payload), raw, release_raw=release
            )
        return Frame(
            header.type, header.request_id, unpack_payload(payload), raw, release_raw=release
        )
