"""
A data-plane caller that outlives its connections.

One TLS connection does not last as long as a mount: the server ends it
after an idle period (GOAWAY C{idle_timeout}), when it restarts (GOAWAY
C{shutdown}, or a plain connection loss), and when the certificate it was
admitted with expires (GOAWAY C{credentials_expired}), and the network may
drop it. L{ReconnectingClient} keeps the C{call(op, payload, raw, timeout=)}
seam of L{svc.dataplane_client.client.DataPlaneClient} over a succession of
connections, opened by a C{connect} callable (which picks up renewed
credentials each time it is called). The rules, from the client error tree
(L{svc.dataplane_client.errors}):

 - A connection is used until it fails a call as L{NotExecuted} or
   L{OutcomeUnknown} (other than a timeout), receives GOAWAY, or closes.
   Then it is dropped; the next call that needs one opens a new connection
   (on demand: an idle client holds no connection).
 - A call that was L{NotExecuted} is sent again on the next connection. A
   call whose outcome is unknown is sent again only when its op is in
   L{RESENDABLE_OPS} (reads, and C{chunk_put}, which stores the same bytes
   under the same name however often it runs); any other op fails with the
   L{OutcomeUnknown}, since it may have run.
 - Calls waiting for a connection are sent on it in the order they were
   first made (a request sees the effects of every earlier request on the
   same connection, and pipelined writers rely on that).
 - The data plane is out of reach from the moment a call finds no open
   connection until one opens. A call waits for a connection at most until
   C{connect_wait} seconds into that outage (and never past its own
   timeout), then fails L{NotExecuted} naming the last connection error:
   calls made during one outage share its wait, rather than each waiting
   C{connect_wait} anew (a mount's few FUSE workers would otherwise be held
   one after another, for everyone). Past that point a call waits only for
   one fresh attempt, made at once (at most C{probe_wait} seconds, shared
   by the calls that come meanwhile; a call right after a failed attempt,
   within C{backoff_initial}, fails at once), and attempts also go on
   without callers until one succeeds (the reconnect callbacks then run).
   While calls wait or the outage is past C{connect_wait}, attempts repeat
   with exponential backoff from C{backoff_initial} to C{backoff_max}
   seconds.
 - L{ReconnectingClient.switch} opens a connection first and then moves new
   calls to it, closing the old one in order (answers still expected are
   awaited): after a certificate renewal, no call sees a gap.
 - Callbacks given to L{ReconnectingClient.on_reconnect} run when a new
   connection replaces a lost one, before the calls waiting for it are sent
   on it: state the server kept per connection (write leases) can be asked
   for again first.

Design: ``docs/specifications/mount-runtime.md`` section 6.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import attrs
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.task import deferLater
from twisted.logger import Logger
from twisted.python.failure import Failure

from svc.backoff import Backoff, retrying
from svc.dataplane_client.client import DEFAULT_CALL_TIMEOUT, PushCallback, Reply
from svc.dataplane_client.errors import CallTimedOut, NotExecuted, OutcomeUnknown
from svc.timers import TimerClock
from svc.wire.commands import COMMANDS
from svc.wire.control import GoAway
from svc.wire.frame import Buffer

_log = Logger()

__all__ = [
    "RESENDABLE_OPS",
    "IConnection",
    "ReconnectClock",
    "ReconnectPolicy",
    "ReconnectingClient",
]

RESENDABLE_OPS = frozenset(op for op, command in COMMANDS.items() if command.resendable)
"""Ops that may run twice with the effect of running once: resent after an unknown outcome."""

CLOSING = "client closing"
"""Why calls fail after a plain L{ReconnectingClient.close}."""

FAILURE_LOG_INTERVAL = 60.0
"""Seconds between logged failed attempts while no call waits for them."""


class IConnection(Protocol):
    """The part of L{svc.dataplane_client.client.DataPlaneClient} this module uses."""

    def call(
        self,
        op: str,
        payload: Mapping[str, object] | None = None,
        raw: Buffer = b"",
        *,
        timeout: float | None = None,
    ) -> Deferred[Reply]:
        """Send C{op}."""

    def on_push(self, callback: PushCallback) -> None:
        """Deliver pushes to C{callback}."""

    @property
    def going_away(self) -> GoAway | None:
        """The server's GOAWAY, once received."""

    def close(self) -> Deferred[None]:
        """Close in order."""

    def when_closed(self) -> Deferred[None]:
        """Fires once the connection is gone."""


class ReconnectClock(TimerClock, Protocol):
    """The part of C{IReactorTime} used here (a reactor or a C{Clock})."""

    def seconds(self) -> float:
        """The current time in seconds."""


@attrs.frozen
class ReconnectPolicy:
    """
    How long calls wait for a connection and how attempts are spaced.

    @ivar call_timeout: a call's whole budget when it names none (seconds).
    @ivar connect_wait: the longest a call waits for a connection.
    @ivar backoff_initial: the pause after the first failed attempt.
    @ivar backoff_max: the longest pause between attempts.
    @ivar start_wait: how long L{ReconnectingClient.start} keeps trying to
        open the first connection (0: one attempt).
    @ivar probe_wait: the longest a call made past C{connect_wait} into an
        outage waits for the fresh attempt it asks for.
    """

    call_timeout: float = DEFAULT_CALL_TIMEOUT
    connect_wait: float = 20.0
    backoff_initial: float = 0.25
    backoff_max: float = 5.0
    start_wait: float = 60.0
    probe_wait: float = 2.0

    @property
    def backoff(self) -> Backoff:
        """The pauses between attempts: from C{backoff_initial}, doubling to C{backoff_max}."""
        return Backoff(initial=self.backoff_initial, maximum=self.backoff_max)


@attrs.define(eq=False, order=False)
class _Waiter:
    seq: int
    deferred: Deferred[IConnection]
    probe: bool = False
    """Waits for the next attempt only (made past C{connect_wait} into an outage)."""

    def __lt__(self, other: _Waiter) -> bool:
        return self.seq < other.seq


class ReconnectingClient:
    """
    See the module docstring. Call L{start} once; then L{call} as on one
    connection.

    @ivar connections: how many connections were admitted so far.
    """

    def __init__(
        self,
        clock: ReconnectClock,
        connect: Callable[[], Deferred[Any]],
        policy: ReconnectPolicy = ReconnectPolicy(),
    ) -> None:
        """
        @param clock: the reactor (or a test C{Clock}).
        @param connect: opens a connection and fires with it once the server
            admitted it (L{svc.dataplane_client.client.connect_dataplane} with the
            current credentials), or fails.
        """
        self._clock = clock
        self._connect = connect
        self._policy = policy
        self._current: IConnection | None = None
        self._waiters: list[_Waiter] = []
        self._connecting = False
        self._closed = False
        self._closed_reason = CLOSING
        self._last_error = "not connected yet"
        self._push_callbacks: list[PushCallback] = []
        self._reconnect_callbacks: list[Callable[[], object]] = []
        self._seq = itertools.count()
        self._answered = False
        self._on_probation = False
        self._quick_drops = 0
        self._missing_since: float | None = None
        self._failed_at = float("-inf")
        self._failures_logged_at = float("-inf")
        self._pausing: tuple[Deferred[None], Any] | None = None
        self.connections = 0

    # -- life cycle ---------------------------------------------------------

    def start(self) -> Deferred[None]:
        """
        Open the first connection, trying again with the backoff for up to
        C{start_wait} seconds (a data plane restarting while a sandbox
        starts: the enrollment token is already spent); then fails with the
        last attempt's error.
        """
        policy = self._policy

        async def starting() -> None:
            connection = await retrying(
                self._clock,
                "data plane not reachable yet",
                self._connect,
                backoff=policy.backoff,
                retryable=lambda error: not self._closed,
                give_up_after=policy.start_wait,
            )
            self._adopt(connection)

        return Deferred.fromCoroutine(starting())

    def switch(self) -> Deferred[bool]:
        """
        Open a new connection (with the credentials C{connect} now uses),
        send new calls on it and close the old one in order. Fires with
        whether it switched; a failed attempt keeps the old connection.
        """

        async def switching() -> bool:
            try:
                fresh = await self._connect()
            except Exception as error:
                _log.warn("could not open a new data-plane connection: {error}", error=error)
                return False
            if self._closed:
                await fresh.close()
                return False
            old, self._current = self._current, None
            self._adopt(fresh)
            if old is not None:
                await old.close()
            return True

        return Deferred.fromCoroutine(switching())

    def close(self, reason: str = CLOSING) -> Deferred[None]:
        """
        Close the connection in order and open no other: calls waiting for
        one, and every later call, fail L{NotExecuted} with C{reason} (for
        example, the server said the credentials are revoked).
        """
        if not self._closed:
            self._closed = True
            self._closed_reason = reason
        self._end_pause()
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.deferred.called:
                waiter.deferred.errback(NotExecuted(self._closed_reason))
        current, self._current = self._current, None
        if current is None:
            return succeed(None)
        return current.close()

    def on_push(self, callback: PushCallback) -> None:
        """Deliver the pushes of this and every later connection to C{callback}."""
        self._push_callbacks.append(callback)
        if self._current is not None:
            self._current.on_push(callback)

    def on_reconnect(self, callback: Callable[[], object]) -> None:
        """
        Call C{callback()} each time a new connection replaces a lost one,
        before the calls waiting for it are sent on it (so what it sends
        goes first); a failure is logged.
        """
        self._reconnect_callbacks.append(callback)

    @property
    def connected(self) -> bool:
        """Whether a connection is open and taking calls."""
        return self._usable(self._current)

    # -- calls --------------------------------------------------------------

    def call(
        self,
        op: str,
        payload: Mapping[str, object] | None = None,
        raw: Buffer = b"",
        *,
        timeout: float | None = None,
    ) -> Deferred[Reply]:
        """
        Send C{op} on the current connection, opening one if needed; see the
        module docstring for when it is sent again. Fails with the client's
        errors (L{NotExecuted} when no connection could be had in time).
        """
        seq = next(self._seq)
        budget = self._policy.call_timeout if timeout is None else timeout
        deadline = self._clock.seconds() + budget
        payload = payload or {}
        current = self._current
        if current is None or not self._usable(current):
            return Deferred.fromCoroutine(self._call(seq, deadline, op, payload, raw))
        # The common case, with a connection open: its call's Deferred with
        # callbacks, not the coroutine (every request of a mount comes through
        # here); a failure goes on as L{_call}'s loop would, in the coroutine.
        connection = current

        def answered(reply: Reply) -> Reply:
            if connection is self._current:
                self._answered = True
            return reply

        def failed(failure: Failure) -> Reply | Failure | Deferred[Reply]:
            error = failure.value
            if isinstance(error, CallTimedOut):
                return failure
            if isinstance(error, NotExecuted):
                self._drop(connection, error)
                if self._clock.seconds() >= deadline:
                    return failure
            elif isinstance(error, OutcomeUnknown):
                self._drop(connection, error)
                if op not in RESENDABLE_OPS or self._clock.seconds() >= deadline:
                    return failure
            else:
                return failure
            return Deferred.fromCoroutine(self._call(seq, deadline, op, payload, raw))

        remaining = max(0.0, deadline - self._clock.seconds())
        try:
            sent = connection.call(op, payload, raw, timeout=remaining)
        except Exception:
            sent = fail()
        return sent.addCallbacks(answered, failed)

    async def _call(
        self, seq: int, deadline: float, op: str, payload: Mapping[str, object], raw: Buffer
    ) -> Reply:
        while True:
            connection = await self._connection_for(seq, deadline)
            remaining = max(0.0, deadline - self._clock.seconds())
            try:
                reply = await connection.call(op, payload, raw, timeout=remaining)
            except CallTimedOut:
                raise
            except NotExecuted as error:
                self._drop(connection, error)
                if self._clock.seconds() >= deadline:
                    raise
            except OutcomeUnknown as error:
                self._drop(connection, error)
                if op not in RESENDABLE_OPS or self._clock.seconds() >= deadline:
                    raise
            else:
                if connection is self._current:
                    self._answered = True
                return reply

    def _usable(self, connection: IConnection | None) -> bool:
        return connection is not None and connection.going_away is None

    def _connection_for(self, seq: int, deadline: float) -> Deferred[IConnection]:
        current = self._current
        if self._usable(current):
            assert current is not None
            return succeed(current)
        if current is not None:
            self._drop(current, None)
        if self._closed:
            raise NotExecuted(self._closed_reason)
        now = self._clock.seconds()
        if self._missing_since is None:
            self._missing_since = now
        left = self._missing_since + self._policy.connect_wait - now
        probe = left <= 0
        if probe:
            if now - self._failed_at < self._policy.backoff_initial:
                self._ensure_connecting()
                raise self._out_of_reach_error()
            left = self._policy.probe_wait
        waiter = _Waiter(seq, Deferred(), probe)
        bisect.insort(self._waiters, waiter)
        wait = min(deadline - now, left)
        timer = self._clock.callLater(max(0.0, wait), self._gave_up, waiter)
        waiter.deferred.addBoth(_cancelling(timer))
        self._ensure_connecting()
        if probe:
            self._end_pause()
        return waiter.deferred

    def _out_of_reach_error(self) -> NotExecuted:
        since = self._missing_since
        seconds = 0.0 if since is None else self._clock.seconds() - since
        return NotExecuted(f"no data-plane connection for {seconds:.0f}s: {self._last_error}")

    def _gave_up(self, waiter: _Waiter) -> None:
        if waiter in self._waiters:
            self._waiters.remove(waiter)
        if not waiter.deferred.called:
            waiter.deferred.errback(
                self._out_of_reach_error()
                if waiter.probe
                else NotExecuted(f"no data-plane connection: {self._last_error}")
            )
        if not waiter.probe and self._out_of_reach() and not self._waiters:
            _log.warn(
                "data plane out of reach for {seconds}s ({error}): calls fail at once"
                " until a connection opens; attempts go on every {pause}s at most",
                seconds=self._policy.connect_wait,
                error=self._last_error,
                pause=self._policy.backoff_max,
            )

    def _out_of_reach(self) -> bool:
        """Whether the outage has lasted C{connect_wait}: calls fail at once."""
        since = self._missing_since
        return since is not None and self._clock.seconds() - since >= self._policy.connect_wait

    # -- connections --------------------------------------------------------

    def _drop(self, connection: IConnection, error: Exception | None) -> None:
        if connection is not self._current:
            return
        self._current = None
        # A reconnection that ended before answering anything (a server that
        # admits and then goes away at once, e.g. while stopping) counts as
        # a failed attempt, so reconnecting backs off instead of spinning.
        failed = self._on_probation and not self._answered
        self._quick_drops = self._quick_drops + 1 if failed else 0
        reason = connection.going_away
        why = f"GOAWAY {reason.reason}" if reason is not None else str(error or "closed")
        self._last_error = why
        _log.info("data-plane connection ended ({why}); the next call reconnects", why=why)

    def _adopt(self, connection: IConnection, *, reconnected: bool = False) -> None:
        self.connections += 1
        self._current = connection
        self._missing_since = None
        self._answered = False
        self._on_probation = reconnected
        for callback in self._push_callbacks:
            connection.on_push(callback)
        connection.when_closed().addCallback(lambda _: self._drop(connection, None))
        if reconnected:
            for reconnected_callback in self._reconnect_callbacks:
                try:
                    reconnected_callback()
                except Exception:
                    _log.failure(
                        "reconnect callback {callback} failed", callback=reconnected_callback
                    )
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.deferred.called:
                waiter.deferred.callback(connection)

    def _ensure_connecting(self) -> None:
        if not self._connecting:
            self._connecting = True
            Deferred.fromCoroutine(self._reconnect())

    async def _reconnect(self) -> None:
        backoff = self._policy.backoff
        attempt = 0
        clock: Any = self._clock
        try:
            if self._quick_drops:
                await deferLater(clock, backoff.delay(self._quick_drops))
            while (self._waiters or self._out_of_reach()) and not self._closed:
                attempt += 1
                try:
                    connection = await self._connect()
                except Exception as error:
                    self._last_error = str(error) or type(error).__name__
                    self._failed_at = clock.seconds()
                    self._attempt_failed(attempt)
                    self._fail_probes()
                    await self._pause(backoff.delay(attempt))
                    continue
                if self._closed:
                    await connection.close()
                    return
                _log.info("data-plane connection open again (attempt {attempt})", attempt=attempt)
                self._adopt(connection, reconnected=True)
                return
            # Nobody waits, and the outage is younger than connect_wait:
            # whether it goes on is unknown until the next call, which
            # waits afresh.
            self._missing_since = None
        finally:
            self._connecting = False

    def _pause(self, delay: float) -> Deferred[None]:
        """Fires after C{delay} seconds, or sooner on L{_end_pause}."""
        ended: Deferred[None] = Deferred()
        timer = self._clock.callLater(delay, self._end_pause)
        self._pausing = (ended, timer)
        return ended

    def _end_pause(self) -> None:
        """End the pause between attempts now, if one is going on."""
        pausing, self._pausing = self._pausing, None
        if pausing is not None:
            ended, timer = pausing
            if timer.active():
                timer.cancel()
            ended.callback(None)

    def _fail_probes(self) -> None:
        """An attempt failed: the calls that waited for one attempt fail."""
        probes = [waiter for waiter in self._waiters if waiter.probe]
        self._waiters = [waiter for waiter in self._waiters if not waiter.probe]
        for waiter in probes:
            if not waiter.deferred.called:
                waiter.deferred.errback(self._out_of_reach_error())

    def _attempt_failed(self, attempt: int) -> None:
        """
        Log a failed attempt: each while calls wait for it, then (attempts
        going on by themselves through a long outage) one a minute.
        """
        now = self._clock.seconds()
        if self._waiters or now - self._failures_logged_at >= FAILURE_LOG_INTERVAL:
            self._failures_logged_at = now
            _log.warn(
                "data-plane connection attempt {attempt} failed: {error}",
                attempt=attempt,
                error=self._last_error,
            )


def _cancelling(timer: Any) -> Callable[[object], object]:
    def cancel(result: object) -> object:
        if timer.active():
            timer.cancel()
        return result

    return cancel
