"""
Tests for the outbox as the mount's record of closes that return before
their commit is answered (``mount-outbox.md`` section 8): the close
records the commit first, the record settles with the answer, and a mount
killed before the answer leaves it for the next mount on the same cache,
which sends it before it serves, once, and keeps the content when the data
plane refuses it.
"""

from __future__ import annotations

import os
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from svc.mount.core.attributes import AttributeChanges
from svc.mount.core.errors import FSError
from svc.mount.fs import ROOT_INODE
from svc.mount.outbox.entries import Commit, Entry, Rename
from svc.mount.outbox.log import OutboxLog
from svc.mount.outbox.outbox import INLINE_HELD_BYTES
from svc.mount.test.test_fs_close import create
from svc.mount.test.test_fs_support import AGENT, CALLER, FSFixture, Mount


def kill(mount: Mount) -> None:
    """
    C{mount} dies now: its outbox log stays as it stands (nothing settles
    any more), its connection is gone (requests kept back never run, their
    answers never come), and what it was doing ends (rather than being
    left to the garbage collector half-way).
    """
    mount.outbox.stop()
    mount.answers.down = True
    mount.answers.release(lost=True)


def logged(cache: Path) -> list[Entry]:
    """The unsettled entries the log under C{cache} holds (its mount killed)."""
    log, replay = OutboxLog.open(cache / "log")
    log.close()
    return list(replay.unsettled)


class RecordedCloseTests(SynchronousTestCase):
    """Closes answered early, recorded, replayed."""

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        self.cache = Path(self.mktemp())
        self.mount = self.fixture.mount(outbox_dir=self.cache)

    def killed(self, mount: Mount) -> None:
        """C{mount} dies now (L{kill})."""
        kill(mount)

    def next_mount(self) -> Mount:
        """The next mount on the same cache (a new session)."""
        return self.fixture.mount(outbox_dir=self.cache, epoch=2)

    def close_early(self, name: str, data: bytes, *, unsent: bool) -> None:
        """Create C{name} with C{data} and close it; its put's answer kept back."""
        self.mount.answers.hold("manifest_put", unsent=("manifest_put",) if unsent else ())
        opened = create(self.mount, name, data)
        self.mount.ok(self.mount.fs.flush(opened.fh, CALLER))

    def test_a_close_answered_early_is_recorded_until_its_answer(self) -> None:
        """
        The close returns with the commit sent and recorded (its new chunks
        held); the answer settles the record, and the put carried its tag.
        """
        self.close_early("f", b"content", unsent=False)
        backlog = self.mount.outbox.backlog()
        self.assertEqual((backlog.entries, backlog.content_bytes), (1, len(b"content")))
        self.assertIn(b"content", (self.cache / "log").read_bytes(), "carried in the record")
        self.assertEqual(list((self.cache / "chunks").iterdir()), [])
        self.mount.answers.release()
        self.assertEqual(self.mount.outbox.backlog().entries, 0)
        self.assertNotIn(b"content", (self.cache / "log").read_bytes())
        self.assertEqual(self.fixture.mount().read_file("f"), b"content")

    def test_a_bigger_commit_holds_its_chunks_in_files(self) -> None:
        """
        Over INLINE_HELD_BYTES of new chunks: they are written under
        C{chunks/} until the answer, and replayed from there.
        """
        data = os.urandom(INLINE_HELD_BYTES + 1)
        self.close_early("f", data, unsent=True)
        self.assertGreaterEqual(len(list((self.cache / "chunks").iterdir())), 1)
        self.killed(self.mount)
        after = self.next_mount()
        self.assertEqual(after.read_file("f"), data)
        self.assertEqual(list((self.cache / "chunks").iterdir()), [])

    def test_a_durable_close_records_nothing(self) -> None:
        """A close that waits for its answer has nothing to leave behind."""
        opened = create(self.mount, "f", b"content")
        self.mount.ok(self.mount.fs.fsync(opened.fh, False, CALLER))
        self.assertEqual(self.mount.outbox.backlog().entries, 0)
        self.assertEqual(list((self.cache / "log").parent.glob("chunks/*")), [])

    def test_the_next_mount_sends_what_a_killed_one_left(self) -> None:
        """
        The put never reached the data plane: the next mount on the cache
        sends it before it starts, and the file is there, once.
        """
        self.close_early("f", b"content", unsent=True)
        self.killed(self.mount)
        after = self.next_mount()
        self.assertEqual(after.outbox.backlog().entries, 0)
        self.assertEqual(after.read_file("f"), b"content")
        self.assertEqual(after.lookup_path("f").attributes.version, 2, "created, then committed")

    def test_a_put_that_ran_before_the_kill_is_answered_not_run_again(self) -> None:
        """
        The put ran and the mount died before its answer: the replay is
        answered with the first run's answer, so no second version and no
        conflict copy.
        """
        self.close_early("f", b"content", unsent=False)
        self.killed(self.mount)
        after = self.next_mount()
        self.assertEqual(after.names(""), ["f"])
        self.assertEqual(after.lookup_path("f").attributes.version, 2, "created, then committed")
        self.assertEqual(after.read_file("f"), b"content")

    def test_a_replay_that_lost_to_another_writer_is_a_conflict_copy(self) -> None:
        """
        Another writer made the file while the mount was dead: theirs stays
        at the name, the dead mount's content goes to a conflict copy beside it.
        """
        self.close_early("f", b"mine", unsent=True)
        self.killed(self.mount)
        self.fixture.service.agent().put_file("f", b"theirs", expected_version=1)
        after = self.next_mount()
        self.assertEqual(after.read_file("f"), b"theirs")
        [copy] = [name for name in after.names("") if name != "f"]
        self.assertTrue(copy.startswith("f.conflict-"), copy)
        self.assertEqual(after.read_file(copy), b"mine")

    def test_a_replay_refused_otherwise_is_saved_under_unsent(self) -> None:
        """
        The file's directory is gone when the replay comes: the content is
        saved under the cache's unsent directory, not dropped.
        """
        directory = self.mount.ok(self.mount.fs.mkdir(ROOT_INODE, b"d", 0o755, CALLER))
        self.mount.answers.hold("manifest_put", unsent=("manifest_put",))
        opened, _ = self.mount.ok(
            self.mount.fs.create(directory.ino, b"f", 0o644, os.O_WRONLY, CALLER)
        )
        self.mount.ok(self.mount.fs.write(opened.fh, 0, b"kept", CALLER))
        self.mount.ok(self.mount.fs.flush(opened.fh, CALLER))
        self.killed(self.mount)
        self.fixture.service.agent().ok("dir_remove", path=f"/{AGENT.agent_id}/d")
        after = self.next_mount()
        self.assertEqual(after.names(""), [])
        [saved] = [path for path in after.unsent_dir.rglob("*") if path.is_file()]
        self.assertEqual(saved.read_bytes(), b"kept")
        self.assertEqual(saved.name, "f")
        self.assertEqual(after.outbox.backlog().entries, 0)

    def test_the_recorded_entry_is_the_commit(self) -> None:
        """
        What the log holds names the server path, the version replaced (the
        empty file the create made) and the content.
        """
        self.close_early("f", b"content", unsent=True)
        self.killed(self.mount)
        log, replay = OutboxLog.open(self.cache / "log")
        log.close()
        [entry] = replay.unsettled
        assert isinstance(entry, Commit)
        self.assertEqual(
            (entry.path, entry.expected, entry.size, entry.chained),
            (f"/{AGENT.agent_id}/f", 1, len(b"content"), False),
        )


class RecordedChangeTests(SynchronousTestCase):
    """Namespace changes recorded before they are sent, and what a killed mount left."""

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        self.cache = Path(self.mktemp())
        self.mount = self.fixture.mount(outbox_dir=self.cache)
        self.mount.ok(self.mount.fs.mkdir(ROOT_INODE, b"d", 0o755, CALLER))
        self.mount.write_file("d/f", b"mine")
        self.folder = self.mount.lookup_path("d").ino

    def next_mount(self) -> Mount:
        """The next mount on the same cache, after this one was killed (L{kill})."""
        kill(self.mount)
        return self.fixture.mount(outbox_dir=self.cache, epoch=2)

    def logged(self) -> list[Entry]:
        """The unsettled entries the log holds now."""
        log, replay = OutboxLog.open(self.cache / "log")
        log.close()
        return list(replay.unsettled)

    def test_every_change_is_recorded_until_answered(self) -> None:
        """
        A change in flight is in the log, its request tagged with its
        entry; its answer settles it.
        """
        self.mount.answers.hold("manifest_rename")
        self.mount.ok(self.mount.fs.rename(self.folder, b"f", self.folder, b"g", CALLER))
        self.assertEqual(self.mount.outbox.backlog().entries, 1)
        kill(self.mount)
        [entry] = self.logged()
        self.assertEqual(
            entry, Rename(entry.seq, f"/{AGENT.agent_id}/d/f", f"/{AGENT.agent_id}/d/g")
        )

    def test_a_handed_off_unlink_a_killed_mount_sent_is_applied(self) -> None:
        """
        The unlink returned once sent and never reached the data plane: the
        next mount on the cache sends it before it starts.
        """
        self.mount.answers.hold("manifest_delete", unsent=("manifest_delete",))
        self.mount.ok(self.mount.fs.unlink(self.folder, b"f", CALLER))
        after = self.next_mount()
        self.assertEqual(after.names("d"), [])

    def test_a_rename_that_ran_before_the_kill_is_not_run_again(self) -> None:
        """
        The rename ran and the mount died before its answer; another writer
        then made a new C{f}: the replay is answered as the first run was,
        so the new C{f} is not moved over C{g}.
        """
        self.mount.answers.hold("manifest_rename")
        self.mount.ok(self.mount.fs.rename(self.folder, b"f", self.folder, b"g", CALLER))
        self.fixture.service.agent().put_file("d/f", b"theirs")
        after = self.next_mount()
        self.assertEqual(sorted(after.names("d")), ["f", "g"])
        self.assertEqual(after.read_file("d/f"), b"theirs")
        self.assertEqual(after.read_file("d/g"), b"mine")

    def test_a_truncation_is_recorded_with_its_size(self) -> None:
        """The truncation of a closed file is a setattr entry carrying the size."""
        node = self.mount.lookup_path("d/f")
        self.mount.answers.hold("setattr", unsent=("setattr",))
        truncated = self.mount.fs.setattr(node.ino, AttributeChanges(size=0), CALLER)
        self.assertNoResult(truncated)
        after = self.next_mount()
        self.failureResultOf(truncated, FSError)  # the killed mount's call never returned
        self.assertEqual(after.read_file("d/f"), b"")

    def test_an_atomic_save_a_killed_mount_sent_is_replayed_whole(self) -> None:
        """
        A save's commit of the temporary file and its rename over the real
        one both returned, neither reached the data plane: the next mount
        replays both, in order (the commit alone would leave the save half
        done).
        """
        self.mount.answers.hold(
            "manifest_put", "manifest_rename", unsent=("manifest_put", "manifest_rename")
        )
        opened, _ = self.mount.ok(
            self.mount.fs.create(self.folder, b"f.tmp", 0o644, os.O_WRONLY, CALLER)
        )
        self.mount.ok(self.mount.fs.write(opened.fh, 0, b"saved", CALLER))
        self.mount.ok(self.mount.fs.flush(opened.fh, CALLER))
        self.mount.fs.release(opened.fh, CALLER)  # waits for the commit's answer
        self.mount.ok(self.mount.fs.rename(self.folder, b"f.tmp", self.folder, b"f", CALLER))
        self.assertEqual(self.mount.answers.held, 2, "both sent, neither answered")
        after = self.next_mount()
        self.assertEqual(after.names("d"), ["f"])
        self.assertEqual(after.read_file("d/f"), b"saved")


class EmptyCloseTests(SynchronousTestCase):
    """
    A new file's empty close leaves its commit to a later close or the
    release, and records it first (``mount-outbox.md`` section 8): C{touch f}
    then a killed mount still leaves C{f}.
    """

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        self.cache = Path(self.mktemp())
        self.mount = self.fixture.mount(outbox_dir=self.cache)
        # A new directory is listed whole: files created in it are pending.
        self.folder = self.mount.ok(self.mount.fs.mkdir(ROOT_INODE, b"d", 0o755, CALLER)).ino

    def next_mount(self) -> Mount:
        """The next mount on the same cache, after this one was killed (L{kill})."""
        kill(self.mount)
        return self.fixture.mount(outbox_dir=self.cache, epoch=2)

    def touch(self, name: bytes) -> int:
        """Create C{name} in the folder and close it empty; its handle."""
        opened, _ = self.mount.ok(
            self.mount.fs.create(self.folder, name, 0o644, os.O_WRONLY, CALLER)
        )
        self.mount.ok(self.mount.fs.flush(opened.fh, CALLER))
        return opened.fh

    def test_an_empty_close_is_recorded_until_the_file_is_committed(self) -> None:
        """
        The close sends nothing and records an empty commit; the release's
        commit settles it, and the file is on the data plane.
        """
        self.mount.answers.hold("manifest_put")
        fh = self.touch(b"f")
        self.assertEqual(self.mount.answers.held, 0, "nothing sent")
        self.assertEqual(self.mount.outbox.backlog().entries, 1)
        self.mount.answers.release()
        self.mount.ok(self.mount.fs.release(fh, CALLER))
        self.assertEqual(self.mount.outbox.backlog().entries, 0)
        self.assertEqual(self.fixture.mount().read_file("d/f"), b"")

    def test_a_killed_mount_s_empty_file_is_made_by_the_next(self) -> None:
        """Killed between the close and the release: the next mount makes the empty file."""
        self.touch(b"f")
        kill(self.mount)
        [entry] = logged(self.cache)
        assert isinstance(entry, Commit)
        self.assertEqual(
            (entry.path, entry.expected, entry.size, entry.chunks),
            (f"/{AGENT.agent_id}/d/f", 0, 0, ()),
        )
        after = self.next_mount()
        self.assertEqual(after.names("d"), ["f"])
        self.assertEqual(after.read_file("d/f"), b"")
        self.assertEqual(after.outbox.backlog().entries, 0)

    def test_an_empty_file_removed_before_it_was_committed_is_not_made(self) -> None:
        """Closed empty, then unlinked (it never reached the data plane): nothing to replay."""
        self.touch(b"f")
        self.mount.ok(self.mount.fs.unlink(self.folder, b"f", CALLER))
        self.assertEqual(self.mount.outbox.backlog().entries, 0)
        after = self.next_mount()
        self.assertEqual(after.names("d"), [])

    def test_the_commit_after_an_empty_close_replaces_its_record(self) -> None:
        """
        The shell's C{>}: closed empty, then written and closed again; that
        commit is recorded (and unanswered when the mount dies), the empty
        record settled: the next mount makes the file once, with the content.
        """
        fh = self.touch(b"f")
        self.mount.ok(self.mount.fs.write(fh, 0, b"content", CALLER))
        self.mount.answers.hold("manifest_put", unsent=("manifest_put",))
        self.mount.ok(self.mount.fs.flush(fh, CALLER))
        self.assertEqual(self.mount.outbox.backlog().entries, 1)
        kill(self.mount)
        [entry] = logged(self.cache)
        assert isinstance(entry, Commit)
        self.assertEqual(entry.size, len(b"content"))
        after = self.next_mount()
        self.assertEqual(after.names("d"), ["f"])
        self.assertEqual(after.read_file("d/f"), b"content")

    def test_a_release_commit_after_an_empty_close_is_recorded(self) -> None:
        """
        The release that commits the empty file records its commit (the
        close returned long before) and settles the close's record.
        """
        fh = self.touch(b"f")
        self.mount.answers.hold("manifest_put", unsent=("manifest_put",))
        released = self.mount.fs.release(fh, CALLER)
        self.assertNoResult(released)
        kill(self.mount)
        [entry] = logged(self.cache)
        self.assertEqual(entry.seq, 3, "the release's own (1: the mkdir, 2: the close's)")
        after = self.next_mount()
        self.successResultOf(released)  # kept: its answer was lost
        self.assertEqual(after.read_file("d/f"), b"")
