"""
Tests for C{list} with C{chunks} and C{inline_max} (``dataplane-ops.md``
section 3, "A directory's manifests in one answer"): regular files' entries
carry their chunk lists, within their bounds, and small files' bytes come
in the raw segment, each chunk read as the C{chunk_get} it stands for.
"""

from __future__ import annotations

from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane.interfaces import OpReply
from svc.dataplane.listing import carried_chunks, page_inline
from svc.dataplane.test.test_service import expected, line
from svc.dataplane.test.test_service_inline import TwoChunksCase, put_request
from svc.dataplane.test.test_service_support import blob
from svc.policy import PathPolicy
from svc.store.manifest_values import Attributes, ChunkRef, DirectoryEntry, FileChunks, FileKind
from svc.wire.errno import WireErrno
from svc.wire.messages import MAX_INLINE_BYTES, MAX_LIST_CHUNKS, MAX_LIST_ENTRY_CHUNKS

ROOT = "/agent-1"


def entries_by_name(reply: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The entries of a C{list} answer, by name."""
    return {entry["name"]: entry for entry in reply["entries"]}


def answered_entries(reply: OpReply) -> dict[str, dict[str, Any]]:
    """The entries of a C{list} answer as the server answered them (unencoded), by name."""
    entries: list[dict[str, Any]] = reply.payload["entries"]  # type: ignore[assignment]
    return {entry["name"]: entry for entry in entries}


class ListCase(TwoChunksCase):
    """The two chunks uploaded, and a helper making files of them."""

    def setUp(self) -> None:
        super().setUp()
        for chunk_hash, data in (self.first, self.second):
            self.agent.ok("chunk_put", data, hash=chunk_hash)

    def make(self, name: str, chunks: list[tuple[str, bytes]]) -> None:
        """Create C{<root>/<name>} from C{chunks} (uploaded already)."""
        self.agent.ok("manifest_put", **put_request(name, chunks))


class ListChunksTests(ListCase):
    """C{list} with C{chunks}: the chunk lists of the page's regular files."""

    def test_regular_files_carry_their_chunk_lists(self) -> None:
        """
        Each regular file's entry carries its chunk list as C{manifest_get}
        answers it (an empty file an empty one); a directory, a symlink or a
        special file carries none, nor does any entry of a listing without
        C{chunks}. Nothing is carried in the raw segment.
        """
        self.make("a", [self.first, self.second, self.first])
        self.make("empty", [])
        self.agent.ok("dir_create", path=f"{ROOT}/d", mode=0o755)
        self.agent.ok("symlink", path=f"{ROOT}/l", target="a")
        self.agent.ok("mknod", path=f"{ROOT}/p", kind="fifo", mode=0o600)
        reply = self.agent.reply("list", path=ROOT, chunks=True)
        self.assertEqual(bytes(reply.raw), b"")
        listed = entries_by_name(self.agent.ok("list", path=ROOT, chunks=True))
        self.assertEqual(
            listed["a"]["chunks"], self.agent.ok("manifest_get", path=f"{ROOT}/a")["chunks"]
        )
        self.assertEqual(listed["empty"]["chunks"], [])
        for name in ("d", "l", "p"):
            self.assertNotIn("chunks", listed[name], name)
        for entry in listed.values():
            self.assertNotIn("inline", entry)
        for entry in self.agent.ok("list", path=ROOT)["entries"]:
            self.assertNotIn("chunks", entry)
        self.assertEqual(line(self.fixture.last()), expected("list_entries", ROOT))

    def test_files_the_policy_denies_carry_nothing(self) -> None:
        """
        A file the path policy does not let the agent read is not listed, so
        carries no chunk list; the files it may read carry theirs.
        """
        self.make("open", [self.first])
        self.make("secret", [self.second])
        self.fixture.policies[("tenant-a", "agent-1")] = PathPolicy(deny=("secret",))
        listed = entries_by_name(self.agent.ok("list", path=ROOT, chunks=True))
        self.assertEqual(list(listed), ["open"])
        self.assertEqual(listed["open"]["chunks"], [[self.first[0], 3000]])

    def test_longer_chunk_lists_are_not_carried(self) -> None:
        """
        A file of at most 64 chunk-list entries (repeats counted) carries
        its list; one of 65 carries none, and the entries after it still do.
        """
        self.make("a", [self.second] * MAX_LIST_ENTRY_CHUNKS)
        self.make("b", [self.second] * (MAX_LIST_ENTRY_CHUNKS + 1))
        self.make("c", [self.first])
        listed = entries_by_name(self.agent.ok("list", path=ROOT, chunks=True))
        self.assertEqual(len(listed["a"]["chunks"]), MAX_LIST_ENTRY_CHUNKS)
        self.assertNotIn("chunks", listed["b"])
        self.assertEqual(listed["c"]["chunks"], [[self.first[0], 3000]])

    def test_page_carries_at_most_4096_chunk_list_entries(self) -> None:
        """
        Lists are carried in page order while they total at most 4096
        entries: the entry whose list would pass that carries none, and
        neither does any later entry, however short its list.
        """
        self.make("a", [self.second])
        files = MAX_LIST_CHUNKS // MAX_LIST_ENTRY_CHUNKS
        for index in range(files):
            self.make(f"f{index:02}", [self.second] * MAX_LIST_ENTRY_CHUNKS)
        self.make("g", [self.second])
        listed = entries_by_name(self.agent.ok("list", path=ROOT, chunks=True))
        carried = [name for name, entry in listed.items() if "chunks" in entry]
        self.assertEqual(carried, ["a"] + [f"f{index:02}" for index in range(files - 1)])
        self.assertEqual(sum(len(listed[name]["chunks"]) for name in carried), 4033)
        exactly = self.agent.ok("list", path=ROOT, chunks=True, after="a")
        total = sum(len(entry.get("chunks", ())) for entry in exactly["entries"])
        self.assertEqual(total, MAX_LIST_CHUNKS)
        self.assertNotIn("chunks", exactly["entries"][-1])

    def test_paging_with_after(self) -> None:
        """Pages of a listing with C{chunks} follow C{after} and C{limit} as any listing."""
        for name in ("e", "a", "c", "b", "d"):
            self.make(name, [self.first])
        first = self.agent.ok("list", path=ROOT, limit=2, chunks=True)
        self.assertEqual([e["name"] for e in first["entries"]], ["a", "b"])
        self.assertEqual(first["next_after"], "b")
        rest = self.agent.ok("list", path=ROOT, limit=3, after="b", chunks=True)
        self.assertEqual([e["name"] for e in rest["entries"]], ["c", "d", "e"])
        self.assertIsNone(rest["next_after"])
        for entry in first["entries"] + rest["entries"]:
            self.assertEqual(entry["chunks"], [[self.first[0], 3000]])

    def test_carried_chunks_become_visible(self) -> None:
        """
        The chunks a listing carries become visible to its connection, as a
        C{manifest_get} would make them: once the file is deleted, that
        connection may still fetch them, one that listed without C{chunks}
        may not.
        """
        self.make("f", [self.second])
        reader = self.fixture.agent()
        plain = self.fixture.agent()
        reader.ok("list", path=ROOT, chunks=True)
        plain.ok("list", path=ROOT)
        self.agent.ok("manifest_delete", path=f"{ROOT}/f")
        self.assertEqual(bytes(reader.reply("chunk_get", hash=self.second[0]).raw), self.second[1])
        self.assertEqual(plain.errno("chunk_get", hash=self.second[0]), WireErrno.ENOENT)

    def test_inline_max_needs_chunks(self) -> None:
        """C{inline_max} above 0 without C{chunks} is EINVAL, audited as the listing."""
        asked: list[dict[str, Any]] = [{}, {"chunks": False}]
        for extra in asked:
            self.assertEqual(
                self.agent.errno("list", path=ROOT, inline_max=10, **extra), WireErrno.EINVAL
            )
            self.assertEqual(line(self.fixture.last()), expected("list_entries", ROOT, False))
        self.agent.ok("list", path=ROOT, inline_max=0)

    def test_inline_max_out_of_range(self) -> None:
        """C{inline_max} above 1 MiB or below 0 is EINVAL; C{chunks} not a boolean, EPROTO."""
        for value in (MAX_INLINE_BYTES + 1, -1):
            self.assertEqual(
                self.agent.errno("list", path=ROOT, chunks=True, inline_max=value),
                WireErrno.EINVAL,
            )
        self.assertEqual(self.agent.errno("list", path=ROOT, chunks=1), WireErrno.EPROTO)
        self.agent.ok("list", path=ROOT, chunks=True, inline_max=MAX_INLINE_BYTES)


class ListInlineTests(ListCase):
    """C{list} with C{chunks} and C{inline_max}: small files' bytes in the raw segment."""

    def test_inline_bytes_in_page_order(self) -> None:
        """
        Each small file's entry names its distinct chunks in C{inline}, in
        order of first use; the raw segment is the bytes of each distinct
        chunk once, where it is first named, entry after entry (the chunk
        two entries name is read and carried once). A file over
        C{inline_max} carries its chunk list only. Each chunk is read as a
        C{chunk_get}: its line after the C{list_entries} line, its counter
        and bytes.
        """
        self.make("a", [self.first, self.second, self.first])
        self.make("b", [self.second])
        self.make("c", [self.first, self.first, self.first])
        before = len(self.fixture.audit)
        reply = self.agent.reply("list", path=ROOT, chunks=True, inline_max=6500)
        self.assertEqual(bytes(reply.raw), self.first[1] + self.second[1])
        entries = answered_entries(reply)
        self.assertEqual(entries["a"]["inline"], [self.first[0], self.second[0]])
        self.assertEqual(entries["b"]["inline"], [self.second[0]])
        self.assertNotIn("inline", entries["c"])
        self.assertEqual(len(entries["c"]["chunks"]), 3)
        lines = [line(event) for event in self.fixture.audit[before:]]
        self.assertEqual(lines[0], expected("list_entries", ROOT))
        self.assertEqual(
            sorted(lines[1:], key=lambda fields: fields["size"]),
            [
                expected("chunk_get", "", size=500, hash=self.second[0]),
                expected("chunk_get", "", size=3000, hash=self.first[0]),
            ],
        )
        sample = self.fixture.sample
        self.assertEqual(sample("svc_chunks_total", state="fetched"), 2.0)
        self.assertEqual(
            sample("svc_dataplane_bytes_total", direction="out", op="chunk_get"), 3500.0
        )
        self.assertIsNone(sample("svc_dataplane_op_duration_seconds_count", op="chunk_get"))

    def test_page_carries_at_most_one_mebibyte(self) -> None:
        """
        The entries' inline bytes total at most 1 MiB: the entry whose bytes
        would pass that carries no C{inline}, nor does any later entry; all
        keep their chunk lists.
        """
        big = [blob(f"big-{index}", 400 * 1024) for index in range(3)]
        for index, chunk in enumerate(big):
            self.agent.ok("chunk_put", chunk[1], hash=chunk[0])
            self.make(f"b{index}", [chunk])
        self.make("c", [self.second])
        reply = self.agent.reply("list", path=ROOT, chunks=True, inline_max=MAX_INLINE_BYTES)
        entries = answered_entries(reply)
        self.assertEqual([name for name in entries if "inline" in entries[name]], ["b0", "b1"])
        self.assertEqual(bytes(reply.raw), big[0][1] + big[1][1])
        self.assertTrue(all("chunks" in entry for entry in entries.values()))
        self.assertEqual(len(self.fixture.events("chunk_get")), 2)

    def test_failing_inline_chunk_leaves_no_inline(self) -> None:
        """
        A chunk the store cannot give fails its own C{chunk_get} line; the
        listing still answers, with no C{inline} in any entry and an empty
        raw segment, every entry keeping its chunk list.
        """
        self.make("a", [self.first])
        self.make("b", [self.second])
        (stored,) = [
            path for path in self.fixture.root.rglob(self.second[0] + "*") if path.is_file()
        ]
        stored.unlink()
        reply = self.agent.reply("list", path=ROOT, chunks=True, inline_max=6500)
        self.assertEqual(bytes(reply.raw), b"")
        entries = answered_entries(reply)
        for entry in entries.values():
            self.assertNotIn("inline", entry)
        self.assertEqual(list(entries["b"]["chunks"]), [(self.second[0], 500)])
        refused = [line(event) for event in self.fixture.events("chunk_get") if not event.allowed]
        self.assertEqual(refused, [expected("chunk_get", "", False, hash=self.second[0])])


def file_entry(name: str, inode: int, version: int, size: int) -> DirectoryEntry:
    """A listed regular file's entry."""
    attributes = Attributes(
        inode=inode,
        kind=FileKind.FILE,
        mode=0o644,
        uid=0,
        gid=0,
        size=size,
        mtime_ns=0,
        atime_ns=0,
        ctime_ns=0,
        version=version,
        nlink=1,
        rdev=0,
        symlink_target=None,
    )
    return DirectoryEntry(name, attributes)


class PageSelectionTests(SynchronousTestCase):
    """Which entries of a page carry what (L{carried_chunks}, L{page_inline})."""

    def test_list_of_another_version_is_not_carried(self) -> None:
        """
        A list read for an inode or version other than the one listed (the
        file changed in between) is not carried.
        """
        chunks = (ChunkRef("ab" * 32, 10),)
        page = [file_entry("a", 5, 2, 10), file_entry("b", 6, 1, 10), file_entry("c", 7, 1, 10)]
        lists = {
            "a": FileChunks(5, 3, chunks),
            "b": FileChunks(9, 1, chunks),
            "c": FileChunks(7, 1, chunks),
        }
        self.assertEqual(carried_chunks(page, lists), [None, None, chunks])

    def test_inline_names_placed_in_their_entries(self) -> None:
        """The raw order carries a shared chunk once; each entry's C{inline} names all its own."""
        first, second = ChunkRef("ab" * 32, 10), ChunkRef("cd" * 32, 5)
        page = [file_entry("a", 1, 1, 15), file_entry("b", 2, 1, 5), file_entry("c", 3, 1, 5)]
        inline = page_inline(page, [(first, second), None, (second,)], 100)
        assert inline is not None
        self.assertEqual(inline.hashes, (first.hash, second.hash))
        payload: dict[str, Any] = {
            "entries": [{"name": "a"}, {"name": "b"}, {"name": "c"}],
            "next_after": None,
        }
        self.assertEqual(
            inline.named(payload),
            {
                "entries": [
                    {"name": "a", "inline": [first.hash, second.hash]},
                    {"name": "b"},
                    {"name": "c", "inline": [second.hash]},
                ],
                "next_after": None,
            },
        )
        self.assertEqual(payload["entries"][0], {"name": "a"})
        self.assertIsNone(page_inline(page, [(first, second), None, (second,)], 0))
