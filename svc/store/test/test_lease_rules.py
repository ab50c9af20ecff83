"""
Tests for L{svc.store.lease_rules}: the lease state machine, without I/O.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from svc.config import ConfigError
from svc.store.lease_rules import LeaseState
from svc.store.lease_values import (
    DenialReason,
    Lease,
    LeaseDenied,
    LeaseEffects,
    LeaseEventName,
    LeaseGrant,
    LeaseHolder,
    LeaseMode,
    LeaseReason,
    LeaseTimings,
    PutVerdict,
    Queued,
    random_lease_id,
)

READ = LeaseMode.READ
WRITE = LeaseMode.WRITE
TIMINGS = LeaseTimings(ttl=60.0, revoke_timeout=10.0, wait_margin=5.0)

ALICE = LeaseHolder("alice", "c1", "mount:aa")
BOB = LeaseHolder("bob", "c2", "mount:bb")
CAROL = LeaseHolder("carol", "c3")


def session(epoch: int) -> str:
    """A well-formed mount session id at C{epoch} (the tag is not checked here)."""
    return f"mount:{epoch:016x}{'0' * 16}{'0' * 32}"


def counting_ids() -> Callable[[], str]:
    """A deterministic lease id source: 000...1, 000...2, ..."""
    counter = itertools.count(1)
    return lambda: f"{next(counter):032x}"


def new_state(epoch: int = 0) -> LeaseState:
    return LeaseState(TIMINGS, counting_ids(), epoch)


def events(effects: LeaseEffects) -> list[tuple[str, str, str, str]]:
    """(event, agent, mode, reason) of each event, in order."""
    return [(e.event.value, e.agent_id, e.mode.value, e.reason.value) for e in effects.events]


def granted(answer: object) -> LeaseGrant:
    assert isinstance(answer, LeaseGrant), answer
    return answer


class ValueTests(SynchronousTestCase):
    """
    Tests for the value classes and configuration.
    """

    def test_holder_identity_ignores_session(self) -> None:
        """Two holders with the same agent and connection are equal whatever the session."""
        self.assertEqual(LeaseHolder("a", "c", "s1"), LeaseHolder("a", "c", None))
        self.assertNotEqual(LeaseHolder("a", "c"), LeaseHolder("a", "d"))

    def test_holder_session_epoch(self) -> None:
        """A holder's session epoch is read from a mount session id; other ids have none."""
        self.assertEqual(LeaseHolder("a", "c", session(12)).session_epoch, 12)
        self.assertIsNone(LeaseHolder("a", "c", "mount:aa").session_epoch)
        self.assertIsNone(LeaseHolder("a", "c").session_epoch)

    def test_newer_session_of_same_agent_supersedes(self) -> None:
        """Only a strictly newer mount session of the same agent supersedes a holder."""
        older = LeaseHolder("a", "c1", session(3))
        self.assertTrue(LeaseHolder("a", "c2", session(4)).supersedes(older))
        self.assertFalse(LeaseHolder("a", "c2", session(3)).supersedes(older))
        self.assertFalse(LeaseHolder("a", "c2", session(2)).supersedes(older))
        self.assertFalse(LeaseHolder("b", "c2", session(4)).supersedes(older))
        self.assertFalse(LeaseHolder("a", "c2").supersedes(older))
        self.assertFalse(LeaseHolder("a", "c2", session(4)).supersedes(LeaseHolder("a", "c1")))

    def test_holder_rejects_empty(self) -> None:
        """An empty agent or connection id is refused on construction."""
        self.assertRaises(ValueError, LeaseHolder, "", "c")
        self.assertRaises(ValueError, LeaseHolder, "a", "")

    def test_lease_id_format(self) -> None:
        """A lease id must be 32 lowercase hex characters."""
        self.assertRaises(ValueError, Lease, "ABC", "/p", WRITE, ALICE, 1, 0.0, 1.0)
        Lease("0" * 32, "/p", WRITE, ALICE, 1, 0.0, 1.0)

    def test_random_lease_id(self) -> None:
        """The default source yields distinct 128-bit hex ids."""
        first, second = random_lease_id(), random_lease_id()
        self.assertEqual(len(first), 32)
        int(first, 16)
        self.assertNotEqual(first, second)

    def test_timings_positive(self) -> None:
        """Durations must be positive."""
        self.assertRaises(ValueError, LeaseTimings, ttl=0)
        self.assertRaises(ValueError, LeaseTimings, revoke_timeout=-1)
        self.assertRaises(ValueError, LeaseTimings, wait_margin=0)

    def test_timings_from_environ(self) -> None:
        """Timings are read from SVC_LEASE_* variables with defaults 60/10/5."""
        self.assertEqual(LeaseTimings.from_environ({}), LeaseTimings(60.0, 10.0, 5.0))
        environ = {"SVC_LEASE_TTL_SECONDS": "30", "SVC_LEASE_REVOKE_TIMEOUT_SECONDS": "3"}
        self.assertEqual(LeaseTimings.from_environ(environ), LeaseTimings(30.0, 3.0, 5.0))

    def test_timings_revoke_longer_than_ttl(self) -> None:
        """A revoke timeout beyond the TTL is a configuration error naming the variable."""
        environ = {"SVC_LEASE_TTL_SECONDS": "5", "SVC_LEASE_REVOKE_TIMEOUT_SECONDS": "6"}
        error = self.assertRaises(ConfigError, LeaseTimings.from_environ, environ)
        self.assertEqual(error.variable, "SVC_LEASE_REVOKE_TIMEOUT_SECONDS")

    def test_repeated_lease_id_refused(self) -> None:
        """A lease id source that repeats a live id is a bug and raises."""
        state = LeaseState(TIMINGS, lambda: "1" * 32)
        state.request("/a", READ, ALICE, False, 0.0)
        self.assertRaises(ValueError, state.request, "/b", READ, ALICE, False, 0.0)


class GrantTests(SynchronousTestCase):
    """
    Tests for granting, renewing and upgrading without contention.
    """

    def test_first_grant(self) -> None:
        """A request on a free path is granted with a fresh id, epoch 1 and now+ttl expiry."""
        state = new_state()
        answer, effects = state.request("/f", WRITE, ALICE, False, 100.0)
        grant = granted(answer)
        self.assertEqual(grant, LeaseGrant("0" * 31 + "1", "/f", WRITE, ALICE, 1, 160.0))
        self.assertEqual(events(effects), [("lease_grant", "alice", "write", "")])
        self.assertEqual(effects.events[0].leases_on_path, 1)
        self.assertEqual(effects.stored, state.leases())
        self.assertEqual(effects.epoch, 1)

    def test_reads_shared(self) -> None:
        """Read leases of different holders coexist on one path."""
        state = new_state()
        granted(state.request("/f", READ, ALICE, False, 0.0)[0])
        answer, effects = state.request("/f", READ, BOB, False, 0.0)
        granted(answer)
        self.assertEqual(len(state.leases_on("/f")), 2)
        self.assertEqual(effects.events[0].leases_on_path, 2)
        self.assertEqual(effects.revokes, ())

    def test_rerequest_renews(self) -> None:
        """The same holder asking again for a covered mode renews the same lease (lease_refresh)."""
        state = new_state()
        first = granted(state.request("/f", WRITE, ALICE, False, 0.0)[0])
        answer, effects = state.request("/f", READ, ALICE, False, 30.0)
        again = granted(answer)
        self.assertEqual((again.lease_id, again.mode, again.epoch), (first.lease_id, WRITE, 1))
        self.assertEqual(again.expires_at, 90.0)
        self.assertEqual(events(effects), [("lease_refresh", "alice", "write", "")])

    def test_upgrade_sole_reader(self) -> None:
        """A sole reader asking for write is upgraded in place with a new epoch."""
        state = new_state()
        first = granted(state.request("/f", READ, ALICE, False, 0.0)[0])
        answer, effects = state.request("/f", WRITE, ALICE, False, 1.0)
        upgraded = granted(answer)
        self.assertEqual(upgraded.lease_id, first.lease_id)
        self.assertEqual((upgraded.mode, upgraded.epoch), (WRITE, 2))
        self.assertEqual(events(effects), [("lease_grant", "alice", "write", "")])
        self.assertEqual(len(state.leases_on("/f")), 1)

    def test_epochs_increase(self) -> None:
        """Every grant gets a larger epoch than any before it."""
        state = new_state(epoch=41)
        one = granted(state.request("/a", READ, ALICE, False, 0.0)[0])
        two = granted(state.request("/b", WRITE, BOB, False, 0.0)[0])
        self.assertEqual((one.epoch, two.epoch), (42, 43))


class ContentionTests(SynchronousTestCase):
    """
    Tests for conflicting requests: revokes, queues, denials.
    """

    def test_read_denied_by_writer(self) -> None:
        """A read request against another holder's write lease is denied without a revoke."""
        state = new_state()
        state.request("/f", WRITE, ALICE, False, 0.0)
        answer, effects = state.request("/f", READ, BOB, True, 0.0)
        self.assertEqual(answer, LeaseDenied("/f", READ, BOB, DenialReason.WRITE_HELD))
        self.assertEqual(effects, LeaseEffects(epoch=1))

    def test_write_contention_without_wait(self) -> None:
        """A conflicting write request revokes every other holder and is denied at once."""
        state = new_state()
        state.request("/f", READ, ALICE, False, 0.0)
        state.request("/f", READ, CAROL, False, 0.0)
        answer, effects = state.request("/f", WRITE, BOB, False, 2.0)
        self.assertEqual(answer, LeaseDenied("/f", WRITE, BOB, DenialReason.CONTENTION))
        self.assertEqual(
            events(effects),
            [
                ("lease_revoke", "alice", "read", "contention"),
                ("lease_revoke", "carol", "read", "contention"),
            ],
        )
        self.assertEqual([r.holder for r in effects.revokes], [ALICE, CAROL])
        self.assertEqual({r.deadline for r in effects.revokes}, {12.0})
        self.assertEqual({r.reason for r in effects.revokes}, {LeaseReason.CONTENTION})

    def test_revoke_sent_once(self) -> None:
        """A holder already asked to yield is not asked again by a later request."""
        state = new_state()
        state.request("/f", WRITE, ALICE, False, 0.0)
        state.request("/f", WRITE, BOB, False, 1.0)
        _, effects = state.request("/f", WRITE, CAROL, False, 2.0)
        self.assertEqual(effects.revokes, ())

    def test_waiter_granted_on_release(self) -> None:
        """A waiting writer is granted when the holder releases."""
        state = new_state()
        held = granted(state.request("/f", WRITE, ALICE, False, 0.0)[0])
        answer, _ = state.request("/f", WRITE, BOB, True, 1.0)
        assert isinstance(answer, Queued)
        found, effects = state.release(held.lease_id, ALICE, LeaseReason.CLIENT, 3.0)
        self.assertTrue(found)
        self.assertEqual(
            events(effects),
            [("lease_release", "alice", "write", "client"), ("lease_grant", "bob", "write", "")],
        )
        ((request_id, grant),) = effects.answers
        self.assertEqual(request_id, answer.request_id)
        self.assertEqual((granted(grant).holder, granted(grant).expires_at), (BOB, 63.0))

    def test_fifo_waiters(self) -> None:
        """Waiters are served in arrival order; the next one then asks the new holder to yield."""
        state = new_state()
        held = granted(state.request("/f", WRITE, ALICE, False, 0.0)[0])
        first, _ = state.request("/f", WRITE, BOB, True, 1.0)
        second, _ = state.request("/f", WRITE, CAROL, True, 2.0)
        assert isinstance(first, Queued) and isinstance(second, Queued)
        _, effects = state.release(held.lease_id, ALICE, LeaseReason.CLIENT, 3.0)
        self.assertEqual([rid for rid, _ in effects.answers], [first.request_id])
        self.assertEqual([r.holder for r in effects.revokes], [BOB])
        self.assertEqual(state.waiting("/f"), (second.request_id,))
        self.assertEqual(state.waiter_deadline(second.request_id), 18.0)

    def test_read_denied_while_writer_waits(self) -> None:
        """A new reader does not overtake a queued writer."""
        state = new_state()
        state.request("/f", READ, ALICE, False, 0.0)
        state.request("/f", WRITE, BOB, True, 0.0)
        answer, _ = state.request("/f", READ, CAROL, True, 0.0)
        self.assertEqual(answer, LeaseDenied("/f", READ, CAROL, DenialReason.WRITER_WAITING))

    def test_revoke_timeout(self) -> None:
        """A holder not yielding by its deadline is dropped, fenced, and the waiter granted."""
        state = new_state()
        state.request("/f", WRITE, ALICE, False, 0.0)
        answer, _ = state.request("/f", WRITE, BOB, True, 5.0)
        assert isinstance(answer, Queued)
        self.assertEqual(state.next_deadline(), 15.0)
        self.assertEqual(state.advance(14.9), LeaseEffects(epoch=1))
        effects = state.advance(20.0)
        self.assertEqual(
            events(effects),
            [
                ("lease_violation", "alice", "write", "revoke_timeout"),
                ("lease_grant", "bob", "write", ""),
            ],
        )
        self.assertEqual(granted(effects.answers[0][1]).expires_at, 75.0)
        self.assertTrue(state.is_fenced(ALICE, "/f"))
        self.assertFalse(state.check_write("/f", ALICE))
        self.assertTrue(state.check_write("/f", BOB))

    def test_waiter_timeout(self) -> None:
        """A queued request whose turn does not come by its deadline is denied with timeout."""
        state = new_state()
        held = granted(state.request("/f", WRITE, ALICE, False, 0.0)[0])
        state.request("/f", WRITE, BOB, True, 0.0)
        third, _ = state.request("/f", WRITE, CAROL, True, 1.0)
        assert isinstance(third, Queued)
        state.release(held.lease_id, ALICE, LeaseReason.CLIENT, 2.0)
        # Bob was granted at 2 and asked to yield by 12; Carol waits until 17.
        effects = state.advance(12.0)
        self.assertEqual(events(effects)[0], ("lease_violation", "bob", "write", "revoke_timeout"))
        self.assertEqual(granted(effects.answers[0][1]).holder, CAROL)

    def test_non_head_waiter_times_out(self) -> None:
        """A waiter behind the head gives up at revoke timeout plus margin after it asked."""
        state = new_state()
        state.request("/f", WRITE, ALICE, False, 0.0)
        state.request("/f", WRITE, BOB, True, 0.0)
        third, _ = state.request("/f", WRITE, CAROL, True, 1.0)
        assert isinstance(third, Queued)
        effects = state.advance(10.0)
        # Alice dropped at 10, Bob granted; Carol (deadline 16) asks Bob, extended to 25.
        self.assertEqual(state.waiter_deadline(third.request_id), 25.0)
        self.assertEqual(len(effects.answers), 1)
        effects = state.advance(100.0)
        self.assertEqual([granted(a).holder for _, a in effects.answers], [CAROL])

    def test_withdraw(self) -> None:
        """A withdrawn request is answered with the reason and leaves the queue."""
        state = new_state()
        state.request("/f", WRITE, ALICE, False, 0.0)
        answer, _ = state.request("/f", WRITE, BOB, True, 0.0)
        assert isinstance(answer, Queued)
        effects = state.withdraw(answer.request_id, DenialReason.CANCELLED, 1.0)
        denied = LeaseDenied("/f", WRITE, BOB, DenialReason.CANCELLED)
        self.assertEqual(effects.answers, ((answer.request_id, denied),))
        self.assertEqual(state.waiting("/f"), ())

    def test_upgrade_with_other_readers(self) -> None:
        """A reader asking for write while others read revokes only the others."""
        state = new_state()
        state.request("/f", READ, ALICE, False, 0.0)
        state.request("/f", READ, BOB, False, 0.0)
        answer, effects = state.request("/f", WRITE, ALICE, True, 0.0)
        assert isinstance(answer, Queued)
        self.assertEqual([r.holder for r in effects.revokes], [BOB])
        bob_lease = next(lease for lease in state.leases() if lease.holder == BOB)
        effects = state.release(bob_lease.lease_id, BOB, LeaseReason.CLIENT, 1.0)[1]
        upgraded = granted(effects.answers[0][1])
        self.assertEqual((upgraded.holder, upgraded.mode, upgraded.epoch), (ALICE, WRITE, 3))


class LifetimeTests(SynchronousTestCase):
    """
    Tests for refresh, release, expiry and connection close.
    """

    def test_refresh_extends(self) -> None:
        """Refresh moves expiry to now + ttl and emits lease_refresh."""
        state = new_state()
        held = granted(state.request("/f", READ, ALICE, False, 0.0)[0])
        grant, effects = state.refresh(held.lease_id, ALICE, 50.0)
        self.assertEqual(granted(grant).expires_at, 110.0)
        self.assertEqual(events(effects), [("lease_refresh", "alice", "read", "")])
        self.assertEqual(state.advance(100.0).events, ())

    def test_refresh_keeps_revoke_deadline(self) -> None:
        """Refreshing a lease asked to yield does not move its revoke deadline."""
        state = new_state()
        held = granted(state.request("/f", WRITE, ALICE, False, 0.0)[0])
        state.request("/f", WRITE, BOB, False, 1.0)
        grant, _ = state.refresh(held.lease_id, ALICE, 2.0)
        self.assertEqual(granted(grant).expires_at, 11.0)

    def test_wrong_holder(self) -> None:
        """Another holder can neither refresh nor release a lease; unknown ids likewise."""
        state = new_state()
        held = granted(state.request("/f", WRITE, ALICE, False, 0.0)[0])
        self.assertIsNone(state.refresh(held.lease_id, BOB, 1.0)[0])
        self.assertFalse(state.release(held.lease_id, BOB, LeaseReason.CLIENT, 1.0)[0])
        self.assertIsNone(state.refresh("f" * 32, ALICE, 1.0)[0])
        self.assertEqual(len(state.leases()), 1)

    def test_release_reason_checked(self) -> None:
        """Only client and conn_closed are release reasons."""
        state = new_state()
        self.assertRaises(ValueError, state.release, "0" * 32, ALICE, LeaseReason.EXPIRED, 0.0)

    def test_expiry(self) -> None:
        """An unrefreshed lease is dropped at expiry as a violation; write leases fence."""
        state = new_state()
        state.request("/w", WRITE, ALICE, False, 0.0)
        state.request("/r", READ, BOB, False, 0.0)
        effects = state.advance(60.0)
        self.assertEqual(
            events(effects),
            [
                ("lease_violation", "alice", "write", "expired"),
                ("lease_violation", "bob", "read", "expired"),
            ],
        )
        self.assertEqual(set(effects.dropped), {"0" * 31 + "1", "0" * 31 + "2"})
        self.assertTrue(state.is_fenced(ALICE, "/w"))
        self.assertFalse(state.is_fenced(BOB, "/r"))
        self.assertIsNone(state.next_deadline())

    def test_expired_refresh_not_found(self) -> None:
        """Refreshing after expiry (before any timer ran) reports the violation and no grant."""
        state = new_state()
        held = granted(state.request("/f", WRITE, ALICE, False, 0.0)[0])
        grant, effects = state.refresh(held.lease_id, ALICE, 61.0)
        self.assertIsNone(grant)
        self.assertEqual(events(effects), [("lease_violation", "alice", "write", "expired")])

    def test_new_grant_clears_fence(self) -> None:
        """A fenced holder granted a lease on the path again is no longer fenced."""
        state = new_state()
        state.request("/f", WRITE, ALICE, False, 0.0)
        state.advance(60.0)
        state.request("/f", WRITE, ALICE, False, 61.0)
        self.assertFalse(state.is_fenced(ALICE, "/f"))

    def test_release_connection(self) -> None:
        """Closing a connection releases each of its leases and denies its waiters."""
        state = new_state()
        state.request("/a", READ, ALICE, False, 0.0)
        state.request("/b", WRITE, ALICE, False, 0.0)
        state.request("/c", WRITE, BOB, False, 0.0)
        waiting, _ = state.request("/c", WRITE, ALICE, True, 0.0)
        assert isinstance(waiting, Queued)
        effects = state.release_connection("c1", 1.0)
        self.assertEqual(
            events(effects),
            [
                ("lease_release", "alice", "read", "conn_closed"),
                ("lease_release", "alice", "write", "conn_closed"),
            ],
        )
        denied = LeaseDenied("/c", WRITE, ALICE, DenialReason.CONN_CLOSED)
        self.assertEqual(effects.answers, ((waiting.request_id, denied),))
        self.assertEqual([lease.holder for lease in state.leases()], [BOB])

    def test_release_connection_forgets_fences(self) -> None:
        """A closed connection's fences are forgotten (its holder identity is gone)."""
        state = new_state()
        state.request("/f", WRITE, ALICE, False, 0.0)
        state.advance(60.0)
        state.release_connection("c1", 61.0)
        self.assertFalse(state.is_fenced(ALICE, "/f"))


class ManifestPutTests(SynchronousTestCase):
    """
    Tests for L{LeaseState.manifest_put} and L{LeaseState.check_write}.
    """

    def test_free_path(self) -> None:
        """A put on a path nobody leases proceeds without events."""
        state = new_state()
        self.assertTrue(state.check_write("/f", ALICE))
        self.assertEqual(state.manifest_put("/f", ALICE, 0.0), (PutVerdict.PROCEED, LeaseEffects()))

    def test_holder_proceeds(self) -> None:
        """The write lease holder's put proceeds."""
        state = new_state()
        state.request("/f", WRITE, ALICE, False, 0.0)
        self.assertTrue(state.check_write("/f", ALICE))
        self.assertEqual(state.manifest_put("/f", ALICE, 1.0)[0], PutVerdict.PROCEED)

    def test_contended(self) -> None:
        """A put against another holder's write lease is refused and the holder asked to yield."""
        state = new_state()
        state.request("/f", WRITE, ALICE, False, 0.0)
        self.assertFalse(state.check_write("/f", BOB))
        verdict, effects = state.manifest_put("/f", BOB, 1.0)
        self.assertEqual(verdict, PutVerdict.CONTENDED)
        self.assertEqual(
            events(effects), [("lease_revoke", "alice", "write", "manifest_put_contention")]
        )
        self.assertEqual(effects.revokes[0].reason, LeaseReason.MANIFEST_PUT_CONTENTION)
        self.assertEqual(effects.revokes[0].deadline, 11.0)

    def test_readers_asked(self) -> None:
        """A put with only other readers proceeds and asks those readers to yield."""
        state = new_state()
        state.request("/f", READ, ALICE, False, 0.0)
        state.request("/f", READ, BOB, False, 0.0)
        verdict, effects = state.manifest_put("/f", BOB, 1.0)
        self.assertEqual(verdict, PutVerdict.PROCEED)
        self.assertEqual([r.holder for r in effects.revokes], [ALICE])

    def test_fenced(self) -> None:
        """A put from a holder whose write lease was dropped for not yielding is fenced."""
        state = new_state()
        state.request("/f", WRITE, ALICE, False, 0.0)
        state.manifest_put("/f", BOB, 1.0)
        state.advance(11.0)
        self.assertEqual(state.manifest_put("/f", ALICE, 12.0)[0], PutVerdict.FENCED)
        self.assertEqual(state.manifest_put("/f", BOB, 12.0)[0], PutVerdict.PROCEED)


def stored(lease_id: str, holder: LeaseHolder, mode: LeaseMode, expires: float) -> Lease:
    return Lease(lease_id, "/f", mode, holder, 7, 0.0, expires)


class RestoreTests(SynchronousTestCase):
    """
    Tests for recovering leases stored by a previous run.
    """

    def test_restore_rules(self) -> None:
        """Session write leases become orphans; reads, sessionless and expired rows are released."""
        state = new_state()
        kept = stored("a" * 32, ALICE, WRITE, 200.0)
        rows = [
            kept,
            attrs_evolve_path(stored("b" * 32, BOB, READ, 200.0), "/g"),
            attrs_evolve_path(stored("c" * 32, CAROL, WRITE, 200.0), "/h"),
            attrs_evolve_path(stored("d" * 32, BOB, WRITE, 90.0), "/i"),
        ]
        effects = state.restore(rows, 100.0)
        self.assertEqual(
            events(effects),
            [
                ("lease_release", "bob", "read", "conn_closed"),
                ("lease_release", "carol", "write", "conn_closed"),
                ("lease_release", "bob", "write", "conn_closed"),
            ],
        )
        self.assertEqual(set(effects.dropped), {"b" * 32, "c" * 32, "d" * 32})
        (orphan,) = state.leases()
        self.assertTrue(orphan.orphan)
        self.assertEqual(orphan.expires_at, 160.0)
        self.assertEqual(state.epoch, 7)

    def test_adopt_orphan(self) -> None:
        """A new connection of the same agent and session reclaims the orphan (same id)."""
        state = new_state()
        state.restore([stored("a" * 32, ALICE, WRITE, 200.0)], 100.0)
        again = LeaseHolder("alice", "c9", "mount:aa")
        answer, effects = state.request("/f", WRITE, again, False, 101.0)
        grant = granted(answer)
        self.assertEqual((grant.lease_id, grant.holder, grant.epoch), ("a" * 32, again, 7))
        self.assertEqual(events(effects), [("lease_grant", "alice", "write", "")])
        self.assertEqual(effects.events[0].connection_id, "c9")

    def test_adopt_by_put(self) -> None:
        """A put from the orphan's session reclaims it and proceeds."""
        state = new_state()
        state.restore([stored("a" * 32, ALICE, WRITE, 200.0)], 100.0)
        again = LeaseHolder("alice", "c9", "mount:aa")
        self.assertTrue(state.check_write("/f", again))
        self.assertEqual(state.manifest_put("/f", again, 101.0)[0], PutVerdict.PROCEED)
        self.assertFalse(state.leases()[0].orphan)

    def test_orphan_not_adopted_by_others(self) -> None:
        """Another session, or the old connection id reused, does not own the orphan."""
        state = new_state()
        state.restore([stored("a" * 32, ALICE, WRITE, 200.0)], 100.0)
        other = LeaseHolder("alice", "c9", "mount:zz")
        self.assertFalse(state.check_write("/f", other))
        self.assertEqual(state.release_connection("c1", 101.0).events, ())
        self.assertIsNone(state.refresh("a" * 32, ALICE, 101.0)[0])
        self.assertEqual(len(state.leases()), 1)

    def test_contended_orphan(self) -> None:
        """Contention gives an orphan revoke_timeout to be reclaimed; no revoke is pushed."""
        state = new_state()
        state.restore([stored("a" * 32, ALICE, WRITE, 200.0)], 100.0)
        answer, effects = state.request("/f", WRITE, BOB, True, 101.0)
        assert isinstance(answer, Queued)
        self.assertEqual(events(effects), [("lease_revoke", "alice", "write", "contention")])
        self.assertEqual(effects.revokes, ())
        effects = state.advance(111.0)
        self.assertEqual(
            events(effects),
            [
                ("lease_violation", "alice", "write", "revoke_timeout"),
                ("lease_grant", "bob", "write", ""),
            ],
        )
        self.assertFalse(state.is_fenced(ALICE, "/f"))

    def test_adopting_revoked_orphan_pushes_revoke(self) -> None:
        """Reclaiming an orphan already asked to yield pushes that revoke to the new connection."""
        state = new_state()
        state.restore([stored("a" * 32, ALICE, WRITE, 200.0)], 100.0)
        state.request("/f", WRITE, BOB, True, 101.0)
        again = LeaseHolder("alice", "c9", "mount:aa")
        _, effects = state.request("/f", WRITE, again, False, 102.0)
        (revoke,) = effects.revokes
        self.assertEqual((revoke.holder, revoke.deadline), (again, 111.0))

    def test_newer_session_request_drops_orphan_at_once(self) -> None:
        """
        A write request from a newer session of the orphan's agent drops the
        orphan at once (released, conn_closed) and is granted: nothing is
        asked to yield, nothing waits.
        """
        state = new_state()
        old = LeaseHolder("alice", "c1", session(3))
        state.restore([stored("a" * 32, old, WRITE, 200.0)], 100.0)
        successor = LeaseHolder("alice", "c9", session(4))
        answer, effects = state.request("/f", WRITE, successor, True, 101.0)
        grant = granted(answer)
        self.assertEqual((grant.holder, grant.epoch), (successor, 8))
        self.assertNotEqual(grant.lease_id, "a" * 32)
        self.assertEqual(
            events(effects),
            [
                ("lease_release", "alice", "write", "conn_closed"),
                ("lease_grant", "alice", "write", ""),
            ],
        )
        self.assertEqual(effects.events[0].connection_id, "c1")
        self.assertEqual(effects.dropped, ("a" * 32,))
        self.assertEqual(effects.revokes, ())
        (lease,) = state.leases()
        self.assertEqual((lease.holder, lease.orphan), (successor, False))

    def test_newer_session_put_drops_orphan_and_proceeds(self) -> None:
        """A put from a newer session of the orphan's agent drops the orphan and proceeds."""
        state = new_state()
        state.restore(
            [stored("a" * 32, LeaseHolder("alice", "c1", session(3)), WRITE, 200.0)], 100.0
        )
        successor = LeaseHolder("alice", "c9", session(4))
        self.assertTrue(state.check_write("/f", successor))
        verdict, effects = state.manifest_put("/f", successor, 101.0)
        self.assertEqual(verdict, PutVerdict.PROCEED)
        self.assertEqual(events(effects), [("lease_release", "alice", "write", "conn_closed")])
        self.assertEqual(state.leases(), ())

    def test_orphan_not_dropped_by_older_or_unrelated_sessions(self) -> None:
        """
        An older session, another agent's newer session, or a holder without
        a session meet the orphan as before: it is asked to yield.
        """
        for other in (
            LeaseHolder("alice", "c9", session(2)),
            LeaseHolder("bob", "c9", session(9)),
            LeaseHolder("alice", "c9"),
        ):
            state = new_state()
            state.restore(
                [stored("a" * 32, LeaseHolder("alice", "c1", session(3)), WRITE, 200.0)], 100.0
            )
            self.assertFalse(state.check_write("/f", other))
            answer, effects = state.request("/f", WRITE, other, False, 101.0)
            self.assertIsInstance(answer, LeaseDenied)
            self.assertEqual(events(effects), [("lease_revoke", "alice", "write", "contention")])
            verdict, _ = state.manifest_put("/f", other, 102.0)
            self.assertEqual(verdict, PutVerdict.CONTENDED)

    def test_dropped_orphan_lets_the_queue_move(self) -> None:
        """
        A request waiting for an orphan to yield is granted as soon as a newer
        session drops the orphan; the newer session then meets that grant.
        """
        state = new_state()
        state.restore(
            [stored("a" * 32, LeaseHolder("alice", "c1", session(3)), WRITE, 200.0)], 100.0
        )
        tool = LeaseHolder("alice", "c5")
        queued = state.request("/f", WRITE, tool, True, 101.0)[0]
        assert isinstance(queued, Queued)
        successor = LeaseHolder("alice", "c9", session(4))
        answer, effects = state.request("/f", WRITE, successor, False, 102.0)
        self.assertEqual(
            events(effects),
            [
                ("lease_release", "alice", "write", "conn_closed"),
                ("lease_grant", "alice", "write", ""),
                ("lease_revoke", "alice", "write", "contention"),
            ],
        )
        ((request_id, tool_grant),) = effects.answers
        self.assertEqual((request_id, granted(tool_grant).holder), (queued.request_id, tool))
        self.assertIsInstance(answer, LeaseDenied)
        (revoke,) = effects.revokes
        self.assertEqual(revoke.holder, tool)

    def test_orphan_expiry(self) -> None:
        """An orphan not reclaimed expires as a violation and fences nobody."""
        state = new_state()
        state.restore([stored("a" * 32, ALICE, WRITE, 130.0)], 100.0)
        effects = state.advance(130.0)
        self.assertEqual(events(effects), [("lease_violation", "alice", "write", "expired")])
        self.assertFalse(state.is_fenced(ALICE, "/f"))


def attrs_evolve_path(lease: Lease, path: str) -> Lease:
    return attrs.evolve(lease, path=path)


# A model-checking property over random operation sequences.

HOLDERS = (
    LeaseHolder("a0", "k0", session(1)),
    LeaseHolder("a1", "k1"),
    LeaseHolder("a2", "k2", "s2"),
    LeaseHolder("a0", "k3", session(1)),
    LeaseHolder("a0", "k4", session(2)),
)
PATHS = ("/p", "/q")
TERMINAL = {LeaseEventName.RELEASE, LeaseEventName.VIOLATION}


@attrs.frozen
class Request:
    path: str
    mode: LeaseMode
    holder: int
    wait: bool


@attrs.frozen
class Release:
    holder: int
    pick: int
    refresh: bool


@attrs.frozen
class Close:
    holder: int


@attrs.frozen
class Put:
    path: str
    holder: int


@attrs.frozen
class Advance:
    seconds: float


@attrs.frozen
class Withdraw:
    pick: int


Operation = Request | Release | Close | Put | Advance | Withdraw

holder_index = st.integers(0, len(HOLDERS) - 1)
request = st.builds(
    Request, st.sampled_from(PATHS), st.sampled_from((READ, WRITE)), holder_index, st.booleans()
)
operation: st.SearchStrategy[Operation] = st.one_of(
    request,
    request,
    request,
    st.builds(Release, holder_index, st.integers(0, 7), st.booleans()),
    st.builds(Close, holder_index),
    st.builds(Put, st.sampled_from(PATHS), holder_index),
    st.builds(Advance, st.sampled_from((0.5, 2.0, 5.0, 10.0, 61.0))),
    st.builds(Withdraw, st.integers(0, 7)),
)

#: Leases a previous run may have left: a session write lease on /p (an
#: orphan that HOLDERS[0] and HOLDERS[3] may reclaim and HOLDERS[4], a newer
#: session, drops) and a read on /q.
LEFT_OVER = (
    Lease("e" * 32, "/p", WRITE, LeaseHolder("a0", "old", session(1)), 3, 0.0, 30.0),
    Lease("d" * 32, "/q", READ, LeaseHolder("a1", "old", "s1"), 2, 0.0, 30.0),
)


class _Model:
    """Checks one run of operations against the rules' invariants."""

    def __init__(self, test: SynchronousTestCase, restore: bool) -> None:
        self.test = test
        self.state = LeaseState(TIMINGS, counting_ids())
        self.now = 0.0
        self.history: dict[str, list[LeaseEventName]] = {}
        self.revoked: set[str] = set()
        self.queued: dict[int, LeaseHolder] = {}
        self.answered: set[int] = set()
        self.granted_order: dict[str, list[int]] = {}
        self.records: dict[str, Lease] = {}
        if restore:
            self.records = {lease.lease_id: lease for lease in LEFT_OVER}
            self.history = {lease.lease_id: [LeaseEventName.GRANT] for lease in LEFT_OVER}
            self.apply(self.state.restore(LEFT_OVER, 1.0))

    def apply(self, effects: LeaseEffects) -> None:
        check = self.test
        revoke_events = {
            (e.lease_id, e.reason) for e in effects.events if e.event is LeaseEventName.REVOKE
        }
        for event in effects.events:
            seen = self.history.setdefault(event.lease_id, [])
            if not seen:
                check.assertEqual(event.event, LeaseEventName.GRANT)
            check.assertFalse(seen and seen[-1] in TERMINAL, "event after the lease ended")
            if event.event is LeaseEventName.REVOKE:
                self.revoked.add(event.lease_id)
            if event.reason is LeaseReason.REVOKE_TIMEOUT:
                check.assertIn(event.lease_id, self.revoked)
            seen.append(event.event)
        for revoke in effects.revokes:
            check.assertIn(revoke.lease_id, self.revoked)
            if any(e.event is LeaseEventName.REVOKE for e in effects.events):
                check.assertIn((revoke.lease_id, revoke.reason), revoke_events)
        for request_id, answer in effects.answers:
            check.assertIn(request_id, self.queued)
            check.assertNotIn(request_id, self.answered)
            self.answered.add(request_id)
            if isinstance(answer, LeaseGrant):
                order = self.granted_order.setdefault(answer.path, [])
                check.assertTrue(not order or order[-1] < request_id, "FIFO broken")
                order.append(request_id)
        for lease in effects.stored:
            self.records[lease.lease_id] = lease
        for key in effects.dropped:
            self.records.pop(key, None)
        self.check_invariants(effects)

    def check_invariants(self, effects: LeaseEffects) -> None:
        check = self.test
        state = self.state
        check.assertEqual(self.records, {lease.lease_id: lease for lease in state.leases()})
        for path in PATHS:
            leases = state.leases_on(path)
            holders = [lease.holder for lease in leases if not lease.orphan]
            check.assertEqual(len(holders), len(set(holders)), "two leases of one holder")
            if any(lease.mode is WRITE for lease in leases):
                check.assertEqual(len(leases), 1, "write lease beside another lease")
            for lease in leases:
                check.assertGreater(lease.ends_at, self.now)
            waiting = state.waiting(path)
            for request_id in waiting:
                deadline = state.waiter_deadline(request_id)
                assert deadline is not None
                check.assertGreater(deadline, self.now)
            if waiting:
                # The head waiter has asked every other holder to yield, in time.
                head = state.waiter_deadline(waiting[0])
                assert head is not None
                for lease in leases:
                    if lease.holder != self.queued[waiting[0]] or lease.orphan:
                        check.assertIsNotNone(lease.revoke_deadline)
                        check.assertLess(lease.ends_at, head)
            on_path = [e for e in effects.events if e.path == path]
            if on_path:
                check.assertEqual(on_path[-1].leases_on_path, len(leases))

    def run(self, op: Operation) -> None:
        state, now = self.state, self.now
        if isinstance(op, Request):
            holder = HOLDERS[op.holder]
            answer, effects = state.request(op.path, op.mode, holder, op.wait, now)
            if isinstance(answer, Queued):
                self.queued[answer.request_id] = holder
            self.apply(effects)
            if isinstance(answer, LeaseGrant):
                (lease,) = [x for x in state.leases_on(op.path) if x.holder == holder]
                self.test.assertEqual(lease.lease_id, answer.lease_id)
                self.test.assertTrue(lease.mode is WRITE or op.mode is READ)
                self.test.assertFalse(state.is_fenced(holder, op.path))
        elif isinstance(op, Release):
            ids = [*sorted(self.records), "f" * 32]
            lease_id, holder = ids[op.pick % len(ids)], HOLDERS[op.holder]
            if op.refresh:
                self.apply(state.refresh(lease_id, holder, now)[1])
            else:
                self.apply(state.release(lease_id, holder, LeaseReason.CLIENT, now)[1])
        elif isinstance(op, Close):
            self.apply(state.release_connection(HOLDERS[op.holder].connection_id, now))
        elif isinstance(op, Put):
            verdict, effects = state.manifest_put(op.path, HOLDERS[op.holder], now)
            self.apply(effects)
            if verdict is PutVerdict.PROCEED:
                writers = [x for x in state.leases_on(op.path) if x.mode is WRITE]
                self.test.assertTrue(all(x.holder == HOLDERS[op.holder] for x in writers))
        elif isinstance(op, Advance):
            self.now = now + op.seconds
            self.apply(state.advance(self.now))
        else:
            pending = sorted(set(self.queued) - self.answered) or [0]
            request_id = pending[op.pick % len(pending)]
            self.apply(state.withdraw(request_id, DenialReason.CANCELLED, now))

    def finish(self) -> None:
        self.now += 10 * TIMINGS.ttl
        self.apply(self.state.advance(self.now))
        check = self.test
        check.assertEqual(self.state.leases(), ())
        check.assertIsNone(self.state.next_deadline())
        check.assertEqual(set(self.queued), self.answered)
        for lease_id, seen in self.history.items():
            check.assertIn(seen[-1], TERMINAL, f"lease {lease_id} never ended")


class LeaseRulesPropertyTests(SynchronousTestCase):
    """
    Random sequences of operations keep the lease invariants.
    """

    @settings(max_examples=400, deadline=None)
    @given(st.lists(operation, max_size=40), st.booleans())
    def test_invariants(self, ops: list[Operation], restore: bool) -> None:
        """Exclusive writes, ordered events, FIFO answers, matching records, all leases end."""
        model = _Model(self, restore)
        for op in ops:
            model.run(op)
        model.finish()
