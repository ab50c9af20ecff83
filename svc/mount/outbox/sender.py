"""
The outbox's one sender (``mount-outbox.md`` section 6): entries go to the
data plane in order, pipelined up to a window, each tagged with its outbox
position so the data plane applies it at most once.

    sender = OutboxSender(remote, source, reactor, session_id=lambda: session)
    sender.append(entry)       # for each entry the log takes, in order
    await sender.drained()     # nothing left unanswered

Each entry ends in exactly one of two calls to its L{SenderSource}:
C{answered(entry, answer)} (the decoded answer message) or
C{refused(entry, failure)} (the data plane said no: the source reconciles).
A failure that is not the data plane's answer (no connection, the
connection lost with the answer, a timeout) is no refusal: the sender stops
sending, lets what is in flight come back, and sends every unanswered entry
again in order, with the same tags, so an entry that did run is answered as
it was the first time: at once the first time, then after a pause
(L{Backoff}) each time it fails again, until an answer comes. An outage is
held that way for as long as it lasts. The source may take an entry back
instead (C{gave_up}: a change whose caller waits and was told it failed),
which is then not sent again.

A commit first uploads the chunks it adds to its base (C{chunk_put}, from
the source's held chunks, L{svc.mount.outbox.held_chunks}); one of them
missing or damaged on the cache disk refuses the entry (the source keeps
what it can).

Reactor thread only; the source is called there too.
"""

from __future__ import annotations

import errno
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from twisted.internet.defer import Deferred, gatherResults, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure

from svc.backoff import Backoff
from svc.mount.core.errors import RemoteFailure
from svc.mount.outbox.entries import Entry
from svc.mount.outbox.held_chunks import new_chunks
from svc.mount.outbox.requests import request_of, tag_of
from svc.mount.remote.data_plane import Remote
from svc.timers import Timer, TimerClock
from svc.wire.kinds import FieldRefused

_log = Logger()

DEFAULT_WINDOW = 64
"""Most entries sent and not yet answered."""

DEFAULT_BACKOFF = Backoff(initial=0.2, maximum=10.0)
"""The pause before sending again after the connection failed."""


class SenderSource(Protocol):
    """What the sender needs from the outbox's owner."""

    @property
    def outbox_id(self) -> bytes:
        """The outbox's id."""

    def settled_through(self) -> int:
        """The highest seq up to which every entry is settled."""

    def held_chunk(self, name: str) -> bytes | None:
        """A held chunk's verified bytes, or L{None}."""

    def answered(self, entry: Entry, answer: Any) -> None:
        """C{entry} was applied; C{answer} is the decoded answer message."""

    def refused(self, entry: Entry, failure: RemoteFailure) -> None:
        """C{entry} was refused (it applied nothing)."""

    def gave_up(self, entry: Entry, failure: RemoteFailure, *, resent: bool) -> bool:
        """
        C{entry} came back without an answer (C{failure}); C{resent}: it
        was sent before and that answer was lost too (it may have run).
        Whether the source takes it back (it is settled there, and not
        sent again) rather than leave it to be sent again.
        """

    def held_back(self, failure: RemoteFailure) -> None:
        """Entries came back without an answer (C{failure}): they are sent again after a pause."""

    def resend_ready(self) -> Deferred[None]:
        """
        Fires when entries that came back without an answer may be sent
        again (the requests sent beside them, outside the sender, answered).
        """


class Unsendable(RemoteFailure):
    """An entry refused here, before anything was sent (it cannot be sent as it is)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code, message)


def is_refusal(failure: RemoteFailure) -> bool:
    """
    Whether C{failure} is a refusal (the data plane's answer, or
    L{Unsendable}), not a lost or unmade connection.
    """
    return isinstance(failure, Unsendable) or (failure.wire is not None and not failure.unknown)


class OutboxSender:
    """See the module docstring."""

    def __init__(
        self,
        remote: Remote,
        source: SenderSource,
        clock: TimerClock,
        *,
        session_id: Callable[[], str | None],
        window: int = DEFAULT_WINDOW,
        backoff: Backoff = DEFAULT_BACKOFF,
    ) -> None:
        self._remote = remote
        self._source = source
        self._clock = clock
        self._session_id = session_id
        self._window = window
        self._backoff = backoff
        self._waiting: deque[Entry] = deque()
        self._in_flight: dict[int, Entry] = {}
        self._again: list[Entry] = []  # came back without an answer, to send again
        self._may_have_run: set[int] = set()  # sent, and the answer lost: they may have run
        self._failures = 0  # connection failures in a row
        self._retry: Timer | None = None
        self._drained: list[Deferred[None]] = []
        self._stopped = False
        self._pumping = False
        self._blocked = False  # waiting for resend_ready
        self._lost_with: RemoteFailure | None = None  # the last failure of an entry in _again

    @property
    def unanswered(self) -> int:
        """Entries appended and not answered or refused yet."""
        return len(self._waiting) + len(self._in_flight) + len(self._again)

    @property
    def holding(self) -> bool:
        """Whether entries wait out a pause after coming back without an answer."""
        return self._retry is not None or self._blocked or bool(self._again)

    def append(self, entry: Entry) -> None:
        """Send C{entry} after every entry appended before it."""
        self._waiting.append(entry)
        self._pump()

    def withdraw(self, entry: Entry) -> bool:
        """
        Take C{entry} back if it was never sent, nor came back to be sent
        again: whether it was (it is then not sent; the caller settles it).
        """
        if entry in self._waiting and entry.seq not in self._may_have_run:
            self._waiting.remove(entry)
            self._after()
            return True
        return False

    def drained(self) -> Deferred[None]:
        """Fires once every entry appended so far is answered or refused."""
        if not self.unanswered:
            return succeed(None)
        waiter: Deferred[None] = Deferred()
        self._drained.append(waiter)
        return waiter

    def now(self) -> None:
        """A new connection: what waits for the pause after a failure is sent at once."""
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
            self._retry = None
            self._pump()

    def stop(self) -> None:
        """Send nothing more (what is unanswered stays in the log for the next mount)."""
        self._stopped = True
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
        self._retry = None

    # Sending

    def _pump(self) -> None:
        # An entry can come back inside its own send (no connection, or an
        # in-process service): the loop is not re-entered (its caller's
        # loop goes on), and stops as soon as one is waiting to be sent again.
        if self._pumping:
            return
        self._pumping = True
        try:
            while (
                self._waiting
                and len(self._in_flight) < self._window
                and not (self._stopped or self._blocked or self._retry is not None or self._again)
            ):
                entry = self._waiting.popleft()
                self._in_flight[entry.seq] = entry
                self._deliver(entry).addBoth(self._came_back, entry)
        finally:
            self._pumping = False

    def _deliver(self, entry: Entry) -> Deferred[Any]:
        """Send C{entry} (a commit's new chunks first); its decoded answer."""
        source = self._source
        tag = tag_of(source.outbox_id, entry.seq, min(source.settled_through(), entry.seq - 1))
        try:
            op, request = request_of(entry, tag, self._session_id())
        except (FieldRefused, ValueError) as error:
            message = getattr(error, "message", str(error))
            return _local_refusal(errno.EINVAL, f"entry {entry.seq}: {message}")
        uploads: list[Deferred[Any]] = []
        for name in sorted(new_chunks(entry)):
            data = source.held_chunk(name)
            if data is None:
                return _local_refusal(errno.EIO, f"entry {entry.seq}: chunk {name} is not held")
            uploads.append(self._remote.chunk_put(name, data, session_id=self._session_id()))
        sent = self._remote.change(op, request)
        if not uploads:
            return sent
        # The put follows its uploads on the connection; their failure is
        # the entry's unless the put went through anyway.
        gathered = gatherResults(uploads, consumeErrors=True)
        gathered.addErrback(_first_error)
        return gatherResults([gathered, sent], consumeErrors=True).addCallbacks(
            lambda results: results[1], _first_error
        )

    def _came_back(self, outcome: object, entry: Entry) -> None:
        del self._in_flight[entry.seq]
        if isinstance(outcome, Failure):
            failure = outcome.value
            if not isinstance(failure, RemoteFailure):
                _log.failure("outbox entry {seq} failed unexpectedly", outcome, seq=entry.seq)
                failure = Unsendable(errno.EIO, f"entry {entry.seq}: {failure}")
            elif not is_refusal(failure):
                self._lost(entry, failure)
                return
            self._may_have_run.discard(entry.seq)
            if not isinstance(failure, Unsendable):
                self._failures = 0  # the data plane answered
            self._source.refused(entry, failure)
        else:
            self._failures = 0
            self._may_have_run.discard(entry.seq)
            self._source.answered(entry, outcome)
        self._after()

    def _lost(self, entry: Entry, failure: RemoteFailure) -> None:
        """
        C{entry} came back without an answer: send it again, in order,
        once nothing is in flight (unless its source takes it back).
        """
        resent = entry.seq in self._may_have_run
        if self._source.gave_up(entry, failure, resent=resent):
            self._may_have_run.discard(entry.seq)
        else:
            if failure.unknown:
                self._may_have_run.add(entry.seq)
            self._again.append(entry)
            self._lost_with = failure
        self._after()

    def _send_again(self) -> None:
        """Nothing is in flight any more: what came back goes again, once the source is ready."""
        failure = self._lost_with
        assert failure is not None
        self._failures += 1
        count = len(self._again)
        self._waiting.extendleft(sorted(self._again, key=lambda e: e.seq, reverse=True))
        self._again = []
        self._blocked = True
        self._source.resend_ready().addBoth(self._resend, count, failure)

    def _resend(self, _: object, count: int, failure: RemoteFailure) -> None:
        """Send again what came back (C{count} entries): at once the first time, else later."""
        self._blocked = False
        if self._failures == 1:
            # A lost connection: the next request opens a new one.
            _log.info(
                "outbox: {count} entries unanswered ({error}); sending them again",
                count=count,
                error=failure,
            )
            self._pump()
            return
        delay = self._backoff.delay(self._failures - 1)
        _log.info(
            "outbox: {count} entries unanswered ({error}); sending them again in {delay:.1f} s",
            count=count,
            error=failure,
            delay=delay,
        )
        if not self._stopped:
            self._retry = self._clock.callLater(delay, self._retry_now)
        self._source.held_back(failure)

    def _retry_now(self) -> None:
        self._retry = None
        self._pump()

    def _after(self) -> None:
        """An entry came back (or was taken back): send more, or again, or tell the drained."""
        if self._again and not self._in_flight:
            # The last in flight came back, answered or not: the lost go again.
            self._send_again()
            return
        self._pump()
        if not self.unanswered:
            waiters, self._drained = self._drained, []
            for waiter in waiters:
                waiter.callback(None)


def _local_refusal(code: int, message: str) -> Deferred[Any]:
    """A refusal made here, before anything was sent."""
    failed: Deferred[Any] = Deferred()
    failed.errback(Unsendable(code, message))
    return failed


def _first_error(failure: Failure) -> Failure:
    """The first error of a C{gatherResults}, unwrapped."""
    inner = getattr(failure.value, "subFailure", None)
    return inner if isinstance(inner, Failure) else failure
