"""
Garbage-input properties of the decoder: whatever bytes arrive, split however,
the decoder returns frames or raises L{CodecError}, nothing else.
"""

from __future__ import annotations

import itertools

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from svc.wire.decoder import FrameDecoder
from svc.wire.errors import CodecError
from svc.wire.frame import HEADER, HEADER_SIZE, MAGIC, Frame, FrameType, encode_frame
from svc.wire.test.strategies import frames

# Small limits keep each example cheap; the limit logic is the same.
LIMIT = 4096


def encoded_stream(stream: list[Frame]) -> bytes:
    """Frames encoded back to back."""
    return b"".join(b"".join(encode_frame(frame)) for frame in stream)


@st.composite
def mutated_streams(draw: st.DrawFn) -> bytes:
    """A valid stream of one to three frames with a few bytes changed, added or cut."""
    data = bytearray(encoded_stream(draw(st.lists(frames, min_size=1, max_size=3))))
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        if not data:
            break
        # Aim half of the edits at the first header, where most checks live.
        limit = len(data) - 1 if draw(st.booleans()) else min(HEADER_SIZE, len(data)) - 1
        index = draw(st.integers(min_value=0, max_value=limit))
        edit = draw(st.sampled_from(["set", "flip", "insert", "delete", "truncate"]))
        if edit == "set":
            data[index] = draw(st.integers(min_value=0, max_value=255))
        elif edit == "flip":
            data[index] ^= 1 << draw(st.integers(min_value=0, max_value=7))
        elif edit == "insert":
            data[index:index] = draw(st.binary(min_size=1, max_size=8))
        elif edit == "delete":
            del data[index : index + draw(st.integers(min_value=1, max_value=8))]
        else:
            del data[index:]
    return bytes(data)


@st.composite
def random_payload_frames(draw: st.DrawFn) -> bytes:
    """A well-formed header followed by a payload of random bytes."""
    payload = draw(st.binary(min_size=1, max_size=64))
    frame_type = draw(st.sampled_from(FrameType))
    request_id = 0 if frame_type in (FrameType.HELLO, FrameType.PUSH, FrameType.GOAWAY) else 1
    return HEADER.pack(MAGIC, 1, frame_type, 0, 0, request_id, len(payload), 0) + payload


msgpack_anything = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8)
    | st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=4)),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.text(max_size=4) | st.binary(max_size=4), children, max_size=3)
    ),
    max_leaves=8,
)


@st.composite
def any_msgpack_frames(draw: st.DrawFn) -> bytes:
    """A well-formed header followed by any msgpack value, map or not, valid keys or not."""
    payload: bytes = msgpack.packb(draw(msgpack_anything), use_bin_type=True)
    frame_type = draw(st.sampled_from(FrameType))
    request_id = 0 if frame_type in (FrameType.HELLO, FrameType.PUSH, FrameType.GOAWAY) else 1
    return HEADER.pack(MAGIC, 1, frame_type, 0, 0, request_id, len(payload), 0) + payload


hostile_streams = (
    st.binary(max_size=96) | mutated_streams() | random_payload_frames() | any_msgpack_frames()
)


class GarbageTests(SynchronousTestCase):
    """
    The decoder's only failure is L{CodecError}.
    """

    def check(self, data: bytes, cuts: list[int]) -> None:
        """Feed C{data} cut at C{cuts}; demand frames or L{CodecError} and consistent state."""
        decoder = FrameDecoder(max_payload=LIMIT, max_raw=LIMIT)
        bounds = [0, *sorted(cut % (len(data) + 1) for cut in cuts), len(data)]
        decoded: list[Frame] = []
        try:
            for start, end in itertools.pairwise(bounds):
                decoded += decoder.feed(data[start:end])
        except CodecError:
            self.assertTrue(decoder.failed)
            self.assertRaises(CodecError, decoder.feed, b"")
            return
        self.assertFalse(decoder.failed)
        self.assertLessEqual(decoder.buffered, len(data))
        # Anything accepted is a frame this side could have sent itself (compared
        # as encodings, since a mutated float may be a NaN, unequal to itself).
        again = encoded_stream(decoded)
        self.assertEqual(encoded_stream(FrameDecoder().feed(again)), again)

    @settings(max_examples=3000, deadline=None)
    @given(hostile_streams, st.lists(st.integers(min_value=0), max_size=4))
    def test_any_bytes_any_split(self, data: bytes, cuts: list[int]) -> None:
        """Random, mutated and hand-built byte strings yield frames or CodecError only."""
        self.check(data, cuts)

    @settings(max_examples=500, deadline=None)
    @given(any_msgpack_frames())
    def test_any_msgpack_value(self, data: bytes) -> None:
        """Every msgpack value as a payload yields a frame or CodecError only."""
        self.check(data, [])
