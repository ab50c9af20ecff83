"""
Tests for the changes a last release keeps through a data-plane outage
(``docs/specifications/mount-consistency.md`` section 2.5, "Changes kept
through an outage"; L{svc.mount.writeback.kept_write_backs}).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from svc.mount.outbox.outbox import INLINE_HELD_BYTES
from svc.mount.test.test_fs_close import create
from svc.mount.test.test_fs_outbox import kill
from svc.mount.test.test_fs_support import CALLER, FSFixture, Mount
from svc.mount.writeback.kept_write_backs import PAUSE_INITIAL


def spill_files(mount: Mount) -> list[str]:
    """The files in C{mount}'s spill directory."""
    return [name for _dirs, _subdirs, names in os.walk(mount.spill_dir) for name in names]


def saved_files(mount: Mount) -> list[tuple[str, bytes]]:
    """
    The copies in C{mount}'s unsent directory (of kept files, or of changes
    given up), sorted: their paths in the disk and their bytes.
    """
    if not mount.unsent_dir.exists():
        return []
    return sorted(
        (str(path.relative_to(folder)), path.read_bytes())
        for folder in mount.unsent_dir.iterdir()
        for path in folder.rglob("*")
        if path.is_file()
    )


class KeptThroughAnOutageTests(SynchronousTestCase):
    """A file whose last release cannot reach the data plane is kept, and written back later."""

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        self.up = [True]
        self.cache = Path(self.mktemp())
        self.mount = self.fixture.mount(connected=lambda: self.up[0], outbox_dir=self.cache)
        self.answers = self.mount.answers
        self.clock = self.fixture.service.clock

    def outage(self) -> None:
        self.up[0] = False
        self.answers.down = True

    def back(self) -> None:
        self.up[0] = True
        self.answers.down = False

    def on_server(self, name: str) -> bytes | None:
        """C{name}'s content as a fresh mount reads it (L{None}: no such file)."""
        fresh = self.fixture.mount()
        if name not in fresh.names(""):
            return None
        return fresh.read_file(name)

    def test_a_handed_off_commit_lost_with_the_connection_is_kept(self) -> None:
        """
        The close returned (handed off); the connection was lost with the
        commit unsent and stays down through the release. The changes are
        kept, not discarded, and committed on the first round after the
        data plane is back.
        """
        opened = create(self.mount, "f", b"handed off")
        self.answers.hold("manifest_put", unsent=["manifest_put"])
        self.mount.ok(self.mount.fs.flush(opened.fh, CALLER))  # returned: handed off
        self.outage()
        self.answers.release(lost=True)
        self.mount.ok(self.mount.fs.release(opened.fh, CALLER))
        self.assertEqual(self.mount.fs.kept_files, 1)
        self.assertIn(self.on_server("f"), (None, b""), "not committed yet")
        self.back()
        self.clock.advance(PAUSE_INITIAL)
        self.assertEqual(self.mount.fs.kept_files, 0)
        self.assertEqual(self.on_server("f"), b"handed off")
        flushes = self.mount.events("flush")
        self.assertEqual([line.allowed for line in flushes][-1], True)
        self.assertTrue(any(not line.allowed for line in flushes), "the failures are audited")

    def test_a_close_that_reported_the_outage_still_keeps_the_changes(self) -> None:
        """
        With the connection down the close waits and fails C{EIO}; the
        release keeps the changes anyway, and a reconnection sends them at
        once.
        """
        opened = create(self.mount, "f", b"reported")
        self.outage()
        self.assertEqual(self.mount.errno(self.mount.fs.flush(opened.fh, CALLER)), errno.EIO)
        lines = len(self.mount.events("flush"))
        self.mount.ok(self.mount.fs.release(opened.fh, CALLER))
        self.assertEqual(self.mount.fs.kept_files, 1)
        self.assertEqual(
            len(self.mount.events("flush")), lines, "kept without trying: still disconnected"
        )
        self.back()
        self.mount.fs.reconnected()
        self.clock.advance(0)
        self.assertEqual(self.mount.fs.kept_files, 0)
        self.assertEqual(self.on_server("f"), b"reported")

    def test_a_release_tries_first_while_the_connection_looks_open(self) -> None:
        """
        The connection counts as open but no answer comes (it is failing
        right now): the release writes back first, and keeps the file when
        that gets no answer.
        """
        opened = create(self.mount, "f", b"tried")
        self.mount.ok(self.mount.fs.fsync(opened.fh, False, CALLER))
        self.mount.ok(self.mount.fs.write(opened.fh, 5, b" again", CALLER))
        self.answers.down = True
        lines = len(self.mount.events("flush"))
        self.mount.ok(self.mount.fs.release(opened.fh, CALLER))
        self.assertEqual(self.mount.fs.kept_files, 1)
        self.assertEqual(len(self.mount.events("flush")), lines + 1, "tried once")
        self.answers.down = False
        self.clock.advance(PAUSE_INITIAL)
        self.assertEqual(self.on_server("f"), b"tried again")

    def test_rounds_during_the_outage_try_one_file_each(self) -> None:
        """Three kept files, rounds while the outage lasts: one attempt (one put) each."""
        handles = [create(self.mount, name, name.encode()) for name in ("a", "b", "c")]
        self.outage()
        for opened in handles:
            self.mount.fs.flush(opened.fh, CALLER).addErrback(lambda _: None)
            self.mount.ok(self.mount.fs.release(opened.fh, CALLER))
        self.assertEqual(self.mount.fs.kept_files, 3)
        failed_before = len(self.mount.events("flush"))
        self.clock.advance(PAUSE_INITIAL)
        self.clock.advance(2 * PAUSE_INITIAL)
        self.assertEqual(len(self.mount.events("flush")) - failed_before, 2)
        self.back()
        self.clock.advance(4 * PAUSE_INITIAL)
        self.assertEqual(self.mount.fs.kept_files, 0)
        self.assertEqual([self.on_server(name) for name in ("a", "b", "c")], [b"a", b"b", b"c"])

    def test_a_kept_file_reads_its_kept_content_and_takes_more_writes(self) -> None:
        """
        Reopened while kept, the file shows the kept bytes; a write and
        close then commit everything, and the kept attempt finds nothing
        left.
        """
        opened = create(self.mount, "f", b"first")
        self.outage()
        self.mount.fs.flush(opened.fh, CALLER).addErrback(lambda _: None)
        self.mount.ok(self.mount.fs.release(opened.fh, CALLER))
        entry = self.mount.lookup_path("f")
        again = self.mount.ok(self.mount.fs.open(entry.ino, os.O_RDWR, CALLER))
        self.assertEqual(self.mount.ok(self.mount.fs.read(again.fh, 0, 100, CALLER)), b"first")
        self.mount.ok(self.mount.fs.write(again.fh, 5, b"+second", CALLER))
        self.back()
        self.mount.ok(self.mount.fs.flush(again.fh, CALLER))
        self.mount.ok(self.mount.fs.release(again.fh, CALLER))
        self.assertEqual(self.mount.fs.kept_files, 1, "its own attempt is still to come")
        puts = self.mount.count("manifest_put")
        self.clock.advance(PAUSE_INITIAL)
        self.assertEqual(self.mount.fs.kept_files, 0)
        self.assertEqual(self.mount.count("manifest_put"), puts, "nothing left to commit")
        self.assertEqual(self.on_server("f"), b"first+second")

    def keep(self, name: str, data: bytes) -> None:
        """Create C{name} with C{data}; the outage begins; its close fails, its release keeps it."""
        opened = create(self.mount, name, data)
        self.outage()
        self.assertEqual(self.mount.errno(self.mount.fs.flush(opened.fh, CALLER)), errno.EIO)
        self.mount.ok(self.mount.fs.release(opened.fh, CALLER))
        self.assertEqual(self.mount.fs.kept_files, 1)

    def next_mount(self) -> Mount:
        """The mount is killed; the data plane is back; the next mount on the same cache."""
        kill(self.mount)
        self.back()
        return self.fixture.mount(outbox_dir=self.cache, epoch=2)

    def test_a_kept_file_is_recorded_until_written_back(self) -> None:
        """
        While kept (in the mount's memory and spill files), the file's
        content is also recorded in the outbox, unsent; once written back,
        the record settles. Nothing is copied under C{unsent}.
        """
        self.keep("f", b"kept")
        self.assertEqual(self.mount.outbox.backlog().entries, 1)
        self.back()
        self.clock.advance(PAUSE_INITIAL)
        self.assertEqual(self.on_server("f"), b"kept")
        self.assertEqual(self.mount.outbox.backlog().entries, 0)
        self.assertEqual(saved_files(self.mount), [])

    def test_a_mount_killed_while_a_file_is_kept_leaves_it_to_the_next(self) -> None:
        """
        The mount dies while the file is kept: the next mount on the same
        cache sends the recorded content before it serves.
        """
        self.keep("f", b"kept through the outage")
        after = self.next_mount()
        self.assertEqual(after.read_file("f"), b"kept through the outage")
        self.assertEqual(after.outbox.backlog().entries, 0)

    def test_a_big_kept_file_is_recorded_in_chunk_files(self) -> None:
        """
        A kept file's new chunks over INLINE_HELD_BYTES go to the outbox's
        chunk files as they are cut, and the next mount sends them.
        """
        data = os.urandom(3 * INLINE_HELD_BYTES)
        self.keep("big", data)
        self.assertGreaterEqual(len(list((self.cache / "chunks").iterdir())), 1)
        after = self.next_mount()
        self.assertEqual(after.read_file("big"), data)
        self.assertEqual(list((self.cache / "chunks").iterdir()), [])

    def test_the_record_follows_writes_made_while_kept(self) -> None:
        """
        Reopened, written and closed again while the outage lasts: the file
        is recorded again with the new content, in place of the first
        record (one record, not two), and that is what a killed mount leaves.
        """
        self.keep("f", b"first")
        again = self.mount.ok(
            self.mount.fs.open(self.mount.lookup_path("f").ino, os.O_RDWR, CALLER)
        )
        self.mount.ok(self.mount.fs.write(again.fh, 5, b"+second", CALLER))
        self.mount.fs.flush(again.fh, CALLER).addErrback(lambda _: None)
        self.mount.ok(self.mount.fs.release(again.fh, CALLER))
        self.clock.advance(PAUSE_INITIAL)  # a round: kept again
        self.assertEqual(self.mount.outbox.backlog().entries, 1)
        after = self.next_mount()
        self.assertEqual(after.read_file("f"), b"first+second")

    def test_a_handed_off_commit_left_unanswered_stays_recorded(self) -> None:
        """
        A close handed its commit off, and the connection was lost before
        the answer: the commit's record stays (it is the file's record)
        through the keep, not recorded a second time.
        """
        opened = create(self.mount, "f", b"handed off")
        self.answers.hold("manifest_put", unsent=["manifest_put"])
        self.mount.ok(self.mount.fs.flush(opened.fh, CALLER))
        self.outage()
        self.answers.release(lost=True)
        self.mount.ok(self.mount.fs.release(opened.fh, CALLER))
        self.assertEqual(self.mount.fs.kept_files, 1)
        self.assertEqual(self.mount.outbox.backlog().entries, 1)
        after = self.next_mount()
        self.assertEqual(after.read_file("f"), b"handed off")

    def test_shutdown_leaves_what_still_cannot_be_written_back_to_the_next_mount(self) -> None:
        """
        The last round's failure is final for this mount: the file is let go
        (the spill file removed, no retry scheduled) and its changes stay
        recorded in the outbox, not copied; the next mount on the cache
        sends them.
        """
        data = os.urandom(4 << 20)
        self.keep("f", data)
        self.assertEqual(len(spill_files(self.mount)), 1, "kept: its spill file stays")
        retries = len(self.clock.getDelayedCalls())
        self.mount.ok(self.mount.fs.last_write_backs())
        self.assertEqual(self.mount.fs.kept_files, 0)
        self.assertEqual(spill_files(self.mount), [])
        self.assertEqual(len(self.clock.getDelayedCalls()), retries - 1)
        self.assertEqual(self.mount.outbox.backlog().entries, 1)
        self.assertEqual(saved_files(self.mount), [], "recorded, not copied")
        after = self.next_mount()
        self.assertEqual(after.read_file("f"), data)

    def test_shutdown_during_the_outage_tries_once_and_leaves_the_rest(self) -> None:
        """
        Three kept files, the data plane still out of reach at shutdown: one
        last attempt (one more C{flush} line), then the other two are let go
        without trying, so shutdown does not wait a connection wait per
        file; all three stay recorded for the next mount.
        """
        handles = [create(self.mount, name, name.encode()) for name in ("a", "b", "c")]
        self.outage()
        for opened in handles:
            self.mount.fs.flush(opened.fh, CALLER).addErrback(lambda _: None)
            self.mount.ok(self.mount.fs.release(opened.fh, CALLER))
        lines = len(self.mount.events("flush"))
        self.mount.ok(self.mount.fs.last_write_backs())
        self.assertEqual(len(self.mount.events("flush")) - lines, 1)
        self.assertEqual(self.mount.fs.kept_files, 0)
        self.assertEqual(saved_files(self.mount), [])
        self.back()
        self.assertEqual(
            [self.on_server(name) in (None, b"") for name in ("a", "b", "c")], [True] * 3
        )
        after = self.next_mount()
        self.assertEqual([after.read_file(name) for name in ("a", "b", "c")], [b"a", b"b", b"c"])

    def test_shutdown_writes_back_once_the_data_plane_answers(self) -> None:
        """The last round commits a kept file when it can."""
        opened = create(self.mount, "f", b"at shutdown")
        self.outage()
        self.mount.fs.flush(opened.fh, CALLER).addErrback(lambda _: None)
        self.mount.ok(self.mount.fs.release(opened.fh, CALLER))
        self.back()
        self.mount.ok(self.mount.fs.last_write_backs())
        self.assertEqual(self.on_server("f"), b"at shutdown")
        self.assertEqual(saved_files(self.mount), [], "nothing given up, nothing left")

    def test_read_only_mode_keeps_nothing(self) -> None:
        """
        A write-back refused for another reason than an outage (here
        read-only mode) keeps nothing: the release reports it, as before.
        """
        opened = create(self.mount, "f", b"refused")
        self.mount.fs.set_read_only("test")
        self.mount.fs.flush(opened.fh, CALLER).addErrback(lambda _: None)
        self.assertEqual(self.mount.errno(self.mount.fs.release(opened.fh, CALLER)), errno.EROFS)
        self.assertEqual(self.mount.fs.kept_files, 0)
