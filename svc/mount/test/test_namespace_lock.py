"""Tests for L{svc.mount.core.namespace_lock.NamespaceLock}."""

from __future__ import annotations

import errno

from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from svc.mount.core.errors import FSError
from svc.mount.core.namespace_lock import NamespaceLock
from svc.mount.core.op_ticket import OpTicket, run_with_ticket


def hold(
    lock: NamespaceLock,
    *,
    beside: bool = False,
    sending: bool = False,
    handing_off: bool = False,
    renaming: bool = False,
) -> tuple[Deferred[None], Deferred[None]]:
    """Take C{lock} in a coroutine: (fires once held, fire it to let go)."""
    held: Deferred[None] = Deferred()
    letting_go: Deferred[None] = Deferred()

    async def holding() -> None:
        if beside:
            async with lock.beside_commits():
                held.callback(None)
                await letting_go
        elif sending or renaming:
            async with lock.sending_commit(after_closes=renaming):
                held.callback(None)
                await letting_go
        elif handing_off:
            async with lock.handing_off():
                held.callback(None)
                await letting_go
        else:
            async with lock:
                held.callback(None)
                await letting_go

    Deferred.fromCoroutine(holding())
    return held, letting_go


class NamespaceLockTests(SynchronousTestCase):
    """The lock waits for commits in flight unless taken beside them."""

    def test_taken_at_once_with_nothing_in_flight(self) -> None:
        """No commit in flight, lock free: held at once."""
        lock = NamespaceLock()
        held, letting_go = hold(lock)
        self.successResultOf(held)
        self.assertTrue(lock.locked)
        letting_go.callback(None)
        self.assertFalse(lock.locked)

    def test_waits_for_commits_in_flight(self) -> None:
        """Held only once every commit sent has settled."""
        lock = NamespaceLock()
        first, second = lock.commit_sent(), lock.commit_sent()
        held, _ = hold(lock)
        self.assertNoResult(held)
        first()
        self.assertNoResult(held)
        second()
        self.successResultOf(held)

    def test_beside_commits_does_not_wait(self) -> None:
        """Taken beside commits: held with a commit in flight."""
        lock = NamespaceLock()
        lock.commit_sent()
        held, _ = hold(lock, beside=True)
        self.successResultOf(held)

    def test_commit_sent_while_waiting_for_the_lock(self) -> None:
        """
        A commit sent (beside) while an operation waited for the lock makes
        it wait for that commit too.
        """
        lock = NamespaceLock()
        sender, let_sender_go = hold(lock, beside=True)
        self.successResultOf(sender)
        held, _ = hold(lock)
        settle = lock.commit_sent()
        let_sender_go.callback(None)
        self.assertNoResult(held)
        self.assertFalse(lock.locked)
        settle()
        self.successResultOf(held)

    def test_settling_twice_counts_once(self) -> None:
        """The settle callable is idempotent."""
        lock = NamespaceLock()
        settle = lock.commit_sent()
        lock.commit_sent()
        settle()
        settle()
        self.assertEqual(lock.commits_in_flight, 1)
        self.assertNoResult(lock.commits_answered())

    def test_commits_answered(self) -> None:
        """Fires at once with nothing in flight, else when the last is settled."""
        lock = NamespaceLock()
        self.successResultOf(lock.commits_answered())
        settle = lock.commit_sent()
        settled = lock.commits_answered()
        self.assertNoResult(settled)
        settle()
        self.successResultOf(settled)

    def test_a_commit_answered_is_not_waited_for(self) -> None:
        """A commit whose answer came no longer holds up L{commits_answered}, though in flight."""
        lock = NamespaceLock()
        count = lock.commit_sent()
        answered = lock.commits_answered()
        self.assertNoResult(answered)
        count.answered()
        self.successResultOf(answered)
        self.assertEqual(lock.commits_in_flight, 1)
        count()
        self.assertEqual(lock.commits_in_flight, 0)

    def test_commits_not_sent_hold_off_while_commits_settle_is_awaited(self) -> None:
        """
        While something waits for the commits in flight, a commit about to
        be sent waits too (a stream of closes cannot keep it waiting), and
        goes once they are answered.
        """
        lock = NamespaceLock()
        settle = lock.commit_sent()
        settled = lock.commits_answered()
        sending = Deferred.fromCoroutine(self._send_commit(lock))
        self.assertNoResult(sending)
        settle()
        self.successResultOf(settled)
        self.successResultOf(sending)

    async def _send_commit(self, lock: NamespaceLock) -> None:
        async with lock.sending_commit():
            pass

    def test_sending_does_not_wait_for_commits_in_flight(self) -> None:
        """Sending a commit needs only the lock, commits in flight or not."""
        lock = NamespaceLock()
        lock.commit_sent()
        held, _ = hold(lock, sending=True)
        self.successResultOf(held)

    def test_a_waiting_change_goes_before_new_commits(self) -> None:
        """
        While an operation waits for the commits in flight, a new commit is
        not sent (a stream of closes cannot starve it); it is sent after.
        """
        lock = NamespaceLock()
        settle = lock.commit_sent()
        change, let_change_go = hold(lock)
        sender, _ = hold(lock, sending=True)
        self.assertNoResult(change)
        self.assertNoResult(sender)
        self.assertFalse(lock.locked)
        settle()
        self.successResultOf(change)
        self.assertNoResult(sender)
        let_change_go.callback(None)
        self.successResultOf(sender)

    def test_beside_commits_does_not_wait_for_a_waiting_change(self) -> None:
        """Work beside commits (a conflict copy of a commit in flight) is not held back."""
        lock = NamespaceLock()
        lock.commit_sent()
        change, _ = hold(lock)
        beside, _ = hold(lock, beside=True)
        self.assertNoResult(change)
        self.successResultOf(beside)


class HandOffsInFlightTests(SynchronousTestCase):
    """
    Handed-off changes (unlinks, renames): exclusive holders wait for them,
    the next handed-off change does not.
    """

    def test_exclusive_waits_for_handed_off_changes(self) -> None:
        """Held only once every handed-off change sent has settled."""
        lock = NamespaceLock()
        settle = lock.hand_off_sent()
        self.assertEqual(lock.hand_offs_in_flight, 1)
        held, _ = hold(lock)
        self.assertNoResult(held)
        settle()
        settle()  # idempotent
        self.successResultOf(held)
        self.assertEqual(lock.hand_offs_in_flight, 0)

    def test_handing_off_waits_for_commits_not_handed_off_changes(self) -> None:
        """The next change goes beside handed-off ones in flight, but after commits in flight."""
        lock = NamespaceLock()
        lock.hand_off_sent()
        held, letting_go = hold(lock, handing_off=True)
        self.successResultOf(held)
        letting_go.callback(None)
        commit = lock.commit_sent()
        held, _ = hold(lock, handing_off=True)
        self.assertNoResult(held)
        commit()
        self.successResultOf(held)

    def test_vacated_waits_for_changes_leaving_the_name(self) -> None:
        """
        L{NamespaceLock.vacated} waits while a handed-off change counted for
        the name it leaves is in flight, for that name only.
        """
        lock = NamespaceLock()
        first = lock.hand_off_sent(7, leaving=(1, "a"))
        second = lock.hand_off_sent(leaving=(1, "a"))
        waiting = Deferred.fromCoroutine(lock.vacated(1, "a"))
        self.successResultOf(Deferred.fromCoroutine(lock.vacated(1, "b")))
        self.successResultOf(Deferred.fromCoroutine(lock.vacated(2, "a")))
        self.assertTrue(lock.moving(7))
        first()
        self.assertFalse(lock.moving(7))
        self.assertNoResult(waiting)
        second()
        self.successResultOf(waiting)
        self.assertEqual(lock.hand_offs_in_flight, 0)

    def test_handing_off_lets_a_waiting_exclusive_go_first(self) -> None:
        """An exclusive holder waiting for handed-off changes is not overtaken by further ones."""
        lock = NamespaceLock()
        settle = lock.hand_off_sent()
        exclusive, release_exclusive = hold(lock)
        handed, _ = hold(lock, handing_off=True)
        self.assertNoResult(exclusive)
        self.assertNoResult(handed)
        settle()
        self.successResultOf(exclusive)
        self.assertNoResult(handed)
        release_exclusive.callback(None)
        self.successResultOf(handed)


async def _exclusive(lock: NamespaceLock) -> None:
    async with lock:
        pass


class UnsentClosesTests(SynchronousTestCase):
    """
    Closes answered before their commits were sent: namespace changes wait
    for them to send, commits do not.
    """

    def setUp(self) -> None:
        self.lock = NamespaceLock()

    def test_namespace_changes_wait_commits_do_not(self) -> None:
        """
        An exclusive holder, a handing-off change and a rename beside the
        commits wait while a close answered early has not sent its commit;
        another commit's sending does not, even with them waiting (they do
        not count as waiting yet, so the close's own commit can go out).
        """
        unsent = self.lock.close_answered()
        waiting = [
            hold(self.lock)[0],
            hold(self.lock, handing_off=True)[0],
            hold(self.lock, renaming=True)[0],
        ]
        for held in waiting:
            self.assertNoResult(held)
        sent, let_go = hold(self.lock, sending=True)
        self.successResultOf(sent)
        settle = self.lock.commit_sent()
        let_go.callback(None)
        unsent()
        unsent()  # idempotent
        for held in waiting:
            self.assertNoResult(held)  # now the commit in flight holds them
        settle()
        self.successResultOf(waiting[0])


class StalledTests(SynchronousTestCase):
    """
    While a handed-off change cannot be settled (the data plane cannot be
    asked), operations that would wait for it fail EIO instead of holding a
    FUSE worker until their timeout.
    """

    def assertEIO(self, result: Deferred[None]) -> None:
        error = self.failureResultOf(result, FSError).value
        assert isinstance(error, FSError)
        self.assertEqual(error.errno, errno.EIO)
        self.assertIn("no connection for 20s", str(error))

    def test_exclusive_holder_fails_at_once_while_stalled(self) -> None:
        """An exclusive holder arriving while a handed-off change is stalled fails EIO."""
        lock = NamespaceLock()
        lock.hand_off_sent()
        lock.stalled("no connection for 20s")
        self.assertEIO(Deferred.fromCoroutine(_exclusive(lock)))
        self.assertFalse(lock.locked)

    def test_waiting_exclusive_holder_fails_when_the_stall_begins(self) -> None:
        """One already waiting for the change fails as soon as it stalls."""
        lock = NamespaceLock()
        lock.hand_off_sent()
        waiting = Deferred.fromCoroutine(_exclusive(lock))
        self.assertNoResult(waiting)
        lock.stalled("no connection for 20s")
        self.assertEIO(waiting)

    def test_vacated_fails_while_stalled(self) -> None:
        """Waiting for a name a stalled rename moves away from fails EIO too."""
        lock = NamespaceLock()
        lock.hand_off_sent(7, leaving=(1, "a"))
        waiting = Deferred.fromCoroutine(lock.vacated(1, "a"))
        lock.stalled("no connection for 20s")
        self.assertEIO(waiting)
        self.successResultOf(Deferred.fromCoroutine(lock.vacated(1, "b")))

    def test_waits_again_once_the_stall_ends(self) -> None:
        """After the stall ends (the server answered), holders wait for the change as before."""
        lock = NamespaceLock()
        settle = lock.hand_off_sent()
        end = lock.stalled("no connection for 20s")
        end()
        end()
        waiting = Deferred.fromCoroutine(_exclusive(lock))
        self.assertNoResult(waiting)
        settle()
        self.successResultOf(waiting)

    def test_settled_change_is_not_waited_for_even_if_stalled(self) -> None:
        """With nothing handed off in flight, a stall elsewhere does not fail anyone."""
        lock = NamespaceLock()
        lock.stalled("no connection for 20s")
        self.successResultOf(Deferred.fromCoroutine(_exclusive(lock)))

    def test_other_users_of_the_lock_are_not_failed(self) -> None:
        """Commits and further hand-offs do not wait for handed-off changes: unaffected."""
        lock = NamespaceLock()
        lock.hand_off_sent()
        lock.stalled("no connection for 20s")
        sending, release_sending = hold(lock, sending=True)
        self.successResultOf(sending)
        release_sending.callback(None)
        handing, _ = hold(lock, handing_off=True)
        self.successResultOf(handing)


class AbandonedTests(SynchronousTestCase):
    """
    An operation whose program was answered without it (its ticket
    abandoned) stops waiting for the lock, fails EIO, and never holds it.
    """

    def waiting(self, lock: NamespaceLock, how: str, ticket: OpTicket) -> Deferred[None]:
        async def take() -> None:
            if how == "beside":
                async with lock.beside_commits():
                    pass
            elif how == "sending":
                async with lock.sending_commit():
                    pass
            elif how == "handing_off":
                async with lock.handing_off():
                    pass
            else:
                async with lock:
                    pass

        return run_with_ticket(ticket, lambda: Deferred.fromCoroutine(take()))

    def test_every_way_of_taking_the_lock(self) -> None:
        """Exclusive, beside commits, sending a commit, handing off: each gives up."""
        for how in ("exclusive", "beside", "sending", "handing_off"):
            lock = NamespaceLock()
            _held, release = hold(lock)
            ticket = OpTicket()
            waiting = self.waiting(lock, how, ticket)
            self.assertNoResult(waiting)
            ticket.abandon()
            error = self.failureResultOf(waiting, FSError).value
            assert isinstance(error, FSError)
            self.assertEqual(error.errno, errno.EIO, how)
            release.callback(None)
            self.assertFalse(lock.locked, how)

    def test_waiting_for_commits_gives_up(self) -> None:
        """An exclusive holder waiting for commits in flight gives up too; the commits go on."""
        lock = NamespaceLock()
        settle = lock.commit_sent()
        ticket = OpTicket()
        waiting = self.waiting(lock, "exclusive", ticket)
        ticket.abandon()
        self.failureResultOf(waiting, FSError)
        settle()
        self.assertEqual(lock.commits_in_flight, 0)
        self.assertFalse(lock.locked)

    def test_free_lock_is_not_kept_by_an_operation_already_abandoned(self) -> None:
        """
        Abandoned while it waited for something else, an operation then finds
        the lock free: it fails EIO, and the lock it was given is released.
        """
        for how in ("exclusive", "beside", "sending", "handing_off"):
            lock = NamespaceLock()
            ticket = OpTicket()
            ticket.abandon()
            error = self.failureResultOf(self.waiting(lock, how, ticket), FSError).value
            assert isinstance(error, FSError)
            self.assertEqual(error.errno, errno.EIO, how)
            self.assertFalse(lock.locked, how)
