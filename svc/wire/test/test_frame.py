"""
Tests for L{svc.wire.frame}: the frame value, its header and the encoder.
"""

from __future__ import annotations

import struct
from array import array

import msgpack
from hypothesis import given, settings
from twisted.trial.unittest import SynchronousTestCase

from svc.wire.decoder import FrameDecoder
from svc.wire.errors import CodecError
from svc.wire.frame import (
    FRAMES_TO_CLIENT,
    FRAMES_TO_SERVER,
    HEADER_SIZE,
    MAGIC,
    MAX_FRAME_SIZE,
    MAX_PAYLOAD_SIZE,
    MAX_RAW_SIZE,
    Frame,
    FrameType,
    encode_frame,
    read_header,
)
from svc.wire.test.strategies import FRAMES_BY_TYPE


def encoded(frame: Frame) -> bytes:
    """The whole encoding of C{frame} as one byte string."""
    return b"".join(encode_frame(frame))


def round_trip(frame: Frame) -> Frame:
    """Encode C{frame}, decode it again and return the single frame."""
    [decoded] = FrameDecoder().feed(encoded(frame))
    return decoded


class FrameTests(SynchronousTestCase):
    """
    Tests for the rules L{Frame} checks when built.
    """

    def test_request_needs_nonzero_id(self) -> None:
        """A REQUEST with request id 0 is refused."""
        self.assertRaises(CodecError, Frame, FrameType.REQUEST, 0, {"op": "ping"})

    def test_answers_need_nonzero_id(self) -> None:
        """RESPONSE and ERROR frames with request id 0 are refused."""
        self.assertRaises(CodecError, Frame, FrameType.RESPONSE, 0, {})
        self.assertRaises(CodecError, Frame, FrameType.ERROR, 0, {"errno": 5, "message": ""})

    def test_request_id_fits_u32(self) -> None:
        """A request id of 2**32 does not fit the header and is refused."""
        self.assertRaises(CodecError, Frame, FrameType.RESPONSE, 2**32, {})
        Frame(FrameType.RESPONSE, 2**32 - 1, {})

    def test_unsolicited_frames_need_zero_id(self) -> None:
        """PUSH, HELLO and GOAWAY frames with a non-zero request id are refused."""
        self.assertRaises(CodecError, Frame, FrameType.PUSH, 3, {"op": "lease_revoke"})
        self.assertRaises(CodecError, Frame, FrameType.GOAWAY, 3, {"reason": "shutdown"})
        hello = {"versions": [1], "max_payload": 1, "max_raw": 1, "max_in_flight": 1}
        self.assertRaises(CodecError, Frame, FrameType.HELLO, 3, hello)

    def test_bool_is_not_request_id(self) -> None:
        """A boolean is not accepted as a request id."""
        self.assertRaises(CodecError, Frame, FrameType.RESPONSE, True, {})

    def test_type_must_be_frame_type(self) -> None:
        """A plain integer in place of a L{FrameType} is refused."""
        self.assertRaises(CodecError, Frame, 3, 1, {})

    def test_request_and_push_need_op(self) -> None:
        """REQUEST and PUSH payloads need a non-empty string C{op}."""
        for payload in ({}, {"op": ""}, {"op": 1}):
            self.assertRaises(CodecError, Frame, FrameType.REQUEST, 1, payload)
            self.assertRaises(CodecError, Frame, FrameType.PUSH, 0, payload)

    def test_error_payload_checked(self) -> None:
        """ERROR payloads need an integer errno >= 1, a string message, a map as details."""
        for payload in (
            {"message": "m"},
            {"errno": 0, "message": "m"},
            {"errno": True, "message": "m"},
            {"errno": "5", "message": "m"},
            {"errno": 5},
            {"errno": 5, "message": "m", "details": [1]},
        ):
            self.assertRaises(CodecError, Frame, FrameType.ERROR, 1, payload)

    def test_hello_payload_checked(self) -> None:
        """HELLO payloads need versions 1..255 and integer limits in range."""
        good = {"versions": [1], "max_payload": 10, "max_raw": 0, "max_in_flight": 1}
        Frame(FrameType.HELLO, 0, good)
        changes: list[dict[str, object]] = [
            {"versions": []},
            {"versions": [0]},
            {"versions": [256]},
            {"versions": 1},
            {"max_payload": 0},
            {"max_raw": -1},
            {"max_in_flight": 2**32},
            {"server": 7},
        ]
        for change in changes:
            self.assertRaises(CodecError, Frame, FrameType.HELLO, 0, {**good, **change})

    def test_goaway_payload_checked(self) -> None:
        """GOAWAY payloads need a string reason and, if present, a string message."""
        self.assertRaises(CodecError, Frame, FrameType.GOAWAY, 0, {})
        self.assertRaises(CodecError, Frame, FrameType.GOAWAY, 0, {"reason": "x", "message": 1})

    def test_raw_only_where_allowed(self) -> None:
        """HELLO, ERROR and GOAWAY frames may not carry a raw segment."""
        self.assertRaises(CodecError, Frame, FrameType.ERROR, 1, {"errno": 5, "message": ""}, b"x")
        self.assertRaises(CodecError, Frame, FrameType.GOAWAY, 0, {"reason": "x"}, b"x")
        Frame(FrameType.PUSH, 0, {"op": "lease_revoke"}, b"x")

    def test_payload_keys_are_strings(self) -> None:
        """A payload with a non-string top-level key is refused."""
        self.assertRaises(CodecError, Frame, FrameType.RESPONSE, 1, {1: "x"})
        self.assertRaises(CodecError, Frame, FrameType.RESPONSE, 1, [("a", 1)])

    def test_raw_not_text(self) -> None:
        """A C{str} raw segment is refused."""
        self.assertRaises(CodecError, Frame, FrameType.RESPONSE, 1, {}, "text")

    def test_raw_view_cast_to_bytes(self) -> None:
        """A memoryview of wider items is taken as its bytes, so lengths are byte counts."""
        frame = Frame(FrameType.RESPONSE, 1, {}, memoryview(array("I", [1, 2])))
        self.assertEqual(len(frame.raw), 8)
        self.assertEqual(len(round_trip(frame).raw), 8)

    def test_repr_hides_raw_bytes(self) -> None:
        """The repr gives a raw segment's length, not its bytes."""
        text = repr(Frame(FrameType.RESPONSE, 1, {}, b"secret-bytes"))
        self.assertIn("<12 bytes>", text)
        self.assertNotIn("secret", text)

    def test_direction_sets(self) -> None:
        """Clients receive everything but REQUEST; servers only REQUEST and GOAWAY."""
        self.assertEqual(FRAMES_TO_CLIENT | FRAMES_TO_SERVER, set(FrameType))
        self.assertEqual(FRAMES_TO_CLIENT & FRAMES_TO_SERVER, {FrameType.GOAWAY})


class EncodeTests(SynchronousTestCase):
    """
    Tests for L{encode_frame} and L{read_header}.
    """

    def test_header_layout(self) -> None:
        """The header is magic, version, type, flags, reserved, id, lengths, big-endian."""
        data = encoded(Frame(FrameType.REQUEST, 0x01020304, {"op": "ping"}, b"xyz"))
        self.assertEqual(HEADER_SIZE, 20)
        self.assertEqual(data[0:4], b"SVCW")
        self.assertEqual(data[4:8], bytes([1, 2, 0, 0]))
        self.assertEqual(data[8:12], b"\x01\x02\x03\x04")
        payload = b"\x81\xa2op\xa4ping"
        self.assertEqual(struct.unpack(">II", data[12:20]), (len(payload), 3))
        self.assertEqual(data[20:], payload + b"xyz")

    def test_raw_segment_not_copied(self) -> None:
        """The raw segment is handed back as the very object given, after one header buffer."""
        raw = b"r" * 1000
        buffers = encode_frame(Frame(FrameType.RESPONSE, 1, {}, raw))
        self.assertEqual(len(buffers), 2)
        self.assertIs(buffers[1], raw)

    def test_no_raw_one_buffer(self) -> None:
        """A frame without a raw segment encodes to a single buffer."""
        self.assertEqual(len(encode_frame(Frame(FrameType.RESPONSE, 1, {}))), 1)

    def test_empty_payload_is_one_byte(self) -> None:
        """An empty payload is the one-byte empty map, so a payload is never empty."""
        data = encoded(Frame(FrameType.RESPONSE, 1, {}))
        self.assertEqual(data[12:16], b"\x00\x00\x00\x01")
        self.assertEqual(data[20:], b"\x80")

    def test_payload_limit(self) -> None:
        """A payload over the peer's limit is refused by the encoder."""
        frame = Frame(FrameType.RESPONSE, 1, {"blob": b"x" * 100})
        self.assertRaises(CodecError, encode_frame, frame, max_payload=100)
        encode_frame(frame, max_payload=200)

    def test_raw_limit(self) -> None:
        """A raw segment over the peer's limit is refused by the encoder."""
        frame = Frame(FrameType.RESPONSE, 1, {}, b"x" * 101)
        self.assertRaises(CodecError, encode_frame, frame, max_raw=100)

    def test_unencodable_payload(self) -> None:
        """Values outside the msgpack profile are a L{CodecError}, not another exception."""
        unencodable = (
            object(),
            2**64,
            -(2**63) - 1,
            "\ud800",
            {1: 2},
            {b"k": 1},
            {1.5},
            [msgpack.ExtType(1, b"")],
        )
        for value in unencodable:
            frame = Frame(FrameType.RESPONSE, 1, {"v": value})
            self.assertRaises(CodecError, encode_frame, frame)

    def test_read_header_checks(self) -> None:
        """L{read_header} refuses each broken header field."""
        good = bytearray(encoded(Frame(FrameType.RESPONSE, 1, {}, b"x"))[:HEADER_SIZE])
        read_header(good)
        for offset, value in ((0, 0x54), (4, 2), (5, 0), (5, 7), (6, 1), (7, 1)):
            bad = bytearray(good)
            bad[offset] = value
            self.assertRaises(CodecError, read_header, bad)
        self.assertRaises(CodecError, read_header, good[:-1])

    def test_max_frame_size(self) -> None:
        """The largest default frame is the header plus 1 MiB plus 16 MiB."""
        self.assertEqual(MAX_FRAME_SIZE, 20 + MAX_PAYLOAD_SIZE + MAX_RAW_SIZE)
        self.assertEqual(MAGIC, b"\x53\x56\x43\x57")


class RoundTripTests(SynchronousTestCase):
    """
    Encoding then decoding gives back an equal frame, for every frame type.
    """

    @settings(max_examples=150, deadline=None)
    @given(FRAMES_BY_TYPE[FrameType.HELLO])
    def test_hello(self, frame: Frame) -> None:
        """HELLO frames survive a round trip."""
        self.assertEqual(round_trip(frame), frame)

    @settings(max_examples=200, deadline=None)
    @given(FRAMES_BY_TYPE[FrameType.REQUEST])
    def test_request(self, frame: Frame) -> None:
        """REQUEST frames, payload and raw segment, survive a round trip."""
        self.assertEqual(round_trip(frame), frame)

    @settings(max_examples=200, deadline=None)
    @given(FRAMES_BY_TYPE[FrameType.RESPONSE])
    def test_response(self, frame: Frame) -> None:
        """RESPONSE frames, payload and raw segment, survive a round trip."""
        self.assertEqual(round_trip(frame), frame)

    @settings(max_examples=150, deadline=None)
    @given(FRAMES_BY_TYPE[FrameType.ERROR])
    def test_error(self, frame: Frame) -> None:
        """ERROR frames survive a round trip."""
        self.assertEqual(round_trip(frame), frame)

    @settings(max_examples=150, deadline=None)
    @given(FRAMES_BY_TYPE[FrameType.PUSH])
    def test_push(self, frame: Frame) -> None:
        """PUSH frames survive a round trip."""
        self.assertEqual(round_trip(frame), frame)

    @settings(max_examples=100, deadline=None)
    @given(FRAMES_BY_TYPE[FrameType.GOAWAY])
    def test_goaway(self, frame: Frame) -> None:
        """GOAWAY frames survive a round trip."""
        self.assertEqual(round_trip(frame), frame)

    def test_tuples_become_lists(self) -> None:
        """Tuples are sent as arrays and come back as lists."""
        frame = Frame(FrameType.RESPONSE, 1, {"t": (1, (2, 3))})
        self.assertEqual(round_trip(frame).payload, {"t": [1, [2, 3]]})


class LargeRawTests(SynchronousTestCase):
    """
    A raw segment of the maximum chunk size, 16 MiB.
    """

    chunk: bytes = bytes(range(256)) * (MAX_RAW_SIZE // 256)

    def test_maximum_raw_round_trip(self) -> None:
        """A 16 MiB raw segment fed in 64 KiB pieces decodes to the same bytes."""
        frame = Frame(FrameType.REQUEST, 77, {"op": "chunk_put"}, self.chunk)
        header_and_payload, raw = encode_frame(frame)
        self.assertIs(raw, self.chunk)
        decoder = FrameDecoder()
        stream = memoryview(bytes(header_and_payload) + self.chunk)
        decoded: list[Frame] = []
        for start in range(0, len(stream), 65536):
            decoded.extend(decoder.feed(stream[start : start + 65536]))
        self.assertEqual(decoded, [frame])
        self.assertEqual(decoder.buffered, 0)

    def test_maximum_raw_whole(self) -> None:
        """A 16 MiB raw segment fed at once decodes without holding anything back."""
        frame = Frame(FrameType.RESPONSE, 1, {"size": len(self.chunk)}, self.chunk)
        decoder = FrameDecoder()
        self.assertEqual(decoder.feed(encoded(frame)), [frame])

    def test_one_byte_over(self) -> None:
        """A raw segment one byte over 16 MiB is refused by the encoder."""
        frame = Frame(FrameType.RESPONSE, 1, {}, memoryview(self.chunk + b"!"))
        self.assertRaises(CodecError, encode_frame, frame)
