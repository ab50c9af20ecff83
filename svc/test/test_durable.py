"""
Tests for L{svc.durable}.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from svc.durable import TEMP_PREFIX, make_directories, write_file_atomically


class WriteFileAtomicallyTests(SynchronousTestCase):
    """
    Tests for L{write_file_atomically}.
    """

    def setUp(self) -> None:
        self.dir = Path(self.mktemp())
        self.dir.mkdir()

    def test_creates_with_mode(self) -> None:
        """A new file has exactly the bytes and permission bits asked for."""
        target = self.dir / "f"
        write_file_atomically(target, b"hello", mode=0o600)
        self.assertEqual(target.read_bytes(), b"hello")
        self.assertEqual(stat.S_IMODE(target.stat().st_mode), 0o600)

    def test_replaces_and_leaves_no_temp(self) -> None:
        """Replacing a file leaves only the final name behind."""
        target = self.dir / "f"
        write_file_atomically(target, b"one")
        write_file_atomically(target, b"two", mode=0o644)
        self.assertEqual(target.read_bytes(), b"two")
        self.assertEqual(stat.S_IMODE(target.stat().st_mode), 0o644)
        self.assertEqual(os.listdir(self.dir), ["f"])

    def test_replaces_by_rename(self) -> None:
        """Replacing swaps in a new inode: a reader holding the old file sees old bytes."""
        target = self.dir / "f"
        write_file_atomically(target, b"old")
        with target.open("rb") as reader:
            old_inode = os.fstat(reader.fileno()).st_ino
            write_file_atomically(target, b"new")
            self.assertEqual(reader.read(), b"old")
        self.assertNotEqual(target.stat().st_ino, old_inode)

    def test_failure_removes_temp(self) -> None:
        """When the rename fails the temporary file is removed and the error raised."""
        target = self.dir / "d"
        target.mkdir()
        (target / "x").write_bytes(b"")
        # Renaming a file over a non-empty directory fails.
        self.assertRaises(OSError, write_file_atomically, target, b"data")
        self.assertEqual([n for n in os.listdir(self.dir) if n.startswith(TEMP_PREFIX)], [])


class MakeDirectoriesTests(SynchronousTestCase):
    """
    Tests for L{make_directories}.
    """

    def test_nested_with_mode(self) -> None:
        """Every missing level is created with the given mode; existing ones are kept."""
        base = Path(self.mktemp())
        base.mkdir()
        make_directories(base / "a" / "b" / "c", mode=0o750)
        for level in (base / "a", base / "a" / "b", base / "a" / "b" / "c"):
            self.assertTrue(level.is_dir())
            self.assertEqual(stat.S_IMODE(level.stat().st_mode), 0o750)
        make_directories(base / "a" / "b" / "c")
