"""
The llfuse bridge: an C{llfuse.Operations} whose handlers only translate.

Each handler runs on an llfuse worker thread. It turns the kernel's
arguments into L{MountFS} arguments (the caller from
L{svc.mount.runtime.fuse_callers.caller_of}), runs the operation on the reactor
thread through L{svc.mount.runtime.reactor_caller.ReactorCaller} (with the llfuse
global lock released and a timeout: a FUSE thread never waits forever),
and turns the answer back into llfuse values (L{svc.mount.runtime.llfuse_values}).
L{FSError} becomes C{FUSEError(errno)}; a timeout or any other exception
is EIO (the latter logged as a bug). A write's bytes may be stored here,
on the FUSE thread (L{svc.mount.core.spill_writes}).

Threads and timeouts: ``docs/specifications/mount-runtime.md``.
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any, TypeVar

import llfuse
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from svc.audit.events import NO_PROCESS, CallerProcess
from svc.mount.core.attributes import Entry, OpenResult
from svc.mount.core.errors import FSError
from svc.mount.core.spill_writes import SpillWrite
from svc.mount.fs import MountFS
from svc.mount.runtime.fuse_callers import caller_of
from svc.mount.runtime.llfuse_values import (
    attribute_changes,
    entry_attributes,
    negative_entry,
    statvfs_data,
)
from svc.mount.runtime.reactor_caller import ReactorCaller
from svc.mount.runtime.settings import BridgeTimeouts

T = TypeVar("T")

_log = Logger()

DEFAULT_TIMEOUTS = BridgeTimeouts()

READDIR_PAGE = 64
"""Entries asked of L{MountFS.readdir} per call (the kernel's buffer is small)."""


def _abandon_write(started: object) -> None:
    """A write's start answered after its timeout: give its lock back, storing nothing."""
    if isinstance(started, SpillWrite):
        started.finish(False)


def _spill_errno(error: OSError) -> int:
    """What the writer sees when its bytes could not reach the spill file."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return errno.ENOSPC
    return errno.EIO


class Bridge(llfuse.Operations):  # type: ignore[misc]
    """
    The FUSE operations of one mount, translating to C{fs}. It remembers
    the caller of each open handle (llfuse passes no context to C{read},
    C{write}, C{flush}, C{release}, C{readdir}).
    """

    def __init__(
        self, fs: MountFS, caller: ReactorCaller, timeouts: BridgeTimeouts = DEFAULT_TIMEOUTS
    ) -> None:
        super().__init__()
        self._fs = fs
        self._call = caller
        self._timeouts = timeouts
        self._owners: dict[int, CallerProcess] = {}
        self._dir_owners: dict[int, CallerProcess] = {}
        self._owners_lock = threading.Lock()

    # Helpers

    def _op(self, what: str, f: Callable[..., Deferred[T]], *args: Any) -> T:
        result: T = self._call.call(self._timeouts.op_seconds, what, f, *args)
        return result

    def _sync(self, what: str, f: Callable[..., T], *args: Any) -> T:
        result: T = self._call.call(self._timeouts.op_seconds, what, f, *args)
        return result

    def _writeback(self, what: str, f: Callable[..., Deferred[T]], *args: Any) -> T:
        result: T = self._call.call(self._timeouts.writeback_seconds, what, f, *args)
        return result

    def _here(self, f: Callable[..., T | None], *args: Any) -> T | None:
        """
        C{f(*args)}, a C{MountFS} method that answers on this FUSE thread
        when it can: its answer, or L{None} for the reactor to answer. Its
        C{FSError} is the C{FUSEError}; anything else (a bug) is logged and
        leaves the call to the reactor, never escaping the handler.
        """
        try:
            return f(*args)
        except FSError as error:
            raise llfuse.FUSEError(error.errno) from None
        except Exception:
            _log.failure("answering {f} on the FUSE thread failed", f=f)
            return None

    def _attributes(self, entry: Entry) -> llfuse.EntryAttributes:
        return entry_attributes(entry, self._timeouts)

    def _owner(self, fh: int) -> CallerProcess:
        with self._owners_lock:
            return self._owners.get(fh, NO_PROCESS)

    def _remember(self, fh: int, caller: CallerProcess) -> None:
        with self._owners_lock:
            self._owners[fh] = caller

    # Names and attributes

    def lookup(self, parent_inode: int, name: bytes, ctx: Any = None) -> llfuse.EntryAttributes:
        """
        A name in a directory: answered here, without the reactor, when the
        inode table knows the answer (a file or directory it holds, or a name
        a wholly known directory does not hold: the next name a program
        creates, most often). A name that does not exist is answered as a
        negative entry the kernel keeps for C{entry_seconds}, as it keeps
        positive ones: under the exclusive mount lease this mount's answer
        is authoritative, names it creates replace the negative entry in
        the kernel, and names others create arrive as a C{changed} push that
        invalidates it (``docs/specifications/mount-runtime.md`` section 2).
        """
        caller = caller_of(ctx)
        try:
            entry = self._here(self._fs.known_lookup, parent_inode, name, caller)
            if entry is None:
                entry = self._op("lookup", self._fs.lookup, parent_inode, name, caller)
        except llfuse.FUSEError as error:
            if error.errno != errno.ENOENT:
                raise
            return negative_entry(self._timeouts)
        return self._attributes(entry)

    def getattr(self, inode: int, ctx: Any = None) -> llfuse.EntryAttributes:
        """
        An inode's attributes: answered here, without the reactor, when the
        inode table holds them (a directory's after a create in it, which
        the kernel asks for before the next name is looked up there).
        """
        attributes = self._here(self._fs.known_attributes, inode)
        if attributes is None:
            attributes = self._op("getattr", self._fs.getattr, inode, caller_of(ctx))
        return self._attributes(Entry(inode, attributes))

    def setattr(
        self, inode: int, attr: Any, fields: Any, fh: int | None, ctx: Any = None
    ) -> llfuse.EntryAttributes:
        """Change mode, owner, size or times (a size change may write back)."""
        changes = attribute_changes(attr, fields)
        call = self._writeback if changes.size is not None else self._op
        attributes = call("setattr", self._fs.setattr, inode, changes, caller_of(ctx))
        return self._attributes(Entry(inode, attributes))

    def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        """The kernel dropped lookups; nothing to wait for."""
        self._call_no_wait(self._fs.forget, list(inode_list))

    def _call_no_wait(self, f: Callable[..., object], *args: Any) -> None:
        reactor: Any = self._call._reactor
        reactor.callFromThread(f, *args)

    def readlink(self, inode: int, ctx: Any = None) -> bytes:
        """A symlink's target."""
        result: bytes = self._op("readlink", self._fs.readlink, inode, caller_of(ctx))
        return result

    def statfs(self, ctx: Any = None) -> llfuse.StatvfsData:
        """Capacity and usage."""
        return statvfs_data(self._op("statfs", self._fs.statfs, caller_of(ctx)))

    # Directories

    def opendir(self, inode: int, ctx: Any = None) -> int:
        """Open a directory (lists it unless complete)."""
        caller = caller_of(ctx)
        fh: int = self._op("opendir", self._fs.opendir, inode, caller)
        with self._owners_lock:
            self._dir_owners[fh] = caller
        return fh

    def readdir(self, fh: int, off: int) -> Iterator[tuple[bytes, llfuse.EntryAttributes, int]]:
        """Entries from offset C{off}, a page at a time."""
        with self._owners_lock:
            caller = self._dir_owners.get(fh, NO_PROCESS)
        while True:
            page = self._sync("readdir", self._fs.readdir, fh, off, caller, READDIR_PAGE)
            for item in page:
                yield (item.name, self._attributes(item.entry), item.next_offset)
            if len(page) < READDIR_PAGE:
                return
            off = page[-1].next_offset

    def releasedir(self, fh: int) -> None:
        """Close a directory handle."""
        with self._owners_lock:
            self._dir_owners.pop(fh, None)
        self._sync("releasedir", self._fs.releasedir, fh)

    def mkdir(
        self, parent_inode: int, name: bytes, mode: int, ctx: Any = None
    ) -> llfuse.EntryAttributes:
        """Create a directory."""
        return self._attributes(
            self._op("mkdir", self._fs.mkdir, parent_inode, name, mode, caller_of(ctx))
        )

    def rmdir(self, parent_inode: int, name: bytes, ctx: Any = None) -> None:
        """Remove an empty directory."""
        self._op("rmdir", self._fs.rmdir, parent_inode, name, caller_of(ctx))

    def unlink(self, parent_inode: int, name: bytes, ctx: Any = None) -> None:
        """Remove a name."""
        self._op("unlink", self._fs.unlink, parent_inode, name, caller_of(ctx))

    def rename(
        self,
        parent_inode_old: int,
        name_old: bytes,
        parent_inode_new: int,
        name_new: bytes,
        ctx: Any = None,
    ) -> None:
        """Rename, replacing the target."""
        self._op(
            "rename",
            self._fs.rename,
            parent_inode_old,
            name_old,
            parent_inode_new,
            name_new,
            caller_of(ctx),
        )

    def link(
        self, inode: int, new_parent_inode: int, new_name: bytes, ctx: Any = None
    ) -> llfuse.EntryAttributes:
        """A hard link."""
        return self._attributes(
            self._op("link", self._fs.link, inode, new_parent_inode, new_name, caller_of(ctx))
        )

    def symlink(
        self, parent_inode: int, name: bytes, target: bytes, ctx: Any = None
    ) -> llfuse.EntryAttributes:
        """A symlink."""
        return self._attributes(
            self._op("symlink", self._fs.symlink, parent_inode, name, target, caller_of(ctx))
        )

    def mknod(
        self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: Any = None
    ) -> llfuse.EntryAttributes:
        """A regular file, FIFO, socket or device node."""
        return self._attributes(
            self._op("mknod", self._fs.mknod, parent_inode, name, mode, rdev, caller_of(ctx))
        )

    # Files

    def create(
        self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: Any = None
    ) -> tuple[int, llfuse.EntryAttributes]:
        """Create and open a regular file."""
        caller = caller_of(ctx)
        opened, entry = self._call.call(
            self._timeouts.op_seconds,
            "create",
            self._fs.create,
            parent_inode,
            name,
            mode,
            flags,
            caller,
            late=partial(self._abandon_created, caller),
        )
        self._remember(opened.fh, caller)
        return opened.fh, self._attributes(entry)

    def _abandon_created(self, caller: CallerProcess, result: tuple[OpenResult, Entry]) -> None:
        """
        A create answered after its timeout (the program was told EIO): the
        kernel never got the handle or the entry, so the handle is released
        (a new file nobody else has is forgotten with it:
        C{MountFS.abandon_create}) and the lookup forgotten.
        """
        opened, entry = result
        _log.warn("a file created after its call timed out is given up")
        self._fs.abandon_create(opened.fh, caller).addErrback(
            lambda failure: _log.failure("giving up a late create failed", failure)
        )
        self._fs.forget([(entry.ino, 1)])

    def _abandon_opened(self, caller: CallerProcess, opened: OpenResult) -> None:
        """An open answered after its timeout: the handle nobody has is released."""
        _log.warn("a file handle opened after its call timed out is released")
        self._fs.release(opened.fh, caller).addErrback(
            lambda failure: _log.failure("releasing an abandoned handle failed", failure)
        )

    def open(self, inode: int, flags: int, ctx: Any = None) -> int:
        """
        Open a regular file: answered here, without the reactor, for a
        read-only open the inode table and the open files can answer.
        """
        caller = caller_of(ctx)
        opened = self._here(self._fs.known_open, inode, flags, caller)
        if opened is None:
            opened = self._call.call(
                self._timeouts.op_seconds,
                "open",
                self._fs.open,
                inode,
                flags,
                caller,
                late=partial(self._abandon_opened, caller),
            )
        self._remember(opened.fh, caller)
        fh: int = opened.fh
        return fh

    def read(self, fh: int, off: int, size: int) -> bytes:
        """Read from an open file."""
        data: bytes = self._op("read", self._fs.read, fh, off, size, self._owner(fh))
        return data

    def write(self, fh: int, off: int, buf: bytes) -> int:
        """
        Write to an open file (kept locally until write-back). The reactor
        checks the write and takes the file's lock; the C{pwrite} into the
        spill file happens here, and the reactor is told when it is done
        without waiting for it (two thread hand-offs instead of four per
        request; C{docs/specifications/mount-runtime.md}).
        """
        data = bytes(buf)
        grant = self._fs.take_write_grant(fh)
        if grant is not None:
            if grant.usable and grant.accepts(off, len(data)):
                self._store(lambda: grant.store(off, data), partial(grant.finish, off, data))
                return len(data)
            self._call.post(grant.give_back)  # queued before the start below
        started: int | SpillWrite = self._call.call(
            self._timeouts.op_seconds,
            "write",
            self._fs.start_write,
            fh,
            off,
            data,
            self._owner(fh),
            late=_abandon_write,
        )
        if isinstance(started, int):
            return started
        self._store(started.store, started.finish)
        return len(data)

    def _store(self, store: Callable[[], None], finish: Callable[[bool], object]) -> None:
        """
        C{store()} here (the C{pwrite} into a spill file), then
        C{finish(stored)} posted to the reactor; errors become C{FUSEError}.
        """
        stored = False
        try:
            self._call.blocking(store)
            stored = True
        except OSError as error:
            _log.error("writing a spill file failed: {error}", error=error)
            raise llfuse.FUSEError(_spill_errno(error)) from None
        except Exception:
            # A bug: EIO for this write, never an exception out of the
            # handler (llfuse would end the mount's main loop).
            _log.failure("writing a spill file failed unexpectedly: EIO")
            raise llfuse.FUSEError(errno.EIO) from None
        finally:
            # Queued before the kernel hears back, so any later request of
            # the writer runs on the reactor after the bytes count.
            self._call.post(finish, stored)

    def flush(self, fh: int) -> None:
        """
        Write back on close of a descriptor; answered here, without the
        reactor, when there is nothing to write back (a read-only open's
        close, most often). A close that hands its commit off returns once
        the commit is recorded in the outbox and sent (``mount-outbox.md``
        section 8), so it goes through the reactor.
        """
        if self._here(self._fs.nothing_to_flush, fh):
            return
        self._writeback("flush", self._fs.flush, fh, self._owner(fh))

    def fsync(self, fh: int, datasync: bool) -> None:
        """Write back."""
        self._writeback("fsync", self._fs.fsync, fh, bool(datasync), self._owner(fh))

    def release(self, fh: int) -> None:
        """
        Close a file handle, without waiting: the release is posted to the
        reactor, which runs it after every call posted before (the handle's
        writes and flushes), and answered at once. Nobody waits for the
        answer (C{close(2)} returned after the flush, and the kernel ignores
        a release's errors), but a FUSE thread waiting here for the commit
        of a handed-off close held one of the few threads every other
        request needs. The handle counts as open (L{open_handles}) until the
        release has run, so a shutdown writes it back meanwhile.
        """
        released = self._here(self._fs.release_here, fh)
        if released is not None:
            # A read-only handle whose release needs nothing now: forgotten
            # here; its file's state is retired by a sweep on the reactor.
            with self._owners_lock:
                self._owners.pop(fh, None)
            if released:
                self._call.post(self._fs.sweep_released)
            return
        self._call.post(self._release_on_reactor, fh, self._owner(fh))

    def _release_on_reactor(self, fh: int, owner: CallerProcess) -> None:
        def released(result: object) -> None:
            with self._owners_lock:
                self._owners.pop(fh, None)
            if isinstance(result, Failure):
                if isinstance(result.value, FSError):
                    _log.warn("release of file {fh} failed: {error}", fh=fh, error=result.value)
                else:
                    _log.failure("release of file {fh} failed", result, fh=fh)

        self._fs.release(fh, owner).addBoth(released)

    # Shutdown (reactor thread)

    def open_handles(self) -> dict[int, CallerProcess]:
        """The open file handles and their callers."""
        with self._owners_lock:
            return dict(self._owners)
