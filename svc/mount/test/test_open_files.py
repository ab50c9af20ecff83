"""
Tests for L{svc.mount.core.open_files.OpenFiles}: one open state per inode,
whichever thread opened it first.
"""

from __future__ import annotations

from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from svc.mount.chunks.chunk_memo import ChunkMemo
from svc.mount.core.file_state import FileState
from svc.mount.core.open_files import OpenFiles
from svc.mount.core.spill import SpillDirectory
from svc.mount.test.test_writeback import DictSource
from svc.testing.worker import ImmediateWorker


class OpenFilesTests(SynchronousTestCase):
    """Handles and the shared state of each inode."""

    def setUp(self) -> None:
        self.files = OpenFiles()
        self.spill = SpillDirectory(Path(self.mktemp()))

    def state(self, ino: int) -> FileState:
        return FileState(
            ino,
            1,
            (),
            worker=ImmediateWorker(),
            spill_dir=self.spill,
            memo=ChunkMemo(DictSource({}), budget=0),
            now_ns=lambda: 1,
        )

    def test_open_uses_the_state_registered_meanwhile(self) -> None:
        """
        A state made for an inode that another thread opened meanwhile is
        not registered: the new handle shares the registered one.
        """
        first = self.files.open_unopened(3, lambda: self.state(3))
        assert first is not None
        late = self.state(3)
        second = self.files.open(late, writable=True)
        self.assertIs(second.state, first.state)
        self.assertIs(self.files.state(3), first.state)
        self.assertEqual(first.state.handles, 2)

    def test_open_unopened_only_once(self) -> None:
        """An inode with a state gets no second one, and no state is made for it."""
        self.files.open(self.state(3), writable=False)
        made: list[int] = []

        def make() -> FileState:
            made.append(3)
            return self.state(3)

        self.assertIsNone(self.files.open_unopened(3, make))
        self.assertEqual(made, [])

    def test_released_and_retired(self) -> None:
        """The state goes once its last handle is released and it is retired."""
        handle = self.files.open_unopened(4, lambda: self.state(4))
        assert handle is not None
        self.assertFalse(handle.writable)
        self.assertIs(self.files.release(handle.fh), handle)
        self.assertTrue(self.files.retire_if_idle(handle.state))
        self.assertIsNone(self.files.state(4))
        self.assertIsNotNone(self.files.open_unopened(4, lambda: self.state(4)))

    def test_release_reader_of_a_clean_state(self) -> None:
        """
        A read-only handle is forgotten from any thread; its state stays
        registered (the reactor retires it), its count lowered.
        """
        handle = self.files.open_unopened(4, lambda: self.state(4))
        assert handle is not None
        self.assertIs(self.files.release_reader(handle.fh), handle.state)
        self.assertIsNone(self.files.handle(handle.fh))
        self.assertEqual(handle.state.handles, 0)
        self.assertIs(self.files.state(4), handle.state)
        self.assertIsNone(self.files.release_reader(handle.fh), "already released")

    def test_release_reader_leaves_what_needs_the_reactor(self) -> None:
        """
        A writable handle, or the last handle of a state with something to
        do (a change not committed, a lock held), is left to the reactor's
        release; a reader beside other handles is not the last.
        """
        state = self.state(5)
        writer = self.files.open(state, writable=True)
        reader = self.files.open(state, writable=False)
        self.assertIsNone(self.files.release_reader(writer.fh))
        self.assertIs(self.files.release_reader(reader.fh), state, "the writer keeps it")
        self.assertEqual(state.handles, 1)
        self.files.release(writer.fh)
        last = self.files.open(state, writable=False)
        state.layout.write(0, 3)  # a change not committed yet
        self.assertIsNone(self.files.release_reader(last.fh))
        state.layout.reset(())
        state.lock.acquire()
        self.assertIsNone(self.files.release_reader(last.fh))
        state.lock.release()
        self.assertIs(self.files.release_reader(last.fh), state)
