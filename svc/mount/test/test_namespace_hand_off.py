"""
Tests for handed-off namespace changes (L{svc.mount.remote.namespace_hand_off}):
an unlink, an emptied directory's rmdir or a rename returns once its
request is sent, so a run of them is pipelined; what waits for their
answers, and what a refused one leaves.
"""

from __future__ import annotations

import errno
import os

from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from svc.mount.core.attributes import AttributeChanges, Entry, OpenResult
from svc.mount.core.fs_context import FSSettings
from svc.mount.core.op_ticket import OpTicket, run_with_ticket
from svc.mount.fs import ROOT_INODE
from svc.mount.outbox.sender import DEFAULT_BACKOFF
from svc.mount.remote.namespace_hand_off import NAMESPACE_HAND_OFF_MAX
from svc.mount.test.test_fs_outbox import kill
from svc.mount.test.test_fs_support import CALLER, FSFixture, Mount
from svc.policy import PathPolicy

NAMES = [f"f{index}" for index in range(3)]


def wait_then_release(mount: Mount, name: bytes) -> None:
    """
    With answers held: a mkdir of C{name} (not handed off) and shutdown's
    wait both wait for them; once released, both end.
    """
    case = mount.fixture.case
    made = mount.fs.mkdir(ROOT_INODE, name, 0o755, CALLER)
    settled = mount.fs.write_backs_settled()
    case.assertNoResult(made)
    case.assertNoResult(settled)
    mount.answers.release()
    mount.ok(made)
    mount.ok(settled)


class UnlinkHandOffTests(SynchronousTestCase):
    """Unlinks of files in a directory, the data plane's answers held back."""

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        self.mount = self.fixture.mount()
        self.mount.ok(self.mount.fs.mkdir(ROOT_INODE, b"d", 0o755, CALLER))
        for name in NAMES:
            self.mount.write_file(f"d/{name}", name.encode())
        self.folder = self.mount.lookup_path("d").ino

    def unlink(self, mount: Mount, name: str) -> Deferred[None]:
        return mount.fs.unlink(self.folder, name.encode(), CALLER)

    def unlink_lines(self, mount: Mount) -> list[tuple[str, bool]]:
        return [(event.path, event.allowed) for event in mount.events("unlink")]

    def test_unlinks_return_before_their_answers(self) -> None:
        """
        Each unlink returns once its request is sent: the three go out one
        after another, the names are gone at once, and each C{unlink} line
        is written when its answer arrives.
        """
        self.mount.answers.hold("manifest_delete")
        for name in NAMES:
            self.mount.ok(self.unlink(self.mount, name))
        self.assertEqual(self.mount.answers.held, 3)
        self.assertEqual(self.mount.names("d"), [])
        lookup = self.mount.fs.lookup(self.folder, b"f0", CALLER)
        self.assertEqual(self.mount.errno(lookup), errno.ENOENT)
        self.assertEqual(self.unlink_lines(self.mount), [])
        forgotten = len(self.mount.forgotten_attributes)
        self.mount.answers.release()
        self.assertEqual(self.unlink_lines(self.mount), [(f"/d/{n}", True) for n in NAMES])
        # The kernel forgets the mount's own times for the folder.
        self.assertEqual(self.mount.forgotten_attributes[forgotten:], [self.folder] * 3)
        self.assertEqual(self.fixture.mount().names("d"), [])

    def test_rmdir_of_the_emptied_directory_goes_too_and_shutdown_waits(self) -> None:
        """
        The emptied directory's removal is handed off behind the unlinks (the
        server runs them in order); another namespace change and shutdown's
        wait wait for all the answers.
        """
        self.mount.answers.hold("manifest_delete", "dir_remove")
        for name in NAMES:
            self.mount.ok(self.unlink(self.mount, name))
        root = self.mount.fs.known_attributes(ROOT_INODE)
        assert root is not None
        self.mount.ok(self.mount.fs.rmdir(ROOT_INODE, b"d", CALLER))
        self.assertEqual(self.mount.answers.held, 4)
        # The root's link count drops at once, as on a local disk.
        after = self.mount.fs.known_attributes(ROOT_INODE)
        assert after is not None
        self.assertEqual(after.nlink, root.nlink - 1)
        wait_then_release(self.mount, b"e")
        self.assertEqual(self.mount.names(""), ["e"])
        self.assertEqual([event.allowed for event in self.mount.events("rmdir")], [True])
        self.assertEqual(self.fixture.mount().names(""), ["e"])

    def test_rmdir_of_a_directory_not_listed_waits(self) -> None:
        """A directory whose entries the mount has not listed whole: the rmdir waits."""
        other = self.fixture.mount()
        other.ok(other.fs.mkdir(ROOT_INODE, b"empty", 0o755, CALLER))
        fresh = self.fixture.mount()
        fresh.lookup_path("empty")
        fresh.answers.hold("dir_remove")
        removed = fresh.fs.rmdir(ROOT_INODE, b"empty", CALLER)
        self.assertNoResult(removed)
        fresh.answers.release()
        fresh.ok(removed)

    def test_durable_close_waits_for_each_answer(self) -> None:
        """With C{durable_close}, an unlink returns with its answer, as before."""
        durable = self.fixture.mount(settings=FSSettings(durable_close=True))
        self.folder = durable.lookup_path("d").ino
        durable.answers.hold("manifest_delete")
        unlinked = self.unlink(durable, "f0")
        self.assertNoResult(unlinked)
        durable.answers.release()
        durable.ok(unlinked)

    def test_an_unlink_waits_while_the_connection_is_down(self) -> None:
        """
        With the data plane's connection down, an unlink waits for its
        answer (here: the held one); once it is up again, unlinks hand off.
        """
        up = [False]
        mount = self.fixture.mount(connected=lambda: up[0])
        self.folder = mount.lookup_path("d").ino
        mount.names("d")
        mount.answers.hold("manifest_delete")
        unlinked = self.unlink(mount, "f0")
        self.assertNoResult(unlinked)
        mount.answers.release()
        mount.ok(unlinked)
        up[0] = True
        mount.answers.hold("manifest_delete")
        mount.ok(self.unlink(mount, "f1"))
        mount.answers.release()

    def test_an_unlink_during_an_outage_reports_it(self) -> None:
        """
        No connection to be had: the unlink fails C{EIO} and the name stays,
        rather than returning success and the name coming back later.
        """
        up = [False]
        mount = self.fixture.mount(connected=lambda: up[0])
        self.folder = mount.lookup_path("d").ino
        mount.names("d")
        mount.answers.down = True
        self.assertEqual(mount.errno(self.unlink(mount, "f0")), errno.EIO)
        self.assertIn("f0", mount.names("d"))
        up[0] = True
        mount.answers.down = False
        self.assertIn("f0", self.fixture.mount().names("d"))

    def test_bounded_in_flight(self) -> None:
        """Beyond C{NAMESPACE_HAND_OFF_MAX} unanswered, an unlink waits for its own answer."""
        for index in range(NAMESPACE_HAND_OFF_MAX + 1):
            self.mount.write_file(f"d/many{index}", b"x")
        self.mount.answers.hold("manifest_delete")
        for index in range(NAMESPACE_HAND_OFF_MAX):
            self.mount.ok(self.unlink(self.mount, f"many{index}"))
        last = self.unlink(self.mount, f"many{NAMESPACE_HAND_OFF_MAX}")
        self.assertNoResult(last)
        self.mount.answers.release()
        self.mount.ok(last)

    def test_refused_unlink_shows_the_name_again(self) -> None:
        """
        An unlink the data plane refuses after it returned: its line says
        so, the name is found again (the folder is asked anew), and the
        next unlink waits for its own answer until one succeeds.
        """
        policies = self.fixture.service.policies
        policies[("tenant-a", "agent-1")] = PathPolicy(readonly=True)  # the server's alone
        self.mount.answers.hold("manifest_delete")
        self.mount.ok(self.unlink(self.mount, "f0"))
        self.mount.answers.release()
        del policies[("tenant-a", "agent-1")]
        self.assertEqual(self.unlink_lines(self.mount), [("/d/f0", False)])
        self.assertIn(self.folder, self.mount.invalidated)
        self.assertIn((self.folder, b"f0"), self.mount.invalidated_entries)
        self.assertEqual(self.mount.read_file("d/f0"), b"f0")
        self.assertEqual(sorted(self.mount.names("d")), NAMES)
        self.mount.answers.hold("manifest_delete")
        waiting = self.unlink(self.mount, "f1")
        self.assertNoResult(waiting)
        self.mount.answers.release()
        self.mount.ok(waiting)
        self.mount.answers.hold("manifest_delete")
        self.mount.ok(self.unlink(self.mount, "f2"))  # handed off again
        self.mount.answers.release()


class RenameHandOffTests(SynchronousTestCase):
    """Renames in a directory (an atomic save's), the data plane's answers held back."""

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        # The mount's clock is ahead: its own stamps differ from the server's.
        self.mount = self.fixture.mount(clock_ahead=0.25)
        self.mount.ok(self.mount.fs.mkdir(ROOT_INODE, b"d", 0o755, CALLER))
        self.mount.ok(self.mount.fs.mkdir(ROOT_INODE, b"e", 0o755, CALLER))
        self.mount.write_file("d/final", b"old")
        self.folder = self.mount.lookup_path("d").ino
        self.names("d")  # listed whole: the mount knows which names are free

    def names(self, path: str) -> list[str]:
        return sorted(self.mount.names(path))

    def rename(self, name: str, new_name: str, *, to: str = "d") -> Deferred[None]:
        target = self.mount.lookup_path(to).ino
        return self.mount.fs.rename(self.folder, name.encode(), target, new_name.encode(), CALLER)

    def rename_lines(self) -> list[tuple[str, object, bool]]:
        return [
            (event.path, dict(event.extra).get("to_path"), event.allowed)
            for event in self.mount.events("rename")
        ]

    def test_atomic_save_returns_before_the_answer(self) -> None:
        """
        Renaming a closed temporary file over the real one returns once the
        C{manifest_rename} is sent: the new content is read at once under
        the real name, the C{rename} line is written when the answer
        arrives, and a fresh mount sees the same.
        """
        self.mount.write_file("d/final.tmp", b"new")
        self.mount.answers.hold("manifest_rename")
        self.mount.ok(self.rename("final.tmp", "final"))
        self.assertEqual(self.mount.answers.held, 1)
        self.assertEqual(self.names("d"), ["final"])
        self.assertEqual(self.mount.read_file("d/final"), b"new")
        self.assertEqual(self.rename_lines(), [])
        forgotten = len(self.mount.forgotten_attributes)
        self.mount.answers.release()
        self.assertEqual(self.rename_lines(), [("/d/final.tmp", "/d/final", True)])
        # The kernel forgets the mount's own times for the directory and the file.
        moved = self.mount.lookup_path("d/final").ino
        self.assertEqual(
            sorted(self.mount.forgotten_attributes[forgotten:]), sorted([self.folder, moved])
        )
        fresh = self.fixture.mount()
        self.assertEqual(sorted(fresh.names("d")), ["final"])
        self.assertEqual(fresh.read_file("d/final"), b"new")

    def test_renames_are_pipelined_and_exclusive_changes_wait(self) -> None:
        """
        Further renames go out beside the first's unanswered request; a
        namespace change that is not handed off (a mkdir) and shutdown's
        wait wait for every answer. The directories' times become the
        server's.
        """
        self.mount.write_file("d/a", b"a")
        self.mount.write_file("d/b", b"b")
        self.mount.answers.hold("manifest_rename")
        self.mount.ok(self.rename("a", "a2"))
        self.mount.ok(self.rename("b", "b2", to="e"))
        self.assertEqual(self.mount.answers.held, 2)
        wait_then_release(self.mount, b"f")
        self.assertEqual(self.names("d"), ["a2", "final"])
        self.assertEqual(self.names("e"), ["b2"])
        fresh = self.fixture.mount()
        for path in ("d", "e"):
            mine = self.mount.lookup_path(path).attributes
            theirs = fresh.lookup_path(path).attributes
            self.assertEqual(
                (mine.mtime_ns, mine.ctime_ns, mine.nlink),
                (theirs.mtime_ns, theirs.ctime_ns, theirs.nlink),
            )

    def test_name_a_rename_left_is_taken_after_its_answer(self) -> None:
        """
        A create, a link or a rename onto the name a handed-off rename left
        waits for that rename's answer (so a lost one can be sent again);
        other names do not wait.
        """
        self.mount.write_file("d/final.tmp", b"new")
        self.mount.write_file("d/other", b"other")
        other = self.mount.lookup_path("d/other").ino
        self.mount.answers.hold("manifest_rename")
        self.mount.ok(self.rename("final.tmp", "final"))
        fs = self.mount.fs
        name = b"final.tmp"
        created = fs.create(self.folder, name, 0o644, os.O_WRONLY | os.O_CREAT, CALLER)
        linked = fs.link(other, self.folder, name, CALLER)
        renamed = fs.rename(self.folder, b"other", self.folder, name, CALLER)
        for call in (created, linked, renamed):
            self.assertNoResult(call)
        self.mount.ok(fs.create(self.folder, b"free", 0o644, os.O_WRONLY | os.O_CREAT, CALLER))
        self.mount.answers.release()
        opened, _ = self.mount.ok(created)
        self.mount.ok(fs.release(opened.fh, CALLER))
        self.assertEqual(self.mount.errno(linked), errno.EEXIST)
        self.mount.ok(renamed)
        self.assertEqual(self.names("d"), ["final", "final.tmp", "free"])
        self.assertEqual(self.mount.read_file("d/final.tmp"), b"other")

    def test_directory_rename_waits_for_handed_off_changes(self) -> None:
        """
        A directory's rename changes the paths below it, so it waits for
        the handed-off changes in flight (a lost one is looked into at the
        paths it was sent with); a file's rename does not.
        """
        self.mount.write_file("d/a", b"a")
        self.mount.write_file("d/b", b"b")
        self.mount.answers.hold("manifest_delete")
        self.mount.ok(self.mount.fs.unlink(self.folder, b"a", CALLER))
        self.mount.ok(self.rename("b", "b2"))
        moved = self.mount.fs.rename(ROOT_INODE, b"d", ROOT_INODE, b"d2", CALLER)
        self.assertNoResult(moved)
        self.mount.answers.release()
        self.mount.ok(moved)
        self.assertEqual(sorted(self.mount.names("")), ["d2", "e"])
        self.assertEqual(sorted(self.mount.names("d2")), ["b2", "final"])

    def test_atomic_save_goes_behind_the_temporary_files_commit(self) -> None:
        """
        A rename right after the close that handed off the source's commit
        goes out behind that commit, without waiting for its answer or its
        own (the server runs them in order); the new file is bound when the
        commit's answer arrives, and reads and a fresh mount see the save.
        """
        fs = self.mount.fs
        self.mount.answers.hold("manifest_put", "manifest_rename")
        opened, _ = self.mount.ok(
            fs.create(self.folder, b"final.tmp", 0o644, os.O_WRONLY | os.O_CREAT, CALLER)
        )
        self.mount.ok(fs.write(opened.fh, 0, b"new", CALLER))
        self.mount.ok(fs.flush(opened.fh, CALLER))  # the close: its commit handed off
        released = fs.release(opened.fh, CALLER)
        self.mount.ok(self.rename("final.tmp", "final"))
        self.assertEqual(self.mount.connection.calls[-2:], ["manifest_put", "manifest_rename"])
        self.assertEqual(self.mount.answers.held, 2)
        self.assertEqual(self.names("d"), ["final"])
        self.mount.answers.release()
        self.mount.ok(released)
        self.assertEqual(self.rename_lines(), [("/d/final.tmp", "/d/final", True)])
        self.assertEqual([event.allowed for event in self.mount.events("flush")][-1], True)
        self.assertEqual(self.mount.read_file("d/final"), b"new")
        fresh = self.fixture.mount()
        self.assertEqual(sorted(fresh.names("d")), ["final"])
        self.assertEqual(fresh.read_file("d/final"), b"new")
        mine = self.mount.lookup_path("d").attributes
        theirs = fresh.lookup_path("d").attributes
        self.assertEqual(
            (mine.version, mine.mtime_ns, mine.nlink),
            (theirs.version, theirs.mtime_ns, theirs.nlink),
        )

    def test_what_the_mount_cannot_judge_waits(self) -> None:
        """
        The rename waits for its answer when the source is a directory or
        still open, or the target's directory is not listed whole and the
        target unknown.
        """
        self.mount.ok(self.mount.fs.mkdir(self.folder, b"sub", 0o755, CALLER))
        self.mount.answers.hold("manifest_rename")
        moving_directory = self.rename("sub", "sub2")
        self.assertNoResult(moving_directory)
        self.mount.answers.release()
        self.mount.ok(moving_directory)

        entry = self.mount.lookup_path("d/final")
        opened = self.mount.ok(self.mount.fs.open(entry.ino, os.O_RDONLY, CALLER))
        self.mount.answers.hold("manifest_rename")
        moving_open = self.rename("final", "final2")
        self.assertNoResult(moving_open)
        self.mount.answers.release()
        self.mount.ok(moving_open)
        self.mount.ok(self.mount.fs.release(opened.fh, CALLER))

        other = self.fixture.mount()
        other.ok(other.fs.mkdir(ROOT_INODE, b"g", 0o755, CALLER))
        self.mount.lookup_path("g")  # known, but its entries not listed
        self.mount.answers.hold("manifest_rename")
        into_unlisted = self.rename("final2", "x", to="g")
        self.assertNoResult(into_unlisted)
        self.mount.answers.release()
        self.mount.ok(into_unlisted)

    def test_durable_close_waits_for_the_answer(self) -> None:
        """With C{durable_close}, a rename returns with its answer, as before."""
        durable = self.fixture.mount(settings=FSSettings(durable_close=True))
        self.mount = durable
        self.names("d")
        durable.answers.hold("manifest_rename")
        renamed = self.rename("final", "final2")
        self.assertNoResult(renamed)
        durable.answers.release()
        durable.ok(renamed)

    def test_a_rename_waits_while_the_connection_is_down(self) -> None:
        """With the data plane's connection down, a rename waits for its answer."""
        up = [False]
        self.mount = self.fixture.mount(connected=lambda: up[0])
        self.names("d")
        self.mount.answers.hold("manifest_rename")
        renamed = self.rename("final", "final2")
        self.assertNoResult(renamed)
        self.mount.answers.release()
        self.mount.ok(renamed)

    def test_refused_rename_shows_the_old_names_again(self) -> None:
        """
        A rename the data plane refuses after it returned: its line says
        so, the old names are found again (both directories are asked
        anew), and the next rename waits for its own answer until one
        succeeds.
        """
        self.mount.write_file("d/final.tmp", b"new")
        policies = self.fixture.service.policies
        policies[("tenant-a", "agent-1")] = PathPolicy(readonly=True)  # the server's alone
        self.mount.answers.hold("manifest_rename")
        self.mount.ok(self.rename("final.tmp", "final"))
        self.mount.answers.release()
        del policies[("tenant-a", "agent-1")]
        self.assertEqual(self.rename_lines(), [("/d/final.tmp", "/d/final", False)])
        self.assertIn(self.folder, self.mount.invalidated)
        self.assertIn((self.folder, b"final"), self.mount.invalidated_entries)
        self.assertIn((self.folder, b"final.tmp"), self.mount.invalidated_entries)
        self.assertEqual(self.names("d"), ["final", "final.tmp"])
        self.assertEqual(self.mount.read_file("d/final"), b"old")
        self.assertEqual(self.mount.read_file("d/final.tmp"), b"new")
        self.mount.answers.hold("manifest_rename")
        waiting = self.rename("final.tmp", "final")
        self.assertNoResult(waiting)
        self.mount.answers.release()
        self.mount.ok(waiting)
        self.assertEqual(self.mount.read_file("d/final"), b"new")
        self.mount.write_file("d/again", b"x")
        self.mount.answers.hold("manifest_rename")
        self.mount.ok(self.rename("again", "again2"))  # handed off again
        self.mount.answers.release()

    def save_behind_held_commit(self, content: bytes) -> Deferred[None]:
        """
        Write C{d/final.tmp}, close (its commit handed off) and rename it
        over C{d/final} with every answer held: the release's Deferred.
        """
        fs = self.mount.fs
        self.mount.answers.hold("manifest_put", "manifest_rename")
        opened, _ = self.mount.ok(
            fs.create(self.folder, b"final.tmp", 0o644, os.O_WRONLY | os.O_CREAT, CALLER)
        )
        self.mount.ok(fs.write(opened.fh, 0, content, CALLER))
        self.mount.ok(fs.flush(opened.fh, CALLER))
        released = fs.release(opened.fh, CALLER)
        self.mount.ok(self.rename("final.tmp", "final"))
        return released

    def test_refused_commit_and_rename_leave_the_file_at_its_old_name(self) -> None:
        """
        The temporary file's commit and the rename behind it are both
        refused: the file goes back to its old name, where its next
        write-back (the release's) creates it; the real name keeps its old
        content. Nothing written is lost.
        """
        policies = self.fixture.service.policies
        policies[("tenant-a", "agent-1")] = PathPolicy(readonly=True)  # the server's alone
        released = self.save_behind_held_commit(b"new")
        del policies[("tenant-a", "agent-1")]
        self.mount.answers.release()
        self.mount.ok(released)
        self.assertEqual(self.rename_lines(), [("/d/final.tmp", "/d/final", False)])
        self.assertEqual(
            [event.allowed for event in self.mount.events("flush")][-2:], [False, True]
        )
        self.assertEqual(self.names("d"), ["final", "final.tmp"])
        fresh = self.fixture.mount()
        self.assertEqual(fresh.read_file("d/final.tmp"), b"new")
        self.assertEqual(fresh.read_file("d/final"), b"old")
        self.assertEqual(self.mount.read_file("d/final.tmp"), b"new")

    def test_lost_race_behind_the_rename_is_resolved_at_the_new_name(self) -> None:
        """
        Another writer created the temporary name first: the commit is
        refused (ESTALE), and the rename behind it moves the other writer's
        file over the real name. The commit is not retried at the old path
        (the file is no longer there); the release's write-back resolves at
        the new name: the other writer's file stays, ours is saved as a
        conflict copy beside it.
        """
        other = self.fixture.mount()
        other.write_file("d/final.tmp", b"theirs")
        released = self.save_behind_held_commit(b"new")
        self.mount.answers.release()
        self.assertEqual(self.mount.errno(released), errno.ESTALE)
        self.assertEqual(self.rename_lines(), [("/d/final.tmp", "/d/final", True)])
        fresh = self.fixture.mount()
        names = sorted(fresh.names("d"))
        self.assertEqual(names[0], "final")
        self.assertEqual(len(names), 2)
        self.assertTrue(names[1].startswith("final.conflict-"), names)
        self.assertEqual(fresh.read_file("d/final"), b"theirs")
        self.assertEqual(fresh.read_file(f"d/{names[1]}"), b"new")


class UnansweredHandOffTests(SynchronousTestCase):
    """
    Handed-off unlinks and renames whose answers never came (the connection
    was lost): the mount asks the server what the names hold, settles what
    ran, sends again what did not, and only what it cannot tell is handled
    as a refusal.
    """

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        self.mount = self.fixture.mount()
        self.mount.ok(self.mount.fs.mkdir(ROOT_INODE, b"d", 0o755, CALLER))
        self.mount.write_file("d/final", b"old")
        self.folder = self.mount.lookup_path("d").ino
        self.mount.names("d")  # listed whole: the mount knows which names are free

    def lines(self, event: str) -> list[tuple[str, object, bool]]:
        return [
            (line.path, dict(line.extra).get("to_path"), line.allowed)
            for line in self.mount.events(event)
        ]

    def rename(self, new_name: bytes = b"final") -> Deferred[None]:
        return self.mount.fs.rename(self.folder, b"final.tmp", self.folder, new_name, CALLER)

    def assert_saved(self) -> None:
        """The save is done here, on the server, and changes hand off again."""
        self.assertEqual(self.lines("rename"), [("/d/final.tmp", "/d/final", True)])
        fresh = self.fixture.mount()
        for mount in (self.mount, fresh):
            self.assertEqual(sorted(mount.names("d")), ["final"])
            self.assertEqual(mount.read_file("d/final"), b"new")
        here, there = (
            m.ok(m.fs.getattr(m.lookup_path("d").ino, CALLER)) for m in (self.mount, fresh)
        )
        self.assertEqual(
            (here.version, here.mtime_ns, here.ctime_ns, here.nlink),
            (there.version, there.mtime_ns, there.ctime_ns, there.nlink),
            "the directory's attributes as the server has them",
        )
        self.assert_hands_off_again()

    def assert_hands_off_again(self) -> None:
        self.mount.write_file("d/again", b"x")
        self.mount.answers.hold("manifest_delete")
        self.mount.ok(self.mount.fs.unlink(self.folder, b"again", CALLER))
        self.assertEqual(self.mount.answers.held, 1)
        self.mount.answers.release()

    def save(self, *unsent: str, new_name: bytes = b"final") -> Deferred[None]:
        """
        An atomic save with the temporary file's commit and the rename
        kept back (they ran on the server, except the C{unsent} ops): the
        release's Deferred.
        """
        fs = self.mount.fs
        self.mount.answers.hold("manifest_put", "manifest_rename", unsent=unsent)
        opened, _ = self.mount.ok(
            fs.create(self.folder, b"final.tmp", 0o644, os.O_WRONLY | os.O_CREAT, CALLER)
        )
        self.mount.ok(fs.write(opened.fh, 0, b"new", CALLER))
        self.mount.ok(fs.flush(opened.fh, CALLER))
        released = fs.release(opened.fh, CALLER)
        self.mount.ok(self.rename(new_name))
        self.assertEqual(self.mount.answers.held, 2)
        return released

    def test_unlink_right_after_a_save_removes_the_old_file_too(self) -> None:
        """
        A save over an existing file, then an unlink of its name while the
        save's commit and rename are in flight: the unlink waits for the
        rename. Here neither reached the server (lost with the connection):
        the save is replayed, and the unlink then removes the name on the
        server, where the old file would otherwise have stayed.
        """
        released = self.save("manifest_put", "manifest_rename")
        removed = self.mount.fs.unlink(self.folder, b"final", CALLER)
        self.assertNoResult(removed)
        self.mount.answers.release(lost=True)
        self.mount.ok(released)
        self.mount.ok(removed)
        for mount in (self.mount, self.fixture.mount()):
            self.assertEqual(mount.names("d"), [])

    def test_unlink_that_ran_is_done(self) -> None:
        """
        The answer to an unlink that ran was lost: the server no longer
        has the name, so the unlink succeeded; its line says so and the
        next unlink hands off again.
        """
        self.mount.write_file("d/gone", b"x")
        self.mount.answers.hold("manifest_delete")
        self.mount.ok(self.mount.fs.unlink(self.folder, b"gone", CALLER))
        self.mount.answers.release(lost=True)
        self.assertEqual(self.lines("unlink"), [("/d/gone", None, True)])
        self.assertEqual(self.mount.names("d"), ["final"])
        self.assertEqual(self.fixture.mount().names("d"), ["final"])
        self.assert_hands_off_again()

    def test_unlink_whose_resend_gets_no_answer_is_sent_again_after_a_pause(self) -> None:
        """
        The answer to an unlink that ran was lost, and the outbox's sender
        gets no answer to its first resend either: the name stays gone (the
        program was told so); after the sender's pause the resend is
        answered as the first run was, and the unlink is settled as done.
        """
        self.mount.write_file("d/gone", b"x")
        self.mount.answers.hold("manifest_delete")
        self.mount.ok(self.mount.fs.unlink(self.folder, b"gone", CALLER))
        self.mount.answers.lose("manifest_delete", ran=False)
        self.mount.answers.release(lost=True)
        self.assertEqual(self.lines("unlink"), [])
        self.assertEqual(self.mount.names("d"), ["final"])
        self.fixture.service.clock.advance(DEFAULT_BACKOFF.delay(1))
        self.assertEqual(self.lines("unlink"), [("/d/gone", None, True)])
        self.assertEqual(self.fixture.mount().names("d"), ["final"])
        self.assertEqual(self.mount.outbox.backlog().entries, 0)
        self.assert_hands_off_again()

    def lose_an_unlink_and_the_server_with_it(self) -> None:
        """
        A handed-off unlink of C{d/gone} whose answer is lost, and the
        sender's first resend unanswered too: meanwhile a C{mkdir} fails EIO.
        """
        self.mount.write_file("d/gone", b"x")
        self.mount.answers.hold("manifest_delete")
        self.mount.ok(self.mount.fs.unlink(self.folder, b"gone", CALLER))
        self.mount.answers.lose("manifest_delete", ran=False)
        self.mount.answers.release(lost=True)
        self.assertEqual(
            self.mount.errno(self.mount.fs.mkdir(self.folder, b"sub", 0o755, CALLER)), errno.EIO
        )

    def test_new_connection_sends_a_lost_unlink_again_at_once(self) -> None:
        """
        While a lost unlink's resend gets no answer, changes fail; a new
        connection ends the sender's pause, so they go through at once
        rather than up to a pause later.
        """
        self.lose_an_unlink_and_the_server_with_it()
        self.mount.fs.reconnected()
        self.assertEqual(self.lines("unlink"), [("/d/gone", None, True)])
        self.mount.ok(self.mount.fs.mkdir(self.folder, b"sub", 0o755, CALLER))

    def test_change_its_program_stopped_waiting_for_never_runs(self) -> None:
        """
        A mkdir waits for a handed-off unlink's answer; its program is
        answered EIO meanwhile (the bridge's timeout abandons its ticket):
        when the answer comes, the mkdir is not sent. Nothing takes effect
        after its program was told it failed.
        """
        self.mount.write_file("d/gone", b"x")
        self.mount.answers.hold("manifest_delete")
        self.mount.ok(self.mount.fs.unlink(self.folder, b"gone", CALLER))
        made_before = self.mount.count("dir_create")
        ticket = OpTicket()
        made = run_with_ticket(ticket, self.mount.fs.mkdir, self.folder, b"sub", 0o755, CALLER)
        self.assertNoResult(made)
        ticket.abandon()
        self.assertEqual(self.mount.errno(made), errno.EIO)
        self.mount.answers.release()
        self.assertEqual(self.mount.count("dir_create"), made_before)
        for mount in (self.mount, self.fixture.mount()):
            self.assertEqual(mount.names("d"), ["final"])
        self.mount.ok(self.mount.fs.mkdir(self.folder, b"sub", 0o755, CALLER))

    def test_changes_fail_at_once_while_a_lost_unlink_gets_no_answer(self) -> None:
        """
        A handed-off unlink's answer was lost and its resend gets none: a
        namespace change, which would wait for that unlink to settle, fails
        EIO at once (it would need the server anyway) instead of holding a
        FUSE worker until its timeout; once the resend is answered, changes
        go through again.
        """
        self.lose_an_unlink_and_the_server_with_it()
        self.fixture.service.clock.advance(DEFAULT_BACKOFF.delay(1))
        self.assertEqual(self.lines("unlink"), [("/d/gone", None, True)])
        self.mount.ok(self.mount.fs.mkdir(self.folder, b"sub", 0o755, CALLER))
        self.assertEqual(sorted(self.fixture.mount().names("d")), ["final", "sub"])

    def test_unlink_that_found_no_connection_is_held_not_undone(self) -> None:
        """
        A handed-off unlink (the program told it succeeded) whose request
        found no connection: the outbox's sender holds it through the
        outage, rather than showing the name again, and sends it once the
        data plane is back.
        """
        self.mount.write_file("d/gone", b"x")
        self.mount.answers.down = True
        self.mount.ok(self.mount.fs.unlink(self.folder, b"gone", CALLER))
        self.assertEqual(self.mount.names("d"), ["final"])
        self.assertEqual(self.lines("unlink"), [])
        self.mount.answers.down = False
        self.mount.fs.reconnected()
        self.assertEqual(self.lines("unlink"), [("/d/gone", None, True)])
        self.assertEqual(self.fixture.mount().names("d"), ["final"])
        self.assertEqual(self.mount.outbox.backlog().entries, 0)

    def test_unlink_that_never_ran_is_sent_again(self) -> None:
        """
        An unlink lost on its way: the server still has the file, so the
        unlink is sent again, and the name is gone on the server too.
        """
        self.mount.write_file("d/gone", b"x")
        self.mount.answers.lose("manifest_delete", ran=False)
        self.mount.ok(self.mount.fs.unlink(self.folder, b"gone", CALLER))
        self.assertEqual(self.lines("unlink"), [("/d/gone", None, True)])
        self.assertEqual(self.fixture.mount().names("d"), ["final"])
        self.assert_hands_off_again()

    def create_and_write(self, name: bytes, data: bytes) -> Deferred[None]:
        """Create C{name} in the folder (waiting, perhaps), then write C{data} and close."""
        fs = self.mount.fs
        created = fs.create(self.folder, name, 0o644, os.O_WRONLY | os.O_CREAT, CALLER)

        def write(result: tuple[OpenResult, Entry]) -> Deferred[None]:
            opened, _ = result
            self.mount.ok(fs.write(opened.fh, 0, data, CALLER))
            self.mount.ok(fs.flush(opened.fh, CALLER))
            return fs.release(opened.fh, CALLER)

        return created.addCallback(write)

    def test_name_unlinked_is_given_again_once_the_unlink_is_settled(self) -> None:
        """
        A file created under a name whose handed-off unlink is in flight
        waits for the unlink's answer. Here the unlink was lost on its way:
        the name still free on the mount, it is sent again, and only then
        is the new file made; the server ends with the new file, not the
        old one, and no conflict copy.
        """
        self.mount.write_file("d/gone", b"x")
        self.mount.answers.hold("manifest_delete", unsent=["manifest_delete"])
        self.mount.ok(self.mount.fs.unlink(self.folder, b"gone", CALLER))
        written = self.create_and_write(b"gone", b"y")
        self.assertNoResult(written)
        self.mount.answers.release(lost=True)
        self.mount.ok(written)
        self.assertEqual(self.lines("unlink"), [("/d/gone", None, True)])
        for mount in (self.mount, self.fixture.mount()):
            self.assertEqual(sorted(mount.names("d")), ["final", "gone"])
            self.assertEqual(mount.read_file("d/gone"), b"y")
        self.assert_hands_off_again()

    def test_name_a_save_left_is_saved_again_once_the_rename_is_settled(self) -> None:
        """
        Two atomic saves in a row through one temporary name (git's
        C{index.lock}, a retried save): the second create waits for the
        first rename's answer. Here the rename was lost on its way: it is
        sent again, then the second save runs as usual, and no conflict
        copy is made.
        """
        self.mount.write_file("d/final.tmp", b"new")
        self.mount.answers.hold("manifest_rename", unsent=["manifest_rename"])
        self.mount.ok(self.rename())
        written = self.create_and_write(b"final.tmp", b"newer")
        self.assertNoResult(written)
        self.mount.answers.release(lost=True)
        self.mount.ok(written)
        self.mount.ok(self.rename())
        self.assertEqual(self.lines("rename"), [("/d/final.tmp", "/d/final", True)] * 2)
        for mount in (self.mount, self.fixture.mount()):
            self.assertEqual(sorted(mount.names("d")), ["final"])
            self.assertEqual(mount.read_file("d/final"), b"newer")
        self.assert_hands_off_again()

    def test_changes_of_a_file_a_lost_rename_moved_follow_it(self) -> None:
        """
        A file renamed (handed off), then renamed again, or unlinked: the
        later change waits for the rename's answer. Here each rename was
        lost on its way; it is sent again before the next change goes, so
        the server ends as the mount shows.
        """
        fs = self.mount.fs
        self.mount.write_file("d/a", b"a")
        for then_move in (True, False):
            self.mount.answers.hold("manifest_rename", unsent=["manifest_rename"])
            self.mount.ok(fs.rename(self.folder, b"a", self.folder, b"b", CALLER))
            self.assertEqual(self.mount.answers.held, 1)
            if then_move:
                changed = fs.rename(self.folder, b"b", self.folder, b"a", CALLER)
            else:
                changed = fs.unlink(self.folder, b"b", CALLER)
            self.assertNoResult(changed)
            self.mount.answers.release(lost=True)
            self.mount.ok(changed)
            names = ["a", "final"] if then_move else ["final"]
            for mount in (self.mount, self.fixture.mount()):
                self.assertEqual(sorted(mount.names("d")), names)

    def test_file_moved_out_then_its_directory_removed_both_lost(self) -> None:
        """
        A file moved out of a directory, then the emptied directory removed,
        both handed off and lost on their way: both are sent again by the
        outbox's sender, in the order they were first sent, so the rmdir
        finds the directory empty.
        """
        fs = self.mount.fs
        self.mount.ok(fs.mkdir(self.folder, b"sub", 0o755, CALLER))
        self.mount.write_file("d/sub/x", b"x")
        sub = self.mount.lookup_path("d/sub").ino
        self.mount.names("d/sub")  # listed whole
        self.mount.answers.hold(
            "manifest_rename", "dir_remove", unsent=["manifest_rename", "dir_remove"]
        )
        self.mount.ok(fs.rename(sub, b"x", self.folder, b"x", CALLER))
        self.mount.ok(fs.rmdir(self.folder, b"sub", CALLER))
        self.assertEqual(self.mount.answers.held, 2)
        self.mount.answers.release(lost=True)
        for event in ("rename", "rmdir"):
            self.assertEqual([line.allowed for line in self.mount.events(event)], [True])
        for mount in (self.mount, self.fixture.mount()):
            self.assertEqual(sorted(mount.names("d")), ["final", "x"])

    def test_rename_that_ran_is_done(self) -> None:
        """The answer to a rename that ran was lost: the new name holds the file."""
        self.mount.write_file("d/final.tmp", b"new")
        self.mount.answers.hold("manifest_rename")
        self.mount.ok(self.rename())
        self.mount.answers.release(lost=True)
        self.assert_saved()

    def test_rename_that_never_ran_is_sent_again(self) -> None:
        """A rename lost on its way: the old name still holds the file; sent again."""
        self.mount.write_file("d/final.tmp", b"new")
        self.mount.answers.lose("manifest_rename", ran=False)
        self.mount.ok(self.rename())
        self.assert_saved()

    def test_atomic_save_whose_answers_were_lost(self) -> None:
        """
        The temporary file's commit and the rename behind it both ran, and
        both answers were lost: the server's inode of the new file is
        unknown, but the real name changed, so the rename ran; the file's
        next write-back finds its own content there.
        """
        released = self.save()
        self.mount.answers.release(lost=True)
        self.mount.ok(released)
        self.assert_saved()

    def test_atomic_save_whose_rename_never_ran(self) -> None:
        """
        The temporary file's commit ran (its answer lost), the rename behind
        it never did: the temporary name holds the file, so the rename is
        sent again.
        """
        released = self.save("manifest_rename")
        self.mount.answers.release(lost=True)
        self.mount.ok(released)
        self.assert_saved()

    def test_atomic_save_that_never_reached_the_server_is_replayed(self) -> None:
        """
        Neither the commit nor the rename ran: the server has nothing at the
        temporary name and the old file at the real one. The file's next
        write-back replays the save by committing over the old file at the
        real name (a compare-and-swap on its version).
        """
        old_version = self.fixture.mount().lookup_path("d/final").attributes.version
        released = self.save("manifest_put", "manifest_rename")
        self.mount.answers.release(lost=True)
        self.mount.ok(released)
        self.assertEqual(
            [line.path for line in self.mount.events("flush")][-2:],
            ["/d/final.tmp", "/d/final"],
        )
        self.assertEqual(
            self.fixture.mount().lookup_path("d/final").attributes.version, old_version + 1
        )
        self.assert_saved()

    def link_final(self) -> None:
        """Give the file at C{d/final} a second name, C{d/final.link}."""
        final = self.mount.lookup_path("d/final").ino
        self.mount.ok(self.mount.fs.link(final, self.folder, b"final.link", CALLER))

    def test_save_over_a_file_with_other_links_is_replayed_through_its_temporary_name(
        self,
    ) -> None:
        """
        The same, the old file having another name: committing over it
        would change that name's content too, so the replay commits at the
        temporary name, then renames it over the real one.
        """
        self.link_final()
        released = self.save("manifest_put", "manifest_rename")
        self.mount.answers.release(lost=True)
        self.mount.ok(released)
        self.assertEqual(
            [line.path for line in self.mount.events("flush")][-2:], ["/d/final.tmp"] * 2
        )
        for mount in (self.mount, self.fixture.mount()):
            self.assertEqual(sorted(mount.names("d")), ["final", "final.link"])
            self.assertEqual(mount.read_file("d/final"), b"new")
            self.assertEqual(mount.read_file("d/final.link"), b"old")

    def test_next_save_through_the_temporary_name_before_the_replay(self) -> None:
        """
        A save that never reached the server, and at once the next save of
        the file through the same temporary name: its create waits for the
        lost rename to be looked into; the replay then commits over the old
        file, so the next save neither meets the first file at the
        temporary name nor makes a conflict copy.
        """
        released = self.save("manifest_put", "manifest_rename")
        written = self.create_and_write(b"final.tmp", b"newer")
        self.assertNoResult(written)
        self.mount.answers.release(lost=True)
        self.mount.ok(written)
        self.mount.ok(released)
        self.mount.ok(self.rename())
        conflicts = [
            line for line in self.mount.events("flush") if dict(line.extra).get("recovery_kind")
        ]
        self.assertEqual(conflicts, [])
        for mount in (self.mount, self.fixture.mount()):
            self.assertEqual(sorted(mount.names("d")), ["final"])
            self.assertEqual(mount.read_file("d/final"), b"newer")

    def test_rename_sent_again_without_its_commit_is_replayed(self) -> None:
        """
        The temporary file's commit was lost unsent with the connection;
        the rename behind it, sent again on the next connection, finds no
        such file (C{ENOENT}): the save is replayed as when neither ran.
        """
        released = self.save("manifest_put")
        self.mount.answers.release(lost=["manifest_put"])
        self.mount.ok(released)
        self.assert_saved()

    def test_rename_refused_while_its_commit_is_in_flight_is_refused(self) -> None:
        """
        C{ENOENT} for a rename whose file's commit has not been answered:
        that commit may still create the old name, so nothing is replayed;
        the rename is refused as before and the content is kept at the
        temporary name.
        """
        self.mount.answers.hold("manifest_put", unsent=["manifest_put"])
        fs = self.mount.fs
        opened, _ = self.mount.ok(
            fs.create(self.folder, b"final.tmp", 0o644, os.O_WRONLY | os.O_CREAT, CALLER)
        )
        self.mount.ok(fs.write(opened.fh, 0, b"new", CALLER))
        self.mount.ok(fs.flush(opened.fh, CALLER))
        released = fs.release(opened.fh, CALLER)
        self.mount.ok(self.rename())  # refused at once: the put has not run
        self.assertEqual(self.lines("rename"), [("/d/final.tmp", "/d/final", False)])
        self.mount.answers.release()
        self.mount.ok(released)
        for mount in (self.mount, self.fixture.mount()):
            self.assertEqual(sorted(mount.names("d")), ["final", "final.tmp"])
            self.assertEqual(mount.read_file("d/final"), b"old")
            self.assertEqual(mount.read_file("d/final.tmp"), b"new")

    def test_replayed_save_whose_rename_fails_keeps_the_temporary_name(self) -> None:
        """
        A replayed save whose rename fails: the new content stays at the
        temporary name, where the server has it, and a second C{rename}
        line says the save failed. Nothing is lost.
        """
        self.link_final()  # so the save is replayed through its temporary name
        released = self.save("manifest_put", "manifest_rename")
        self.mount.answers.lose("manifest_put", ran=False)  # the commit's resend
        # The rename, sent again once the commit failed, finds no file: the
        # file's write-back replays the save (its commit's answer held
        # here), whose rename then gets no answer, nor does its resend.
        self.mount.answers.release("manifest_put", lost=True)
        self.assertEqual(self.mount.answers.held, 1)
        self.mount.answers.lose("manifest_rename", ran=False, times=2)
        self.mount.answers.release()
        self.mount.ok(released)
        self.assertEqual(
            self.lines("rename"),
            [("/d/final.tmp", "/d/final", True), ("/d/final.tmp", "/d/final", False)],
        )
        for mount in (self.mount, self.fixture.mount()):
            self.assertEqual(sorted(mount.names("d")), ["final", "final.link", "final.tmp"])
            self.assertEqual(mount.read_file("d/final"), b"old")
            self.assertEqual(mount.read_file("d/final.tmp"), b"new")

    def test_new_file_that_never_reached_the_server_stays_at_its_new_name(self) -> None:
        """
        A new file written under a temporary name and renamed to a free
        one, neither its commit nor the rename run: the file never reached
        the server and the new name is still free there, so it stays where
        the program put it; its next write-back creates it there.
        """
        released = self.save("manifest_put", "manifest_rename", new_name=b"made")
        self.mount.answers.release(lost=True)
        self.mount.ok(released)
        self.assertEqual(self.lines("rename"), [("/d/final.tmp", "/d/made", True)])
        for mount in (self.mount, self.fixture.mount()):
            self.assertEqual(sorted(mount.names("d")), ["final", "made"])
            self.assertEqual(mount.read_file("d/made"), b"new")
            self.assertEqual(mount.read_file("d/final"), b"old")
        self.assert_hands_off_again()

    def test_a_resend_without_answer_is_sent_again_until_answered(self) -> None:
        """
        The rename's answer never came, nor the answers to the sender's
        first two resends (no connection): the program was told the rename
        succeeded, so the sender sends it again after each pause until the
        data plane answers, and then it is settled (here: it had not run;
        sent again, it is done).
        """
        self.mount.write_file("d/final.tmp", b"new")
        self.mount.answers.lose("manifest_rename", ran=False, times=3)
        self.mount.ok(self.rename())
        self.assertEqual(self.lines("rename"), [], "not settled yet")
        self.fixture.service.clock.advance(DEFAULT_BACKOFF.delay(1))
        self.assertEqual(self.lines("rename"), [], "sent again: still no answer")
        self.fixture.service.clock.advance(DEFAULT_BACKOFF.delay(2))
        self.assert_saved()

    def test_a_resend_without_answer_at_shutdown_is_left_to_the_next_mount(self) -> None:
        """
        Still no answer when shutdown begins: the mount stops waiting and
        handles the rename as refused (the old names are shown again); its
        outbox entry stays, so the next mount on the same cache sends it,
        and the save the program was told of is done.
        """
        self.mount.write_file("d/final.tmp", b"new")
        self.mount.answers.lose("manifest_rename", ran=False, times=2)
        self.mount.ok(self.rename())
        self.mount.fs.stopping()
        self.assertEqual(self.lines("rename"), [("/d/final.tmp", "/d/final", False)])
        self.assertEqual(sorted(self.mount.names("d")), ["final", "final.tmp"])
        kill(self.mount)
        after = self.fixture.mount(outbox_dir=self.mount.outbox_dir, epoch=2)
        self.assertEqual(after.names("d"), ["final"])
        self.assertEqual(after.read_file("d/final"), b"new")


class UnansweredWaitedChangeTests(SynchronousTestCase):
    """
    Unlinks and renames the caller waits for (here: with C{durable_close},
    and a directory's rename), whose answers never came: sent once more
    with their outbox tags, so a change that ran is answered as it was,
    rather than failing C{EIO}.
    """

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        self.mount = self.fixture.mount(settings=FSSettings(durable_close=True))
        self.mount.ok(self.mount.fs.mkdir(ROOT_INODE, b"d", 0o755, CALLER))
        self.mount.ok(self.mount.fs.mkdir(ROOT_INODE, b"sub", 0o755, CALLER))
        self.mount.write_file("d/f", b"x")
        self.folder = self.mount.lookup_path("d").ino

    def rename_sub(self) -> Deferred[None]:
        return self.mount.fs.rename(ROOT_INODE, b"sub", ROOT_INODE, b"moved", CALLER)

    def test_rename_that_ran_succeeds(self) -> None:
        """The directory's rename ran: the call succeeds, and both mounts see it."""
        self.mount.answers.lose("manifest_rename", ran=True)
        self.mount.ok(self.rename_sub())
        for mount in (self.mount, self.fixture.mount()):
            self.assertEqual(sorted(mount.names("")), ["d", "moved"])

    def test_rename_that_never_ran_is_sent_again(self) -> None:
        """The rename never reached the server: sent again, it succeeds."""
        self.mount.answers.lose("manifest_rename", ran=False)
        self.mount.ok(self.rename_sub())
        self.assertEqual(sorted(self.fixture.mount().names("")), ["d", "moved"])

    def test_rename_whose_resend_gets_no_answer_fails(self) -> None:
        """
        Nobody can tell whether it ran: C{EIO}, as before, and its outbox
        entry is dropped (a later mount must not make a change its program
        was told failed).
        """
        self.mount.answers.lose("manifest_rename", ran=False, times=2)
        self.assertEqual(self.mount.errno(self.rename_sub()), errno.EIO)
        self.assertEqual(self.mount.outbox.backlog().entries, 0)

    def test_unlink_that_ran_succeeds(self) -> None:
        """The unlink ran: the call succeeds, and the name is gone for both mounts."""
        self.mount.answers.lose("manifest_delete", ran=True)
        self.mount.ok(self.mount.fs.unlink(self.folder, b"f", CALLER))
        for mount in (self.mount, self.fixture.mount()):
            self.assertEqual(mount.names("d"), [])

    def test_unlink_that_never_ran_is_sent_again(self) -> None:
        """The unlink never reached the server: sent again, it succeeds."""
        self.mount.answers.lose("manifest_delete", ran=False)
        self.mount.ok(self.mount.fs.unlink(self.folder, b"f", CALLER))
        self.assertEqual(self.fixture.mount().names("d"), [])

    def test_creations_that_ran_succeed(self) -> None:
        """
        A mkdir, symlink, hard link and a create in a directory not listed
        whole, each of whose answer never came though it ran: each call
        succeeds, with the node the server has.
        """
        fs = self.mount.fs
        lose = self.mount.answers.lose
        lose("dir_create", ran=True)
        made = self.mount.ok(fs.mkdir(self.folder, b"e", 0o755, CALLER))
        lose("symlink", ran=True)
        self.mount.ok(fs.symlink(self.folder, b"s", b"f", CALLER))
        lose("link", ran=True)
        linked = self.mount.ok(
            fs.link(self.mount.lookup_path("d/f").ino, self.folder, b"g", CALLER)
        )
        self.assertEqual(linked.attributes.nlink, 2)
        fresh = self.fixture.mount(settings=FSSettings(durable_close=True))
        fresh.answers.lose("mknod", ran=True)
        opened, _ = fresh.ok(
            fresh.fs.create(fresh.lookup_path("d").ino, b"n", 0o644, os.O_WRONLY, CALLER)
        )
        fresh.ok(fresh.fs.release(opened.fh, CALLER))
        self.assertEqual(made.attributes.kind.name, "DIR")
        self.assertEqual(self.mount.answers.losses_left + fresh.answers.losses_left, 0)
        last = self.fixture.mount()
        self.assertEqual(sorted(last.names("d")), ["e", "f", "g", "n", "s"])
        self.assertEqual(last.read_file("d/g"), b"x")

    def test_creations_that_never_ran_are_sent_again(self) -> None:
        """A mkdir and a symlink lost on their way: sent again, they succeed."""
        fs = self.mount.fs
        self.mount.answers.lose("dir_create", "symlink", ran=False)
        self.mount.ok(fs.mkdir(self.folder, b"e", 0o755, CALLER))
        self.mount.ok(fs.symlink(self.folder, b"s", b"f", CALLER))
        self.assertEqual(self.mount.answers.losses_left, 0)
        self.assertEqual(sorted(self.fixture.mount().names("d")), ["e", "f", "s"])

    def test_setattr_is_sent_again(self) -> None:
        """A chmod whose answer never came (ran or not) is sent once more, and holds."""
        ino = self.mount.lookup_path("d/f").ino
        for ran, mode in ((True, 0o600), (False, 0o640)):
            self.mount.answers.lose("setattr", ran=ran)
            self.mount.ok(self.mount.fs.setattr(ino, AttributeChanges(mode=mode), CALLER))
            self.assertEqual(self.mount.answers.losses_left, 0)
            found = self.fixture.mount().lookup_path("d/f").attributes.mode
            self.assertEqual(found & 0o777, mode)
