"""
Tests for handed-off unlinks (L{svc.mount.unlink_hand_off}): an unlink
returns once its C{manifest_delete} is sent, so a run of unlinks is
pipelined; what waits for their answers, and what a refused one leaves.
"""

from __future__ import annotations

import errno

from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from svc.mount.fs import ROOT_INODE
from svc.mount.fs_context import FSSettings
from svc.mount.test.test_fs_support import CALLER, FSFixture, Mount
from svc.mount.unlink_hand_off import UNLINK_HAND_OFF_MAX
from svc.policy import PathPolicy

NAMES = [f"f{index}" for index in range(3)]


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
        self.mount.answers.release()
        self.assertEqual(self.unlink_lines(self.mount), [(f"/d/{n}", True) for n in NAMES])
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
        made = self.mount.fs.mkdir(ROOT_INODE, b"e", 0o755, CALLER)
        settled = self.mount.fs.write_backs_settled()
        self.assertNoResult(made)
        self.assertNoResult(settled)
        self.mount.answers.release()
        self.mount.ok(made)
        self.mount.ok(settled)
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

    def test_bounded_in_flight(self) -> None:
        """Beyond C{UNLINK_HAND_OFF_MAX} unanswered, an unlink waits for its own answer."""
        for index in range(UNLINK_HAND_OFF_MAX + 1):
            self.mount.write_file(f"d/many{index}", b"x")
        self.mount.answers.hold("manifest_delete")
        for index in range(UNLINK_HAND_OFF_MAX):
            self.mount.ok(self.unlink(self.mount, f"many{index}"))
        last = self.unlink(self.mount, f"many{UNLINK_HAND_OFF_MAX}")
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
