"""
Tests for a cold open of a small file in one request: the open's
C{manifest_get} asks for the file's bytes (C{inline_read_bytes}), the mount
checks them and keeps them for the reads that follow and the chunk cache;
a reply of the wrong shape is EIO, and bytes that do not hash to their name
are fetched again.
"""

from __future__ import annotations

from typing import Any

import attrs
from blake3 import blake3
from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane_client.client import Reply
from svc.mount.core.fs_context import DEFAULT_INLINE_READ_BYTES, FSSettings
from svc.mount.remote.data_plane import Remote
from svc.mount.remote.remote_values import Manifest
from svc.mount.test.test_fs_support import FSFixture, Mount, pseudo_random
from svc.mount.test.test_remote import Canned

ATTRIBUTES = {
    "inode": 7,
    "kind": "file",
    "mode": 0o644,
    "uid": 0,
    "gid": 0,
    "size": 5,
    "mtime_ns": 1,
    "atime_ns": 1,
    "ctime_ns": 1,
    "version": 1,
    "nlink": 1,
    "rdev": 0,
}


class InlineReadTests(SynchronousTestCase):
    """A fresh mount opening and reading a file another mount wrote."""

    def setUp(self) -> None:
        self.fixture = FSFixture(self)

    def written(self, name: str, size: int) -> bytes:
        data = pseudo_random(name, size)
        self.fixture.mount().write_file(name, data)
        return data

    def test_small_file_is_read_with_its_manifest(self) -> None:
        """
        One C{manifest_get} and no C{chunk_get}: the bytes came with the
        chunk list. They are kept in memory for the reads that follow, not
        written to the disk cache (a later mount gets them inline again).
        """
        data = self.written("small", 5000)
        reader = self.fixture.mount()
        forget_chunk_list(reader, "small")
        self.assertEqual(reader.read_file("small"), data)
        self.assertEqual(reader.read_file("small"), data)
        self.assertEqual((reader.count("manifest_get"), reader.count("chunk_get")), (1, 0))
        self.assertEqual(reader.chunks.fetched, 0)
        self.assertNotIn(blake3(data).hexdigest(), reader.chunks.chunks)

    def test_written_chunk_cached_on_disk_only_when_too_large_to_come_inline(self) -> None:
        """
        A written chunk of at most C{inline_read_bytes} stays out of the disk
        cache (kept in memory: reading it back costs no request); a larger
        one is cached, since a later mount would have to fetch it.
        """
        writer = self.fixture.mount()
        small = pseudo_random("small", DEFAULT_INLINE_READ_BYTES)
        larger = pseudo_random("larger", DEFAULT_INLINE_READ_BYTES + 1)
        writer.write_file("small", small)
        writer.write_file("larger", larger)
        self.assertEqual(set(writer.chunks.chunks), {blake3(larger).hexdigest()})
        self.assertEqual(writer.read_file("small"), small)
        self.assertEqual(writer.count("chunk_get"), 0)

    def test_file_over_the_limit_is_fetched(self) -> None:
        """A file one byte over C{inline_read_bytes} is read by C{chunk_get}, as before."""
        data = self.written("larger", DEFAULT_INLINE_READ_BYTES + 1)
        reader = self.fixture.mount()
        self.assertEqual(reader.read_file("larger"), data)
        self.assertGreaterEqual(reader.count("chunk_get"), 1)

    def test_zero_asks_for_no_bytes(self) -> None:
        """With C{inline_read_bytes=0} the open asks for the chunk list alone."""
        data = self.written("small", 5000)
        reader = self.fixture.mount(settings=FSSettings(inline_read_bytes=0))
        self.assertEqual(reader.read_file("small"), data)
        self.assertEqual(reader.count("chunk_get"), 1)

    def test_bytes_that_do_not_hash_are_fetched_again(self) -> None:
        """
        Inline bytes that are not their chunk's are dropped, never read:
        the read fetches the chunk and returns the file's own bytes.
        """
        data = self.written("small", 5000)
        reader = self.fixture.mount()
        forget_chunk_list(reader, "small")
        corrupt(reader)
        self.assertEqual(reader.read_file("small"), data)
        self.assertEqual(reader.count("chunk_get"), 1)
        self.assertEqual(reader.chunks.fetched, 1)


def forget_chunk_list(mount: Mount, path: str) -> None:
    """
    Make C{mount} forget the chunk list its listing gave it for C{path}, as
    an outside change does: its next open asks C{manifest_get}.
    """
    node = mount.fs._ctx.table.require(mount.lookup_path(path).ino)
    node.chunks = node.chunks_version = None


def corrupt(mount: Mount) -> None:
    """Make every C{manifest_get} of C{mount} carry other bytes for its inline chunks."""
    real = mount.remote.manifest_get

    def manifest_get(path: str, **options: Any) -> Deferred[Manifest]:
        def flipped(manifest: Manifest) -> Manifest:
            inline = tuple((name, b"!" + data[1:]) for name, data in manifest.inline)
            assert inline, "the test needs inline bytes"
            return attrs.evolve(manifest, inline=inline)

        return real(path, **options).addCallback(flipped)

    mount.remote.manifest_get = manifest_get  # type: ignore[method-assign]


class InlineReplyShapeTests(SynchronousTestCase):
    """What C{inline} in a C{manifest_get} reply may be."""

    def manifest(self, extra: dict[str, object], raw: bytes) -> Deferred[Manifest]:
        payload = {**ATTRIBUTES, "chunks": [["a" * 64, 2], ["b" * 64, 3]], **extra}
        return Remote(Canned(Reply(payload, raw))).manifest_get("/agent-1/f", inline_max=5)

    def test_cut_in_order(self) -> None:
        """Each named chunk's bytes, cut from the raw segment in the order named."""
        got = self.successResultOf(self.manifest({"inline": ["b" * 64, "a" * 64]}, b"bbbaa"))
        self.assertEqual(got.inline, (("b" * 64, b"bbb"), ("a" * 64, b"aa")))
        plain = self.successResultOf(self.manifest({}, b""))
        self.assertEqual(plain.inline, ())

    def test_bad_shapes_are_eio(self) -> None:
        """A name not in the chunk list, a repeat, a length mismatch or bare bytes: EIO."""
        shapes: list[tuple[dict[str, object], bytes]] = [
            ({"inline": ["c" * 64]}, b"ccc"),
            ({"inline": ["a" * 64, "a" * 64]}, b"aaaa"),
            ({"inline": ["a" * 64]}, b"aaa"),
            ({"inline": "a" * 64}, b"aa"),
            ({}, b"aa"),
        ]
        for extra, raw in shapes:
            failure = self.failureResultOf(self.manifest(extra, raw))
            self.assertEqual(failure.value.errno, 5, (extra, raw))


class HeldChunksTests(SynchronousTestCase):
    """Bytes the mount held already are not kept again, and make opens stop asking."""

    def test_opens_stop_asking_for_bytes_the_mount_holds(self) -> None:
        """
        Forty files of one content: the first open's bytes are new, the
        next two are held already, and from then on opens ask only as
        probes (the 19th and the 35th), so the data plane reads the chunk
        five times instead of forty. Every file reads correctly.
        """
        fixture = FSFixture(self)
        writer = fixture.mount()
        data = pseudo_random("same", 3000)
        for index in range(40):
            writer.write_file(f"f{index}", data)
        before = len(fixture.service.events("chunk_get"))
        reader = fixture.mount()
        for index in range(40):
            forget_chunk_list(reader, f"f{index}")
        for index in range(40):
            self.assertEqual(reader.read_file(f"f{index}"), data)
        self.assertEqual(len(fixture.service.events("chunk_get")) - before, 5)
        self.assertEqual((reader.count("manifest_get"), reader.count("chunk_get")), (40, 0))
