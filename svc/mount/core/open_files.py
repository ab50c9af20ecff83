"""
Open files: the file handles by number, and the one shared
L{svc.mount.core.file_state.FileState} of each inode with an open handle
(L{OpenFiles}).
"""

from __future__ import annotations

import errno
import itertools
import threading
from collections.abc import Callable

from svc.mount.core.errors import FSError
from svc.mount.core.file_state import FileState


class Handle:
    """One open file handle: its inode, state, and whether it may write."""

    def __init__(self, fh: int, state: FileState, writable: bool) -> None:
        self.fh = fh
        self.state = state
        self.writable = writable


class OpenFiles:
    """
    File handles by number, and the shared L{FileState} of each inode.
    Changed from the reactor and, for a read-only open answered without it
    (L{open_unopened}), from a FUSE thread: every change holds a guard, so
    an inode never has two states.
    """

    def __init__(self) -> None:
        self._handles: dict[int, Handle] = {}
        self._states: dict[int, FileState] = {}
        self._numbers = itertools.count(1)
        self._guard = threading.Lock()

    def state(self, ino: int) -> FileState | None:
        """The open state of C{ino}, if any handle is open."""
        return self._states.get(ino)

    def open(self, state: FileState, writable: bool) -> Handle:
        """
        A new handle on C{state}, registered as C{state.ino}'s state, or on
        the state already registered for that inode (opened meanwhile on a
        FUSE thread): use the handle's C{state}.
        """
        with self._guard:
            return self._open_locked(self._states.get(state.ino, state), writable)

    def open_unopened(self, ino: int, new_state: Callable[[], FileState]) -> Handle | None:
        """
        Any thread: a read-only handle on a new state from C{new_state()},
        if C{ino} has no state yet; else L{None}.
        """
        with self._guard:
            if ino in self._states:
                return None
            return self._open_locked(new_state(), False)

    def _open_locked(self, state: FileState, writable: bool) -> Handle:
        self._states[state.ino] = state
        state.handles += 1
        handle = Handle(next(self._numbers), state, writable)
        self._handles[handle.fh] = handle
        return handle

    def handle(self, fh: int) -> Handle | None:
        """The handle C{fh}, if open."""
        return self._handles.get(fh)

    def existing(self, fh: int) -> Handle:
        """The handle C{fh}; L{FSError} C{EBADF} when it is not open."""
        handle = self._handles.get(fh)
        if handle is None:
            raise FSError(errno.EBADF, f"no open file {fh}")
        return handle

    def release(self, fh: int) -> Handle | None:
        """
        Forget handle C{fh} (its state's handle count drops; the state stays
        registered until L{retire_if_idle}).
        """
        with self._guard:
            handle = self._handles.pop(fh, None)
            if handle is not None:
                handle.state.handles -= 1
            return handle

    def release_reader(self, fh: int) -> FileState | None:
        """
        Any thread: forget read-only handle C{fh} when its release needs
        the reactor at once for nothing: another handle keeps its state,
        or it was the state's last handle and the state is clean (no change
        to commit, none in flight, no lock held, no spill), so retiring it
        may wait. The handle's state, its count lowered (the caller has the
        state retired on the reactor later if no handle is left); L{None},
        and nothing changed, otherwise (a writable handle, an unknown one,
        a state with something to do).
        """
        with self._guard:
            handle = self._handles.get(fh)
            if handle is None or handle.writable:
                return None
            state = handle.state
            last = state.handles == 1
            if last and (
                state.dirty
                or state.commits_in_flight
                or state.lock.locked
                or state.spill is not None
            ):
                return None
            del self._handles[fh]
            state.handles -= 1
            return state

    def retire_if_idle(self, state: FileState) -> bool:
        """Unregister C{state} if no handle uses it any more; whether it was."""
        with self._guard:
            if state.handles == 0 and self._states.get(state.ino) is state:
                del self._states[state.ino]
                return True
            return False

    def __len__(self) -> int:
        return len(self._handles)
