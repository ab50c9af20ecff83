"""
The behaviour every L{svc.store.chunks.IChunkStore} must have.

Mix L{ChunkStoreContractMixin} into a L{SynchronousTestCase} and implement
its three hooks; the store's L{Deferred}s must fire synchronously (use an
C{ImmediateWorker}).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from svc.store.chunks import (
    MAX_CHUNK_SIZE,
    ChunkHashMismatch,
    ChunkInfo,
    CorruptStoredChunk,
    IChunkStore,
    chunk_hash,
)
from svc.store.errors import CorruptChunk, InvalidArgument, NotFound
from svc.wire.errno import WireErrno

if TYPE_CHECKING:
    _Base = SynchronousTestCase
else:
    _Base = object

NOW_NS = time.time_ns()
"""Roughly now: the hooks age chunks to instants well before this."""

BAD_HASHES = (
    "",
    "ab",
    "A" * 64,  # uppercase
    "g" * 64,
    "0" * 63,
    "0" * 65,
    "../" + "0" * 61,
)


def chunk(seed: int, size: int = 1000) -> tuple[str, bytes]:
    """
    A deterministic chunk of C{size} bytes and its hash.
    """
    data = (seed.to_bytes(4, "big") * (size // 4 + 1))[:size]
    return chunk_hash(data), data


class ChunkStoreContractMixin(_Base):
    """
    Tests for the L{IChunkStore} contract. Subclasses implement
    L{make_store}, L{corrupt_chunk} and L{set_mtime}.
    """

    def make_store(self) -> IChunkStore:
        """
        A new, empty, ready store whose mtimes are close to L{NOW_NS}.
        """
        raise NotImplementedError()

    def corrupt_chunk(self, store: IChunkStore, name: str, data: bytes) -> None:
        """
        Replace the stored bytes of C{name} with C{data}, as a bad disk would.
        """
        raise NotImplementedError()

    def set_mtime(self, store: IChunkStore, name: str, mtime_ns: int) -> None:
        """
        Make the stored chunk C{name} look last stored at C{mtime_ns}.
        """
        raise NotImplementedError()

    def test_put_get_round_trip(self) -> None:
        """Bytes put under their hash come back unchanged from get."""
        store = self.make_store()
        name, data = chunk(1, 5000)
        result = self.successResultOf(store.put(name, data))
        self.assertEqual((result.hash, result.size, result.deduped), (name, 5000, False))
        self.assertEqual(self.successResultOf(store.get(name)), data)

    def test_read_lends_the_verified_bytes(self) -> None:
        """
        read gives a read-only view of the chunk's bytes; released, a later
        read still gives the right bytes; absent and malformed names fail
        as get does.
        """
        store = self.make_store()
        stored = [chunk(seed, 700 * seed) for seed in (1, 2, 3)]
        for name, data in stored:
            self.successResultOf(store.put(name, data))
        for _ in range(2):
            for name, data in stored:
                lent = self.successResultOf(store.read(name))
                self.assertTrue(lent.data.readonly)
                self.assertEqual(bytes(lent.data), data)
                lent.release()
        self.failureResultOf(store.read(chunk(9)[0]), NotFound)
        self.failureResultOf(store.read("../x"), InvalidArgument)

    def test_read_never_serves_corrupt_bytes(self) -> None:
        """read of a chunk that no longer verifies fails with EIO, like get."""
        store = self.make_store()
        name, data = chunk(62, 900)
        self.successResultOf(store.put(name, data))
        self.corrupt_chunk(store, name, data[:-1] + b"Z")
        failure = self.failureResultOf(store.read(name), CorruptStoredChunk)
        self.assertEqual(failure.value.errno, WireErrno.EIO)
        self.failureResultOf(store.read(name), NotFound)

    def test_put_accepts_memoryview_and_mutable_buffers(self) -> None:
        """A memoryview over a bytearray is stored as the bytes it held at put time."""
        store = self.make_store()
        name, data = chunk(2)
        buffer = bytearray(data)
        self.successResultOf(store.put(name, memoryview(buffer)))
        buffer[:10] = b"\x00" * 10
        self.assertEqual(self.successResultOf(store.get(name)), data)

    def test_put_empty_chunk(self) -> None:
        """The empty chunk is a valid chunk of size zero."""
        store = self.make_store()
        name = chunk_hash(b"")
        self.assertEqual(self.successResultOf(store.put(name, b"")).size, 0)
        self.assertEqual(self.successResultOf(store.get(name)), b"")

    def test_put_maximum_size(self) -> None:
        """A chunk of exactly MAX_CHUNK_SIZE bytes is accepted."""
        store = self.make_store()
        data = b"\x5a" * MAX_CHUNK_SIZE
        name = chunk_hash(data)
        self.assertEqual(self.successResultOf(store.put(name, data)).size, MAX_CHUNK_SIZE)
        self.assertEqual(self.successResultOf(store.total_bytes()), MAX_CHUNK_SIZE)

    def test_second_put_is_deduped(self) -> None:
        """Putting present content again reports deduped and does not count it twice."""
        store = self.make_store()
        name, data = chunk(3, 700)
        self.successResultOf(store.put(name, data))
        again = self.successResultOf(store.put(name, data))
        self.assertEqual((again.hash, again.size, again.deduped), (name, 700, True))
        self.assertEqual(self.successResultOf(store.total_bytes()), 700)
        self.assertEqual(len(self.successResultOf(store.list_chunks())), 1)

    def test_dedup_refreshes_mtime(self) -> None:
        """Re-offering a present chunk restarts its GC grace period."""
        store = self.make_store()
        name, data = chunk(4)
        self.successResultOf(store.put(name, data))
        self.set_mtime(store, name, 1_000)
        self.assertEqual(self.successResultOf(store.stat(name)).mtime_ns, 1_000)
        self.successResultOf(store.put(name, data))
        self.assertGreater(self.successResultOf(store.stat(name)).mtime_ns, NOW_NS - 10**12)

    def test_hash_mismatch_rejected(self) -> None:
        """Bytes that do not hash to the name fail with EINVAL and nothing is stored."""
        store = self.make_store()
        name, _ = chunk(5)
        _, other = chunk(6)
        failure = self.failureResultOf(store.put(name, other), ChunkHashMismatch)
        self.assertIsInstance(failure.value, CorruptChunk)
        self.assertEqual(failure.value.errno, WireErrno.EINVAL)
        self.assertEqual((failure.value.expected, failure.value.actual), (name, chunk_hash(other)))
        self.assertEqual(self.successResultOf(store.has([name])).absent, (name,))
        self.assertEqual(self.successResultOf(store.total_bytes()), 0)
        self.assertEqual(self.successResultOf(store.list_chunks()), [])

    def test_oversize_rejected(self) -> None:
        """A chunk over MAX_CHUNK_SIZE fails with InvalidArgument (EINVAL) and is not stored."""
        store = self.make_store()
        data = bytes(MAX_CHUNK_SIZE + 1)
        name = chunk_hash(data)
        failure = self.failureResultOf(store.put(name, data), InvalidArgument)
        self.assertEqual(failure.value.errno, WireErrno.EINVAL)
        self.assertEqual(self.successResultOf(store.list_chunks()), [])
        self.assertEqual(self.successResultOf(store.total_bytes()), 0)

    def test_malformed_hashes_rejected(self) -> None:
        """Every operation refuses a malformed hash with InvalidArgument."""
        store = self.make_store()
        good, data = chunk(7)
        self.successResultOf(store.put(good, data))
        for bad in BAD_HASHES:
            self.failureResultOf(store.put(bad, data), InvalidArgument)
            self.failureResultOf(store.get(bad), InvalidArgument)
            self.failureResultOf(store.stat(bad), InvalidArgument)
            self.failureResultOf(store.has([good, bad]), InvalidArgument)
            self.failureResultOf(store.delete([good, bad]), InvalidArgument)
        self.assertEqual(self.successResultOf(store.has([good])).present, (good,))

    def test_get_absent(self) -> None:
        """Getting a chunk that is not stored fails with NotFound (ENOENT)."""
        store = self.make_store()
        failure = self.failureResultOf(store.get(chunk(8)[0]), NotFound)
        self.assertEqual(failure.value.errno, WireErrno.ENOENT)

    def test_stat(self) -> None:
        """stat gives a stored chunk's size and NotFound for an absent one."""
        store = self.make_store()
        name, data = chunk(9, 321)
        self.failureResultOf(store.stat(name), NotFound)
        self.successResultOf(store.put(name, data))
        info = self.successResultOf(store.stat(name))
        self.assertEqual((info.hash, info.size), (name, 321))

    def test_has_batch(self) -> None:
        """has splits distinct hashes into present and absent, in request order."""
        store = self.make_store()
        names = [chunk(seed)[0] for seed in range(10, 16)]
        for seed in (11, 13, 14):
            self.successResultOf(store.put(*chunk(seed)))
        asked = [names[5], names[1], names[0], names[1], names[3], names[4], names[2]]
        result = self.successResultOf(store.has(asked))
        self.assertEqual(result.present, (names[1], names[3], names[4]))
        self.assertEqual(result.absent, (names[5], names[0], names[2]))
        self.assertEqual(
            result.as_dict(),
            {n: n in (names[1], names[3], names[4]) for n in names},
        )

    def test_has_empty_batch(self) -> None:
        """An empty probe answers with two empty tuples."""
        result = self.successResultOf(self.make_store().has([]))
        self.assertEqual((result.present, result.absent), ((), ()))

    def test_delete_batch(self) -> None:
        """delete removes present chunks, reports missing ones and sums the bytes freed."""
        store = self.make_store()
        a, data_a = chunk(20, 100)
        b, data_b = chunk(21, 250)
        c, data_c = chunk(22, 400)
        missing = chunk(23)[0]
        for name, data in ((a, data_a), (b, data_b), (c, data_c)):
            self.successResultOf(store.put(name, data))
        result = self.successResultOf(store.delete([b, missing, a, b]))
        self.assertEqual(result.deleted, (b, a))
        self.assertEqual(result.missing, (missing,))
        self.assertEqual((result.kept, result.errors), ((), ()))
        self.assertEqual(result.bytes_freed, 350)
        self.assertEqual(self.successResultOf(store.has([a, b, c])).present, (c,))
        self.assertEqual(self.successResultOf(store.total_bytes()), 400)
        self.failureResultOf(store.get(a), NotFound)

    def test_delete_keeps_recently_modified(self) -> None:
        """With modified_before_ns, chunks stored at or after the cut-off are kept."""
        store = self.make_store()
        old, old_data = chunk(30, 100)
        young, young_data = chunk(31, 200)
        self.successResultOf(store.put(old, old_data))
        self.successResultOf(store.put(young, young_data))
        self.set_mtime(store, old, 1_000)
        self.set_mtime(store, young, 5_000)
        result = self.successResultOf(store.delete([old, young], modified_before_ns=5_000))
        self.assertEqual((result.deleted, result.kept, result.bytes_freed), ((old,), (young,), 100))
        self.assertEqual(self.successResultOf(store.has([old, young])).present, (young,))
        self.assertEqual(self.successResultOf(store.total_bytes()), 200)

    def test_delete_then_put_again(self) -> None:
        """A deleted chunk can be stored again and is then fresh, not deduped."""
        store = self.make_store()
        name, data = chunk(32)
        self.successResultOf(store.put(name, data))
        self.successResultOf(store.delete([name]))
        self.assertFalse(self.successResultOf(store.put(name, data)).deduped)
        self.assertEqual(self.successResultOf(store.get(name)), data)

    def test_total_bytes(self) -> None:
        """total_bytes counts each distinct stored chunk's size exactly once."""
        store = self.make_store()
        self.assertEqual(self.successResultOf(store.total_bytes()), 0)
        chunks = [chunk(seed, 1000 + seed) for seed in range(40, 45)]
        for name, data in chunks:
            self.successResultOf(store.put(name, data))
        self.successResultOf(store.put(*chunks[0]))
        self.assertEqual(self.successResultOf(store.total_bytes()), sum(1040 + i for i in range(5)))
        self.successResultOf(store.delete([chunks[1][0], chunks[3][0]]))
        self.assertEqual(self.successResultOf(store.total_bytes()), 1040 + 1042 + 1044)

    def test_list_chunks(self) -> None:
        """list_chunks gives every stored chunk with its size, sorted by hash."""
        store = self.make_store()
        chunks = [chunk(seed, 10 * seed) for seed in range(50, 56)]
        for name, data in chunks:
            self.successResultOf(store.put(name, data))
        listed = self.successResultOf(store.list_chunks())
        self.assertEqual(
            [(i.hash, i.size) for i in listed],
            sorted((name, len(data)) for name, data in chunks),
        )
        for info in listed:
            self.assertIsInstance(info, ChunkInfo)
            self.assertEqual(info, self.successResultOf(store.stat(info.hash)))

    def test_corrupt_chunk_never_served(self) -> None:
        """A stored chunk that no longer verifies fails with EIO and is withdrawn."""
        store = self.make_store()
        name, data = chunk(60, 800)
        keep, keep_data = chunk(61, 300)
        self.successResultOf(store.put(name, data))
        self.successResultOf(store.put(keep, keep_data))
        self.corrupt_chunk(store, name, b"X" + data[1:])
        failure = self.failureResultOf(store.get(name), CorruptStoredChunk)
        self.assertEqual((failure.value.errno, failure.value.chunk_hash), (WireErrno.EIO, name))
        self.assertEqual(self.successResultOf(store.has([name, keep])).absent, (name,))
        self.assertEqual(self.successResultOf(store.total_bytes()), 300)
        self.failureResultOf(store.get(name), NotFound)
        self.assertFalse(self.successResultOf(store.put(name, data)).deduped)
        self.assertEqual(self.successResultOf(store.get(name)), data)
        self.assertEqual(self.successResultOf(store.total_bytes()), 1100)

    def test_total_matches_contents(self) -> None:
        """After any puts and deletes, total_bytes is the sum of the listed chunk sizes."""

        @settings(max_examples=15, deadline=None)
        @given(
            st.lists(
                st.tuples(st.booleans(), st.integers(min_value=0, max_value=5)),
                max_size=8,
            )
        )
        def check(operations: list[tuple[bool, int]]) -> None:
            store = self.make_store()
            expected: dict[str, int] = {}
            for is_put, seed in operations:
                name, data = chunk(seed, 17 * seed)
                if is_put:
                    put = self.successResultOf(store.put(name, data))
                    self.assertEqual(put.deduped, name in expected)
                    expected[name] = len(data)
                else:
                    deleted = self.successResultOf(store.delete([name]))
                    self.assertEqual(deleted.deleted, (name,) if name in expected else ())
                    expected.pop(name, None)
            listed = {i.hash: i.size for i in self.successResultOf(store.list_chunks())}
            self.assertEqual(listed, expected)
            self.assertEqual(self.successResultOf(store.total_bytes()), sum(expected.values()))

        check()
