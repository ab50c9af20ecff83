"""
Tests for L{svc.store.leases.LeaseTable} and L{svc.store.leases_schema}:
the lease table driven by a L{Clock}, recorded in a real ``leases.db``.
"""

from __future__ import annotations

import itertools
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import TypeVar

from twisted.internet.defer import CancelledError
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from svc.store.errors import NotFound
from svc.store.lease_values import (
    DenialReason,
    LeaseDenied,
    LeaseEvent,
    LeaseGrant,
    LeaseHolder,
    LeaseMode,
    LeaseReason,
    LeaseRevoke,
    LeaseTimings,
    PutVerdict,
)
from svc.store.leases import LeaseTable
from svc.store.leases_schema import CURRENT_VERSION, LeaseDatabase
from svc.store.sqlite_migrations import SchemaTooNew
from svc.testing.worker import ImmediateWorker, ManualWorker

T = TypeVar("T")

READ = LeaseMode.READ
WRITE = LeaseMode.WRITE
ALICE = LeaseHolder("alice", "conn-1", "mount:aa")
BOB = LeaseHolder("bob", "conn-2")
CAROL = LeaseHolder("carol", "conn-3")


class LeaseTableTests(SynchronousTestCase):
    """
    Tests for L{LeaseTable} with an inline worker.
    """

    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(1000)
        self.path = Path(self.mktemp())
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.revokes: list[LeaseRevoke] = []
        self.events: list[LeaseEvent] = []
        self.table = self.open_table()

    def tearDown(self) -> None:
        self.successResultOf(self.table.close())
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def open_table(self) -> LeaseTable:
        counter = itertools.count(1)
        return self.successResultOf(
            LeaseTable.open(
                self.path,
                ImmediateWorker(),
                self.clock,
                self.revokes.append,
                self.events.append,
                LeaseTimings(ttl=60.0, revoke_timeout=10.0, wait_margin=5.0),
                lambda: f"{next(counter):032x}",
            )
        )

    def seen(self) -> list[tuple[str, str, str, str, str]]:
        """(event, agent, mode, reason, path) of each event so far, then forget them."""
        result = [
            (e.event.value, e.agent_id, e.mode.value, e.reason.value, e.path) for e in self.events
        ]
        del self.events[:]
        return result

    def rows(self) -> list[tuple[object, ...]]:
        with closing(sqlite3.connect(self.path)) as connection:
            return connection.execute(
                "SELECT lease_id, path, mode, agent_id, connection_id, session_id, epoch,"
                " expires_ms, revoke_reason FROM leases ORDER BY lease_id"
            ).fetchall()

    def grant(self, path: str, mode: LeaseMode, holder: LeaseHolder) -> LeaseGrant:
        answer = self.successResultOf(self.table.grant(path, mode, holder))
        assert isinstance(answer, LeaseGrant), answer
        return answer

    def test_grant_recorded(self) -> None:
        """A grant fires at once, emits lease_grant and is written to leases.db."""
        grant = self.grant("/a/f", WRITE, ALICE)
        self.assertEqual(grant.expires_at, 1060.0)
        self.assertEqual(self.seen(), [("lease_grant", "alice", "write", "", "/a/f")])
        self.assertEqual(
            self.rows(),
            [(grant.lease_id, "/a/f", "write", "alice", "conn-1", "mount:aa", 1, 1060000, None)],
        )

    def test_contention_revokes_each_holder(self) -> None:
        """A conflicting writer pushes one revoke (reason contention) per other holder."""
        self.grant("/f", READ, ALICE)
        self.grant("/f", READ, CAROL)
        self.seen()
        waiting = self.table.grant("/f", WRITE, BOB, wait=True)
        self.assertNoResult(waiting)
        self.assertEqual(
            [(r.holder, r.reason) for r in self.revokes],
            [
                (ALICE, LeaseReason.CONTENTION),
                (CAROL, LeaseReason.CONTENTION),
            ],
        )
        self.assertEqual(
            self.seen(),
            [
                ("lease_revoke", "alice", "read", "contention", "/f"),
                ("lease_revoke", "carol", "read", "contention", "/f"),
            ],
        )
        self.assertEqual({row[8] for row in self.rows()}, {"contention"})
        self.table.release_connection("conn-2")

    def test_no_wait_denied_after_revoke(self) -> None:
        """Without wait a conflicting writer is denied at once, the revoke still sent."""
        self.grant("/f", WRITE, ALICE)
        answer = self.successResultOf(self.table.grant("/f", WRITE, BOB, wait=False))
        self.assertEqual(answer, LeaseDenied("/f", WRITE, BOB, DenialReason.CONTENTION))
        self.assertEqual(len(self.revokes), 1)

    def test_waiter_granted_after_release(self) -> None:
        """The second writer is granted when the holder releases."""
        held = self.grant("/f", WRITE, ALICE)
        waiting = self.table.grant("/f", WRITE, BOB, wait=True)
        self.clock.advance(3)
        self.successResultOf(self.table.release(held.lease_id, ALICE))
        grant = self.successResultOf(waiting)
        assert isinstance(grant, LeaseGrant)
        self.assertEqual((grant.holder, grant.epoch, grant.expires_at), (BOB, 2, 1063.0))
        self.assertEqual(
            self.seen()[-2:],
            [
                ("lease_release", "alice", "write", "client", "/f"),
                ("lease_grant", "bob", "write", "", "/f"),
            ],
        )
        self.assertEqual([row[3] for row in self.rows()], ["bob"])

    def test_ignored_revoke(self) -> None:
        """A holder ignoring a revoke is dropped at the timeout, fenced, and the waiter granted."""
        self.grant("/f", WRITE, ALICE)
        waiting = self.table.grant("/f", WRITE, BOB, wait=True)
        self.seen()
        self.clock.advance(9.9)
        self.assertNoResult(waiting)
        self.clock.advance(0.1)
        grant = self.successResultOf(waiting)
        assert isinstance(grant, LeaseGrant)
        self.assertEqual(grant.holder, BOB)
        self.assertEqual(
            self.seen(),
            [
                ("lease_violation", "alice", "write", "revoke_timeout", "/f"),
                ("lease_grant", "bob", "write", "", "/f"),
            ],
        )
        self.assertTrue(self.table.is_fenced(ALICE, "/f"))
        self.assertFalse(self.table.check_write("/f", ALICE))
        self.assertEqual(self.table.manifest_put_contention("/f", ALICE), PutVerdict.FENCED)

    def test_expiry(self) -> None:
        """A lease not refreshed is dropped at expiry as lease_violation expired."""
        self.grant("/f", READ, ALICE)
        self.seen()
        self.clock.advance(59)
        self.assertEqual(self.seen(), [])
        self.clock.advance(1)
        self.assertEqual(self.seen(), [("lease_violation", "alice", "read", "expired", "/f")])
        self.assertEqual(self.table.leases(), ())
        self.assertEqual(self.rows(), [])

    def test_refresh_extends(self) -> None:
        """A refresh moves the expiry to now plus the TTL."""
        held = self.grant("/f", WRITE, ALICE)
        self.clock.advance(50)
        grant = self.successResultOf(self.table.refresh(held.lease_id, ALICE))
        self.assertEqual(grant.expires_at, 1110.0)
        self.assertEqual(self.seen()[-1], ("lease_refresh", "alice", "write", "", "/f"))
        self.assertEqual(self.rows()[0][7], 1110000)
        self.clock.advance(59)
        self.assertEqual(len(self.table.leases()), 1)
        self.clock.advance(1)
        self.assertEqual(self.table.leases(), ())

    def test_wrong_holder(self) -> None:
        """Another holder's refresh or release of a lease fails with NotFound."""
        held = self.grant("/f", WRITE, ALICE)
        self.failureResultOf(self.table.refresh(held.lease_id, BOB), NotFound)
        self.failureResultOf(self.table.release(held.lease_id, BOB), NotFound)
        self.failureResultOf(self.table.release("9" * 32, ALICE), NotFound)
        self.assertEqual(len(self.table.leases()), 1)

    def test_release_connection(self) -> None:
        """Closing a connection releases each of its leases with reason conn_closed."""
        self.grant("/a", READ, ALICE)
        self.grant("/b", WRITE, ALICE)
        self.grant("/c", WRITE, BOB)
        self.seen()
        self.successResultOf(self.table.release_connection("conn-1"))
        self.assertEqual(
            self.seen(),
            [
                ("lease_release", "alice", "read", "conn_closed", "/a"),
                ("lease_release", "alice", "write", "conn_closed", "/b"),
            ],
        )
        self.assertEqual([row[3] for row in self.rows()], ["bob"])

    def test_manifest_put_contention(self) -> None:
        """A put against another's write lease is refused; it revokes (manifest_put_contention)."""
        self.grant("/f", WRITE, ALICE)
        self.assertEqual(self.table.manifest_put_contention("/f", BOB), PutVerdict.CONTENDED)
        self.assertEqual(
            [(r.holder, r.reason) for r in self.revokes],
            [(ALICE, LeaseReason.MANIFEST_PUT_CONTENTION)],
        )
        self.assertEqual(self.table.manifest_put_contention("/f", ALICE), PutVerdict.PROCEED)
        self.assertEqual(self.table.manifest_put_contention("/g", BOB), PutVerdict.PROCEED)
        self.assertTrue(self.table.check_write("/g", BOB))

    def test_cancel_waiter(self) -> None:
        """Cancelling a waiting grant withdraws it; the next waiter is served instead."""
        held = self.grant("/f", WRITE, ALICE)
        first = self.table.grant("/f", WRITE, BOB, wait=True)
        second = self.table.grant("/f", WRITE, CAROL, wait=True)
        first.cancel()
        self.failureResultOf(first, CancelledError)
        self.successResultOf(self.table.release(held.lease_id, ALICE))
        grant = self.successResultOf(second)
        assert isinstance(grant, LeaseGrant)
        self.assertEqual(grant.holder, CAROL)

    def test_close_denies_waiters(self) -> None:
        """Closing answers waiting requests with shutdown and leaves no delayed call."""
        self.grant("/f", WRITE, ALICE)
        waiting = self.table.grant("/f", WRITE, BOB, wait=True)
        self.assertNotEqual(self.clock.getDelayedCalls(), [])
        self.successResultOf(self.table.close())
        answer = self.successResultOf(waiting)
        self.assertEqual(answer, LeaseDenied("/f", WRITE, BOB, DenialReason.SHUTDOWN))
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertRaises(RuntimeError, self.table.grant, "/g", READ, ALICE)
        self.successResultOf(self.table.close())

    def test_one_timer(self) -> None:
        """However many leases, one delayed call is pending, for the earliest deadline."""
        self.grant("/a", READ, ALICE)
        self.clock.advance(5)
        self.grant("/b", READ, ALICE)
        calls = self.clock.getDelayedCalls()
        self.assertEqual([call.getTime() for call in calls], [1060.0])  # type: ignore[misc]
        self.table.release_connection("conn-1")
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_failing_event_sink(self) -> None:
        """A sink that raises is logged and does not stop the operation."""

        def broken(value: object) -> None:
            raise RuntimeError("sink down")

        path = Path(self.mktemp())
        path.parent.mkdir(parents=True, exist_ok=True)
        table = self.successResultOf(
            LeaseTable.open(path, ImmediateWorker(), self.clock, broken, broken)
        )
        self.assertIsInstance(self.successResultOf(table.grant("/f", WRITE, ALICE)), LeaseGrant)
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        self.successResultOf(table.close())


class RestartTests(SynchronousTestCase):
    """
    Tests for what a reopened ``leases.db`` keeps.
    """

    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(1000)
        self.path = Path(self.mktemp())
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.events: list[LeaseEvent] = []
        self.revokes: list[LeaseRevoke] = []

    def open_table(self) -> LeaseTable:
        return self.successResultOf(
            LeaseTable.open(
                self.path, ImmediateWorker(), self.clock, self.revokes.append, self.events.append
            )
        )

    def test_restart(self) -> None:
        """Session write leases survive as orphans for their session; the rest are released."""
        table = self.open_table()
        kept = self.successResultOf(table.grant("/w", WRITE, ALICE))
        assert isinstance(kept, LeaseGrant)
        self.successResultOf(table.grant("/r", READ, ALICE))
        self.successResultOf(table.grant("/x", WRITE, BOB))
        self.successResultOf(table.close())
        del self.events[:]
        self.clock.advance(30)
        table = self.open_table()
        self.assertEqual(
            [(e.event.value, e.path, e.reason.value) for e in self.events],
            [("lease_release", "/r", "conn_closed"), ("lease_release", "/x", "conn_closed")],
        )
        (orphan,) = table.leases()
        self.assertTrue(orphan.orphan)
        self.assertFalse(table.check_write("/w", CAROL))
        again = LeaseHolder("alice", "conn-9", "mount:aa")
        grant = self.successResultOf(table.grant("/w", WRITE, again))
        assert isinstance(grant, LeaseGrant)
        self.assertEqual((grant.lease_id, grant.epoch), (kept.lease_id, kept.epoch))
        fresh = self.successResultOf(table.grant("/y", READ, CAROL))
        assert isinstance(fresh, LeaseGrant)
        self.assertEqual(fresh.epoch, 4)
        self.successResultOf(table.close())
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_orphan_expires(self) -> None:
        """An orphan nobody reclaims expires at its recorded expiry."""
        table = self.open_table()
        self.successResultOf(table.grant("/w", WRITE, ALICE))
        self.successResultOf(table.close())
        self.clock.advance(50)
        table = self.open_table()
        del self.events[:]
        self.clock.advance(10)
        self.assertEqual(
            [(e.event.value, e.reason.value) for e in self.events],
            [("lease_violation", "expired")],
        )
        self.assertEqual(table.leases(), ())
        self.successResultOf(table.close())

    def test_epoch_survives_empty_table(self) -> None:
        """Epochs keep increasing across restarts even when no lease row is left."""
        table = self.open_table()
        held = self.successResultOf(table.grant("/f", READ, BOB))
        assert isinstance(held, LeaseGrant)
        self.successResultOf(table.release(held.lease_id, BOB))
        self.successResultOf(table.close())
        table = self.open_table()
        again = self.successResultOf(table.grant("/f", READ, BOB))
        assert isinstance(again, LeaseGrant)
        self.assertEqual(again.epoch, held.epoch + 1)
        self.successResultOf(table.close())


class DeferredWriteTests(SynchronousTestCase):
    """
    Tests that answers wait for the record to be committed.
    """

    def test_grant_fires_after_commit(self) -> None:
        """A grant's Deferred fires only once its row has been written."""
        path = Path(self.mktemp())
        path.parent.mkdir(parents=True, exist_ok=True)
        worker = ManualWorker()
        clock = Clock()
        opening = LeaseTable.open(path, worker, clock, lambda r: None, lambda e: None)
        worker.run()
        table = self.successResultOf(opening)
        granting = table.grant("/f", WRITE, ALICE)
        self.assertNoResult(granting)
        worker.run()
        self.assertIsInstance(self.successResultOf(granting), LeaseGrant)
        closing = table.close()
        worker.run()
        self.successResultOf(closing)

    def test_cancel_after_decision(self) -> None:
        """A waiter cancelled between its grant and the commit gives the lease back."""
        path = Path(self.mktemp())
        path.parent.mkdir(parents=True, exist_ok=True)
        worker = ManualWorker()
        events: list[LeaseEvent] = []
        opening = LeaseTable.open(path, worker, Clock(), lambda r: None, events.append)
        worker.run()
        table = self.successResultOf(opening)
        held = table.grant("/f", WRITE, ALICE)
        waiting = table.grant("/f", WRITE, BOB, wait=True)
        worker.run()
        grant = self.successResultOf(held)
        assert isinstance(grant, LeaseGrant)
        table.release(grant.lease_id, ALICE)
        waiting.cancel()
        self.failureResultOf(waiting, CancelledError)
        worker.run()
        self.assertEqual(
            [(e.event.value, e.agent_id, e.reason.value) for e in events[-2:]],
            [("lease_grant", "bob", ""), ("lease_release", "bob", "client")],
        )
        self.assertEqual(table.leases(), ())
        closing = table.close()
        worker.run()
        self.successResultOf(closing)


class SchemaTests(SynchronousTestCase):
    """
    Tests for L{svc.store.leases_schema}.
    """

    def test_version(self) -> None:
        """A new database is at the current schema version, in WAL mode."""
        path = Path(self.mktemp())
        path.parent.mkdir(parents=True, exist_ok=True)
        LeaseDatabase.open(path).close()
        with closing(sqlite3.connect(path)) as connection:
            self.assertEqual(connection.execute("PRAGMA user_version").fetchone()[0], 1)
            self.assertEqual(connection.execute("PRAGMA journal_mode").fetchone()[0], "wal")
        self.assertEqual(CURRENT_VERSION, 1)

    def test_too_new(self) -> None:
        """A database from a newer schema version is refused."""
        path = Path(self.mktemp())
        path.parent.mkdir(parents=True, exist_ok=True)
        with closing(sqlite3.connect(path)) as connection:
            connection.execute("PRAGMA user_version = 99")
        self.assertRaises(SchemaTooNew, LeaseDatabase.open, path)

    def test_bad_row_refused(self) -> None:
        """The DDL refuses a row whose mode is not read or write."""
        path = Path(self.mktemp())
        path.parent.mkdir(parents=True, exist_ok=True)
        LeaseDatabase.open(path).close()
        connection = sqlite3.connect(path)
        self.addCleanup(connection.close)
        with self.assertRaises(sqlite3.IntegrityError):
            connection.execute(
                "INSERT INTO leases VALUES"
                " (?, '/f', 'append', 'a', 'c', NULL, 1, 0, 1, NULL, NULL)",
                ("0" * 32,),
            )
