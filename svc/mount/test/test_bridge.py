"""
Tests for L{svc.mount.runtime.bridge} (with L{svc.mount.runtime.reactor_caller} and
L{svc.mount.runtime.llfuse_values}): the translation of llfuse calls into
L{MountFS} calls, errors and timeouts, without mounting (the real mount is
``tests/test_mount_system.py``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable
from typing import Any

import attrs
import llfuse
from twisted.internet.defer import Deferred, fail, succeed
from twisted.trial.unittest import SynchronousTestCase

from svc.mount.core.attributes import (
    AttributeChanges,
    Attributes,
    DirEntry,
    Entry,
    FileKind,
    FsStats,
    OpenResult,
    QuotaReport,
)
from svc.mount.core.errors import FSError
from svc.mount.core.op_ticket import OpTicket, current_ticket
from svc.mount.core.spill import MemoryBudget, MemorySpill
from svc.mount.core.spill_writes import SpillWrite, WriteGrant
from svc.mount.runtime.bridge import Bridge
from svc.mount.runtime.reactor_caller import ReactorCaller
from svc.mount.runtime.settings import BridgeTimeouts


class ImmediateReactor:
    """Runs C{callFromThread} calls at once, or never when C{dropping}."""

    def __init__(self) -> None:
        self.dropping = False
        self.calls = 0

    def callFromThread(self, f: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.calls += 1
        if not self.dropping:
            f(*args, **kwargs)


def attributes(kind: FileKind = FileKind.FILE, size: int = 10) -> Attributes:
    return Attributes(
        server_inode=77,
        kind=kind,
        mode=0o640,
        uid=1,
        gid=2,
        size=size,
        mtime_ns=3,
        atime_ns=4,
        ctime_ns=5,
        version=1,
        nlink=1,
    )


class Fields:
    """Stands in for llfuse.SetattrFields (whose attributes are read-only)."""

    def __init__(self, **update: bool) -> None:
        for name in ("mode", "uid", "gid", "size", "mtime", "atime"):
            setattr(self, f"update_{name}", update.get(name, False))


class Context:
    def __init__(self, pid: int, uid: int = 1000, gid: int = 1000) -> None:
        self.pid = pid
        self.uid = uid
        self.gid = gid


class SpillRecorder:
    """Stands in for a spill file: records writes."""

    def __init__(self, events: list[object]) -> None:
        self.events = events

    def write(self, offset: int, data: bytes) -> None:
        self.events.append(("store", offset, data))


SYNCHRONOUS = {
    "take_write_grant",
    "nothing_to_flush",
    "release_here",
    "known_attributes",
    "known_lookup",
    "known_open",
}
"""MountFS methods called from the FUSE thread directly (not through the reactor)."""


class RecordingFS:
    """A MountFS stand-in that records calls and answers from C{answers}."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.answers: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Callable[..., Any]:
        def method(*args: Any) -> Any:
            self.calls.append((name, args))
            answer = self.answers.get(name)
            if name in SYNCHRONOUS:
                if isinstance(answer, BaseException):
                    raise answer
                return answer
            if isinstance(answer, BaseException):
                return fail(answer)
            if callable(answer):
                return answer(*args)
            return succeed(answer)

        return method


class RecordingCaller(ReactorCaller):
    """Remembers the timeout of each call."""

    def __init__(self, reactor: ImmediateReactor) -> None:
        threads: Any = reactor
        super().__init__(threads, contextlib.nullcontext)
        self.timeouts: list[tuple[str, float]] = []

    def call(
        self,
        timeout: float,
        what: str,
        f: Callable[..., Any],
        *args: Any,
        late: Callable[[Any], object] | None = None,
    ) -> Any:
        self.timeouts.append((what, timeout))
        return super().call(timeout, what, f, *args, late=late)


class BridgeTests(SynchronousTestCase):
    """Each llfuse handler translates to one MountFS call and back."""

    def setUp(self) -> None:
        self.reactor = ImmediateReactor()
        self.fs = RecordingFS()
        self.caller = RecordingCaller(self.reactor)
        self.timeouts = BridgeTimeouts(
            op_seconds=0.05, writeback_seconds=7.0, entry_seconds=11, attr_seconds=13
        )
        self.bridge = Bridge(self.fs, self.caller, self.timeouts)  # type: ignore[arg-type]

    def fuse_errno(self, call: Callable[[], object]) -> int:
        with self.assertRaises(llfuse.FUSEError) as raised:
            call()
        return int(raised.exception.errno)

    def test_lookup_translates_entry(self) -> None:
        """lookup answers EntryAttributes with the FUSE inode, full mode and the cache timeouts."""
        self.fs.answers["lookup"] = Entry(5, attributes())
        out = self.bridge.lookup(1, b"name", Context(os.getpid()))
        self.assertEqual(out.st_ino, 5)
        self.assertEqual(out.st_mode, stat.S_IFREG | 0o640)
        self.assertEqual((out.st_size, out.st_uid, out.st_gid), (10, 1, 2))
        self.assertEqual((out.entry_timeout, out.attr_timeout), (11, 13))
        self.assertEqual([name for name, _ in self.fs.calls], ["known_lookup", "lookup"])
        name, args = self.fs.calls[1]
        self.assertEqual((name, args[:2]), ("lookup", (1, b"name")))
        self.assertEqual(args[2].pid, os.getpid())

    def test_missing_name_is_a_cached_negative_entry(self) -> None:
        """
        lookup of a name that does not exist answers inode 0 with the entry
        timeout (the kernel caches the miss); other errors stay errors.
        """
        self.fs.answers["lookup"] = FSError(errno.ENOENT, "no such name")
        out = self.bridge.lookup(1, b"missing", Context(os.getpid()))
        self.assertEqual((out.st_ino, out.entry_timeout), (0, 11))
        self.fs.answers["lookup"] = FSError(errno.EACCES, "policy")
        lookup = self.bridge.lookup
        self.assertEqual(self.fuse_errno(lambda: lookup(1, b"secret", None)), errno.EACCES)

    def test_fs_error_becomes_fuse_error(self) -> None:
        """An FSError's errno is the FUSEError's errno."""
        self.fs.answers["unlink"] = FSError(errno.ENOTEMPTY, "no")
        self.assertEqual(
            self.fuse_errno(lambda: self.bridge.unlink(1, b"x", None)), errno.ENOTEMPTY
        )

    def test_bug_becomes_eio(self) -> None:
        """Any other exception is EIO, and logged."""
        self.fs.answers["mkdir"] = RuntimeError("bug")
        self.assertEqual(
            self.fuse_errno(lambda: self.bridge.mkdir(1, b"d", 0o755, None)), errno.EIO
        )
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)

    def test_timeout_becomes_eio(self) -> None:
        """A call the reactor never answers fails with EIO after the timeout."""
        self.fs.answers["getattr"] = lambda *a: Deferred()
        self.assertEqual(self.fuse_errno(lambda: self.bridge.getattr(1, None)), errno.EIO)

    def test_timeout_abandons_the_operation(self) -> None:
        """
        The operation runs with a ticket of its own, abandoned when its
        program is answered EIO for want of time (so it cannot start later);
        one answered in time keeps its ticket.
        """
        seen: list[OpTicket | None] = []

        def hanging(*args: object) -> Deferred[None]:
            seen.append(current_ticket())
            return Deferred()

        self.fs.answers["mkdir"] = hanging
        self.assertEqual(
            self.fuse_errno(lambda: self.bridge.mkdir(1, b"d", 0o755, None)), errno.EIO
        )
        self.fs.answers["rmdir"] = lambda *args: seen.append(current_ticket())
        self.bridge.rmdir(1, b"d", None)
        [abandoned, answered] = seen
        assert abandoned is not None and answered is not None
        self.assertTrue(abandoned.abandoned)
        self.assertFalse(answered.abandoned)
        self.assertIsNot(abandoned, answered)
        self.assertIsNone(current_ticket())

    def test_dropped_call_times_out(self) -> None:
        """A call the reactor never runs fails with EIO too: nothing waits forever."""
        self.reactor.dropping = True
        self.assertEqual(self.fuse_errno(lambda: self.bridge.statfs(None)), errno.EIO)

    def test_writeback_calls_wait_longer(self) -> None:
        """flush, fsync and a truncation use the write-back timeout (release does not wait)."""
        self.fs.answers["open"] = type("R", (), {"fh": 9, "keep_cache": False})()
        self.fs.answers["setattr"] = attributes(size=0)
        self.assertEqual(self.bridge.open(4, os.O_RDWR, Context(os.getpid())), 9)
        self.bridge.flush(9)
        self.bridge.fsync(9, True)
        self.bridge.release(9)
        fields = Fields(size=True)
        attr = llfuse.EntryAttributes()
        attr.st_size = 0
        self.bridge.setattr(4, attr, fields, None, None)
        self.assertEqual(
            self.caller.timeouts,
            [("open", 0.05), ("flush", 7.0), ("fsync", 7.0), ("setattr", 7.0)],
        )
        self.assertEqual(self.fs.calls[-1][1][1], AttributeChanges(size=0))
        [flush] = [args for name, args in self.fs.calls if name == "flush"]
        flush_caller = flush[1]
        self.assertEqual(flush_caller.pid, os.getpid())

    def test_reader_released_here_posts_only_a_sweep(self) -> None:
        """
        A release L{MountFS.release_here} takes is answered without a
        reactor release; the handle is no longer open; the sweep is posted
        only when it says so.
        """
        self.fs.answers["open"] = type("R", (), {"fh": 9, "keep_cache": False})()
        self.bridge.open(4, os.O_RDONLY, Context(os.getpid()))
        self.fs.answers["release_here"] = True
        self.bridge.release(9)
        self.assertEqual(self.bridge.open_handles(), {})
        self.fs.answers["release_here"] = False
        self.bridge.release(9)
        names = [name for name, _ in self.fs.calls]
        self.assertEqual(names.count("sweep_released"), 1)
        self.assertNotIn("release", names)

    def test_release_is_posted_without_waiting(self) -> None:
        """
        release answers at once; the handle counts as open until the
        reactor has run it.
        """
        self.fs.answers["open"] = type("R", (), {"fh": 9, "keep_cache": False})()
        self.bridge.open(4, os.O_RDWR, Context(os.getpid()))
        self.reactor.dropping = True  # the reactor never gets to it
        self.bridge.release(9)
        self.assertEqual(self.caller.timeouts[-1:], [("open", 0.05)])
        self.assertIn(9, self.bridge.open_handles())
        self.assertNotIn("release", [name for name, _ in self.fs.calls])
        self.reactor.dropping = False
        self.bridge.release(9)
        self.assertEqual([name for name, _ in self.fs.calls][-1], "release")
        self.assertNotIn(9, self.bridge.open_handles())

    def test_release_failures_are_logged(self) -> None:
        """A release that fails is logged (a bug as a failure); the handle is gone either way."""
        self.fs.answers["release"] = FSError(errno.EIO, "write-back failed")
        self.bridge.release(3)
        self.assertEqual(self.flushLoggedErrors(), [])
        self.fs.answers["release"] = RuntimeError("bug")
        self.bridge.release(4)
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        self.assertEqual(self.bridge.open_handles(), {})

    def test_flush_with_nothing_to_write_back_stays_on_the_fuse_thread(self) -> None:
        """A flush the filesystem says has nothing to do is answered without the reactor."""
        self.fs.answers["nothing_to_flush"] = True
        self.bridge.flush(9)
        self.assertEqual(self.caller.timeouts, [])
        self.assertEqual([name for name, _ in self.fs.calls], ["nothing_to_flush"])

    def test_known_attributes_stay_on_the_fuse_thread(self) -> None:
        """
        getattr is answered without the reactor when the filesystem knows
        the attributes, and asks the reactor when it does not.
        """
        self.fs.answers["known_attributes"] = attributes(FileKind.DIR, size=4096)
        out = self.bridge.getattr(3, None)
        self.assertEqual((out.st_ino, out.st_mode, out.st_size), (3, stat.S_IFDIR | 0o640, 4096))
        self.assertEqual(self.caller.timeouts, [])
        self.fs.answers["known_attributes"] = None
        self.fs.answers["getattr"] = attributes(size=7)
        self.assertEqual(self.bridge.getattr(4, None).st_size, 7)
        self.assertEqual(self.caller.timeouts, [("getattr", 0.05)])

    def test_an_unlinked_open_file_counts_no_links(self) -> None:
        """
        The link count is passed on as it is: 0 for a file unlinked while
        open (C{fstat} shows it, as on a local disk).
        """
        self.fs.answers["known_attributes"] = attrs.evolve(attributes(), nlink=0)
        self.assertEqual(self.bridge.getattr(3, None).st_nlink, 0)
        self.fs.answers["known_attributes"] = attrs.evolve(attributes(), nlink=3)
        self.assertEqual(self.bridge.getattr(3, None).st_nlink, 3)

    def test_known_lookups_stay_on_the_fuse_thread(self) -> None:
        """
        lookup is answered without the reactor when the filesystem knows
        the child, or knows the name is missing (a cached negative entry).
        """
        self.fs.answers["known_lookup"] = Entry(5, attributes())
        self.assertEqual(self.bridge.lookup(1, b"known", Context(os.getpid())).st_ino, 5)
        self.fs.answers["known_lookup"] = FSError(errno.ENOENT, "no such name")
        out = self.bridge.lookup(1, b"missing", Context(os.getpid()))
        self.assertEqual((out.st_ino, out.entry_timeout), (0, 11))
        self.assertEqual(self.caller.timeouts, [])
        name, args = self.fs.calls[0]
        self.assertEqual((name, args[:2]), ("known_lookup", (1, b"known")))
        self.assertEqual(args[2].pid, os.getpid())

    def test_known_opens_stay_on_the_fuse_thread(self) -> None:
        """
        open is answered without the reactor when the filesystem can, and
        the handle's owner is remembered either way (a read is the caller's).
        """
        self.fs.answers["known_open"] = OpenResult(7, keep_cache=True)
        self.assertEqual(self.bridge.open(5, os.O_RDONLY, Context(os.getpid())), 7)
        self.assertEqual(self.caller.timeouts, [])
        self.fs.answers["known_open"] = None
        self.fs.answers["open"] = OpenResult(8, keep_cache=False)
        self.assertEqual(self.bridge.open(5, os.O_WRONLY, Context(os.getpid())), 8)
        self.assertEqual(self.caller.timeouts, [("open", 0.05)])
        self.fs.answers["read"] = b"data"
        self.bridge.read(7, 0, 4)
        name, args = self.fs.calls[-1]
        self.assertEqual((name, args[3].pid), ("read", os.getpid()))

    def test_a_bug_answering_here_leaves_the_call_to_the_reactor(self) -> None:
        """An unexpected exception of a FUSE-thread answer is logged; the reactor answers."""
        self.fs.answers["known_attributes"] = RuntimeError("bug")
        self.fs.answers["getattr"] = attributes(size=7)
        self.assertEqual(self.bridge.getattr(4, None).st_size, 7)
        self.assertEqual(self.caller.timeouts, [("getattr", 0.05)])
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)

    def test_setattr_fields(self) -> None:
        """Only the fields llfuse marks are asked to change; mode loses its type bits."""
        self.fs.answers["setattr"] = attributes()
        fields = Fields(mode=True)
        attr = llfuse.EntryAttributes()
        attr.st_mode = stat.S_IFREG | 0o600
        self.bridge.setattr(4, attr, fields, None, None)
        self.assertEqual(self.fs.calls[0][1][1], AttributeChanges(mode=0o600))
        self.assertEqual(self.caller.timeouts, [("setattr", 0.05)])

    def test_readdir_pages(self) -> None:
        """readdir asks page after page until a short one, resuming at next_offset."""
        entries = [
            DirEntry(f"n{i}".encode(), Entry(10 + i, attributes()), i + 1) for i in range(70)
        ]
        self.fs.answers["opendir"] = 3
        self.fs.answers["readdir"] = lambda fh, off, caller, limit: entries[off : off + limit]
        fh = self.bridge.opendir(1, Context(os.getpid()))
        names = [name for name, _attr, _next in self.bridge.readdir(fh, 0)]
        self.assertEqual(names, [e.name for e in entries])
        offsets = [args[1] for name, args in self.fs.calls if name == "readdir"]
        self.assertEqual(offsets, [0, 64])

    def test_statfs(self) -> None:
        """statfs reports the quota in blocks and a 255-byte name limit."""
        self.fs.answers["statfs"] = FsStats.from_quota(QuotaReport(1 << 20, 4096))
        out = self.bridge.statfs(None)
        self.assertEqual(
            (out.f_bsize, out.f_blocks, out.f_bfree, out.f_namemax), (4096, 256, 255, 255)
        )

    def test_create_remembers_caller(self) -> None:
        """create answers (fh, attributes); later writes carry the creating process."""
        opened = type("R", (), {"fh": 12, "keep_cache": False})()
        self.fs.answers["create"] = (opened, Entry(8, attributes(size=0)))
        self.fs.answers["start_write"] = 3
        fh, out = self.bridge.create(1, b"f", 0o644, os.O_WRONLY, Context(os.getpid(), 5, 6))
        self.assertEqual((fh, out.st_ino), (12, 8))
        self.assertEqual(self.bridge.write(12, 0, b"abc"), 3)
        caller = self.fs.calls[-1][1][3]
        self.assertEqual((caller.uid, caller.gid), (5, 6))
        self.assertEqual(self.bridge.open_handles(), {12: caller})

    def test_write_stores_on_the_fuse_thread_then_finishes(self) -> None:
        """
        A write that goes to a spill file is stored by the FUSE thread,
        then finished on the reactor as stored; the count is answered.
        """
        events: list[object] = []
        started = SpillWrite(lambda: events.append("store"), events.append)
        self.fs.answers["start_write"] = started
        self.assertEqual(self.bridge.write(4, 0, b"abcd"), 4)
        self.assertEqual(events, ["store", True])
        self.assertEqual(self.caller.timeouts, [("write", 0.05)])

    def test_failed_store_finishes_unstored(self) -> None:
        """A pwrite that fails finishes the write as not stored: ENOSPC or EIO."""
        for error, expected in ((errno.ENOSPC, errno.ENOSPC), (errno.EROFS, errno.EIO)):
            finished: list[bool] = []

            def store(error: int = error) -> None:
                raise OSError(error, "spill")

            self.fs.answers["start_write"] = SpillWrite(store, finished.append)
            self.assertEqual(self.fuse_errno(lambda: self.bridge.write(4, 0, b"x")), expected)
            self.assertEqual(finished, [False])

    def test_usable_grant_stores_without_the_reactor(self) -> None:
        """With a usable grant the write is stored here and finished by a post: no start."""
        events: list[object] = []
        grant = WriteGrant(
            SpillRecorder(events),  # type: ignore[arg-type]
            0,
            lambda offset, data, stored: events.append(("finish", offset, data, stored)),
            lambda: events.append("given back"),
        )
        grant.usable = True
        self.fs.answers["take_write_grant"] = grant
        calls = self.reactor.calls
        self.assertEqual(self.bridge.write(4, 7, b"abcd"), 4)
        self.assertEqual(events, [("store", 7, b"abcd"), ("finish", 7, b"abcd", True)])
        self.assertEqual(self.reactor.calls, calls + 1)  # the post only
        self.assertNotIn("start_write", [name for name, _ in self.fs.calls])

    def _given_back_then_started(
        self, spill_for: Callable[[list[object]], Any], usable: bool, data: bytes
    ) -> list[object]:
        """
        Write C{data} with a grant into C{spill_for(events)}; the events seen
        (stores, finishes, give-backs and starts), in order.
        """
        events: list[object] = []
        grant = WriteGrant(
            spill_for(events),
            0,
            lambda offset, data, stored: events.append("finish"),
            lambda: events.append("given back"),
        )
        grant.usable = usable
        self.fs.answers["take_write_grant"] = grant

        def start(*args: object) -> Deferred[int]:
            events.append("start")
            return succeed(len(data))

        self.fs.answers["start_write"] = start
        self.assertEqual(self.bridge.write(4, 0, data), len(data))
        return events

    def test_unusable_grant_given_back_before_the_start(self) -> None:
        """An unusable grant is given back, then the write starts on the reactor as usual."""
        events = self._given_back_then_started(SpillRecorder, False, b"x")
        self.assertEqual(events, ["given back", "start"])

    def test_grant_that_cannot_hold_the_write_is_given_back(self) -> None:
        """A usable grant into a memory spill too small for the write goes back first."""
        memory = MemorySpill(4, MemoryBudget(4))
        events = self._given_back_then_started(lambda events: memory, True, b"12345")
        self.assertEqual(memory.allocated(), 0)
        self.assertEqual(events, ["given back", "start"])

    def test_store_bug_is_eio(self) -> None:
        """Any other exception while storing is EIO (logged), and the write finishes unstored."""
        finished: list[bool] = []

        def store() -> None:
            raise RuntimeError("bug")

        self.fs.answers["start_write"] = SpillWrite(store, finished.append)
        self.assertEqual(self.fuse_errno(lambda: self.bridge.write(4, 0, b"x")), errno.EIO)
        self.assertEqual(finished, [False])
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)

    def test_late_start_gives_its_lock_back(self) -> None:
        """A write start answered after the timeout is finished unstored, never stored."""
        events: list[object] = []
        answer: Deferred[SpillWrite] = Deferred()
        self.fs.answers["start_write"] = lambda *a: answer
        self.assertEqual(self.fuse_errno(lambda: self.bridge.write(4, 0, b"x")), errno.EIO)
        answer.callback(SpillWrite(lambda: events.append("store"), events.append))
        self.assertEqual(events, [False])

    def test_late_open_and_create_release_their_handles(self) -> None:
        """
        An open or a create answered after its timeout (the program was
        told EIO): the handle the kernel never got is released (a create's
        given up), and the create's lookup forgotten.
        """
        opened: Deferred[OpenResult] = Deferred()
        created: Deferred[tuple[OpenResult, Entry]] = Deferred()
        self.fs.answers["open"] = lambda *a: opened
        self.fs.answers["create"] = lambda *a: created
        self.fs.answers["release"] = None
        self.fs.answers["abandon_create"] = None
        self.assertEqual(
            self.fuse_errno(lambda: self.bridge.open(4, os.O_RDWR, Context(1))), errno.EIO
        )
        self.assertEqual(
            self.fuse_errno(lambda: self.bridge.create(1, b"f", 0o644, os.O_WRONLY, Context(1))),
            errno.EIO,
        )
        opened.callback(OpenResult(fh=7, keep_cache=False))
        created.callback((OpenResult(fh=8, keep_cache=False), Entry(5, attributes())))
        self.assertEqual(
            [
                (name, args[0])
                for name, args in self.fs.calls
                if name in ("release", "abandon_create", "forget")
            ],
            [("release", 7), ("abandon_create", 8), ("forget", [(5, 1)])],
        )
