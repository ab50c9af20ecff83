"""
The data-plane lease table of one tenant: L{LeaseState}'s rules driven by an
injected clock, with every change recorded in ``leases.db``.

The in-memory L{LeaseState} is the authority for every decision (the fast
path); the database is a durable record written on the single injected
L{IWorker}, in submission order. Answers that change leases fire after their
row is committed. Revoke requests and audit events go to the callbacks given
to L{LeaseTable.open}; the server pushes the first on the holder's connection
and turns the second into audit lines and the C{svc_lease_held} gauge.

One delayed call from the clock is pending at a time, for the earliest
deadline of the state; L{LeaseTable.close} cancels it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure

from svc.store.errors import NotFound
from svc.store.lease_rules import (
    LeaseState,
)
from svc.store.lease_values import (
    DenialReason,
    Lease,
    LeaseDenied,
    LeaseEffects,
    LeaseEvent,
    LeaseGrant,
    LeaseHolder,
    LeaseMode,
    LeaseReason,
    LeaseRevoke,
    LeaseTimings,
    PutVerdict,
    Queued,
    random_lease_id,
)
from svc.store.leases_schema import LeaseDatabase
from svc.worker import IWorker

__all__ = ["LeaseTable"]

_log = Logger()

T = TypeVar("T")


class TimerCall(Protocol):
    """The part of C{IDelayedCall} the table uses."""

    def active(self) -> bool:
        """Whether the call is still pending."""

    def cancel(self) -> None:
        """Stop the pending call."""


class LeaseClock(Protocol):
    """
    The part of C{IReactorTime} the table uses (a reactor or a
    L{twisted.internet.task.Clock}); C{callLater} returns a L{TimerCall}.
    """

    def seconds(self) -> float:
        """The current time in seconds."""

    def callLater(
        self, delay: float, callable: Callable[..., object], *args: object, **kw: object
    ) -> Any:
        """Call C{callable} after C{delay} seconds."""


class LeaseTable:
    """
    Per-path data-plane leases of one tenant. Build it with L{open}.
    """

    def __init__(
        self,
        state: LeaseState,
        database: LeaseDatabase,
        worker: IWorker,
        clock: LeaseClock,
        on_revoke: Callable[[LeaseRevoke], object],
        on_event: Callable[[LeaseEvent], object],
    ) -> None:
        self._state = state
        self._database = database
        self._worker = worker
        self._clock = clock
        self._on_revoke = on_revoke
        self._on_event = on_event
        self._waiting: dict[int, Deferred[LeaseGrant | LeaseDenied]] = {}
        self._timer: TimerCall | None = None
        self._timer_at = 0.0
        self._stored_epoch = state.epoch
        self._closed = False

    @classmethod
    def open(
        cls,
        db_path: Path,
        worker: IWorker,
        clock: LeaseClock,
        on_revoke: Callable[[LeaseRevoke], object],
        on_event: Callable[[LeaseEvent], object],
        timings: LeaseTimings | None = None,
        new_lease_id: Callable[[], str] = random_lease_id,
    ) -> Deferred[LeaseTable]:
        """
        Open (creating if needed) the ``leases.db`` at C{db_path} and recover
        its leases by L{LeaseState.restore}: write leases of a session become
        orphans its reconnecting connection can reclaim, every other stored
        lease is released with reason C{conn_closed} (events go to
        C{on_event}). Fires once the recovery is committed.
        """
        chosen = LeaseTimings() if timings is None else timings

        def loaded(result: tuple[LeaseDatabase, tuple[Lease, ...], int]) -> Deferred[LeaseTable]:
            database, leases, epoch = result
            state = LeaseState(chosen, new_lease_id, epoch)
            table = cls(state, database, worker, clock, on_revoke, on_event)
            effects = state.restore(leases, clock.seconds())
            written = table._apply(effects)
            return written.addCallback(lambda _: table)

        def load() -> tuple[LeaseDatabase, tuple[Lease, ...], int]:
            database = LeaseDatabase.open(Path(db_path))
            try:
                leases, epoch = database.load()
            except BaseException:
                database.close()
                raise
            return database, leases, epoch

        return worker.submit(load).addCallback(loaded)

    # Operations.

    def grant(
        self, path: str, mode: LeaseMode, holder: LeaseHolder, wait: bool = False
    ) -> Deferred[LeaseGrant | LeaseDenied]:
        """
        Ask for a lease on C{path}. Compatible requests are granted at once (a
        holder re-requesting a mode it holds renews its lease). A conflicting
        write request asks each other holder to yield (reason C{contention})
        and then, with C{wait}, fires with the grant when they have released
        or been dropped (FIFO per path; L{LeaseDenied} with reason C{timeout}
        if its turn does not come in time), or without C{wait} fires with
        L{LeaseDenied} at once. A conflicting read request is denied at once.
        Cancelling a waiting Deferred withdraws the request.
        """
        self._check_open()
        answer, effects = self._state.request(path, mode, holder, wait, self._clock.seconds())
        written = self._apply(effects)
        if isinstance(answer, Queued):
            request_id = answer.request_id

            def cancel(_: Deferred[LeaseGrant | LeaseDenied]) -> None:
                if self._waiting.pop(request_id, None) is not None and not self._closed:
                    now = self._clock.seconds()
                    self._apply(self._state.withdraw(request_id, DenialReason.CANCELLED, now))

            waiting: Deferred[LeaseGrant | LeaseDenied] = Deferred(cancel)
            self._waiting[request_id] = waiting
            return waiting
        return _then(written, answer)

    def refresh(self, lease_id: str, holder: LeaseHolder) -> Deferred[LeaseGrant]:
        """
        Extend C{holder}'s lease C{lease_id} to now plus the TTL (a revoke
        deadline already set still applies). Fails with L{NotFound} if the
        lease is unknown, already ended, or not C{holder}'s.
        """
        self._check_open()
        grant, effects = self._state.refresh(lease_id, holder, self._clock.seconds())
        written = self._apply(effects)
        if grant is None:
            return _then_fail(written, NotFound(f"no lease {lease_id} held by this holder"))
        return _then(written, grant)

    def release(
        self, lease_id: str, holder: LeaseHolder, reason: LeaseReason = LeaseReason.CLIENT
    ) -> Deferred[None]:
        """
        Give up C{holder}'s lease C{lease_id} (reason C{client} or
        C{conn_closed}); queued requests on its path may then be granted.
        Fails with L{NotFound} if there is no such lease of C{holder}'s.
        """
        self._check_open()
        found, effects = self._state.release(lease_id, holder, reason, self._clock.seconds())
        written = self._apply(effects)
        if not found:
            return _then_fail(written, NotFound(f"no lease {lease_id} held by this holder"))
        return _then(written, None)

    def release_connection(self, connection_id: str) -> Deferred[None]:
        """
        A connection closed: release all its leases (reason C{conn_closed}),
        deny its waiting requests and forget its fences.
        """
        self._check_open()
        effects = self._state.release_connection(connection_id, self._clock.seconds())
        return _then(self._apply(effects), None)

    def manifest_put_contention(self, path: str, writer: LeaseHolder) -> PutVerdict:
        """
        Call before every C{manifest_put}: L{PutVerdict.PROCEED} when C{writer}
        holds the write lease or no other holder does (other holders' read
        leases are then asked to yield); L{PutVerdict.CONTENDED} when another
        holder holds the write lease, which is asked to yield (reason
        C{manifest_put_contention}); L{PutVerdict.FENCED} when C{writer}'s own
        write lease on C{path} was forcibly dropped. Refuse the last two with
        ESTALE; the client refetches and retries (a contended retry succeeds
        once the holder yields or is dropped, within the revoke timeout).
        """
        self._check_open()
        verdict, effects = self._state.manifest_put(path, writer, self._clock.seconds())
        self._apply(effects)
        return verdict

    def check_write(self, path: str, holder: LeaseHolder) -> bool:
        """
        Whether C{holder} is unfenced on C{path} and holds its write lease, or
        nobody holds any lease there.
        """
        self._check_open()
        self._apply(self._state.advance(self._clock.seconds()))
        return self._state.check_write(path, holder)

    def is_fenced(self, holder: LeaseHolder, path: str) -> bool:
        """
        Whether C{holder}'s write lease on C{path} was dropped for not
        yielding or expiring, and it has not been granted a lease there since.
        """
        self._check_open()
        self._apply(self._state.advance(self._clock.seconds()))
        return self._state.is_fenced(holder, path)

    def leases(self) -> tuple[Lease, ...]:
        """Every live lease (orphans included)."""
        self._apply(self._state.advance(self._clock.seconds()))
        return self._state.leases()

    def close(self) -> Deferred[None]:
        """
        Cancel the pending timer, deny waiting requests (reason C{shutdown}),
        finish the writes and close the database. Leases stay recorded for the
        next L{open}. Idempotent.
        """
        if self._closed:
            return succeed(None)
        written = self._apply(self._state.shutdown())
        self._closed = True
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        database = self._database
        return written.addCallback(lambda _: self._worker.submit(database.close))

    # Internals.

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the lease table is closed")

    def _apply(self, effects: LeaseEffects) -> Deferred[None]:
        """
        Carry out C{effects}: emit events, push revokes, record the rows on
        the worker and, once committed, answer waiting requests. Returns a
        Deferred that fires (never fails) once the rows are committed.
        """
        for event in effects.events:
            _deliver(self._on_event, event, "lease event")
        for revoke in effects.revokes:
            _deliver(self._on_revoke, revoke, "lease revoke")
        written = self._record(effects)
        for request_id, answer in effects.answers:
            waiting = self._waiting.pop(request_id, None)
            if waiting is not None:
                written.addCallback(self._answer, waiting, answer)
        if not self._closed:
            self._reschedule()
        return written

    def _answer(
        self,
        _result: None,
        waiting: Deferred[LeaseGrant | LeaseDenied],
        answer: LeaseGrant | LeaseDenied,
    ) -> None:
        """
        Fire a waiting request's Deferred; if it was cancelled after its
        grant was decided, give the unwanted lease back.
        """
        if not waiting.called:
            waiting.callback(answer)
        elif isinstance(answer, LeaseGrant) and not self._closed:
            now = self._clock.seconds()
            effects = self._state.release(answer.lease_id, answer.holder, LeaseReason.CLIENT, now)
            self._apply(effects[1])

    def _record(self, effects: LeaseEffects) -> Deferred[None]:
        epoch = effects.epoch
        if not effects.stored and not effects.dropped and epoch <= self._stored_epoch:
            return succeed(None)
        self._stored_epoch = max(self._stored_epoch, epoch)
        database = self._database
        stored, dropped = effects.stored, effects.dropped
        written = self._worker.submit(lambda: database.write(stored, dropped, epoch))

        def failed(failure: Failure) -> None:
            _log.failure("Recording lease changes in leases.db failed", failure)

        return written.addErrback(failed)

    def _reschedule(self) -> None:
        deadline = self._state.next_deadline()
        timer = self._timer
        if timer is not None and timer.active():
            if deadline is not None and self._timer_at == deadline:
                return
            timer.cancel()
        self._timer = None
        if deadline is None:
            return
        delay = max(0.0, deadline - self._clock.seconds())
        self._timer_at = deadline
        self._timer = self._clock.callLater(delay, self._deadline_reached)

    def _deadline_reached(self) -> None:
        self._timer = None
        now = max(self._clock.seconds(), self._timer_at)
        self._apply(self._state.advance(now))


def _deliver(callback: Callable[[T], object], value: T, what: str) -> None:
    """Call C{callback}; a failing callback is logged, never propagated."""
    try:
        callback(value)
    except Exception:
        _log.failure("Delivering a {what} failed", what=what)


def _then(written: Deferred[None], value: T) -> Deferred[T]:
    """A Deferred firing with C{value} once C{written} has fired."""
    result: Deferred[T] = Deferred()
    written.addCallback(lambda _: result.callback(value))
    return result


def _then_fail(written: Deferred[None], error: Exception) -> Deferred[T]:
    """A Deferred failing with C{error} once C{written} has fired."""
    result: Deferred[T] = Deferred()
    written.addCallback(lambda _: result.errback(error))
    return result
