"""
L{ReconnectingClient}: which calls are sent again on a new connection, in
what order, how connection attempts are spaced, and switching connections
after a certificate renewal. Against scripted connections, and against the
real server protocol over in-memory TLS 1.3 (idle timeout, expired
credentials).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.task import Clock
from twisted.test.iosim import IOPump
from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane.factory import ServerLimits
from svc.dataplane.interfaces import OpReply
from svc.dataplane.test.fakes import TLSHarness
from svc.dataplane_client.client import DataPlaneClient, PushCallback, Reply
from svc.dataplane_client.errors import (
    AdmissionFailed,
    CallTimedOut,
    ConnectionGoingAway,
    NotExecuted,
    OutcomeUnknown,
)
from svc.dataplane_client.reconnecting import ReconnectingClient, ReconnectPolicy
from svc.wire.control import GoAway
from svc.wire.frame import Buffer


@attrs.define(eq=False)
class SentCall:
    op: str
    payload: Mapping[str, object]
    deferred: Deferred[Reply]


class ScriptedConnection:
    """A connection whose calls the test answers, fails or loses."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.sent: list[SentCall] = []
        self.goaway: GoAway | None = None
        self.closed = False
        self.pushes: list[PushCallback] = []
        self._closed_waiters: list[Deferred[None]] = []

    def call(
        self,
        op: str,
        payload: Mapping[str, object] | None = None,
        raw: Buffer = b"",
        *,
        timeout: float | None = None,
    ) -> Deferred[Reply]:
        if self.closed:
            return fail(NotExecuted("connection closed"))
        call = SentCall(op, dict(payload or {}), Deferred())
        self.sent.append(call)
        return call.deferred

    def on_push(self, callback: PushCallback) -> None:
        self.pushes.append(callback)

    @property
    def going_away(self) -> GoAway | None:
        return self.goaway

    def close(self) -> Deferred[None]:
        self._lost()
        return succeed(None)

    def when_closed(self) -> Deferred[None]:
        if self.closed:
            return succeed(None)
        waiter: Deferred[None] = Deferred()
        self._closed_waiters.append(waiter)
        return waiter

    def ops(self) -> list[str]:
        return [call.op for call in self.sent]

    def answer(self, index: int, payload: Mapping[str, object] | None = None) -> None:
        self.sent[index].deferred.callback(Reply(payload or {}))

    def lose(self) -> None:
        """The connection drops: unanswered calls fail, newest first (as the client does)."""
        pending = [call for call in self.sent if not call.deferred.called]
        self._lost()
        for call in reversed(pending):
            call.deferred.errback(OutcomeUnknown("connection lost"))

    def _lost(self) -> None:
        self.closed = True
        waiters, self._closed_waiters = self._closed_waiters, []
        for waiter in waiters:
            waiter.callback(None)


class Dialler:
    """The C{connect} callable: each attempt waits for the test to accept or refuse it."""

    def __init__(self) -> None:
        self.attempts: list[Deferred[ScriptedConnection]] = []
        self.connections: list[ScriptedConnection] = []

    def __call__(self) -> Deferred[ScriptedConnection]:
        attempt: Deferred[ScriptedConnection] = Deferred()
        self.attempts.append(attempt)
        return attempt

    def accept(self) -> ScriptedConnection:
        connection = ScriptedConnection(f"c{len(self.connections)}")
        self.connections.append(connection)
        self.attempts[-1].callback(connection)
        return connection

    def refuse(self, message: str = "connection refused") -> None:
        self.attempts[-1].errback(ConnectionRefusedError(message))


POLICY = ReconnectPolicy(call_timeout=60.0, connect_wait=10.0, backoff_initial=1.0, backoff_max=4.0)


def started() -> tuple[Clock, Dialler, ReconnectingClient, ScriptedConnection]:
    """A client whose first connection is open."""
    clock = Clock()
    dialler = Dialler()
    client = ReconnectingClient(clock, dialler, POLICY)
    done = client.start()
    first = dialler.accept()
    assert done.called
    return clock, dialler, client, first


def waits_then_fails(
    case: SynchronousTestCase, clock: Clock, result: Deferred[Any], seconds: float
) -> None:
    """C{result} is still waiting just before C{seconds} pass, and fails L{NotExecuted} then."""
    clock.advance(seconds - 0.001)
    case.assertNoResult(result)
    clock.advance(0.001)
    case.failureResultOf(result, NotExecuted)


class CallRoutingTests(SynchronousTestCase):
    """
    Calls go to the current connection; a dropped one is replaced on demand.
    """

    def test_call_uses_current_connection(self) -> None:
        """A call is sent on the open connection and fires with its reply."""
        _clock, dialler, client, first = started()
        result = client.call("head_file", {"path": "/a"})
        self.assertEqual(first.ops(), ["head_file"])
        first.answer(0, {"size": 3})
        self.assertEqual(self.successResultOf(result), Reply({"size": 3}))
        self.assertEqual(len(dialler.attempts), 1)
        self.assertTrue(client.connected)

    def test_start_retries_then_reports_the_last_error(self) -> None:
        """
        start tries again with the backoff for start_wait seconds, then
        fails with the last attempt's error and tries no more.
        """
        clock = Clock()
        dialler = Dialler()
        client = ReconnectingClient(clock, dialler, attrs.evolve(POLICY, start_wait=6.0))
        done = client.start()
        dialler.refuse("first")
        self.assertNoResult(done)
        for pause in (1.0, 2.0):  # attempts at 1 s and 3 s
            clock.advance(pause)
            dialler.refuse("again")
        clock.advance(4.0)  # the next pause would end past the 6 s
        self.assertEqual(len(dialler.attempts), 3)
        self.assertIn("again", str(self.failureResultOf(done, ConnectionRefusedError).value))
        clock.advance(100)
        self.assertEqual(len(dialler.attempts), 3)

    def test_start_succeeds_when_the_server_comes_up(self) -> None:
        """A data plane that answers within start_wait is adopted."""
        clock = Clock()
        dialler = Dialler()
        client = ReconnectingClient(clock, dialler, POLICY)
        done = client.start()
        dialler.refuse()
        clock.advance(1.0)
        dialler.accept()
        self.successResultOf(done)
        self.assertTrue(client.connected)

    def test_start_without_wait_tries_once(self) -> None:
        """start_wait 0: the first error is reported and nothing is retried."""
        clock = Clock()
        dialler = Dialler()
        client = ReconnectingClient(clock, dialler, attrs.evolve(POLICY, start_wait=0.0))
        done = client.start()
        dialler.refuse()
        self.failureResultOf(done, ConnectionRefusedError)
        clock.advance(100)
        self.assertEqual(len(dialler.attempts), 1)

    def test_idle_close_reconnects_on_demand(self) -> None:
        """A connection the server closed while idle is replaced only when a call comes."""
        clock, dialler, client, first = started()
        first.goaway = GoAway("idle_timeout")
        first.close()
        self.assertFalse(client.connected)
        clock.advance(1000)
        self.assertEqual(len(dialler.attempts), 1, "no attempt while nothing is asked")
        result = client.call("list", {"path": "/a"})
        second = dialler.accept()
        self.assertEqual(second.ops(), ["list"])
        second.answer(0)
        self.successResultOf(result)
        self.assertEqual(client.connections, 2)

    def test_goaway_received_stops_new_calls_there(self) -> None:
        """After GOAWAY, new calls wait for a new connection even before the old one closes."""
        _clock, dialler, client, first = started()
        running = client.call("chunk_get", {"hash": "h"})
        first.goaway = GoAway("shutdown")
        later = client.call("head_file", {"path": "/a"})
        second = dialler.accept()
        self.assertEqual((first.ops(), second.ops()), (["chunk_get"], ["head_file"]))
        first.answer(0)
        self.successResultOf(running)
        self.assertNoResult(later)

    def test_push_callbacks_follow_connections(self) -> None:
        """A push callback is registered on the current and on every later connection."""
        _clock, dialler, client, first = started()
        client.on_push(lambda op, payload, raw: None)
        first.close()
        client.call("ping")
        second = dialler.accept()
        self.assertEqual((len(first.pushes), len(second.pushes)), (1, 1))

    def test_reconnect_callbacks_send_before_waiting_calls(self) -> None:
        """
        A reconnect callback runs when a new connection replaces a lost one
        (not for the first), and what it sends goes before the calls that
        waited for the connection; a failing one does not stop the others.
        """
        _clock, dialler, client, first = started()
        reconnects: list[str] = []

        def broken() -> None:
            raise RuntimeError("bug")

        def refresh() -> None:
            reconnects.append("again")
            client.call("lease_refresh")

        client.on_reconnect(broken)
        client.on_reconnect(refresh)
        self.assertEqual(reconnects, [])
        first.close()
        waiting = client.call("head_file", {"path": "/a"})
        second = dialler.accept()
        self.assertEqual(reconnects, ["again"])
        self.assertEqual(second.ops(), ["lease_refresh", "head_file"])
        self.assertNoResult(waiting)
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)


class ResendTests(SynchronousTestCase):
    """
    What is sent again after a connection fails a call.
    """

    def test_not_executed_is_resent(self) -> None:
        """A write refused as not executed (GOAWAY crossing it) runs on the next connection."""
        _clock, dialler, client, first = started()
        result = client.call("manifest_put", {"path": "/a/f"})
        first.goaway = GoAway("shutdown")
        first.sent[0].deferred.errback(ConnectionGoingAway(first.goaway))
        second = dialler.accept()
        self.assertEqual(second.ops(), ["manifest_put"])
        second.answer(0, {"version": 2})
        self.assertEqual(self.successResultOf(result).payload, {"version": 2})

    def test_unknown_outcome_read_is_resent(self) -> None:
        """A read whose connection dropped is sent again."""
        _clock, dialler, client, first = started()
        result = client.call("chunk_get", {"hash": "h"})
        first.lose()
        second = dialler.accept()
        second.answer(0)
        self.successResultOf(result)

    def test_unknown_outcome_chunk_put_is_resent(self) -> None:
        """chunk_put is idempotent: sent again after an unknown outcome."""
        _clock, dialler, client, first = started()
        result = client.call("chunk_put", {"hash": "h"}, b"bytes")
        first.lose()
        second = dialler.accept()
        self.assertEqual(second.ops(), ["chunk_put"])

        second.answer(0, {"size": 5})
        self.successResultOf(result)

    def test_unknown_outcome_write_fails(self) -> None:
        """A write that may have run is not sent again: it fails OutcomeUnknown."""
        _clock, dialler, client, first = started()
        result = client.call("manifest_put", {"path": "/a/f"})
        first.lose()
        self.failureResultOf(result, OutcomeUnknown)
        self.assertEqual(dialler.attempts[1:], [], "no waiting call, no attempt")

    def test_timeout_is_not_resent(self) -> None:
        """A call that timed out fails; its connection stays in use."""
        _clock, dialler, client, first = started()
        result = client.call("chunk_get", {"hash": "h"})
        first.sent[0].deferred.errback(CallTimedOut("no answer in time", True))
        self.failureResultOf(result, CallTimedOut)
        self.assertTrue(client.connected)
        self.assertEqual(len(dialler.attempts), 1)

    def test_resent_in_original_order(self) -> None:
        """Calls waiting for the new connection are sent in the order they were made."""
        _clock, dialler, client, first = started()
        for index in range(4):
            client.call("chunk_put", {"n": index}, b"x")
        first.lose()  # fails them newest first
        second = dialler.accept()
        self.assertEqual([call.payload["n"] for call in second.sent], [0, 1, 2, 3])


class BackoffTests(SynchronousTestCase):
    """
    Connection attempts while the data plane is unreachable.
    """

    def test_attempts_back_off_then_call_fails_not_executed(self) -> None:
        """Attempts repeat at 1, 2, 4, 4 s; after connect_wait the call fails naming the error."""
        clock, dialler, client, first = started()
        first.close()
        result = client.call("list", {"path": "/a"})
        dialler.refuse("refused at 0.0")
        times = []
        for _ in range(3):
            before = len(dialler.attempts)
            while len(dialler.attempts) == before:
                clock.advance(0.5)
            times.append(clock.seconds())
            dialler.refuse(f"refused at {clock.seconds()}")
        self.assertEqual(times, [1.0, 3.0, 7.0])
        clock.advance(3)
        error = self.failureResultOf(result, NotExecuted).value
        self.assertIn("refused at 7.0", str(error))

    def test_attempts_stop_with_the_last_call_that_waits(self) -> None:
        """Before the outage is C{connect_wait} old, nobody waiting means no attempts."""
        clock, dialler, client, first = started()
        first.close()
        result = client.call("list", {"path": "/a"}, timeout=2.0)
        dialler.refuse()
        clock.advance(2)
        self.failureResultOf(result, NotExecuted)
        clock.advance(1)
        dialler.refuse()
        attempts = len(dialler.attempts)
        for _ in range(100):
            clock.advance(1)
        self.assertEqual(len(dialler.attempts), attempts)
        later = client.call("ping")
        dialler.refuse()
        waits_then_fails(self, clock, later, 10)  # a new outage, as far as anyone knows


class OutageTests(SynchronousTestCase):
    """
    Calls made during one outage share its C{connect_wait}; past it they
    fail at once while attempts go on by themselves.
    """

    def test_calls_in_one_outage_share_its_wait(self) -> None:
        """A call made 6 s into the outage waits 4 s, not C{connect_wait} (10 s)."""
        clock, dialler, client, first = started()
        first.close()
        early = client.call("list", {"path": "/a"})
        dialler.refuse()
        clock.advance(6)
        late = client.call("list", {"path": "/b"})
        clock.advance(4 - 0.001)
        self.assertNoResult(early)
        self.assertNoResult(late)
        clock.advance(0.001)
        self.failureResultOf(early, NotExecuted)
        self.failureResultOf(late, NotExecuted)

    def test_call_past_connect_wait_fails_at_once(self) -> None:
        """Once the outage is C{connect_wait} old, a call fails at once, naming it."""
        clock, dialler, client, first = started()
        first.close()
        self.fails_after(clock, client.call("ping"), 10)
        dialler.refuse("still refused")
        error = self.failureResultOf(client.call("ping"), NotExecuted).value
        self.assertIn("no data-plane connection for 10s", str(error))
        self.assertIn("still refused", str(error))

    def fails_after(self, clock: Clock, result: Deferred[Any], seconds: float) -> None:
        """Advance C{clock} by C{seconds}; C{result} then failed L{NotExecuted}."""
        clock.advance(seconds)
        self.failureResultOf(result, NotExecuted)

    def refused_for(self, clock: Clock, dialler: Dialler, client: ReconnectingClient) -> None:
        """
        A call waits out C{connect_wait} (10 s) with every attempt refused
        (at 0, 1, 3 and 7 s: the next is due at 11 s).
        """
        waiting = client.call("ping")
        while clock.seconds() < 10:
            if not dialler.attempts[-1].called:
                dialler.refuse()
            clock.advance(0.5)
        self.failureResultOf(waiting, NotExecuted)

    def test_call_past_connect_wait_asks_for_a_fresh_attempt(self) -> None:
        """
        Past C{connect_wait}, a call made in a pause between attempts makes
        one at once and is sent on the connection it opens.
        """
        clock, dialler, client, first = started()
        first.close()
        self.refused_for(clock, dialler, client)
        attempts = len(dialler.attempts)
        result = client.call("list", {"path": "/a"})
        self.assertEqual(len(dialler.attempts), attempts + 1)
        dialler.accept().answer(0)
        self.successResultOf(result)

    def test_fresh_attempt_refused_fails_its_calls(self) -> None:
        """The calls waiting for that one attempt fail with it, not after C{connect_wait}."""
        clock, dialler, client, first = started()
        first.close()
        self.refused_for(clock, dialler, client)
        one, two = client.call("ping"), client.call("ping")
        dialler.refuse("refused again")
        for result in (one, two):
            self.assertIn("refused again", str(self.failureResultOf(result, NotExecuted).value))
        late = client.call("ping")  # within backoff_initial of that answer
        self.assertIn("refused again", str(self.failureResultOf(late, NotExecuted).value))

    def test_fresh_attempt_waited_for_at_most_probe_wait(self) -> None:
        """An attempt that hangs fails its calls after C{probe_wait} (2 s)."""
        clock, dialler, client, first = started()
        first.close()
        self.refused_for(clock, dialler, client)
        result = client.call("ping")
        waits_then_fails(self, clock, result, 2)

    def test_attempts_go_on_past_connect_wait(self) -> None:
        """With nobody waiting, attempts repeat every C{backoff_max} seconds."""
        clock, dialler, client, first = started()
        first.close()
        result = client.call("ping")
        times = []
        while clock.seconds() < 30:
            if not dialler.attempts[-1].called:
                times.append(clock.seconds())
                dialler.refuse()
            clock.advance(0.5)
        self.failureResultOf(result, NotExecuted)
        self.assertEqual(times, [0.0, 1.0, 3.0, 7.0, 11.0, 15.0, 19.0, 23.0, 27.0])

    def test_connection_opened_by_itself_serves_the_next_call(self) -> None:
        """
        An attempt made with nobody waiting that succeeds runs the reconnect
        callbacks and ends the outage: the next call is sent on it.
        """
        clock, dialler, client, first = started()
        reconnected: list[int] = []
        client.on_reconnect(lambda: reconnected.append(len(dialler.connections)))
        first.close()
        self.refused_for(clock, dialler, client)
        clock.advance(1)
        self.assertNoResult(dialler.attempts[-1])  # made at 11 s, with nobody waiting
        second = dialler.accept()
        self.assertEqual(reconnected, [2])
        result = client.call("ping")
        second.answer(0)
        self.successResultOf(result)

    def test_a_later_outage_waits_again(self) -> None:
        """After a connection opened, the next outage's calls wait C{connect_wait} again."""
        clock, dialler, client, first = started()
        first.close()
        self.fails_after(clock, client.call("ping"), 10)
        second = dialler.accept()
        answered = client.call("ping")
        second.answer(0)
        self.successResultOf(answered)
        second.close()
        clock.advance(100)
        result = client.call("ping")
        dialler.refuse()
        waits_then_fails(self, clock, result, 10)

    def test_recovers_when_server_returns(self) -> None:
        """A call waiting through failed attempts runs once an attempt succeeds."""
        clock, dialler, client, first = started()
        first.close()
        result = client.call("list", {"path": "/a"})
        dialler.refuse()
        clock.advance(1)
        second = dialler.accept()
        second.answer(0)
        self.successResultOf(result)

    def test_call_budget_bounds_the_wait(self) -> None:
        """A call never waits for a connection past its own timeout."""
        clock, dialler, client, first = started()
        first.close()
        result = client.call("list", {"path": "/a"}, timeout=2.0)
        clock.advance(2)
        self.failureResultOf(result, NotExecuted)
        dialler.accept()
        self.assertEqual(dialler.connections[-1].sent, [])

    def test_admitted_then_gone_at_once_backs_off(self) -> None:
        """A server that admits and at once goes away is retried with backoff, not in a spin."""
        clock, dialler, client, first = started()
        first.close()
        result = client.call("ping")
        self.assertEqual(len(dialler.attempts), 2, "the first reconnection is at once")
        for pause in (1.0, 2.0):
            going = dialler.accept()
            going.goaway = GoAway("shutdown")
            going.sent[-1].deferred.errback(ConnectionGoingAway(going.goaway))
            attempts = len(dialler.attempts)
            clock.advance(pause - 0.001)
            self.assertEqual(len(dialler.attempts), attempts, "no attempt before the pause")
            clock.advance(0.001)
            self.assertEqual(len(dialler.attempts), attempts + 1)
        dialler.accept().answer(0)
        self.successResultOf(result)

    def test_refused_admission_is_retried(self) -> None:
        """An admission refusal (a certificate renewed meanwhile?) is one more failed attempt."""
        clock, dialler, client, first = started()
        first.close()
        result = client.call("ping")
        dialler.attempts[-1].errback(AdmissionFailed("connection closed before HELLO", True))
        clock.advance(1)
        dialler.accept().answer(0)
        self.successResultOf(result)


class SwitchAndCloseTests(SynchronousTestCase):
    """
    Moving to a new connection on purpose, and closing.
    """

    def test_switch_moves_new_calls_and_closes_old_in_order(self) -> None:
        """After switch, new calls use the new connection; the old one closes after answering."""
        _clock, dialler, client, first = started()
        running = client.call("chunk_get", {"hash": "h"})
        switched = client.switch()
        second = dialler.accept()
        self.assertTrue(self.successResultOf(switched))
        self.assertTrue(first.closed)
        client.call("head_file", {"path": "/a"})
        self.assertEqual((first.ops(), second.ops()), (["chunk_get"], ["head_file"]))
        self.assertNoResult(running)

    def test_failed_switch_keeps_old_connection(self) -> None:
        """A switch whose connection attempt fails keeps the current connection."""
        _clock, dialler, client, first = started()
        switched = client.switch()
        dialler.refuse()
        self.assertFalse(self.successResultOf(switched))
        client.call("ping")
        self.assertEqual(first.ops(), ["ping"])

    def test_close_fails_waiting_calls(self) -> None:
        """close fails calls still waiting for a connection, and opens none."""
        clock, dialler, client, first = started()
        first.close()
        result = client.call("ping")
        self.successResultOf(client.close())
        self.failureResultOf(result, NotExecuted)
        dialler.accept()
        self.assertTrue(dialler.connections[-1].closed, "a late connection is closed at once")
        self.failureResultOf(client.call("ping"), NotExecuted)
        clock.advance(100)
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_close_with_a_reason(self) -> None:
        """Closed with a reason, waiting and later calls fail at once with it; none reconnects."""
        clock, dialler, client, first = started()
        first.close()
        waiting = client.call("ping")
        attempts = len(dialler.attempts)
        self.successResultOf(client.close("credentials revoked (serial 1f)"))
        error = self.failureResultOf(waiting, NotExecuted).value
        self.assertIn("credentials revoked (serial 1f)", str(error))
        later = self.failureResultOf(client.call("head_file", {"path": "/a"}), NotExecuted)
        self.assertIn("credentials revoked (serial 1f)", str(later.value))
        self.successResultOf(client.close())
        self.assertIn("credentials revoked", str(self.failureResultOf(client.call("ping")).value))
        clock.advance(100)
        self.assertEqual(len(dialler.attempts), attempts)


class RealProtocolTests(SynchronousTestCase):
    """
    Over the real client and server protocols (in-memory TLS 1.3).
    """

    def setUp(self) -> None:
        self.harness = TLSHarness(ServerLimits(idle_timeout=30.0))
        self.pumps: list[IOPump] = []

        def connect() -> Deferred[DataPlaneClient]:
            protocol, pump = self.harness.connect_client(self.harness.agent())
            self.pumps.append(pump)
            return succeed(DataPlaneClient(protocol))

        self.client = ReconnectingClient(self.harness.clock, connect, POLICY)
        self.successResultOf(self.client.start())

    def flush(self) -> None:
        for pump in self.pumps:
            pump.flush()

    def test_survives_server_idle_timeout(self) -> None:
        """After the server's GOAWAY idle_timeout, the next call runs on a new connection."""
        self.harness.clock.advance(31)
        self.flush()
        self.assertFalse(self.client.connected)
        result = self.client.call("echo", {"n": 1})
        self.flush()
        self.assertEqual(self.successResultOf(result).payload, {"n": 1})
        self.assertEqual(self.client.connections, 2)
        self.assertEqual(
            [handler.closed_reasons for handler in self.harness.service.handlers],
            [["idle_timeout"], []],
        )

    def test_call_crossing_expired_credentials_runs_on_new_connection(self) -> None:
        """A call not run before GOAWAY credentials_expired runs after reconnecting."""
        handler = self.harness.service.handlers[0]
        handler.sink.disconnect("credentials_expired")
        crossing = self.client.call("echo", {"n": 2})
        self.flush()
        self.flush()
        self.assertEqual(self.successResultOf(crossing).payload, {"n": 2})
        self.assertEqual(handler.handled, [])
        second = self.harness.service.handlers[1]
        self.assertEqual([op for op, _, _ in second.handled], ["echo"])

    def test_held_call_answered_before_switch_completes(self) -> None:
        """Switching connections lets the old one answer what it is running."""
        running = self.client.call("hold")
        self.flush()
        switched = self.client.switch()
        self.flush()
        self.assertNoResult(switched)
        self.harness.service.handlers[0].held[0].deferred.callback(OpReply({"ok": True}))
        self.flush()
        self.assertEqual(self.successResultOf(running).payload, {"ok": True})
        self.assertTrue(self.successResultOf(switched))
        after = self.client.call("echo", {"n": 3})
        self.flush()
        self.successResultOf(after)
        self.assertEqual([op for op, _, _ in self.harness.service.handlers[1].handled], ["echo"])
