"""Tests for L{svc.mount.writeback.close_hand_off.HandOffs}, with stand-in write-backs."""

from __future__ import annotations

import errno
from collections.abc import Callable

from twisted.internet.defer import Deferred, succeed
from twisted.trial.unittest import SynchronousTestCase

from svc.mount.core.attributes import QuotaReport
from svc.mount.core.errors import FSError
from svc.mount.writeback.close_hand_off import (
    HAND_OFF_HEADROOM,
    HAND_OFF_MAX_BYTES,
    HAND_OFF_MAX_FILES,
    HAND_OFF_MAX_IN_FLIGHT_BYTES,
    HandOffs,
)


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

    def test_never_while_the_connection_is_down(self) -> None:
        """
        While the data plane's connection is not open, a close waits for
        its commit's answer (which comes once a new connection takes it, or
        as the error the program hears); once it is open again, closes hand
        off again.
        """
        up = [False]
        hand_offs = HandOffs(durable_close=False, quota=None, connected=lambda: up[0])
        allowed = Deferred.fromCoroutine(hand_offs.allowed(1, read_only=False))
        self.assertFalse(self.successResultOf(allowed))
        up[0] = True
        allowed = Deferred.fromCoroutine(hand_offs.allowed(1, read_only=False))
        self.assertTrue(self.successResultOf(allowed))


class InFlightBoundTests(SynchronousTestCase):
    """Closes past the bound wait for the oldest commit in flight, then hand off."""

    def setUp(self) -> None:
        self.hand_offs = HandOffs(durable_close=False, quota=None)

    def asking(self, size: int = 10) -> Deferred[bool]:
        return Deferred.fromCoroutine(self.hand_offs.allowed(size, read_only=False))

    def fill(self, count: int, size: int = 10) -> list[StandIn]:
        write_backs = []
        for ino in range(count):
            write_back = StandIn()
            self.assertTrue(self.successResultOf(self.asking(size)))
            closed = self.hand_offs.hand_off(ino, size, write_back)
            write_back.send()
            self.successResultOf(closed)
            write_backs.append(write_back)
        return write_backs

    def test_file_count_bound(self) -> None:
        """At the count bound a close waits; one answer lets it hand off."""
        write_backs = self.fill(HAND_OFF_MAX_FILES)
        asked = self.asking()
        self.assertNoResult(asked)
        write_backs[0].done.callback(None)
        self.assertTrue(self.successResultOf(asked))

    def test_byte_bound(self) -> None:
        """Past the in-flight bytes a close waits too."""
        count = HAND_OFF_MAX_IN_FLIGHT_BYTES // HAND_OFF_MAX_BYTES
        self.assertLess(count, HAND_OFF_MAX_FILES)
        write_backs = self.fill(count, HAND_OFF_MAX_BYTES)
        asked = self.asking(1)
        self.assertNoResult(asked)
        write_backs[-1].done.callback(None)
        self.assertTrue(self.successResultOf(asked))

    def test_a_failure_while_waiting_makes_the_close_wait_for_its_own(self) -> None:
        """An answer that is a failure: the waiting close no longer hands off."""
        write_backs = self.fill(HAND_OFF_MAX_FILES)
        asked = self.asking()
        write_backs[0].done.errback(FSError(errno.EIO, "connection lost"))
        self.assertFalse(self.successResultOf(asked))
