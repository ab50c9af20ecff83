"""
The answer budgets: three levels, FIFO waiting at each, everything given
back when a connection closes.
"""

from __future__ import annotations

from twisted.internet.defer import CancelledError, Deferred
from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane.answer_budget import (
    AnswerBudgets,
    AnswerLimits,
    ConnectionGone,
    Reservation,
)
from svc.store.chunks import MAX_CHUNK_SIZE

CHUNK = MAX_CHUNK_SIZE
LIMITS = AnswerLimits(per_connection=2 * CHUNK, per_agent=3 * CHUNK, server=4 * CHUNK)


def granted(waiting: Deferred[Reservation]) -> Reservation:
    """The reservation C{waiting} fired with (it must have)."""
    result: list[Reservation] = []
    waiting.addCallback(result.append)
    if not result:
        raise AssertionError("the reservation was not granted")
    return result[0]


class LimitsTests(SynchronousTestCase):
    """What L{AnswerLimits} accepts."""

    def test_defaults(self) -> None:
        """The defaults are 32 MiB per connection, 64 MiB per agent, 512 MiB in all."""
        limits = AnswerLimits()
        self.assertEqual(
            (limits.per_connection, limits.per_agent, limits.server),
            (32 << 20, 64 << 20, 512 << 20),
        )

    def test_each_holds_a_chunk_and_the_level_below(self) -> None:
        """A budget smaller than one largest chunk, or than the level below, is refused."""
        with self.assertRaises(ValueError):
            AnswerLimits(per_connection=CHUNK - 1)
        with self.assertRaises(ValueError):
            AnswerLimits(per_connection=2 * CHUNK, per_agent=CHUNK, server=4 * CHUNK)
        with self.assertRaises(ValueError):
            AnswerLimits(per_connection=CHUNK, per_agent=2 * CHUNK, server=CHUNK)


class ReserveTests(SynchronousTestCase):
    """Granting, waiting and giving back."""

    def setUp(self) -> None:
        self.budgets = AnswerBudgets(LIMITS)

    def test_granted_at_once_when_it_fits(self) -> None:
        """A reservation that fits all three budgets is granted at once and counted in each."""
        conn = self.budgets.connection("a")
        reservation = granted(conn.reserve(CHUNK))
        self.assertEqual(reservation.size, CHUNK)
        self.assertEqual(
            (conn.granted, self.budgets.agent_granted("a"), self.budgets.granted),
            (CHUNK, CHUNK, CHUNK),
        )
        reservation.release()
        reservation.release()
        self.assertEqual((conn.granted, self.budgets.granted), (0, 0))

    def test_connection_budget_waits_fifo(self) -> None:
        """Beyond the connection budget a reservation waits; releases grant in arrival order."""
        conn = self.budgets.connection("a")
        first = granted(conn.reserve(CHUNK))
        granted(conn.reserve(CHUNK))
        big: Deferred[Reservation] = conn.reserve(CHUNK)
        small: Deferred[Reservation] = conn.reserve(1)
        self.assertFalse(big.called)
        self.assertFalse(small.called, "a small one does not overtake a waiting large one")
        self.assertEqual(conn.waiting, 2)
        first.release()
        granted(big)
        self.assertFalse(small.called)

    def test_agent_budget_shared_by_its_connections(self) -> None:
        """The agent budget bounds all of the agent's connections; other agents are not held up."""
        one = self.budgets.connection("a")
        two = self.budgets.connection("a")
        held = [granted(one.reserve(CHUNK)), granted(one.reserve(CHUNK))]
        granted(two.reserve(CHUNK))
        waiting = two.reserve(CHUNK)
        self.assertFalse(waiting.called)
        other = self.budgets.connection("b")
        granted(other.reserve(CHUNK))
        held[0].release()
        granted(waiting)

    def test_server_budget_bounds_all_agents(self) -> None:
        """The server budget bounds everyone; its waiters are granted in order as bytes return."""
        agents = [self.budgets.connection(name) for name in "abcd"]
        held = [granted(conn.reserve(CHUNK)) for conn in agents]
        late = self.budgets.connection("e")
        first = late.reserve(CHUNK)
        second = self.budgets.connection("f").reserve(CHUNK)
        self.assertFalse(first.called or second.called)
        held[2].release()
        granted(first)
        self.assertFalse(second.called)
        held[0].release()
        granted(second)

    def test_a_stuck_connection_waits_in_its_own_queue(self) -> None:
        """A connection whose budget is full does not hold up another agent's reservations."""
        stuck = self.budgets.connection("a")
        granted(stuck.reserve(CHUNK))
        granted(stuck.reserve(CHUNK))
        for _ in range(5):
            stuck.reserve(CHUNK)
        other = self.budgets.connection("b")
        granted(other.reserve(CHUNK))

    def test_shrink_gives_back_the_rest(self) -> None:
        """Shrinking keeps only the answer's size and lets waiters in."""
        conn = self.budgets.connection("a")
        first = granted(conn.reserve(CHUNK))
        granted(conn.reserve(CHUNK))
        waiting = conn.reserve(CHUNK // 2)
        first.shrink(CHUNK // 2)
        self.assertEqual(first.size, CHUNK // 2)
        granted(waiting)
        self.assertEqual(self.budgets.granted, 2 * CHUNK)
        with self.assertRaises(ValueError):
            first.shrink(CHUNK)

    def test_larger_than_a_connection_budget_is_an_error(self) -> None:
        """A reservation that could never fit is a programming error, not a wait."""
        with self.assertRaises(ValueError):
            self.budgets.connection("a").reserve(2 * CHUNK + 1)

    def test_cancel_while_waiting(self) -> None:
        """A cancelled wait leaves its queue and gives back the levels it held."""
        one = self.budgets.connection("a")
        two = self.budgets.connection("a")
        held = [granted(one.reserve(CHUNK)), granted(one.reserve(CHUNK))]
        granted(two.reserve(CHUNK))
        waiting = two.reserve(CHUNK)  # holds two's level, waits at the agent's
        behind = two.reserve(CHUNK)
        self.assertEqual(two.granted, 2 * CHUNK)
        waiting.cancel()
        self.failureResultOf(waiting, CancelledError)
        self.assertFalse(behind.called)
        held[0].release()
        granted(behind)


class CloseTests(SynchronousTestCase):
    """A connection that closes gives back everything at once."""

    def setUp(self) -> None:
        self.budgets = AnswerBudgets(LIMITS)

    def test_close_returns_everything_and_fails_waiters(self) -> None:
        """Held bytes return to every level; waiting reservations fail with ConnectionGone."""
        conn = self.budgets.connection("a")
        held = [granted(conn.reserve(CHUNK)), granted(conn.reserve(CHUNK))]
        waiting = conn.reserve(CHUNK)
        other = self.budgets.connection("a")
        granted(other.reserve(CHUNK))
        other_waiting = other.reserve(CHUNK)
        self.assertFalse(other_waiting.called)
        conn.close()
        self.failureResultOf(waiting, ConnectionGone)
        granted(other_waiting)
        self.assertEqual((conn.granted, self.budgets.granted), (0, 2 * CHUNK))
        held[0].release()
        held[1].shrink(0)
        self.assertEqual(self.budgets.granted, 2 * CHUNK)
        self.failureResultOf(conn.reserve(1), ConnectionGone)

    def test_agent_budget_forgotten_with_its_last_connection(self) -> None:
        """An agent's budget exists while it has connections, and starts empty again."""
        conn = self.budgets.connection("a")
        granted(conn.reserve(CHUNK))
        conn.close()
        conn.close()
        self.assertEqual(self.budgets.agent_granted("a"), 0)
        again = self.budgets.connection("a")
        granted(again.reserve(CHUNK))
        granted(again.reserve(CHUNK))
