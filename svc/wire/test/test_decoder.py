"""
Tests for L{svc.wire.decoder.FrameDecoder}.
"""

from __future__ import annotations

import struct
import tracemalloc

import msgpack
from twisted.trial.unittest import SynchronousTestCase

from svc.buffer_pool import BufferPool, LentBuffer, is_immutable
from svc.wire.control import GoAway, Hello, error_frame, goaway_frame, hello_frame
from svc.wire.decoder import KEEP_AS_VIEW, LEND_RAW_FROM, FrameDecoder
from svc.wire.errno import WireErrno
from svc.wire.errors import CodecError
from svc.wire.frame import (
    FRAMES_TO_CLIENT,
    FRAMES_TO_SERVER,
    HEADER,
    HEADER_SIZE,
    MAGIC,
    MAX_PAYLOAD_SIZE,
    MAX_RAW_SIZE,
    Frame,
    FrameType,
    encode_frame,
    raw_bytes,
)
from svc.wire.payload import MAX_NESTING


def encoded(frame: Frame) -> bytes:
    """The whole encoding of C{frame} as one byte string."""
    return b"".join(encode_frame(frame))


def raw_frame(
    payload: bytes,
    raw: bytes = b"",
    *,
    frame_type: int = FrameType.RESPONSE,
    request_id: int = 1,
    version: int = 1,
    flags: int = 0,
    reserved: int = 0,
    magic: bytes = MAGIC,
    payload_length: int | None = None,
    raw_length: int | None = None,
) -> bytes:
    """A frame assembled by hand, so any field can be wrong."""
    header = HEADER.pack(
        magic,
        version,
        frame_type,
        flags,
        reserved,
        request_id,
        len(payload) if payload_length is None else payload_length,
        len(raw) if raw_length is None else raw_length,
    )
    return header + payload + raw


SAMPLE_FRAMES = [
    hello_frame(Hello(server="svc test")),
    Frame(FrameType.REQUEST, 1, {"op": "chunk_put", "hash": "ab" * 32}, b"chunk bytes"),
    Frame(FrameType.RESPONSE, 1, {"stored": True}),
    error_frame(2, WireErrno.ESTALE, "lost", {"current_version": 4}),
    Frame(FrameType.PUSH, 0, {"op": "lease_revoke", "lease_id": "0f"}),
    Frame(FrameType.RESPONSE, 3, {}, b"\x00" * 7),
    goaway_frame(GoAway("shutdown")),
]
STREAM = b"".join(encoded(frame) for frame in SAMPLE_FRAMES)


class FrameDecoderTests(SynchronousTestCase):
    """
    Tests for splitting, limits and failure of the decoder.
    """

    def assertRejected(self, data: bytes, decoder: FrameDecoder | None = None) -> CodecError:
        """Feeding C{data} raises L{CodecError} and leaves the decoder failed."""
        decoder = decoder or FrameDecoder()
        error: CodecError = self.assertRaises(CodecError, decoder.feed, data)
        self.assertTrue(decoder.failed)
        self.assertIsInstance(error.reason, str)
        return error

    def test_many_frames_one_feed(self) -> None:
        """A stream of frames of every type fed at once decodes to those frames, in order."""
        self.assertEqual(FrameDecoder().feed(STREAM), SAMPLE_FRAMES)

    def test_every_split(self) -> None:
        """Splitting the stream at any byte boundary yields the same frames."""
        for split in range(len(STREAM) + 1):
            decoder = FrameDecoder()
            frames = decoder.feed(STREAM[:split]) + decoder.feed(STREAM[split:])
            self.assertEqual(frames, SAMPLE_FRAMES, f"split at {split}")
            self.assertEqual(decoder.buffered, 0)

    def test_every_pair_of_splits(self) -> None:
        """Cutting the first frames into three pieces anywhere yields the same frames."""
        stream = b"".join(encoded(frame) for frame in SAMPLE_FRAMES[1:3])
        for first in range(len(stream) + 1):
            for second in range(first, len(stream) + 1):
                decoder = FrameDecoder()
                frames = decoder.feed(stream[:first])
                frames += decoder.feed(stream[first:second])
                frames += decoder.feed(stream[second:])
                self.assertEqual(frames, SAMPLE_FRAMES[1:3])

    def test_byte_at_a_time(self) -> None:
        """Feeding one byte at a time yields each frame on its last byte."""
        decoder = FrameDecoder()
        frames: list[Frame] = []
        for index in range(len(STREAM)):
            frames += decoder.feed(STREAM[index : index + 1])
        self.assertEqual(frames, SAMPLE_FRAMES)

    def test_buffered_counts_partial_frame(self) -> None:
        """L{FrameDecoder.buffered} counts the bytes of the incomplete frame held."""
        data = encoded(SAMPLE_FRAMES[1])
        decoder = FrameDecoder()
        decoder.feed(data[:10])
        self.assertEqual(decoder.buffered, 10)
        decoder.feed(data[10:30])
        self.assertEqual(decoder.buffered, 30)
        self.assertEqual(decoder.feed(data[30:]), [SAMPLE_FRAMES[1]])
        self.assertEqual(decoder.buffered, 0)

    def test_accepts_buffers(self) -> None:
        """A bytearray or memoryview may be fed; later changes to it do not alter frames."""
        data = bytearray(encoded(SAMPLE_FRAMES[1]))
        [frame] = FrameDecoder().feed(data)
        data[-3:] = b"XXX"
        self.assertEqual(frame, SAMPLE_FRAMES[1])
        self.assertEqual(
            FrameDecoder().feed(memoryview(encoded(SAMPLE_FRAMES[2]))), [SAMPLE_FRAMES[2]]
        )

    def test_raw_is_read_only(self) -> None:
        """Decoded raw segments cannot be written through, whole or assembled from pieces."""
        data = encoded(SAMPLE_FRAMES[1])
        [whole] = FrameDecoder().feed(data)
        decoder = FrameDecoder()
        decoder.feed(data[:-1])
        [pieces] = decoder.feed(data[-1:])
        for frame in (whole, pieces):
            self.assertIsInstance(frame.raw, memoryview)
            self.assertTrue(memoryview(frame.raw).readonly)

    def test_raw_backed_by_bytes(self) -> None:
        """
        A raw segment, whole or assembled from pieces of any size, is a view
        of a C{bytes} object, so a consumer may keep it without copying.
        """
        raw = bytes(range(256)) * 1024
        data = encoded(Frame(FrameType.REQUEST, 5, {"op": "chunk_put"}, raw))
        schedules = [[len(data)], [40, len(data)], [1] * 64 + [KEEP_AS_VIEW * 3], [7, 9000, 3]]
        for schedule in schedules:
            decoder = FrameDecoder()
            frames: list[Frame] = []
            position, turn = 0, 0
            while position < len(data):
                size = schedule[turn % len(schedule)]
                frames += decoder.feed(data[position : position + size])
                position, turn = position + size, turn + 1
            [frame] = frames
            self.assertIsInstance(frame.raw, memoryview)
            self.assertIsInstance(memoryview(frame.raw).obj, bytes)
            self.assertEqual(bytes(frame.raw), raw, schedule)

    def test_raw_from_pieces_owns_its_bytes(self) -> None:
        """
        A raw segment assembled from pieces is a view of a C{bytes} object of
        exactly its own bytes, whatever the split (the payload and the raw
        segment may share a piece), so L{raw_bytes} keeps it without a
        copy; the payload still decodes.
        """
        raw = bytes(range(256)) * 1024
        frame = Frame(FrameType.RESPONSE, 5, {"hash": "x" * 64, "size": len(raw)}, raw)
        data = encoded(frame)
        payload_end = len(data) - len(raw)
        for cut in (HEADER_SIZE + 1, payload_end - 1, payload_end, payload_end + 1, len(data) - 1):
            decoder = FrameDecoder()
            self.assertEqual(decoder.feed(data[:cut]), [], cut)
            [decoded] = decoder.feed(data[cut:])
            self.assertEqual(decoded, frame, cut)
            view = memoryview(decoded.raw)
            self.assertEqual(view.obj, raw, cut)
            self.assertIs(raw_bytes(decoded.raw), view.obj, cut)

    def test_raw_bytes_copies_a_partial_view(self) -> None:
        """
        L{raw_bytes} copies a view that covers only part of its C{bytes}
        object (a frame received whole in one feed shares the data fed), and
        returns C{bytes} as they are.
        """
        data = b"head" + b"body" * 10
        partial = memoryview(data)[4:]
        kept = raw_bytes(partial)
        self.assertEqual(kept, data[4:])
        self.assertIsNot(kept, data)
        self.assertIs(raw_bytes(data), data)
        self.assertIs(raw_bytes(memoryview(data)), data)
        self.assertEqual(raw_bytes(bytearray(b"ab")), b"ab")

    def test_large_raw_assembled_in_a_lent_buffer(self) -> None:
        """
        With a pool, a raw segment of at least LEND_RAW_FROM bytes that
        arrives in pieces lands in a lent buffer, whatever the split (the
        payload may end mid-piece); its release_raw gives the buffer back
        for the next frame.
        """
        pool = BufferPool(MAX_RAW_SIZE, keep=2)
        raw = bytes(range(256)) * (LEND_RAW_FROM // 256 + 3)
        frame = Frame(FrameType.REQUEST, 9, {"op": "chunk_put", "hash": "a" * 64}, raw)
        data = encoded(frame)
        payload_end = len(data) - len(raw)
        for cut in (HEADER_SIZE + 2, payload_end - 1, payload_end, payload_end + 5):
            decoder = FrameDecoder(raw_buffers=pool)
            self.assertEqual(decoder.feed(data[:cut]), [], cut)
            self.assertEqual(decoder.feed(data[cut:-3]), [], cut)
            [decoded] = decoder.feed(data[-3:])
            self.assertEqual(decoded, frame, cut)
            view = memoryview(decoded.raw)
            self.assertTrue(view.readonly)
            self.assertIsInstance(view.obj, LentBuffer)
            self.assertTrue(is_immutable(view))
            del view
            assert decoded.release_raw is not None
            decoded.release_raw()
        self.assertEqual((pool.created, pool.idle), (1, 1))

    def test_raw_written_into_the_receive_target(self) -> None:
        """
        A lent raw segment may be filled through receive_target (short of
        its last byte) in any mix with feed; the frame completes through
        feed, equal to the one sent, and the buffer is lent again.
        """
        pool = BufferPool(MAX_RAW_SIZE, keep=2)
        raw = bytes(range(251)) * (LEND_RAW_FROM // 251 + 3)
        frame = Frame(FrameType.REQUEST, 9, {"op": "chunk_put", "hash": "a" * 64}, raw)
        data = encoded(frame)
        payload_end = len(data) - len(raw)
        for step in (1, 1000, 16384, len(raw)):
            decoder = FrameDecoder(raw_buffers=pool)
            self.assertIsNone(decoder.receive_target())  # nothing begun
            self.assertEqual(decoder.feed(data[: payload_end - 1]), [])
            self.assertIsNone(decoder.receive_target())  # the payload is not complete
            self.assertEqual(decoder.feed(data[payload_end - 1 : payload_end + 7]), [])
            position = payload_end + 7
            while (target := decoder.receive_target()) is not None:
                self.assertLessEqual(position + len(target), len(data) - 1)
                count = min(step, len(target))
                target[:count] = data[position : position + count]
                target.release()
                decoder.received_into(count)
                position += count
            self.assertEqual(position, len(data) - 1, step)
            [decoded] = decoder.feed(data[position:])
            self.assertEqual(decoded, frame, step)
            assert decoded.release_raw is not None
            decoded.release_raw()
        self.assertEqual((pool.created, pool.idle), (1, 1))

    def test_no_receive_target_without_a_loan(self) -> None:
        """Small frames, decoders without a pool and failed decoders offer no target."""
        small = encoded(Frame(FrameType.REQUEST, 1, {"op": "x"}, b"s" * 1000))
        decoder = FrameDecoder(raw_buffers=BufferPool(MAX_RAW_SIZE, keep=1))
        decoder.feed(small[:100])
        self.assertIsNone(decoder.receive_target())
        large = encoded(Frame(FrameType.REQUEST, 2, {"op": "x"}, b"L" * LEND_RAW_FROM))
        plain = FrameDecoder()
        plain.feed(large[:1000])
        self.assertIsNone(plain.receive_target())
        failing = FrameDecoder(raw_buffers=BufferPool(MAX_RAW_SIZE, keep=1))
        with self.assertRaises(CodecError):
            failing.feed(b"HTTP/1.1 200 OK\r\n" * 2)
        self.assertIsNone(failing.receive_target())

    def test_small_or_whole_raw_not_lent(self) -> None:
        """
        Below LEND_RAW_FROM, or when a frame arrives whole in one feed, the
        raw segment is C{bytes} as without a pool, and nothing is lent.
        """
        pool = BufferPool(MAX_RAW_SIZE, keep=2)
        small = encoded(Frame(FrameType.REQUEST, 1, {"op": "x"}, b"s" * (LEND_RAW_FROM - 1)))
        decoder = FrameDecoder(raw_buffers=pool)
        decoder.feed(small[:100])
        [frame] = decoder.feed(small[100:])
        self.assertIsNone(frame.release_raw)
        self.assertIsInstance(memoryview(frame.raw).obj, bytes)
        large = encoded(Frame(FrameType.REQUEST, 2, {"op": "x"}, b"L" * LEND_RAW_FROM))
        [whole] = FrameDecoder(raw_buffers=pool).feed(large)
        self.assertIsNone(whole.release_raw)
        self.assertEqual(pool.created, 0)

    def test_lent_buffer_given_back_on_error(self) -> None:
        """
        A body refused when complete (a payload that is not msgpack) or a
        later error gives its lent buffer back; the decoder stays failed.
        """
        pool = BufferPool(MAX_RAW_SIZE, keep=2)
        raw = b"r" * LEND_RAW_FROM
        garbage = b"\xc1" * 4  # 0xc1 is never valid msgpack
        header = HEADER.pack(MAGIC, 1, FrameType.REQUEST, 0, 0, 3, len(garbage), len(raw))
        decoder = FrameDecoder(raw_buffers=pool)
        decoder.feed(header + garbage + raw[:1000])
        with self.assertRaises(CodecError):
            decoder.feed(raw[1000:])
        self.assertEqual((pool.created, pool.idle), (1, 1))
        self.assertTrue(decoder.failed)

    def test_tiny_pieces_held_compactly(self) -> None:
        """
        A body fed a byte at a time is held as copied runs, not a view per
        byte: the decoder's memory stays near the bytes received.
        """
        raw = b"\x5a" * (256 * 1024)
        data = encoded(Frame(FrameType.REQUEST, 5, {"op": "chunk_put"}, raw))
        decoder = FrameDecoder()
        tracemalloc.start()
        try:
            for index in range(len(data) - 1):
                decoder.feed(data[index : index + 1])
            held, _peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        self.assertLess(held, 2 * len(raw))
        [frame] = decoder.feed(data[-1:])
        self.assertEqual(bytes(frame.raw), raw)

    def test_empty_feed(self) -> None:
        """Feeding nothing returns no frames."""
        self.assertEqual(FrameDecoder().feed(b""), [])

    def test_bad_magic(self) -> None:
        """A header with the wrong magic is refused."""
        self.assertIn("magic", self.assertRejected(raw_frame(b"\x80", magic=b"SVCX")).reason)

    def test_bad_version(self) -> None:
        """A header with a version other than 1 is refused."""
        for version in (0, 2, 255):
            self.assertRejected(raw_frame(b"\x80", version=version))

    def test_bad_type(self) -> None:
        """Unknown frame types are refused."""
        for frame_type in (0, 7, 255):
            self.assertRejected(raw_frame(b"\x80", frame_type=frame_type))

    def test_flags_set(self) -> None:
        """Any flag bit set is refused; none are defined."""
        for flags in (1, 0x80):
            self.assertRejected(raw_frame(b"\x80", flags=flags))

    def test_reserved_set(self) -> None:
        """A non-zero reserved byte is refused."""
        self.assertRejected(raw_frame(b"\x80", reserved=1))

    def test_request_id_rules(self) -> None:
        """Id 0 on a RESPONSE, or a non-zero id on a PUSH, is refused at the header."""
        self.assertRejected(raw_frame(b"\x80", request_id=0))
        push = msgpack.packb({"op": "lease_revoke"})
        self.assertRejected(raw_frame(push, frame_type=FrameType.PUSH, request_id=5))

    def test_empty_payload(self) -> None:
        """A payload length of zero is refused."""
        self.assertRejected(raw_frame(b""))

    def test_raw_on_error_frame(self) -> None:
        """An ERROR frame announcing a raw segment is refused at the header."""
        payload = msgpack.packb({"errno": 5, "message": ""})
        self.assertRejected(raw_frame(payload, b"x", frame_type=FrameType.ERROR))

    def test_accept_filters_types(self) -> None:
        """A side refuses frame types it may not receive."""
        request = encoded(SAMPLE_FRAMES[1])
        self.assertRejected(request, FrameDecoder(accept=FRAMES_TO_CLIENT))
        self.assertEqual(len(FrameDecoder(accept=FRAMES_TO_SERVER).feed(request)), 1)
        self.assertRejected(encoded(SAMPLE_FRAMES[0]), FrameDecoder(accept=FRAMES_TO_SERVER))

    def test_oversize_payload_refused_at_header(self) -> None:
        """A header announcing a payload over the limit fails on its last byte."""
        header = raw_frame(b"", payload_length=MAX_PAYLOAD_SIZE + 1)[:HEADER_SIZE]
        decoder = FrameDecoder()
        for index in range(HEADER_SIZE - 1):
            self.assertEqual(decoder.feed(header[index : index + 1]), [])
            self.assertLessEqual(decoder.buffered, HEADER_SIZE)
        self.assertRejected(header[-1:], decoder)
        self.assertEqual(decoder.buffered, 0)

    def test_oversize_raw_refused_before_body(self) -> None:
        """A header announcing more than 16 MiB of raw data fails with its body unbuffered."""
        data = raw_frame(b"\x80", b"y" * 4096, raw_length=MAX_RAW_SIZE + 1)
        decoder = FrameDecoder()
        self.assertIn("raw", self.assertRejected(data, decoder).reason)
        self.assertEqual(decoder.buffered, 0)

    def test_configured_limits(self) -> None:
        """Limits given to the constructor apply: exactly at the limit passes, one over fails."""
        frame = Frame(FrameType.RESPONSE, 1, {"b": b"x" * 10}, b"r" * 50)
        size = len(encoded(frame)) - HEADER_SIZE - 50
        self.assertEqual(FrameDecoder(max_payload=size, max_raw=50).feed(encoded(frame)), [frame])
        self.assertRejected(encoded(frame), FrameDecoder(max_payload=size - 1))
        self.assertRejected(encoded(frame), FrameDecoder(max_raw=49))

    def test_constructor_limits_checked(self) -> None:
        """Limits outside what the header can express are a ValueError."""
        self.assertRaises(ValueError, FrameDecoder, max_payload=0)
        self.assertRaises(ValueError, FrameDecoder, max_raw=2**32)

    def test_stays_failed(self) -> None:
        """After one error every feed raises, even of valid frames or nothing."""
        decoder = FrameDecoder()
        self.assertRejected(raw_frame(b"\x80", version=9), decoder)
        self.assertRaises(CodecError, decoder.feed, encoded(SAMPLE_FRAMES[2]))
        self.assertRaises(CodecError, decoder.feed, b"")

    def test_error_after_good_frames_in_one_feed(self) -> None:
        """Garbage after good frames in the same feed fails the whole feed."""
        self.assertRejected(STREAM + b"GET / HTTP/1.1\r\n\r\n")

    def test_stranger_refused_early(self) -> None:
        """A stream not starting with the magic fails before a whole header has arrived."""
        decoder = FrameDecoder()
        self.assertEqual(decoder.feed(b"SV"), [])
        self.assertRejected(b"CX", decoder)
        self.assertRejected(b"\x16\x03\x01")

    def test_payload_not_a_map(self) -> None:
        """A payload that is valid msgpack but not a map is refused."""
        for value in ([1], 5, "op", None):
            self.assertRejected(raw_frame(msgpack.packb(value)))

    def test_payload_bad_keys(self) -> None:
        """Integer or binary map keys, at the top or deeper, are refused."""
        for value in ({1: 2}, {b"k": 2}, {"a": {1: 2}}, {"a": [{b"k": 1}]}):
            self.assertRejected(raw_frame(msgpack.packb(value, use_bin_type=True)))

    def test_payload_duplicate_keys(self) -> None:
        """A map with the same key twice is refused, at any depth."""
        self.assertRejected(raw_frame(b"\x82\xa1a\x01\xa1a\x02"))
        self.assertRejected(raw_frame(b"\x81\xa1m\x82\xa1a\x01\xa1a\x02"))

    def test_payload_trailing_bytes(self) -> None:
        """Bytes after the payload map inside the payload length are refused."""
        self.assertRejected(raw_frame(b"\x80\xc0"))

    def test_payload_truncated(self) -> None:
        """A payload map cut short by the payload length is refused."""
        self.assertRejected(raw_frame(msgpack.packb({"key": "value"})[:-2]))

    def test_payload_invalid_utf8(self) -> None:
        """Strings that are not valid UTF-8, including encoded surrogates, are refused."""
        for text in (b"\xff\xfe", b"\xed\xa0\x80", b"\xc0\x80"):
            self.assertRejected(raw_frame(b"\x81\xa1s" + bytes([0xA0 | len(text)]) + text))

    def test_payload_ext_types(self) -> None:
        """Extension types are refused, including timestamps and empty ones."""
        for ext in (b"\xd6\xff\x00\x00\x00\x00", b"\xd4\x05\x00", b"\xc7\x00\x05"):
            self.assertRejected(raw_frame(b"\x81\xa1e" + ext))

    def test_payload_reserved_byte(self) -> None:
        """The never-used msgpack byte 0xc1 is refused."""
        self.assertRejected(raw_frame(b"\x81\xa1x\xc1"))

    def test_payload_announces_huge_array(self) -> None:
        """An array header announcing 2**32-1 elements is refused without allocating them."""
        self.assertRejected(raw_frame(b"\x81\xa1a\xdd\xff\xff\xff\xff"))

    def test_nesting_limit(self) -> None:
        """Containers nested exactly to the limit pass; one deeper is refused."""

        def nested(depth: int) -> bytes:
            # The top-level map is depth 1; each 0x91 adds an array.
            return b"\x81\xa1n" + b"\x91" * (depth - 2) + b"\x90"

        [frame] = FrameDecoder().feed(raw_frame(nested(MAX_NESTING)))
        self.assertEqual(frame.type, FrameType.RESPONSE)
        self.assertRejected(raw_frame(nested(MAX_NESTING + 1)))
        self.assertRejected(raw_frame(b"\x81\xa1n" + b"\x91" * 5000 + b"\xc0"))

    def test_schema_checked_on_decode(self) -> None:
        """An ERROR frame whose payload lacks errno is refused by the decoder."""
        payload = msgpack.packb({"message": "no errno"})
        self.assertRejected(raw_frame(payload, frame_type=FrameType.ERROR))

    def test_unknown_keys_kept(self) -> None:
        """Keys the receiver does not know are decoded, not refused."""
        payload = msgpack.packb({"op": "ping", "future_key": [1, 2]})
        [frame] = FrameDecoder().feed(raw_frame(payload, frame_type=FrameType.REQUEST))
        self.assertEqual(frame.payload["future_key"], [1, 2])

    def test_header_fields_big_endian(self) -> None:
        """Request id and lengths are read big-endian."""
        data = raw_frame(b"\x80", b"ab", request_id=0x01000002)
        self.assertEqual(struct.unpack(">I", data[8:12]), (0x01000002,))
        [frame] = FrameDecoder().feed(data)
        self.assertEqual((frame.request_id, bytes(frame.raw)), (0x01000002, b"ab"))
