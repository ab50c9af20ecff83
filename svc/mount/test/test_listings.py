"""
Tests for what a listing brings a fresh mount (L{svc.mount.ops.listings}): the
chunk lists of the directory's files, so their opens send no
C{manifest_get}; the bytes of a small file and of the files after it, at
its first open, so their reads send no C{chunk_get}; and the shape a
C{list} reply's inline chunks may have.
"""

from __future__ import annotations

import os
from typing import Any

import attrs
from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane_client.client import Reply
from svc.mount.core.inodes import ROOT_INODE
from svc.mount.ops.listings import fetch_limit
from svc.mount.remote.data_plane import Remote
from svc.mount.remote.remote_values import ListPage
from svc.mount.test.test_fs_support import CALLER, FSFixture, Mount, pseudo_random
from svc.mount.test.test_inline_read import ATTRIBUTES
from svc.mount.test.test_remote import Canned

NAMES = ("a", "b", "c", "d", "e")


class ListedManifestTests(SynchronousTestCase):
    """A fresh mount reading files of a directory another mount wrote."""

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        writer = self.fixture.mount()
        writer.ok(writer.fs.mkdir(ROOT_INODE, b"dir", 0o755, CALLER))
        self.contents = {name: pseudo_random(name, 100 + 1000 * i) for i, name in enumerate(NAMES)}
        for name, data in self.contents.items():
            writer.write_file(f"dir/{name}", data)

    def served_chunks(self) -> int:
        """The chunks the data plane has read out so far (C{chunk_get} lines, inline ones too)."""
        return len(self.fixture.service.events("chunk_get"))

    def traffic(self, mount: Mount) -> dict[str, int]:
        return {op: mount.count(op) for op in ("list", "head_file", "manifest_get", "chunk_get")}

    def test_a_directory_read_file_by_file_costs_one_request_for_its_bytes(self) -> None:
        """
        After C{opendir} lists the directory (chunk lists, no bytes), the
        first open of a small file asks for it and the files after it in one
        C{list}; reading them all sends nothing more, and no
        C{manifest_get} or C{chunk_get} at all.
        """
        reader = self.fixture.mount()
        served = self.served_chunks()
        self.assertEqual(sorted(reader.names("dir")), list(NAMES))
        self.assertEqual(self.served_chunks(), served)
        before = self.traffic(reader)
        for name, data in self.contents.items():
            self.assertEqual(reader.read_file(f"dir/{name}"), data)
        after = self.traffic(reader)
        self.assertEqual(
            {op: after[op] - before[op] for op in after},
            {"list": 1, "head_file": 0, "manifest_get": 0, "chunk_get": 0},
        )
        self.assertEqual(self.served_chunks() - served, len(NAMES))

    def test_a_lookup_lists_for_names_and_chunk_lists_not_bytes(self) -> None:
        """
        Looking names up on a fresh mount lists each directory once and
        reads no file's bytes on the data plane; opening one for reading
        then fetches its bytes and its neighbours'.
        """
        reader = self.fixture.mount()
        served = self.served_chunks()
        before = self.traffic(reader)
        for name in NAMES:
            reader.lookup_path(f"dir/{name}")
        after = self.traffic(reader)
        self.assertEqual(
            {op: after[op] - before[op] for op in after},
            {"list": 2, "head_file": 0, "manifest_get": 0, "chunk_get": 0},
        )
        self.assertEqual(self.served_chunks(), served)
        self.assertEqual(reader.read_file("dir/c"), self.contents["c"])
        self.assertEqual(reader.read_file("dir/e"), self.contents["e"])
        self.assertEqual(reader.count("list"), 3)
        self.assertEqual(self.served_chunks() - served, 3)
        self.assertEqual(reader.read_file("dir/a"), self.contents["a"])
        self.assertEqual(reader.count("list"), 4)

    def test_opens_behind_a_fetch_in_flight_wait_for_it(self) -> None:
        """
        Opens of files after the one a fetch of their directory started at
        wait for that fetch instead of sending their own; an open of a file
        before it sends its own.
        """
        reader = self.fixture.mount()
        entries = {name: reader.lookup_path(f"dir/{name}") for name in NAMES}
        lists = reader.count("list")
        reader.answers.hold("list")
        opens = [reader.fs.open(entries[name].ino, os.O_RDONLY, CALLER) for name in "bde"]
        self.assertEqual(reader.count("list") - lists, 1)
        before = reader.fs.open(entries["a"].ino, os.O_RDONLY, CALLER)
        self.assertEqual(reader.count("list") - lists, 2)
        reader.answers.release()
        for opened in [*opens, before]:
            reader.ok(reader.fs.release(reader.ok(opened).fh, CALLER))
        for name, data in self.contents.items():
            self.assertEqual(reader.read_file(f"dir/{name}"), data)
        self.assertEqual((reader.count("list") - lists, reader.count("chunk_get")), (2, 0))

    def test_copies_of_one_file_cost_one_chunk_read(self) -> None:
        """
        Forty files of one content in a directory: the fetch at the first
        open carries their one chunk once, and every file reads from it.
        """
        writer = self.fixture.mount()
        writer.ok(writer.fs.mkdir(ROOT_INODE, b"same", 0o755, CALLER))
        data = pseudo_random("same", 3000)
        for index in range(40):
            writer.write_file(f"same/f{index:02d}", data)
        reader = self.fixture.mount()
        served = self.served_chunks()
        for index in range(40):
            self.assertEqual(reader.read_file(f"same/f{index:02d}"), data)
        self.assertEqual(self.served_chunks() - served, 1)
        self.assertEqual(reader.count("chunk_get"), 0)

    def test_a_failed_fetch_leaves_the_read_to_fetch_its_chunk(self) -> None:
        """
        A fetch of bytes whose answer is lost does not fail the open: the
        read asks for the file's chunk and returns its bytes.
        """
        reader = self.fixture.mount()
        reader.lookup_path("dir/c")
        reader.answers.lose("list", ran=True)
        self.assertEqual(reader.read_file("dir/c"), self.contents["c"])
        self.assertEqual(reader.count("chunk_get"), 1)

    def test_an_open_for_writing_fetches_no_bytes(self) -> None:
        """A small file opened to be written asks for nobody's bytes."""
        reader = self.fixture.mount()
        entry = reader.lookup_path("dir/b")
        served = self.served_chunks()
        opened = reader.ok(reader.fs.open(entry.ino, os.O_WRONLY, CALLER))
        reader.ok(reader.fs.release(opened.fh, CALLER))
        self.assertEqual(self.served_chunks(), served)

    def test_bytes_that_do_not_hash_are_fetched_again(self) -> None:
        """
        Bytes a listing carried that are not their chunk's are dropped,
        never read: the read fetches the chunk and returns the file's own.
        """
        reader = self.fixture.mount()
        corrupt_listings(reader)
        for name, data in self.contents.items():
            self.assertEqual(reader.read_file(f"dir/{name}"), data)
        self.assertEqual(reader.count("chunk_get"), len(NAMES))

    def test_a_file_changed_after_its_listing_is_read_at_its_new_version(self) -> None:
        """
        A chunk list kept from a listing is of the version listed: once the
        file is rewritten by this mount, its reads give the new bytes.
        """
        reader = self.fixture.mount()
        reader.names("dir")
        rewritten = pseudo_random("rewritten", len(self.contents["a"]))
        reader.write_file("dir/a", rewritten)
        self.assertEqual(reader.read_file("dir/a"), rewritten)
        self.assertEqual(self.fixture.mount().read_file("dir/a"), rewritten)


def corrupt_listings(mount: Mount) -> None:
    """Make every C{list} answer of C{mount} carry other bytes for its inline chunks."""
    real = mount.remote.list_dir

    def list_dir(path: str, *args: Any, **options: Any) -> Deferred[ListPage]:
        def flipped(page: ListPage) -> ListPage:
            entries = tuple(
                attrs.evolve(entry, inline=tuple((n, b"!" + d[1:]) for n, d in entry.inline))
                for entry in page.entries
            )
            return attrs.evolve(page, entries=entries)

        return real(path, *args, **options).addCallback(flipped)

    mount.remote.list_dir = list_dir  # type: ignore[method-assign]


class ListReplyShapeTests(SynchronousTestCase):
    """What C{chunks} and C{inline} in a C{list} reply's entries may be."""

    def page(self, entries: list[dict[str, object]], raw: bytes) -> Deferred[ListPage]:
        payload = {"entries": [{**ATTRIBUTES, **entry} for entry in entries], "next_after": None}
        remote = Remote(Canned(Reply(payload, raw)))
        return remote.list_dir("/agent-1", chunks=True, inline_max=10)

    def test_cut_entry_after_entry(self) -> None:
        """
        Each entry's inline chunks, cut from the raw segment entry after
        entry; a chunk an earlier entry carried is not carried again.
        """
        a, b, c = "a" * 64, "b" * 64, "c" * 64
        entries: list[dict[str, object]] = [
            {"name": "x", "chunks": [[a, 2], [b, 3]], "inline": [b, a]},
            {"name": "y", "chunks": [[a, 2]]},
            {"name": "z", "chunks": [[a, 2], [c, 2]], "inline": [a, c]},
            {"name": "w"},
        ]
        page = self.successResultOf(self.page(entries, b"bbbaacc"))
        x, y, z, w = page.entries
        self.assertEqual(x.inline, ((b, b"bbb"), (a, b"aa")))
        self.assertEqual((y.inline, y.chunks is not None), ((), True))
        self.assertEqual(z.inline, ((a, b"aa"), (c, b"cc")))
        self.assertEqual((w.chunks, w.inline), (None, ()))

    def test_bad_shapes_are_eio(self) -> None:
        """
        Inline without a chunk list, a name not in it, a repeat, bytes
        left over or short: EIO.
        """
        a = "a" * 64
        shapes: list[tuple[list[dict[str, object]], bytes]] = [
            ([{"name": "x", "inline": [a]}], b"aa"),
            ([{"name": "x", "chunks": [[a, 2]], "inline": ["c" * 64]}], b"cc"),
            ([{"name": "x", "chunks": [[a, 2]], "inline": [a, a]}], b"aaaa"),
            ([{"name": "x", "chunks": [[a, 2]], "inline": [a]}], b"aaa"),
            ([{"name": "x", "chunks": [[a, 2]], "inline": [a]}], b"a"),
            ([{"name": "x", "chunks": [[a, 2]]}], b"aa"),
        ]
        for entries, raw in shapes:
            failure = self.failureResultOf(self.page(entries, raw))
            self.assertEqual(failure.value.errno, 5, (entries, raw))


class FetchLimitTests(SynchronousTestCase):
    """How many entries a fetch of small files' bytes asks for."""

    def test_as_many_files_of_the_opened_size_as_a_page_of_bytes_holds(self) -> None:
        """4 KiB files: 256 (1 MiB); tiny files: 1,000 at most; 64 KiB files: 32 at least."""
        self.assertEqual(fetch_limit(4096), 256)
        self.assertEqual(fetch_limit(1), 1000)
        self.assertEqual(fetch_limit(0), 1000)
        self.assertEqual(fetch_limit(65536), 32)
