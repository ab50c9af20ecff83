"""
What a data-plane connection receives, turned into requests at a fair pace
(``docs/specifications/wire.md`` sections 3.1 and 9).

L{RequestIntake} holds the connection's frame decoder. Received bytes wait
in the decoder's backlog; a I{turn} decodes and starts at most
C{frames_per_turn} frames (fewer once their payloads reach
C{payload_bytes_per_turn}), then the next turn is scheduled with
C{callLater(0)}, so the reactor serves other connections in between, and
the connection keeps its reading paused while a backlog remains (the
protocol asks L{RequestIntake.waiting}). No turn is taken while the
connection is backlogged (its peer is not taking its answers).

Each REQUEST's operation is found from the first bytes of its packed map
(C{ENOSYS} for an unknown one), a payload over the operation's declared size
is refused unread, and the rest is decoded within the operation's limits
(L{svc.wire.contract.decode}): on the reactor, or for payloads of
L{DECODE_ASIDE_FROM} bytes or more on the decode worker, the connection
starting nothing else meanwhile so its order is kept. A client's GOAWAY is
decoded within small limits. The connection is the L{IntakeOwner}: it
decides whether a frame may run and runs it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from twisted.logger import Logger
from twisted.python.failure import Failure

from svc.buffer_pool import BufferPool
from svc.timers import Timer, TimerClock
from svc.wire.commands import Command
from svc.wire.contract import DecodedRequest, RequestRefused, decode, find_command, unpack_bounded
from svc.wire.control import GoAway, read_goaway
from svc.wire.decoder import FrameDecoder
from svc.wire.errno import WireErrno
from svc.wire.errors import CodecError
from svc.wire.frame import FRAMES_TO_SERVER, Frame, FrameType, PackedFrame
from svc.worker import IWorker

if TYPE_CHECKING:
    from svc.dataplane.factory import ServerLimits

_log = Logger()

DECODE_ASIDE_FROM = 64 * 1024
"""
Request payloads of at least this many bytes are decoded on the decode
worker, off the reactor (a 12000-chunk C{manifest_put} takes milliseconds).
"""

GOAWAY_MAX_STRING = 4096
"""The longest string a client's GOAWAY map may hold (its C{reason} and C{message})."""

DECODING_FAILED = "internal server error"
"""The C{EIO} message of a request whose decoding raised a bug."""


class IntakeOwner(Protocol):
    """What the intake needs of its connection (L{svc.dataplane.protocol})."""

    def reading(self) -> bool:
        """Whether frames are read at all now (admitted, not closing)."""

    def executing(self) -> bool:
        """Whether requests read now may run (not going away: else they are dropped)."""

    def backlogged(self) -> bool:
        """Whether received requests must wait before they start (the peer is not reading)."""

    def going_away(self, goaway: GoAway) -> None:
        """The client sent GOAWAY."""

    def protocol_error(self, reason: str) -> None:
        """The stream broke the protocol: drop the connection."""

    def admit(self, frame: PackedFrame) -> bool:
        """
        Whether the REQUEST C{frame} may go on (its id not in use, room in
        flight); if not, the owner has answered or dropped it.
        """

    def answer_error(self, frame: PackedFrame, errno: WireErrno, message: str) -> None:
        """Answer C{frame} with an ERROR and give back its raw segment."""

    def refused(self, error: RequestRefused) -> None:
        """Count and log (at a bounded rate) a request refused by its shape."""

    def start(self, command: Command, frame: PackedFrame, decoded: DecodedRequest) -> None:
        """Run the request C{frame} carries, decoded."""

    def turn_ended(self) -> None:
        """A turn ended or a decoding finished: look at reading and idleness again."""


def release_raw(frame: Frame | PackedFrame) -> None:
    """Give back the lent raw segment of a request that will not be executed."""
    if frame.release_raw is not None:
        frame.release_raw()


class RequestIntake:
    """One connection's received frames, turned into requests; see the module docstring."""

    def __init__(
        self,
        owner: IntakeOwner,
        *,
        clock: TimerClock,
        limits: ServerLimits,
        commands: Mapping[str, Command],
        raw_buffers: BufferPool | None = None,
        decode_worker: IWorker | None = None,
    ) -> None:
        self._owner = owner
        self._clock = clock
        self._limits = limits
        self._commands = commands
        self._decode_worker = decode_worker
        self._decoder = FrameDecoder(
            max_payload=limits.max_payload,
            max_raw=limits.max_raw,
            accept=FRAMES_TO_SERVER,
            raw_buffers=raw_buffers,
            packed=FRAMES_TO_SERVER,
        )
        self._decoding = False
        self._turn: Timer | None = None

    @property
    def waiting(self) -> bool:
        """Whether received frames wait for a turn, or one is being decoded aside."""
        return bool(self._decoder.pending) or self._decoding

    def receive_target(self) -> memoryview | None:
        """See L{svc.wire.decoder.FrameDecoder.receive_target}."""
        return self._decoder.receive_target()

    def received_into(self, count: int) -> None:
        """See L{svc.wire.decoder.FrameDecoder.received_into}."""
        self._decoder.received_into(count)

    def feed(self, data: bytes) -> None:
        """Take received bytes; a turn is taken now unless one is already due."""
        try:
            self._decoder.push(data)
        except CodecError as error:
            self._owner.protocol_error(error.reason)
            return
        if self._turn is None:
            self._take_turn()

    def schedule(self) -> None:
        """Take another turn soon if received frames wait and may be started."""
        owner = self._owner
        if (
            self._decoder.pending
            and self._turn is None
            and not self._decoding
            and owner.reading()
            and not owner.backlogged()
        ):
            self._turn = self._clock.callLater(0, self._take_turn)

    def stop(self) -> None:
        """The connection is closing: no more turns."""
        turn, self._turn = self._turn, None
        if turn is not None and turn.active():
            turn.cancel()

    def _take_turn(self) -> None:
        self._turn = None
        owner = self._owner
        frames = self._limits.frames_per_turn
        payload_bytes = self._limits.payload_bytes_per_turn
        while frames > 0 and payload_bytes > 0 and not owner.backlogged():
            if self._decoding or not owner.reading():
                return  # a frame decoded aside goes first; a closing one reads nothing
            try:
                frame = self._decoder.next_frame()
            except CodecError as error:
                owner.protocol_error(error.reason)
                return
            if frame is None:
                break
            assert isinstance(frame, PackedFrame)
            frames -= 1
            payload_bytes -= len(frame.payload)
            if frame.type is FrameType.GOAWAY:
                self._goaway(frame)
            elif owner.executing():
                self._request(frame)
            else:
                release_raw(frame)  # read after GOAWAY: never executed
        self.schedule()
        owner.turn_ended()

    def _goaway(self, frame: PackedFrame) -> None:
        try:
            # Decoded within what C{reason}, C{message} and a few unknown
            # keys can need, like every request.
            payload = unpack_bounded(
                frame.payload, containers=4, width=4, keys=8, string=GOAWAY_MAX_STRING, depth=1
            )
            goaway = read_goaway(Frame(FrameType.GOAWAY, 0, payload))
        except (RequestRefused, CodecError) as error:
            self._owner.protocol_error(f"malformed GOAWAY: {error}")
            return
        self._owner.going_away(goaway)

    def _request(self, frame: PackedFrame) -> None:
        owner = self._owner
        if not owner.admit(frame):
            return
        command = self._command_of(frame)
        if command is None:
            return
        if len(frame.payload) >= DECODE_ASIDE_FROM and self._decode_worker is not None:
            self._decode_aside(command, frame, self._decode_worker)
            return
        try:
            decoded = decode(command, frame.payload)
        except RequestRefused as error:
            self._refuse(frame, error)
        else:
            owner.start(command, frame, decoded)

    def _command_of(self, frame: PackedFrame) -> Command | None:
        """
        The command a REQUEST names, or L{None} once it has been answered
        (C{ENOSYS}, or C{EPROTO}: no op, or a payload over the operation's
        size, refused unread).
        """
        try:
            command = find_command(frame.payload, self._commands)
        except RequestRefused as error:
            self._refuse(frame, error)
            return None
        except KeyError:
            self._owner.answer_error(frame, WireErrno.ENOSYS, "unknown operation")
            return None
        limit = command.limits.payload
        if len(frame.payload) > limit:
            message = f"payload of {len(frame.payload)} bytes is over {limit} for {command.op}"
            self._refuse(frame, RequestRefused("too_large", message, str(command.op)))
            return None
        return command

    def _refuse(self, frame: PackedFrame, error: RequestRefused) -> None:
        """Answer C{EPROTO} for a payload refused by its shape; counted, not audited."""
        self._owner.refused(error)
        self._owner.answer_error(frame, WireErrno.EPROTO, error.message[:256])

    def _decode_aside(self, command: Command, frame: PackedFrame, worker: IWorker) -> None:
        """
        Decode a large payload on the decode worker, so the reactor serves
        other connections meanwhile; this connection starts nothing else
        until it is decoded (its order is kept).
        """
        self._decoding = True
        decoding = worker.submit(lambda: decode(command, frame.payload))

        def decoded(result: DecodedRequest | Failure) -> None:
            self._decoding = False
            owner = self._owner
            if not owner.executing():
                release_raw(frame)
            elif isinstance(result, Failure):
                if isinstance(result.value, RequestRefused):
                    self._refuse(frame, result.value)
                else:
                    _log.failure("decoding a {op} request failed", result, op=command.op)
                    owner.answer_error(frame, WireErrno.EIO, DECODING_FAILED)
            else:
                owner.start(command, frame, result)
            self.schedule()
            owner.turn_ended()

        decoding.addBoth(decoded)
