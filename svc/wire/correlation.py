"""
Client-side request ids: allocation, wrap-around and matching answers.

Pure bookkeeping with no transport: the client stores whatever it waits with
(a L{Deferred}, say) and gets it back when the RESPONSE or ERROR arrives.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from svc.wire.errors import CodecError
from svc.wire.frame import MAX_REQUEST_ID

T = TypeVar("T")


class InFlightLimitReached(Exception):
    """
    The server's C{max_in_flight} requests are already unanswered; wait for an
    answer before starting another.
    """


class RequestTable(Generic[T]):
    """
    The requests a client has sent and not yet seen answered.

    Ids run 1, 2, ... 2**32-1 and wrap to 1, skipping any id still in use, so
    no two requests in flight share an id. A request the caller gave up on
    (L{abandon}) keeps its id, and counts against the limit, until the server
    answers it, so a late answer can never be taken for a newer request's.
    """

    def __init__(self, max_in_flight: int, *, last_id: int = MAX_REQUEST_ID) -> None:
        """
        @param max_in_flight: the server's limit from its HELLO; at least 1
            and less than C{last_id}.
        @param last_id: the largest id handed out before wrapping to 1; the
            header allows 2**32-1. Smaller values are for tests.
        """
        if not 1 <= last_id <= MAX_REQUEST_ID:
            raise ValueError(f"last_id {last_id} out of range")
        if not 1 <= max_in_flight < last_id:
            raise ValueError(f"max_in_flight {max_in_flight} out of range")
        self._max_in_flight = max_in_flight
        self._last_id = last_id
        self._next_id = 1
        self._waiting: dict[int, T] = {}
        self._abandoned: set[int] = set()

    @property
    def in_flight(self) -> int:
        """Requests sent and not yet answered, abandoned ones included."""
        return len(self._waiting) + len(self._abandoned)

    def has_room(self, reserved: int = 0) -> bool:
        """Whether L{start} may be called now, leaving C{reserved} slots free."""
        return self.in_flight + reserved < self._max_in_flight

    def start(self, waiter: T) -> int:
        """
        Record a new request and return its id.

        @raise InFlightLimitReached: if the limit is reached.
        """
        if not self.has_room():
            raise InFlightLimitReached(f"{self.in_flight} requests in flight")
        request_id = self._next_id
        while request_id in self._waiting or request_id in self._abandoned:
            request_id = request_id % self._last_id + 1
        self._next_id = request_id % self._last_id + 1
        self._waiting[request_id] = waiter
        return request_id

    def finish(self, request_id: int) -> T | None:
        """
        Match a RESPONSE or ERROR to its request and forget the request.

        @return: the waiter given to L{start}, or C{None} if the request was
            abandoned (the answer is then to be discarded).
        @raise CodecError: if no request with this id is in flight: the
            server broke the protocol and the connection must be dropped.
        """
        if request_id in self._abandoned:
            self._abandoned.discard(request_id)
            return None
        try:
            return self._waiting.pop(request_id)
        except KeyError:
            raise CodecError(f"answer for request id {request_id}, not in flight") from None

    def abandon(self, request_id: int) -> T:
        """
        Give up waiting for a request (e.g. on a timeout) while keeping its id
        reserved until its answer arrives.

        @return: the waiter, for the caller to fail.
        @raise KeyError: if the request is not waited for.
        """
        waiter = self._waiting.pop(request_id)
        self._abandoned.add(request_id)
        return waiter

    def drain(self) -> list[T]:
        """
        Forget every request, for when the connection is lost.

        @return: the waiters still waiting, in the order they started.
        """
        waiters = list(self._waiting.values())
        self._waiting.clear()
        self._abandoned.clear()
        return waiters
