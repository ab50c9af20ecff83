"""Tests for L{svc.mount.core.op_ticket}: operations their program stopped waiting for."""

from __future__ import annotations

import errno

from twisted.internet.defer import Deferred, DeferredLock, succeed
from twisted.trial.unittest import SynchronousTestCase

from svc.mount.core.errors import FSError
from svc.mount.core.op_ticket import OpTicket, current_ticket, run_with_ticket, unless_abandoned


async def _wait(waiting: Deferred[str]) -> str:
    return await unless_abandoned(waiting)


class UnlessAbandonedTests(SynchronousTestCase):
    """L{unless_abandoned} waits for a Deferred unless the operation's ticket is abandoned."""

    def assertEIO(self, result: Deferred[object]) -> None:
        error = self.failureResultOf(result, FSError).value
        assert isinstance(error, FSError)
        self.assertEqual(error.errno, errno.EIO)

    def test_without_a_ticket_waits_as_before(self) -> None:
        """Code run outside any operation (no ticket) just waits."""
        waiting: Deferred[str] = Deferred()
        result = Deferred.fromCoroutine(_wait(waiting))
        self.assertNoResult(result)
        waiting.callback("done")
        self.assertEqual(self.successResultOf(result), "done")

    def test_result_when_it_comes_first(self) -> None:
        """The awaited result comes before any abandonment: it is the answer."""
        ticket = OpTicket()
        waiting: Deferred[str] = Deferred()
        result = run_with_ticket(ticket, lambda: Deferred.fromCoroutine(_wait(waiting)))
        waiting.callback("done")
        self.assertEqual(self.successResultOf(result), "done")
        ticket.abandon()  # later: nothing left to end

    def test_result_already_there_registers_nothing(self) -> None:
        """
        A Deferred that already has its result (a free lock) is awaited as
        it is: the ticket is not asked to tell of its abandonment.
        """
        asked: list[None] = []

        class Counting(OpTicket):
            def when_abandoned(self) -> Deferred[None]:
                asked.append(None)
                return super().when_abandoned()

        ticket = Counting()
        result = run_with_ticket(ticket, lambda: Deferred.fromCoroutine(_wait(succeed("x"))))
        self.assertEqual(self.successResultOf(result), "x")
        self.assertEqual(asked, [])
        waiting: Deferred[str] = Deferred()
        later = run_with_ticket(ticket, lambda: Deferred.fromCoroutine(_wait(waiting)))
        self.assertEqual(asked, [None], "a wait to come still races the ticket")
        waiting.callback("y")
        self.assertEqual(self.successResultOf(later), "y")

    def test_failure_when_it_comes_first(self) -> None:
        """A failure of the awaited Deferred is raised as it is."""
        waiting: Deferred[str] = Deferred()
        result = run_with_ticket(OpTicket(), lambda: Deferred.fromCoroutine(_wait(waiting)))
        waiting.errback(KeyError("x"))
        self.failureResultOf(result, KeyError)

    def test_abandoned_while_waiting_fails_eio_and_cancels_the_wait(self) -> None:
        """Abandoned first: EIO, and the wait is cancelled (a lock acquire leaves the queue)."""
        lock = DeferredLock()
        self.successResultOf(lock.acquire())
        ticket = OpTicket()
        result = run_with_ticket(
            ticket, lambda: Deferred.fromCoroutine(unless_abandoned(lock.acquire()))
        )
        self.assertNoResult(result)
        ticket.abandon()
        self.assertEIO(result)
        lock.release()
        self.assertFalse(lock.locked, "the abandoned operation never got the lock")

    def test_already_abandoned_fails_at_once(self) -> None:
        """A ticket abandoned before the wait begins: EIO at once, even if the result is there."""
        ticket = OpTicket()
        ticket.abandon()
        result = run_with_ticket(ticket, lambda: Deferred.fromCoroutine(_wait(succeed("x"))))
        self.assertEIO(result)

    def test_ticket_seen_across_awaits_and_only_there(self) -> None:
        """The operation's coroutine sees its ticket after awaiting; code outside does not."""
        ticket = OpTicket()
        later: Deferred[None] = Deferred()
        seen: list[OpTicket | None] = []

        async def operation() -> None:
            seen.append(current_ticket())
            await later
            seen.append(current_ticket())

        run_with_ticket(ticket, lambda: Deferred.fromCoroutine(operation()))
        self.assertIsNone(current_ticket())
        later.callback(None)
        self.assertEqual(seen, [ticket, ticket])
