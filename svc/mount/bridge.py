"""
The llfuse bridge: an C{llfuse.Operations} whose handlers only translate.

Each handler runs on an llfuse worker thread. It turns the kernel's
arguments into L{MountFS} arguments, runs the operation on the reactor thread
through L{ReactorCaller} (with the llfuse global lock released and a
timeout: a FUSE thread never waits forever), and turns the answer back into
llfuse values. L{FSError} becomes C{FUSEError(errno)}; a timeout or any
other exception is EIO (the latter logged as a bug).

Threads and timeouts: ``docs/specifications/mount-runtime.md``.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from functools import partial
from typing import Any, TypeVar

import llfuse
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorFromThreads
from twisted.logger import Logger
from twisted.python.failure import Failure

from svc.audit.events import NO_PROCESS, CallerProcess
from svc.mount.attributes import BLOCK_SIZE, AttributeChanges, Entry, OpenResult
from svc.mount.errors import FSError
from svc.mount.fs import MountFS
from svc.mount.op_ticket import OpTicket, run_with_ticket
from svc.mount.open_files import SpillWrite
from svc.mount.settings import BridgeTimeouts

T = TypeVar("T")

_log = Logger()

DEFAULT_TIMEOUTS = BridgeTimeouts()

READDIR_PAGE = 64
"""Entries asked of L{MountFS.readdir} per call (the kernel's buffer is small)."""


def process_name(pid: int, proc: str = "/proc") -> str | None:
    """The command name of C{pid} (C{/proc/<pid>/comm}), L{None} if unknown."""
    if pid <= 0:
        return None
    # Three system calls (a Python file object would add fstat, ioctl and
    # lseek): this runs for most FUSE requests.
    try:
        fd = os.open(f"{proc}/{pid}/comm", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        raw = os.read(fd, 64)
    except OSError:
        return None
    finally:
        os.close(fd)
    name = raw.rstrip(b"\n").decode("utf-8", "replace")
    return name or None


def caller_of(ctx: Any) -> CallerProcess:
    """The L{CallerProcess} behind an llfuse C{RequestContext}."""
    pid = getattr(ctx, "pid", None)
    uid = getattr(ctx, "uid", None)
    gid = getattr(ctx, "gid", None)
    if not isinstance(pid, int) or pid <= 0:
        return CallerProcess(uid=uid, gid=gid)
    return CallerProcess(command=process_name(pid), pid=pid, uid=uid, gid=gid)


class ReactorCaller:
    """
    Runs a function on the reactor thread from a FUSE thread and waits for
    its result, at most C{timeout} seconds, with the llfuse lock released.
    """

    def __init__(
        self,
        reactor: IReactorFromThreads,
        released: Callable[[], AbstractContextManager[Any]] = lambda: llfuse.lock_released,
    ) -> None:
        self._reactor = reactor
        self._released = released

    def call(
        self,
        timeout: float,
        what: str,
        f: Callable[..., Any],
        *args: Any,
        late: Callable[[Any], object] | None = None,
    ) -> Any:
        """
        C{f(*args)} on the reactor thread; its (Deferred's) result.

        @param late: given, on the reactor thread, a result that arrives
            after the timeout (nobody else will see it).
        @raise llfuse.FUSEError: C{FSError.errno}; EIO on timeout or a bug.
        """
        # A plain lock as the signal: held here, released by the reactor
        # when the answer is in (cheaper than an Event's condition).
        done = threading.Lock()
        done.acquire()
        box: list[object] = []
        guard = threading.Lock()
        abandoned = False

        def finished(result: object) -> None:
            with guard:
                if not abandoned:
                    box.append(result)
                    done.release()
                    return
            if late is not None and not isinstance(result, Failure):
                late(result)

        ticket = OpTicket()

        def run() -> None:
            run_with_ticket(ticket, f, *args).addBoth(finished)

        self._reactor.callFromThread(run)
        with self._released():
            answered = done.acquire(timeout=timeout)
        if not answered:
            with guard:
                answered = bool(box)
                abandoned = not answered
        if not answered:
            # What still waits for its turn must not start now (op_ticket).
            self._reactor.callFromThread(ticket.abandon)
            _log.error("{what} got no answer within {timeout}s: EIO", what=what, timeout=timeout)
            raise llfuse.FUSEError(errno.EIO)
        result = box[0]
        if isinstance(result, Failure):
            error = result.value
            if isinstance(error, FSError):
                raise llfuse.FUSEError(error.errno)
            _log.failure("{what} failed unexpectedly: EIO", result, what=what)
            raise llfuse.FUSEError(errno.EIO)
        return result

    def post(self, f: Callable[..., object], *args: Any) -> None:
        """C{f(*args)} on the reactor thread, without waiting; a failure is logged."""

        def run() -> None:
            try:
                f(*args)
            except Exception:
                _log.failure("posted call {f} failed", f=f)

        self._reactor.callFromThread(run)

    def blocking(self, f: Callable[[], T]) -> T:
        """C{f()} here, with the llfuse lock released (for blocking I/O)."""
        with self._released():
            return f()


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
        attributes = entry.attributes
        out = llfuse.EntryAttributes()
        out.st_ino = entry.ino
        out.generation = 0
        out.entry_timeout = self._timeouts.entry_seconds
        out.attr_timeout = self._timeouts.attr_seconds
        out.st_mode = attributes.st_mode
        out.st_nlink = attributes.nlink  # 0 for a file unlinked while open
        out.st_uid = attributes.uid
        out.st_gid = attributes.gid
        out.st_rdev = attributes.rdev
        out.st_size = attributes.size
        out.st_blksize = BLOCK_SIZE
        out.st_blocks = attributes.st_blocks
        out.st_atime_ns = attributes.atime_ns
        out.st_mtime_ns = attributes.mtime_ns
        out.st_ctime_ns = attributes.ctime_ns
        return out

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
            return self._negative()
        return self._attributes(entry)

    def _negative(self) -> llfuse.EntryAttributes:
        out = llfuse.EntryAttributes()
        out.st_ino = 0  # llfuse: a negative entry, cached for entry_timeout
        out.entry_timeout = self._timeouts.entry_seconds
        out.attr_timeout = 0
        return out

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
        changes = AttributeChanges(
            mode=attr.st_mode & 0o7777 if fields.update_mode else None,
            uid=attr.st_uid if fields.update_uid else None,
            gid=attr.st_gid if fields.update_gid else None,
            size=attr.st_size if fields.update_size else None,
            mtime_ns=attr.st_mtime_ns if fields.update_mtime else None,
            atime_ns=attr.st_atime_ns if fields.update_atime else None,
        )
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
        stats = self._op("statfs", self._fs.statfs, caller_of(ctx))
        out = llfuse.StatvfsData()
        out.f_bsize = stats.block_size
        out.f_frsize = stats.block_size
        out.f_blocks = stats.blocks
        out.f_bfree = stats.blocks_free
        out.f_bavail = stats.blocks_available
        out.f_files = stats.files
        out.f_ffree = stats.files_free
        out.f_favail = stats.files_free
        out.f_namemax = stats.name_max
        return out

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


def sync_all(fs: MountFS, handles: dict[int, CallerProcess]) -> Deferred[int]:
    """
    On the reactor thread: tell C{fs} that shutdown begins, write back
    every open handle (before unmounting), then make the final attempt at
    the files kept through an outage; fires with how many handles failed
    (each logged).
    """

    async def syncing() -> int:
        fs.stopping()
        failed = 0
        for fh, caller in sorted(handles.items()):
            try:
                await fs.fsync(fh, False, caller)
            except FSError as error:
                if error.errno == errno.EBADF:
                    # Closed meanwhile: its release is writing it back, and is
                    # waited for below.
                    continue
                failed += 1
                _log.error(
                    "write-back of handle {fh} failed at shutdown: {error}", fh=fh, error=error
                )
        await fs.write_backs_settled()
        await fs.last_write_backs()
        return failed

    return Deferred.fromCoroutine(syncing())


class KernelNotices:
    """
    What C{MountFS} tells the kernel about its caches (its C{invalidate},
    C{forget_attributes} and C{invalidate_entry}), through llfuse, which
    queues each notice for a thread of its own. That queue holds 1,000 and
    its C{put} blocks; the thread runs only while C{llfuse.main} does. So a
    notice while the FUSE loop is not serving (C{serving} false) is dropped:
    the kernel caches nothing of an unmounted file system, and a blocked put
    would stop the reactor. A notice the kernel refuses is logged.
    """

    def __init__(self, serving: Callable[[], bool], fuse: Any = llfuse) -> None:
        self._serving = serving
        self._fuse = fuse

    def invalidate(self, ino: int) -> None:
        """Drop an inode's attributes and page cache."""
        self._send("invalidate_inode", ino)

    def forget_attributes(self, ino: int) -> None:
        """Drop an inode's cached attributes, not its pages."""
        self._send("invalidate_inode", ino, attr_only=True)

    def invalidate_entry(self, parent: int, name: bytes) -> None:
        """Drop directory C{parent}'s entry C{name}."""
        self._send("invalidate_entry", parent, name)

    def _send(self, notice: str, *args: Any, **kwargs: Any) -> None:
        if not self._serving():
            return
        try:
            getattr(self._fuse, notice)(*args, **kwargs)
        except Exception as error:  # the kernel refused
            _log.info(
                "kernel notice {notice}{args} failed: {error}",
                notice=notice,
                args=args,
                error=error,
            )
