"""Tests for L{svc.mount.outbox.entries}: every entry's map form, and damage refused."""

from __future__ import annotations

from typing import Any

import msgpack
from twisted.trial.unittest import SynchronousTestCase

from svc.chunking import ChunkRef
from svc.mount.outbox.entries import (
    BadEntry,
    Commit,
    Entry,
    Link,
    Mkdir,
    Mknod,
    Owner,
    Rename,
    Rmdir,
    SetAttributes,
    Symlink,
    Unlink,
    entry_from_map,
    entry_to_map,
    paths_of,
    superseded,
)

A = "a" * 64
B = "b" * 64
OWNER = Owner(0o100644, 1000, 1000)

EVERY_KIND: tuple[Entry, ...] = (
    Commit(
        1,
        "/agent-1/f",
        expected=3,
        chained=False,
        base=(ChunkRef(0, 10, A),),
        chunks=(ChunkRef(0, 10, A), ChunkRef(10, 5, B)),
        size=15,
        owner=OWNER,
        mtime_ns=1_700_000_000_000_000_000,
        atime_ns=None,
    ),
    Commit(2, "/agent-1/g", 0, True, (), (), 0, OWNER, 5, atime_ns=7),
    Mkdir(3, "/agent-1/d", Owner(0o40755, 0, 0)),
    Mknod(4, "/agent-1/fifo", Owner(0o10644, 1, 2), rdev=0),
    Symlink(5, "/agent-1/s", "../target", 1000, 1000),
    Link(6, "/agent-1/h", existing="/agent-1/f"),
    Unlink(7, "/agent-1/f"),
    Rmdir(8, "/agent-1/d"),
    Rename(9, "/agent-1/g", to="/agent-1/d2/g"),
    SetAttributes(10, "/agent-1/g", mode=0o600, mtime_ns=-5),
    SetAttributes(11, "/agent-1/g"),
)


def round_trip(entry: Entry) -> Entry:
    """C{entry} through its map form and msgpack, as the log stores it."""
    packed = msgpack.packb(entry_to_map(entry), use_bin_type=True)
    return entry_from_map(msgpack.unpackb(packed, raw=False))


class EntryMapTests(SynchronousTestCase):
    """Each kind of entry survives its map form unchanged."""

    def test_every_kind_round_trips(self) -> None:
        """Every kind of entry, optional fields set and unset, comes back equal."""
        for entry in EVERY_KIND:
            self.assertEqual(round_trip(entry), entry)

    def test_chunk_offsets_are_rebuilt_from_lengths(self) -> None:
        """A commit's chunk offsets are not stored: they follow from the lengths."""
        stored = entry_to_map(EVERY_KIND[0])
        self.assertEqual(stored["chunks"], [[bytes.fromhex(A), 10], [bytes.fromhex(B), 5]])

    def test_unknown_keys_are_ignored(self) -> None:
        """A key a later version added does not make the entry unreadable."""
        stored = entry_to_map(Unlink(1, "/agent-1/f"))
        stored["later"] = [1, 2]
        self.assertEqual(entry_from_map(stored), Unlink(1, "/agent-1/f"))

    def test_paths_of(self) -> None:
        """A rename changes both its paths; other entries their one path."""
        self.assertEqual(paths_of(Rename(1, "/a/x", "/a/y")), ("/a/x", "/a/y"))
        self.assertEqual(paths_of(Link(1, "/a/new", "/a/old")), ("/a/new",))


def _commit(seq: int, path: str, expected: int, *, chained: bool = False) -> Commit:
    return Commit(seq, path, expected, chained, (), (), 0, OWNER, 1)


class SupersededTests(SynchronousTestCase):
    """A commit the next entry replaces whole is not replayed."""

    def test_a_commit_followed_by_one_of_its_path_and_version(self) -> None:
        """The earlier of two adjacent commits of one path over one version."""
        entries = (_commit(1, "/a/f", 0), _commit(2, "/a/f", 0), _commit(3, "/a/f", 0))
        self.assertEqual(superseded(entries), frozenset({1, 2}))

    def test_anything_between_or_different_keeps_both(self) -> None:
        """Another entry between them, another path, another version or a chain: both go."""
        cases: tuple[tuple[Entry, ...], ...] = (
            (_commit(1, "/a/f", 0), Rename(2, "/a/f", "/a/g"), _commit(3, "/a/f", 0)),
            (_commit(1, "/a/f", 0), _commit(2, "/a/g", 0)),
            (_commit(1, "/a/f", 0), _commit(2, "/a/f", 1)),
            (_commit(1, "/a/f", 0), _commit(2, "/a/f", 0, chained=True)),
            (Unlink(1, "/a/f"), _commit(2, "/a/f", 0)),
        )
        for entries in cases:
            self.assertEqual(superseded(entries), frozenset(), entries)


class BadEntryTests(SynchronousTestCase):
    """A damaged or foreign map is BadEntry, never a wrong entry."""

    def assertBad(self, raw: Any) -> None:
        self.assertRaises(BadEntry, entry_from_map, raw)

    def test_not_a_map(self) -> None:
        """A list or a number is no entry."""
        self.assertBad([1, 2])
        self.assertBad(3)

    def test_unknown_op(self) -> None:
        """An op this version does not know is refused."""
        self.assertBad({"op": "truncate", "seq": 1, "path": "/a/f"})

    def test_missing_and_mistyped_fields(self) -> None:
        """A field missing, of the wrong type, or negative where it counts is refused."""
        good = entry_to_map(EVERY_KIND[0])
        for name, value in (
            ("seq", -1),
            ("seq", True),
            ("path", b"/agent-1/f"),
            ("expected", "3"),
            ("chained", 1),
            ("size", -1),
            ("mode", None),
            ("chunks", [[b"short", 1]]),
            ("chunks", [[bytes.fromhex(A), 0]]),
            ("chunks", [[bytes.fromhex(A)]]),
            ("base", "none"),
        ):
            damaged = dict(good)
            damaged[name] = value
            self.assertBad(damaged)
        for name in good:
            if name == "atime_ns":
                continue
            damaged = dict(good)
            del damaged[name]
            self.assertBad(damaged)
