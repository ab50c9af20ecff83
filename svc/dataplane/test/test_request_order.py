"""
Tests for L{svc.dataplane.request_order.RequestOrder}: which request of a
connection may start when.
"""

from __future__ import annotations

from itertools import pairwise

from twisted.internet.defer import CancelledError, Deferred
from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane.request_order import RequestOrder, Turn
from svc.wire.ops import Op


class RequestOrderTests(SynchronousTestCase):
    """Ordered, pipelined, after-earlier and unordered requests."""

    def setUp(self) -> None:
        self.order = RequestOrder()

    def test_ordered_requests_run_one_at_a_time(self) -> None:
        """The next ordered request starts when the one before ends."""
        first = self.order.enter(Op.MANIFEST_GET)
        second = self.order.enter(Op.LIST)
        self.successResultOf(first.ready)
        self.assertNoResult(second.ready)
        first.end()
        self.successResultOf(second.ready)

    def test_a_put_that_gave_way_lets_the_next_put_start(self) -> None:
        """
        A put queued in the database lets the next put start before it
        has ended (so the two share a transaction).
        """
        first = self.order.enter(Op.MANIFEST_PUT)
        second = self.order.enter(Op.MANIFEST_PUT)
        self.successResultOf(first.ready)
        self.assertNoResult(second.ready)
        first.release()
        self.successResultOf(second.ready)

    def test_every_namespace_change_that_gave_way_lets_the_next_change_start(self) -> None:
        """
        Removals, renames, creations, links and attribute changes give way
        as puts do: a stream of them (C{rm -r}, C{tar x}) shares transactions.
        """
        changes = [
            Op.MANIFEST_DELETE,
            Op.DIR_REMOVE,
            Op.MANIFEST_RENAME,
            Op.DIR_CREATE,
            Op.SETATTR,
            Op.SYMLINK,
            Op.MKNOD,
            Op.LINK,
            Op.MANIFEST_PUT,
        ]
        turns = [self.order.enter(op) for op in changes]
        for turn, following in pairwise(turns):
            self.successResultOf(turn.ready)
            self.assertNoResult(following.ready)
            turn.release()
        self.successResultOf(turns[-1].ready)

    def test_other_requests_wait_until_the_changes_have_ended(self) -> None:
        """
        A request that is not a namespace change waits for every change
        still finishing, not only for its turn: it sees their effects as if
        they ran one at a time.
        """
        first = self.order.enter(Op.MANIFEST_PUT)
        second = self.order.enter(Op.MANIFEST_DELETE)
        read = self.order.enter(Op.MANIFEST_GET)
        self.successResultOf(first.ready)
        first.release()
        self.successResultOf(second.ready)
        second.release()
        self.assertNoResult(read.ready)
        second.end()
        self.assertNoResult(read.ready)
        first.end()
        self.successResultOf(read.ready)

    def test_requests_after_earlier_ones_wait_for_finishing_puts(self) -> None:
        """C{statfs} (and C{chunk_get}, C{chunk_has}) wait for puts still finishing too."""
        put = self.order.enter(Op.MANIFEST_PUT)
        self.successResultOf(put.ready)
        put.release()
        statfs = self.order.enter(Op.STATFS)
        self.assertNoResult(statfs.ready)
        put.end()
        self.successResultOf(statfs.ready)
        # It held up nothing: the next ordered request starts at once.
        self.successResultOf(self.order.enter(Op.DIR_CREATE).ready)

    def test_a_lease_request_that_gave_way_is_not_waited_for(self) -> None:
        """
        Giving way is final for requests that are not puts (a lease request
        waiting in the lease table): later requests do not wait for their end.
        """
        lease = self.order.enter(Op.LEASE_GRANT)
        self.successResultOf(lease.ready)
        lease.release()
        self.successResultOf(self.order.enter(Op.MANIFEST_RENAME).ready)

    def test_unordered_requests_start_at_once(self) -> None:
        """C{chunk_put} and C{ping} wait for nothing."""
        self.successResultOf(self.order.enter(Op.MANIFEST_RENAME).ready)
        self.successResultOf(self.order.enter(Op.CHUNK_PUT).ready)
        self.successResultOf(self.order.enter(Op.PING).ready)

    def test_given_up_while_waiting_for_puts_gives_the_order_back(self) -> None:
        """
        A request cancelled while it waits for finishing puts (having taken
        its turn) gives the turn back: the request after it still runs,
        after the puts.
        """
        put = self.order.enter(Op.MANIFEST_PUT)
        self.successResultOf(put.ready)
        put.release()
        given_up = self.order.enter(Op.MANIFEST_GET)
        later = self.order.enter(Op.LIST)
        given_up.ready.cancel()
        self.failureResultOf(given_up.ready, CancelledError)
        given_up.end()
        self.assertNoResult(later.ready)
        put.end()
        self.successResultOf(later.ready)

    def test_drained_waits_for_finishing_puts(self) -> None:
        """A closed connection has drained only once its puts have ended."""
        put = self.order.enter(Op.MANIFEST_PUT)
        self.successResultOf(put.ready)
        put.release()
        drained = self.order.drained()
        self.assertNoResult(drained)
        put.end()
        self.successResultOf(drained)

    def test_ordered_requests_wait_for_the_fence(self) -> None:
        """Nothing ordered starts before the agent's closed connections drained."""
        fence: Deferred[None] = Deferred()
        order = RequestOrder(fence)
        put = order.enter(Op.MANIFEST_PUT)
        self.assertNoResult(put.ready)
        self.successResultOf(order.enter(Op.PING).ready)
        fence.callback(None)
        self.successResultOf(put.ready)

    def test_end_and_release_are_idempotent(self) -> None:
        """Ending twice, or releasing after the end, changes nothing."""
        put = self.order.enter(Op.MANIFEST_PUT)
        self.successResultOf(put.ready)
        put.release()
        put.end()
        put.end()
        put.release()
        first = self.order.enter(Op.MANIFEST_RENAME)
        second = self.order.enter(Op.MANIFEST_RENAME)
        self.successResultOf(first.ready)
        self.assertNoResult(second.ready)

    def test_puts_giving_way_at_once_start_one_after_the_other(self) -> None:
        """
        Thousands of puts waiting, each giving way as soon as it starts:
        each starts after the previous one's give-back has returned, not
        inside it (which overflowed the stack), and in arrival order.
        """
        blocker = self.order.enter(Op.MANIFEST_RENAME)
        started: list[int] = []

        def start(_: object, index: int, turn: Turn) -> None:
            started.append(index)
            turn.release()

        for index in range(5000):
            turn = self.order.enter(Op.MANIFEST_PUT)
            turn.ready.addCallback(start, index, turn)
        blocker.end()
        self.assertEqual(started, list(range(5000)))
