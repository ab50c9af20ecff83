"""
Writes stored into an open file's spill off the reactor thread
(``docs/specifications/mount-runtime.md`` section 1): a L{SpillWrite} the
reactor started and another thread stores, a L{WriteGrant} that lets a
FUSE thread store the next write without asking the reactor first, and the
L{FileLock} of a file's state, which takes back a grant nobody is using
when someone asks for the lock.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.defer import Deferred, DeferredLock

from svc.mount.core.file_size_limit import MAX_FILE_BYTES
from svc.mount.core.spill import MemorySpill, Spill


class SpillWrite:
    """
    Bytes on their way into a spill file
    (L{svc.mount.core.file_state.FileState.begin_write}): L{store} them on a
    thread that may block, then L{finish} on the reactor thread, saying
    whether they were stored.
    """

    def __init__(self, store: Callable[[], None], finish: Callable[[bool], None]) -> None:
        self._store = store
        self._finish: Callable[[bool], None] | None = finish

    def store(self) -> None:
        """C{pwrite} the bytes (blocking)."""
        self._store()

    def finish(self, stored: bool) -> None:
        """On the reactor thread, once: the bytes count only if C{stored}."""
        finish, self._finish = self._finish, None
        if finish is not None:
            finish(stored)


class FileLock(DeferredLock):
    """
    A L{svc.mount.core.file_state.FileState}'s lock, which says when someone
    has to wait for it (C{contended}), so that a L{WriteGrant} nobody is
    using gives it back.
    """

    def __init__(self) -> None:
        super().__init__()
        self.contended: Callable[[], object] = lambda: None

    def acquire(self) -> Deferred[FileLock]:
        acquired = super().acquire()
        if self.waiting:
            self.contended()
        return acquired


class WriteGrant:
    """
    The right to store the next write of a file straight into its spill
    (a file, or memory below its limit: L{accepts}), from a FUSE thread,
    without first asking the reactor. A grant holds the file's lock (and
    keeps its spill open) from the moment a stored write, or the create of
    a new file, hands it over until it is used or given back, so the
    reactor's view is the same as for a write in progress: flush, fsync,
    truncate, the write-back and other writes wait for it, and asking for
    the lock gives an unused grant back (L{FileLock}). Taking it is the
    only step off the reactor thread
    (L{svc.mount.core.file_state.FileState.take_grant}); C{usable}
    is set by the taker (L{svc.mount.ops.file_writes.FileWrites.take_write_grant}).

    A taken grant must end in exactly one of L{finish} (after L{store})
    or L{give_back}, both on the reactor thread.
    """

    def __init__(
        self,
        spill: Spill,
        generation: int,
        used: Callable[[int, bytes, bool], None],
        give_back: Callable[[], None],
        fits: Callable[[int, int], bool] = lambda offset, length: True,
    ) -> None:
        self.generation = generation
        self.usable = False
        self._fits = fits
        self._spill = spill
        self._used = used
        self._give_back = give_back
        self._ended = False

    def accepts(self, offset: int, length: int) -> bool:
        """
        Whether a write of C{length} bytes at C{offset} can be stored with
        this grant: always in a spill file; in a memory spill, below its
        limit only (a larger one goes to the reactor, which moves the bytes
        to a spill file).
        """
        spill = self._spill
        if offset + length > MAX_FILE_BYTES or not self._fits(offset, length):
            return False  # the reactor refuses it, or looks again at the quota
        return not isinstance(spill, MemorySpill) or spill.fits(offset + length)

    def store(self, offset: int, data: bytes) -> None:
        """Store C{data} at C{offset} (a C{pwrite}, blocking; any thread)."""
        self._spill.write(offset, data)

    def finish(self, offset: int, data: bytes, stored: bool) -> None:
        """On the reactor: the write ended; its bytes count only if C{stored}."""
        if not self._ended:
            self._ended = True
            self._used(offset, data, stored)

    def give_back(self) -> None:
        """On the reactor: the grant was not used; the lock is released."""
        if not self._ended:
            self._ended = True
            self._give_back()
