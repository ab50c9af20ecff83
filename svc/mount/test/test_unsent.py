"""Tests for L{svc.mount.writeback.unsent}: changes given up are saved on the mount's disk."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from twisted.internet.defer import Deferred, fail, succeed
from twisted.trial.unittest import SynchronousTestCase

from svc.mount.writeback.unsent import PIECE_BYTES, STAGING_PREFIX, UnsentFiles, copies_in
from svc.testing.worker import ImmediateWorker

NOW = 1_795_000_000.0  # 2026-11-18T...Z


def reader(content: bytes) -> object:
    def read(offset: int, length: int) -> Deferred[bytes]:
        return succeed(content[offset : offset + length])

    return read


class UnsentFilesTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.directory = Path(self.mktemp())
        self.unsent = UnsentFiles(self.directory, ImmediateWorker(), lambda: NOW)

    def save(self, rel: str, content: bytes, read: object = None) -> Path | None:
        return self.successResultOf(
            Deferred.fromCoroutine(
                self.unsent.save(rel, 7, len(content), read or reader(content))  # type: ignore[arg-type]
            )
        )

    def test_content_saved_under_time_inode_and_path(self) -> None:
        """The copy is at <directory>/<UTC time>-<inode>/<path>, private to the mount's user."""
        content = os.urandom(PIECE_BYTES + 123)
        saved = self.save("a/b/c.txt", content)
        assert saved is not None
        self.assertEqual(saved.read_bytes(), content)
        [folder] = list(self.directory.iterdir())
        self.assertRegex(folder.name, r"^\d{8}T\d{6}Z-7$")
        self.assertEqual(saved, folder / "a" / "b" / "c.txt")
        self.assertEqual(stat.S_IMODE(saved.stat().st_mode), 0o600)
        self.assertEqual(stat.S_IMODE(folder.stat().st_mode), 0o700)

    def test_path_cannot_leave_the_directory(self) -> None:
        """Dot-dot parts are dropped: the copy stays under the directory."""
        saved = self.save("../../etc/x", b"data")
        assert saved is not None
        self.assertTrue(saved.resolve().is_relative_to(self.directory.resolve()))
        self.assertEqual(saved.name, "x")

    def test_unreadable_content_is_not_saved(self) -> None:
        """A content that cannot be read whole leaves no partial copy."""

        def read(offset: int, length: int) -> Deferred[bytes]:
            if offset:
                return fail(OSError("the data plane is out of reach"))
            return succeed(b"x" * length)

        self.assertIsNone(self.save("big", b"x" * (2 * PIECE_BYTES), read))
        self.assertEqual([files for _, _, files in os.walk(self.directory) if files], [])
        self.assertEqual(copies_in(self.directory), 0)
        self.assertEqual(len(self.flushLoggedErrors()), 0)

    def test_no_directory_saves_nothing(self) -> None:
        """Without a directory, nothing is written and no path is given."""
        unsent = UnsentFiles(None, ImmediateWorker(), lambda: NOW)
        saved = self.successResultOf(
            Deferred.fromCoroutine(unsent.save("f", 1, 3, reader(b"abc")))  # type: ignore[arg-type]
        )
        self.assertIsNone(saved)

    def test_copies_are_removed_with_their_folders(self) -> None:
        """Removing a copy removes the folders it leaves empty, not the directory."""
        saved = self.save("a/b.txt", b"data")
        assert saved is not None
        self.assertEqual(copies_in(self.directory), 1)
        self.successResultOf(Deferred.fromCoroutine(self.unsent.remove(saved)))
        self.assertEqual(list(self.directory.iterdir()), [])
        self.assertEqual(copies_in(self.directory), 0)
        self.assertEqual(copies_in(self.directory / "missing"), 0)

    def test_two_copies_of_one_inode_within_a_second_both_kept(self) -> None:
        """A second copy in the same second goes to <time>-<inode>.2, not over the first."""
        first = self.save("f", b"one")
        second = self.save("f", b"two")
        assert first is not None and second is not None
        self.assertEqual((first.read_bytes(), second.read_bytes()), (b"one", b"two"))
        self.assertEqual(second.parent.name, first.parent.name + ".2")

    def test_a_copy_has_its_name_only_once_whole(self) -> None:
        """
        While the content is still being read, nothing is under the copy's
        name (a mount killed then leaves no empty or short copy there); the
        staging file is not counted as a copy.
        """
        second_piece: Deferred[bytes] = Deferred()

        def read(offset: int, length: int) -> Deferred[bytes]:
            return second_piece if offset else succeed(b"x" * length)

        saving = Deferred.fromCoroutine(self.unsent.save("a/kept.txt", 7, PIECE_BYTES + 5, read))
        self.assertNoResult(saving)
        self.assertEqual(list(self.directory.rglob("kept.txt")), [])
        [staging] = list(self.directory.iterdir())
        self.assertTrue(staging.name.startswith(STAGING_PREFIX))
        self.assertEqual(copies_in(self.directory), 0)
        second_piece.callback(b"y" * 5)
        saved = self.successResultOf(saving)
        assert saved is not None
        self.assertEqual(saved.read_bytes(), b"x" * PIECE_BYTES + b"y" * 5)
        self.assertEqual([path.name for path in self.directory.iterdir()], [saved.parents[1].name])
        self.assertEqual(copies_in(self.directory), 1)
