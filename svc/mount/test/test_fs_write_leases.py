"""
Tests for the mount's per-path write leases (L{svc.mount.remote.write_leases},
``docs/specifications/mount-consistency.md`` section 6), against the real
data-plane service and its lease table: taken by an open for writing of a
file on the data plane, shared by its handles, refreshed, given back at the
last close, yielded after a write-back when asked, taken again after it was
lost; a refusal is audited C{lease_denied} and the file written uncached.
"""

from __future__ import annotations

import errno
import os

from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane.test.test_service_support import LEASE_TIMINGS
from svc.mount.fs import ROOT_INODE, FSSettings
from svc.mount.remote.write_leases import LINGER_SECONDS, MAX_LINGERING, revoke_pushes
from svc.mount.test.test_fs_close import create
from svc.mount.test.test_fs_support import CALLER, FSFixture

PATH = "/agent-1/f"


class WriteLeaseTests(SynchronousTestCase):
    """A file of the disk, opened for writing by this mount and by another connection."""

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        self.service = self.fixture.service
        self.mount = self.fixture.mount()
        self.entry = self.mount.write_file("f", b"version one")
        self.other = self.service.agent()

    def held(self) -> bool:
        """Whether anyone holds a lease on the file (the server's gauge)."""
        return self.service.sample("svc_lease_held", path=PATH) == 1.0

    def grants(self) -> list[str]:
        """The lease ids the server granted on the file, in order."""
        return [
            str(event.get("lease_id"))
            for event in self.service.events("lease_grant")
            if event.path == PATH
        ]

    def open_rw(self) -> int:
        fh: int = self.mount.ok(self.mount.fs.open(self.entry.ino, os.O_RDWR, CALLER)).fh
        return fh

    def close(self, fh: int) -> None:
        self.mount.ok(self.mount.fs.flush(fh, CALLER))
        self.mount.ok(self.mount.fs.release(fh, CALLER))

    def linger(self) -> None:
        """Let the time a closed file's lease is kept pass."""
        self.service.clock.advance(LINGER_SECONDS)

    def test_open_for_writing_holds_the_lease_until_after_the_last_close(self) -> None:
        """
        Two handles share one lease; after the last release it is kept a
        while (an open for writing then asks nothing), then given back.
        """
        first = self.open_rw()
        self.assertTrue(self.held())
        second = self.open_rw()
        self.assertEqual(self.mount.count("lease_grant"), 1)
        self.mount.ok(self.mount.fs.write(second, 0, b"MINE", CALLER))
        self.close(first)
        self.assertTrue(self.held())
        self.close(second)
        self.service.clock.advance(LINGER_SECONDS / 2)
        self.assertTrue(self.held())
        self.close(self.open_rw())
        self.assertEqual(self.mount.count("lease_grant"), 1)
        self.assertEqual(self.mount.count("lease_release"), 0)
        self.linger()
        self.assertFalse(self.held())
        self.assertEqual(self.mount.count("lease_release"), 1)
        [release] = self.service.events("lease_release")
        self.assertEqual(release.get("reason"), "client")
        self.assertEqual(self.fixture.mount().read_file("f"), b"MINEion one")

    def test_two_files_at_one_path_share_the_lease_until_both_are_done(self) -> None:
        """
        A file renamed over one still open for writing, then opened for
        writing too: the server renews the same lease for it. When the
        first is closed and its kept lease runs out, the lease stays for
        the second; it goes once the second's does.
        """
        first = self.open_rw()
        self.mount.write_file("g", b"newer")
        g = self.mount.lookup_path("g").ino
        self.mount.ok(self.mount.fs.rename(ROOT_INODE, b"g", ROOT_INODE, b"f", CALLER))
        second = self.mount.ok(self.mount.fs.open(g, os.O_RDWR, CALLER)).fh
        self.assertEqual(len(set(self.grants())), 1, "the same lease, renewed")
        self.close(first)
        self.linger()
        self.assertTrue(self.held())
        self.assertEqual(self.mount.count("lease_release"), 0)
        self.close(second)
        self.linger()
        self.assertFalse(self.held())

    def test_open_does_not_wait_for_the_grant(self) -> None:
        """The open is answered before the grant; the grant goes out first."""
        self.mount.answers.hold("lease_grant")
        fh = self.open_rw()
        self.assertFalse(self.held() and self.mount.answers.held == 0)
        self.mount.answers.release()
        self.assertTrue(self.held())
        self.mount.ok(self.mount.fs.release(fh, CALLER))
        self.linger()
        self.assertFalse(self.held())

    def test_new_files_and_reading_take_none(self) -> None:
        """A file created here (not on the data plane yet) and a read-only open ask nothing."""
        opened = create(self.mount, "g", b"new")
        self.close(opened.fh)
        reading = self.mount.ok(self.mount.fs.open(self.entry.ino, os.O_RDONLY, CALLER))
        self.mount.ok(self.mount.fs.release(reading.fh, CALLER))
        self.assertEqual(self.mount.count("lease_grant"), 0)

    def test_off_in_the_settings(self) -> None:
        """C{write_leases=False}: an open for writing asks for none."""
        mount = self.fixture.mount(settings=FSSettings(write_leases=False))
        entry = mount.lookup_path("f")
        opened = mount.ok(mount.fs.open(entry.ino, os.O_RDWR, CALLER))
        mount.ok(mount.fs.release(opened.fh, CALLER))
        self.assertEqual(mount.count("lease_grant"), 0)

    def test_refused_lease_is_audited_and_the_file_written_uncached(self) -> None:
        """
        Another connection holds the lease: the open succeeds, audits
        C{lease_denied}, and its close waits for the commit's answer (a
        leased file's close returns once the commit is sent).
        """
        granted = self.other.ok("lease_grant", path=PATH, mode="write")
        fh = self.open_rw()
        [denied] = self.mount.events("lease_denied")
        self.assertTrue(denied.allowed)
        self.assertEqual(denied.path, self.mount.events("open")[-1].path)
        self.assertEqual(denied.command, CALLER.command)
        self.mount.ok(self.mount.fs.write(fh, 0, b"MINE", CALLER))
        self.other.ok("lease_release", lease_id=granted["lease_id"])
        self.mount.answers.hold("manifest_put")
        flushed = self.mount.fs.flush(fh, CALLER)
        self.assertNoResult(flushed)
        self.mount.answers.release()
        self.mount.ok(flushed)
        self.mount.ok(self.mount.fs.release(fh, CALLER))

        leased = self.open_rw()
        self.mount.ok(self.mount.fs.write(leased, 0, b"AGAIN", CALLER))
        self.mount.answers.hold("manifest_put")
        self.mount.ok(self.mount.fs.flush(leased, CALLER))
        self.mount.answers.release()
        self.mount.ok(self.mount.fs.release(leased, CALLER))
        self.assertEqual(self.fixture.mount().read_file("f"), b"AGAINon one")

    def test_grant_lost_with_the_connection_is_no_refusal(self) -> None:
        """
        A grant whose answer the lost connection took: nobody refused it, so
        no C{lease_denied} line, and the file's close still hands its commit
        off (it is not written uncached).
        """
        self.mount.answers.lose("lease_grant", ran=False)
        fh = self.open_rw()
        self.assertEqual(self.mount.events("lease_denied"), [])
        self.assertFalse(self.held())
        self.mount.ok(self.mount.fs.write(fh, 0, b"MINE", CALLER))
        self.mount.answers.hold("manifest_put")
        self.mount.ok(self.mount.fs.flush(fh, CALLER))  # returns before the answer
        self.mount.answers.release()
        self.mount.ok(self.mount.fs.release(fh, CALLER))
        self.assertEqual(self.fixture.mount().read_file("f"), b"MINEion one")

    def test_a_file_closed_before_its_grant_came_is_no_refusal(self) -> None:
        """
        The file is closed while its grant is on its way: the lease is given
        back when it comes, with no C{lease_denied} line, and the file is
        not written uncached at its next open.
        """
        self.mount.answers.hold("lease_grant")
        fh = self.open_rw()
        self.mount.ok(self.mount.fs.release(fh, CALLER))
        self.mount.answers.release()
        self.assertEqual(self.mount.events("lease_denied"), [])
        self.assertFalse(self.held())
        again = self.open_rw()
        self.assertTrue(self.held())
        self.mount.ok(self.mount.fs.release(again, CALLER))
        self.assertEqual(self.mount.events("lease_denied"), [])

    def test_a_lease_wait_the_connection_took_makes_no_conflict_copy(self) -> None:
        """
        A commit refused because another connection holds the path's lease
        waits for it; when that wait is lost with the connection, nobody
        refused anything: the flush fails EIO, no conflict copy is made,
        and the file's next write-back commits its changes.
        """
        granted = self.other.ok("lease_grant", path=PATH, mode="write")
        fh = self.open_rw()
        self.mount.ok(self.mount.fs.write(fh, 0, b"MINE", CALLER))
        self.mount.answers.lose("lease_grant", ran=False)
        self.assertEqual(self.mount.errno(self.mount.fs.flush(fh, CALLER)), errno.EIO)
        self.assertEqual(self.mount.names(""), ["f"])
        self.other.ok("lease_release", lease_id=granted["lease_id"])
        self.mount.ok(self.mount.fs.release(fh, CALLER))
        self.assertEqual(self.fixture.mount().read_file("f"), b"MINEion one")
        self.assertEqual(self.fixture.mount().names(""), ["f"])

    def test_asked_back_after_writing_back(self) -> None:
        """
        Another connection waits for the lease: the mount commits the open
        file's changes, then releases it, and that connection is granted.
        """
        fh = self.open_rw()
        self.mount.ok(self.mount.fs.write(fh, 0, b"MINE", CALLER))
        waiting = self.other.request("lease_grant", path=PATH, mode="write", wait=True)
        self.assertNoResult(waiting)
        self.service.clock.advance(0)  # the mount yields on the next turn
        answer = self.successResultOf(waiting).payload
        self.assertTrue(answer["granted"])
        other_view = self.other.ok("manifest_get", path=PATH)
        self.assertEqual(other_view["size"], len(b"MINEion one"))
        self.assertEqual(self.fixture.mount().read_file("f"), b"MINEion one")
        [line] = [event for event in self.mount.events("flush") if event.command is None]
        self.assertTrue(line.allowed)
        self.assertEqual(self.service.events("lease_violation"), [])
        self.other.ok("lease_release", lease_id=answer["lease_id"])
        self.mount.ok(self.mount.fs.release(fh, CALLER))

    def test_open_while_yielding_is_refused(self) -> None:
        """An open for writing after the lease was asked back does not keep it."""
        fh = self.open_rw()
        waiting = self.other.request("lease_grant", path=PATH, mode="write", wait=True)
        second = self.open_rw()
        self.assertEqual(len(self.mount.events("lease_denied")), 1)
        self.service.clock.advance(0)
        self.assertTrue(self.successResultOf(waiting).payload["granted"])
        self.assertEqual(self.service.events("lease_violation"), [])
        for handle in (fh, second):
            self.mount.ok(self.mount.fs.release(handle, CALLER))

    def test_refreshed_while_open(self) -> None:
        """An open file keeps its lease past the TTL: it is refreshed."""
        fh = self.open_rw()
        step = LEASE_TIMINGS.ttl / 6
        for _ in range(12):
            self.service.clock.advance(step)
        self.assertTrue(self.held())
        self.assertGreaterEqual(self.mount.count("lease_refresh"), 5)
        self.assertEqual(self.service.events("lease_violation"), [])
        self.mount.ok(self.mount.fs.release(fh, CALLER))
        self.linger()
        self.assertFalse(self.held())

    def test_lost_lease_is_taken_again_at_the_next_refresh(self) -> None:
        """
        A lease the server no longer has (its connection went away) is
        asked for again when its refresh is answered ENOENT.
        """
        fh = self.open_rw()
        [first] = self.grants()
        self.mount.ok(self.mount.remote.lease_release(first))
        self.assertFalse(self.held())
        self.service.clock.advance(LEASE_TIMINGS.ttl / 3)
        self.assertTrue(self.held())
        [_, second] = self.grants()
        self.assertNotEqual(first, second)
        self.mount.ok(self.mount.fs.release(fh, CALLER))
        self.linger()
        self.assertFalse(self.held())

    def test_lost_lease_is_taken_again_at_once_after_a_reconnect(self) -> None:
        """
        When a new connection replaces a lost one (which took its leases
        with it), every held lease is refreshed at once, so the lost one is
        asked for again without waiting for its next refresh; a closed
        file's kept lease is not.
        """
        kept = self.mount.write_file("g", b"kept")
        closed = self.mount.ok(self.mount.fs.open(kept.ino, os.O_RDWR, CALLER)).fh
        self.close(closed)
        fh = self.open_rw()
        for event in self.service.events("lease_grant"):
            self.mount.ok(self.mount.remote.lease_release(str(event.get("lease_id"))))
        self.assertFalse(self.held())
        self.mount.fs.reconnected()
        self.assertTrue(self.held())
        self.assertEqual(len(self.grants()), 2)
        kept_grants = [e for e in self.service.events("lease_grant") if e.path == "/agent-1/g"]
        self.assertEqual(len(kept_grants), 1, "the kept lease is not asked for again")
        self.mount.ok(self.mount.fs.release(fh, CALLER))
        self.linger()
        self.assertFalse(self.held())

    def test_kept_lease_refreshed_meanwhile_is_given_back_in_time(self) -> None:
        """
        A refresh that falls while a closed file's lease is kept does not
        keep it longer: it is given back when its time is up.
        """
        fh = self.open_rw()
        refresh = LEASE_TIMINGS.ttl / 3
        self.service.clock.advance(refresh - LINGER_SECONDS / 2)
        self.close(fh)
        self.service.clock.advance(LINGER_SECONDS / 2)  # the refresh
        self.assertEqual(self.mount.count("lease_refresh"), 1)
        self.assertTrue(self.held())
        self.service.clock.advance(LINGER_SECONDS / 2)
        self.assertFalse(self.held())
        self.assertEqual(self.mount.count("lease_release"), 1)

    def test_kept_lease_is_given_back_when_asked(self) -> None:
        """A closed file's kept lease goes at once to another connection asking for it."""
        self.close(self.open_rw())
        self.assertTrue(self.held())
        waiting = self.other.request("lease_grant", path=PATH, mode="write", wait=True)
        self.service.clock.advance(0)
        self.assertTrue(self.successResultOf(waiting).payload["granted"])
        self.assertEqual(self.service.events("lease_violation"), [])

    def test_kept_leases_are_bounded(self) -> None:
        """At most MAX_LINGERING closed files keep their leases; the oldest goes first."""
        names = [f"g{index}" for index in range(MAX_LINGERING + 2)]
        for name in names:
            self.mount.write_file(name, b"x")
        for name in names:
            entry = self.mount.lookup_path(name)
            self.close(self.mount.ok(self.mount.fs.open(entry.ino, os.O_RDWR, CALLER)).fh)
        held = [
            name
            for name in names
            if self.service.sample("svc_lease_held", path=f"/agent-1/{name}") == 1.0
        ]
        self.assertEqual(held, names[2:])


class RevokePushTests(SynchronousTestCase):
    """The push callback that hands C{lease_revoke} pushes to the mount."""

    def test_only_well_formed_revokes_are_delivered(self) -> None:
        received: list[str] = []
        pushed = revoke_pushes(received.append)
        pushed("changed", {"paths": ["/agent-1/f"]}, b"")
        pushed("lease_revoke", {"lease_id": 7}, b"")
        pushed("lease_revoke", {"lease_id": "ab" * 16, "path": PATH}, b"")
        self.assertEqual(received, ["ab" * 16])
