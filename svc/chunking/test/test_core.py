"""
Tests for L{svc.chunking.core}: chunk values, naming and in-memory cutting.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from pyfastcdc import FastCDC
from pyfastcdc.py.constants import MASKS
from twisted.trial.unittest import SynchronousTestCase

from svc.chunking.core import (
    AVG_CHUNK_SIZE,
    MAX_CHUNK_SIZE,
    MIN_CHUNK_SIZE,
    ChunkRef,
    chunk_bytes,
    chunk_hash,
    iter_cut_points,
    new_cutter,
)
from svc.chunking.test import reference
from svc.chunking.test.inputs import MiB, contents, xof

HASH = "ab" * 32
BLAKE3_OF_EMPTY = "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"

big_inputs = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class ChunkRefTests(SynchronousTestCase):
    """
    L{ChunkRef} holds a valid position and name.
    """

    def test_fields(self) -> None:
        """A ref keeps its offset, length and hash and knows where it ends."""
        ref = ChunkRef(10, 20, HASH)
        self.assertEqual((ref.offset, ref.length, ref.hash, ref.end), (10, 20, HASH, 30))

    def test_value_semantics(self) -> None:
        """Equal refs compare equal, hash equal and cannot be modified."""
        ref = ChunkRef(0, 1, HASH)
        self.assertEqual(ref, ChunkRef(0, 1, HASH))
        self.assertEqual(len({ref, ChunkRef(0, 1, HASH)}), 1)
        with self.assertRaises(AttributeError):
            ref.offset = 5  # type: ignore[misc]

    def test_rejects_bad_hash(self) -> None:
        """Hashes must be exactly 64 lowercase hex characters."""
        for bad in ["AB" * 32, "ab" * 31, "ab" * 33, "zz" * 32, "", b"ab" * 32]:
            with self.assertRaises(ValueError, msg=repr(bad)):
                ChunkRef(0, 1, bad)  # type: ignore[arg-type]

    def test_rejects_bad_offset(self) -> None:
        """Offsets are non-negative integers (not bools)."""
        for bad in [-1, 1.0, True, "0"]:
            with self.assertRaises(ValueError, msg=repr(bad)):
                ChunkRef(bad, 1, HASH)  # type: ignore[arg-type]

    def test_rejects_bad_length(self) -> None:
        """Lengths lie in [1, 16 MiB]."""
        for bad in [0, -1, MAX_CHUNK_SIZE + 1, 2.0, False]:
            with self.assertRaises(ValueError, msg=repr(bad)):
                ChunkRef(0, bad, HASH)  # type: ignore[arg-type]
        self.assertEqual(ChunkRef(0, MAX_CHUNK_SIZE, HASH).length, MAX_CHUNK_SIZE)


class ChunkHashTests(SynchronousTestCase):
    """
    L{chunk_hash} names bytes by lowercase hex BLAKE3-256.
    """

    def test_empty(self) -> None:
        """The name of no bytes is BLAKE3's published empty-input digest."""
        self.assertEqual(chunk_hash(b""), BLAKE3_OF_EMPTY)

    def test_buffer_kinds(self) -> None:
        """Bytes, bytearrays and memoryview slices of the same bytes share a name."""
        data = xof(b"kinds", 1000)
        name = chunk_hash(data)
        self.assertEqual(chunk_hash(bytearray(data)), name)
        self.assertEqual(chunk_hash(memoryview(b"xx" + data)[2:]), name)
        self.assertRegex(name, "^[0-9a-f]{64}$")
        self.assertNotEqual(chunk_hash(data[:-1]), name)


class CutterTests(SynchronousTestCase):
    """
    The cutter is the compiled FastCDC 2020 with the specified parameters.
    """

    def test_parameters(self) -> None:
        """Minimum 1 MiB, average 4 MiB, maximum 16 MiB."""
        cutter = new_cutter()
        self.assertEqual(
            (cutter.min_size, cutter.avg_size, cutter.max_size),
            (MIN_CHUNK_SIZE, AVG_CHUNK_SIZE, MAX_CHUNK_SIZE),
        )
        self.assertEqual((MIN_CHUNK_SIZE, AVG_CHUNK_SIZE), (1048576, 4194304))
        self.assertEqual(MAX_CHUNK_SIZE, 16777216)

    def test_compiled(self) -> None:
        """The compiled extension is in use, not pyfastcdc's pure-Python fallback."""
        self.assertEqual(type(new_cutter()).__module__, "pyfastcdc.cy.fastcdc")


class ChunkBytesTests(SynchronousTestCase):
    """
    Properties of L{chunk_bytes} over varied inputs.
    """

    def test_empty(self) -> None:
        """Empty input has no chunks."""
        self.assertEqual(chunk_bytes(b""), [])

    def test_short_input_is_one_chunk(self) -> None:
        """Input up to the minimum size is a single chunk."""
        for length in [1, 2, MIN_CHUNK_SIZE - 1, MIN_CHUNK_SIZE, MIN_CHUNK_SIZE + 1]:
            data = xof(b"short", length)
            self.assertEqual(chunk_bytes(data), [ChunkRef(0, length, chunk_hash(data))])

    def test_run_of_one_byte_cut_at_maximum(self) -> None:
        """A run of zeros holds no cut point: chunks are 16 MiB, then the rest."""
        refs = chunk_bytes(bytes(2 * MAX_CHUNK_SIZE + 3))
        self.assertEqual([ref.length for ref in refs], [MAX_CHUNK_SIZE, MAX_CHUNK_SIZE, 3])
        self.assertEqual(refs[0].hash, refs[1].hash)

    @big_inputs
    @given(contents())
    def test_chunks_tile_the_input(self, data: bytes) -> None:
        """Chunks are contiguous from 0, concatenate back to the input and are named by it."""
        refs = chunk_bytes(data)
        view = memoryview(data)
        position = 0
        for ref in refs:
            self.assertEqual(ref.offset, position)
            self.assertEqual(ref.hash, chunk_hash(view[ref.offset : ref.end]))
            position = ref.end
        self.assertEqual(position, len(data))
        self.assertEqual(b"".join(data[r.offset : r.end] for r in refs), data)

    @big_inputs
    @given(contents())
    def test_sizes_within_limits(self, data: bytes) -> None:
        """Every chunk but the last is 1 to 16 MiB; the last is 1 byte to 16 MiB."""
        refs = chunk_bytes(data)
        self.assertEqual(refs == [], data == b"")
        for ref in refs[:-1]:
            self.assertGreaterEqual(ref.length, MIN_CHUNK_SIZE)
            self.assertLessEqual(ref.length, MAX_CHUNK_SIZE)
        if refs:
            self.assertGreater(refs[-1].length, 0)
            self.assertLessEqual(refs[-1].length, MAX_CHUNK_SIZE)

    @big_inputs
    @given(contents(max_pieces=3, max_piece=12 * MiB))
    def test_deterministic(self, data: bytes) -> None:
        """Cutting the same bytes again, from a separate copy, gives the same chunks."""
        first = chunk_bytes(data)
        self.assertEqual(chunk_bytes(bytearray(data)), first)
        self.assertEqual([(ref.offset, ref.length) for ref in first], list(iter_cut_points(data)))


class ReferenceAgreementTests(SynchronousTestCase):
    """
    The compiled cutter cuts exactly where the specification's algorithm
    (written out byte by byte in L{reference}) cuts.
    """

    @settings(max_examples=60, deadline=None)
    @given(contents(max_pieces=5, max_piece=24 * 1024))
    def test_small_parameters(self, data: bytes) -> None:
        """With 256/1024/4096-byte parameters, compiled and reference cuts agree."""
        cutter = FastCDC(1024, min_size=256, max_size=4096, normalized_chunking=1)
        compiled = [(chunk.offset, chunk.length) for chunk in cutter.cut_buf(data)]
        expected = reference.cut_points(data, 256, 1024, 4096, MASKS[11], MASKS[9])
        self.assertEqual(compiled, expected)

    def test_real_parameters(self) -> None:
        """With the real parameters, compiled and reference cuts agree on a 9 MB input."""
        data = xof(b"svc-chunking/v1/random", 50_000_017)[:9_000_001]
        expected = reference.cut_points(data)
        self.assertGreater(len(expected), 1)
        self.assertEqual(list(iter_cut_points(data)), expected)

    def test_masks(self) -> None:
        """The specification's masks are FastCDC's for 2^(22+1) and 2^(22-1)."""
        self.assertEqual((reference.MASK_S, reference.MASK_L), (MASKS[23], MASKS[21]))
        self.assertEqual(bin(reference.MASK_S).count("1"), 23)
        self.assertEqual(bin(reference.MASK_L).count("1"), 21)
