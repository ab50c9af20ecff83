"""
Read-ahead: a sequential reader of committed content gets the next chunks
fetched before it asks for them; a reader jumping around does not.
"""

from __future__ import annotations

import os

from twisted.trial.unittest import SynchronousTestCase

from svc.mount.core.file_reader import READ_AHEAD_BYTES
from svc.mount.test.test_fs_support import CALLER, FSFixture, Mount, pseudo_random

PIECE = 128 * 1024
"""What the kernel asks for per FUSE read."""


class ReadAheadTests(SynchronousTestCase):
    """
    Chunk fetches of a fresh mount reading a committed 40 MiB file.
    """

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        self.data = pseudo_random("read-ahead", 40 << 20)
        self.fixture.mount().write_file("big", self.data)
        self.reader = self.fixture.mount()
        manifest = self.reader.ok(self.reader.remote.manifest_get("/agent-1/big"))
        self.offsets = []
        position = 0
        for chunk in manifest.chunks:
            self.offsets.append(position)
            position += chunk.size
        self.assertGreaterEqual(len(self.offsets), 4, "the test needs several chunks")

    def open(self, mount: Mount) -> int:
        entry = mount.lookup_path("big")
        fh: int = mount.ok(mount.fs.open(entry.ino, os.O_RDONLY, CALLER)).fh
        return fh

    def chunks_within(self, end: int) -> int:
        """How many chunks start before C{end}."""
        return sum(1 for offset in self.offsets if offset < end)

    def test_sequential_reader_fetches_ahead(self) -> None:
        """Past the first read, the chunks of the next READ_AHEAD_BYTES are already fetched."""
        fh = self.open(self.reader)
        self.reader.ok(self.reader.fs.read(fh, 0, PIECE, CALLER))
        self.assertEqual(self.reader.chunks.fetched, 1, "a first read fetches its own chunk")
        self.reader.ok(self.reader.fs.read(fh, PIECE, PIECE, CALLER))
        self.assertEqual(
            self.reader.chunks.fetched, self.chunks_within(2 * PIECE + READ_AHEAD_BYTES)
        )
        parts, offset = [], 2 * PIECE
        while offset < len(self.data):
            parts.append(self.reader.ok(self.reader.fs.read(fh, offset, PIECE, CALLER)))
            offset += PIECE
        self.assertEqual(self.data[2 * PIECE :], b"".join(parts))
        self.assertEqual(self.reader.chunks.fetched, len(self.offsets), "each chunk once")
        self.reader.ok(self.reader.fs.release(fh, CALLER))

    def test_jumping_reader_fetches_only_what_it_reads(self) -> None:
        """Reads that do not follow each other fetch only their own chunks."""
        fh = self.open(self.reader)
        touched = set()
        for offset in (self.offsets[-1], self.offsets[1], self.offsets[-1] + PIECE * 3):
            data = self.reader.ok(self.reader.fs.read(fh, offset, PIECE, CALLER))
            self.assertEqual(data, self.data[offset : offset + PIECE])
            touched.add(max(o for o in self.offsets if o <= offset))
        self.assertEqual(self.reader.chunks.fetched, len(touched))
        self.reader.ok(self.reader.fs.release(fh, CALLER))

    def test_written_bytes_are_not_fetched_ahead(self) -> None:
        """A region overwritten since the open is read from the spill, never prefetched."""
        fh = self.reader.ok(
            self.reader.fs.open(self.reader.lookup_path("big").ino, os.O_RDWR, CALLER)
        ).fh
        rest = len(self.data) - self.offsets[1]
        self.reader.ok(self.reader.fs.write(fh, self.offsets[1], b"\0" * rest, CALLER))
        self.reader.ok(self.reader.fs.read(fh, 0, PIECE, CALLER))
        self.reader.ok(self.reader.fs.read(fh, PIECE, PIECE, CALLER))
        self.assertEqual(self.reader.chunks.fetched, 1)
        self.reader.ok(self.reader.fs.release(fh, CALLER))
