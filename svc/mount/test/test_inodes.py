"""
Tests for L{svc.mount.core.inodes.InodeTable}: the names guard that lets a FUSE
thread form a path while the reactor changes names.
"""

from __future__ import annotations

from types import TracebackType

from twisted.trial.unittest import SynchronousTestCase

from svc.mount.core.attributes import Attributes, FileKind
from svc.mount.core.inodes import LOCAL_NUMBERS, InodeTable, Node


def attributes(server_inode: int, kind: FileKind = FileKind.FILE) -> Attributes:
    return Attributes(
        server_inode=server_inode,
        kind=kind,
        mode=0o755,
        uid=0,
        gid=0,
        size=0,
        mtime_ns=1,
        atime_ns=1,
        ctime_ns=1,
        version=1,
        nlink=2 if kind is FileKind.DIR else 1,
    )


class RecordingGuard:
    """Stands in for the names guard: how deep it is held, and how often it was taken."""

    def __init__(self) -> None:
        self.depth = 0
        self.taken = 0

    def __enter__(self) -> None:
        self.depth += 1
        self.taken += 1

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.depth -= 1


class GuardedNames(set[tuple[int, str]]):
    """A node's names that fail the test when changed without the guard held."""

    guard: RecordingGuard

    def add(self, element: tuple[int, str]) -> None:
        assert self.guard.depth > 0, "a name added without the names guard"
        super().add(element)

    def discard(self, element: object) -> None:
        assert self.guard.depth > 0, "a name dropped without the names guard"
        super().discard(element)


class NamesGuardTests(SynchronousTestCase):
    """Every change of names holds the names guard; readers off the reactor take it."""

    def setUp(self) -> None:
        self.table = InodeTable(attributes(1, FileKind.DIR))
        self.guard = RecordingGuard()
        self.table._names_guard = self.guard  # type: ignore[assignment]
        GuardedNames.guard = self.guard

    def _guarded(self, node: Node) -> Node:
        node.names = GuardedNames(node.names)
        return node

    def test_every_change_of_names_holds_the_guard(self) -> None:
        """
        Learning, creating, moving, unlinking, forgetting and listing
        change names only with the guard held, and leave it free.
        """
        table, root = self.table, self.table.root
        directory = self._guarded(table.learn(root, "d", attributes(2, FileKind.DIR)))
        directory.complete = True
        first = self._guarded(table.learn(directory, "a", attributes(3)))
        pending = self._guarded(table.add_pending(directory, "p", attributes(0)))
        table.move(directory, "a", root, "b")
        table.unlink(directory, "p")
        table.forget_name(root, "b")
        table.set_listing(directory, [("c", attributes(4))])
        table.forget(first.ino, 1)
        table.discard_if_unused(pending)
        self.assertEqual(self.guard.depth, 0)
        self.assertGreaterEqual(self.guard.taken, 8)
        self.assertEqual(table.path_of(directory), "d")

    def test_path_from_any_thread_takes_the_guard(self) -> None:
        """A path formed for another thread is formed under the guard."""
        directory = self.table.learn(self.table.root, "d", attributes(2, FileKind.DIR))
        child = self.table.learn(directory, "f", attributes(3))
        taken = self.guard.taken
        self.assertEqual(self.table.path_from_any_thread(child), "d/f")
        self.assertEqual(self.guard.taken, taken + 1)
        self.table.unlink(directory, "f")
        self.assertIsNone(self.table.path_from_any_thread(child))

    def test_the_real_guard_is_reentrant(self) -> None:
        """A change that makes others (a listing learns and unlinks) does not deadlock."""
        table = InodeTable(attributes(1, FileKind.DIR))
        directory = table.learn(table.root, "d", attributes(2, FileKind.DIR))
        table.learn(directory, "old", attributes(3))
        table.set_listing(directory, [("new", attributes(4))])
        self.assertEqual(sorted(directory.children), ["new"])
        table.learn(table.root, "e", attributes(2, FileKind.DIR))  # the directory, moved
        self.assertEqual(table.path_from_any_thread(directory), "e")


class GenerationTests(SynchronousTestCase):
    """The generation moves only when an existing path may have changed."""

    def setUp(self) -> None:
        self.table = InodeTable(attributes(1, FileKind.DIR))
        self.directory = self.table.learn(self.table.root, "d", attributes(2, FileKind.DIR))
        self.file = self.table.learn(self.directory, "f", attributes(3))

    def test_new_names_leave_it(self) -> None:
        """New nodes, a name learnt again, a listing and forgetting unnamed nodes do not move it."""
        table = self.table
        before = table.generation
        table.add_pending(self.directory, "p", attributes(0))
        table.learn(self.directory, "g", attributes(4))
        table.learn(self.directory, "f", attributes(3))
        table.set_listing(self.directory, [("f", attributes(3)), ("g", attributes(4))])
        table.forget(self.file.ino, 1)
        self.assertEqual(table.generation, before)

    def test_changed_paths_move_it(self) -> None:
        """A move, an unlink, another name of a known node and a directory moved do."""
        table = self.table
        for change in (
            lambda: table.learn(table.root, "link", attributes(3)),
            lambda: table.move(self.directory, "f", table.root, "f2"),
            lambda: table.learn(table.root, "e", attributes(2, FileKind.DIR)),
            lambda: table.unlink(table.root, "f2"),
        ):
            before = table.generation
            change()
            self.assertGreater(table.generation, before)


class NumberTests(SynchronousTestCase):
    """FUSE inode numbers: the data plane's, so every mount shows the same C{st_ino}."""

    def setUp(self) -> None:
        self.table = InodeTable(attributes(7, FileKind.DIR))

    def test_a_node_the_data_plane_numbers_takes_its_number(self) -> None:
        """A learnt node is numbered as the data plane numbers it, and so is a hard link."""
        table = self.table
        directory = table.learn(table.root, "d", attributes(12, FileKind.DIR))
        file = table.learn(directory, "f", attributes(40))
        self.assertEqual((table.root.ino, directory.ino, file.ino), (1, 12, 40))
        self.assertIs(table.learn(table.root, "link", attributes(40)), file)

    def test_the_same_number_on_another_mount_and_after_a_forget(self) -> None:
        """A fresh table, or the node forgotten and learnt again: the same number."""
        file = self.table.learn(self.table.root, "f", attributes(40))
        self.table.unlink(self.table.root, "f")
        self.table.forget(file.ino, 0)
        again = self.table.learn(self.table.root, "f", attributes(40))
        fresh = InodeTable(attributes(7, FileKind.DIR))
        other = fresh.learn(fresh.root, "f", attributes(40))
        self.assertEqual((again.ino, other.ino), (40, 40))

    def test_a_pending_file_numbers_itself_below_2_to_the_32(self) -> None:
        """
        A file the data plane has not numbered takes a number of the mount's
        own, counting down from 2^32 - 1, kept once the data plane numbers it.
        """
        table = self.table
        first = table.add_pending(table.root, "p", attributes(0))
        second = table.add_pending(table.root, "q", attributes(0))
        self.assertEqual((first.ino, second.ino), (LOCAL_NUMBERS, LOCAL_NUMBERS - 1))
        table.bind(first, attributes(41))
        self.assertEqual(first.ino, LOCAL_NUMBERS)
        self.assertIs(table.learn(table.root, "p", attributes(41)), first)

    def test_a_number_a_live_node_holds_is_not_given_twice(self) -> None:
        """A data-plane number a pending file already holds: the next number of the mount's own."""
        table = self.table
        pending = table.add_pending(table.root, "p", attributes(0))
        clash = table.learn(table.root, "f", attributes(pending.ino))
        self.assertNotEqual(clash.ino, pending.ino)
        self.assertEqual(clash.ino, LOCAL_NUMBERS - 1)
        zero = table.learn(table.root, "z", attributes(0))
        self.assertNotIn(zero.ino, (0, 1, pending.ino, clash.ino))
