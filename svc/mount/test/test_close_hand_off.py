"""Tests for L{svc.mount.close_hand_off.HandOffs}, with stand-in write-backs."""

from __future__ import annotations

import errno
from collections.abc import Callable

from twisted.internet.defer import Deferred, succeed
from twisted.trial.unittest import SynchronousTestCase

from svc.mount.attributes import QuotaReport
from svc.mount.close_hand_off import HAND_OFF_HEADROOM, HandOffs
from svc.mount.errors import FSError


class StandIn:
    """A write-back the test drives: C{send()}, then C{answer()} or C{fail()}."""

    def __init__(self) -> None:
        self.on_sent: Callable[[], None] | None = None
        self.done: Deferred[None] = Deferred()

    async def __call__(self, on_sent: Callable[[], None]) -> None:
        self.on_sent = on_sent
        await self.done

    def send(self) -> None:
        assert self.on_sent is not None
        self.on_sent()


class HandOffTests(SynchronousTestCase):
    """What a handed-off close returns, and what the rest of it leaves."""

    def setUp(self) -> None:
        self.hand_offs = HandOffs(durable_close=False, quota=None)

    def allowed(self, size: int = 10) -> bool:
        result: bool = self.successResultOf(
            Deferred.fromCoroutine(self.hand_offs.allowed(size, read_only=False))
        )
        return result

    def test_returns_once_sent_and_settles_once_answered(self) -> None:
        """The close fires at the send; shutdown's wait at the answer."""
        write_back = StandIn()
        closed = self.hand_offs.hand_off(1, 10, write_back)
        settled = self.hand_offs.settled()
        self.assertNoResult(closed)
        write_back.send()
        self.successResultOf(closed)
        self.assertNoResult(settled)
        write_back.done.callback(None)
        self.successResultOf(settled)
        self.assertTrue(self.allowed())

    def test_a_failure_before_sending_is_the_close_result(self) -> None:
        """Nothing sent yet: the close fails with the write-back's error."""
        write_back = StandIn()
        closed = self.hand_offs.hand_off(1, 10, write_back)
        write_back.done.errback(FSError(errno.EACCES, "denied"))
        self.assertEqual(self.failureResultOf(closed, FSError).value.errno, errno.EACCES)
        self.assertTrue(self.allowed(), "reported to the program: closes still hand off")

    def test_a_failure_after_sending_makes_closes_wait(self) -> None:
        """A failure behind a returned close: closes wait until a commit succeeds."""
        write_back = StandIn()
        closed = self.hand_offs.hand_off(1, 10, write_back)
        write_back.send()
        self.successResultOf(closed)
        write_back.done.errback(FSError(errno.EIO, "connection lost"))
        self.assertFalse(self.allowed())
        self.hand_offs.committed()
        self.assertTrue(self.allowed())

    def test_bytes_in_flight_count_against_the_headroom(self) -> None:
        """Files handed off and still running count as used until they end."""
        report = QuotaReport(HAND_OFF_HEADROOM + 100, 0)
        hand_offs = HandOffs(durable_close=False, quota=lambda: succeed(report))
        write_back = StandIn()
        hand_offs.hand_off(1, 60, write_back)
        write_back.send()
        allowed = Deferred.fromCoroutine(hand_offs.allowed(50, read_only=False))
        self.assertFalse(self.successResultOf(allowed))
        write_back.done.callback(None)
        allowed = Deferred.fromCoroutine(hand_offs.allowed(50, read_only=False))
        self.assertTrue(self.successResultOf(allowed))

    def test_never_with_durable_close_or_read_only(self) -> None:
        """C{durable_close} and a read-only mount never hand off."""
        durable = HandOffs(durable_close=True, quota=None)
        self.assertFalse(
            self.successResultOf(Deferred.fromCoroutine(durable.allowed(1, read_only=False)))
        )
        self.assertFalse(
            self.successResultOf(Deferred.fromCoroutine(self.hand_offs.allowed(1, read_only=True)))
        )
