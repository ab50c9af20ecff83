"""
Bounds on the memory that answers hold while they wait to be sent.

A C{chunk_get} answer is a chunk read into memory (up to 16 MiB) that stays
there until the connection has handed all of it on; an agent that pipelines
C{chunk_get}s on connections it never reads could otherwise make the server
read chunk after chunk into memory. So a bulk answer first reserves its
bytes from three budgets, in this order, and the read starts only once all
three granted them:

 1. its connection's (L{AnswerLimits.per_connection});
 2. its agent's, shared by all the agent's connections (C{per_agent});
 3. the server's, shared by every connection (C{server}).

Each budget grants in arrival order (FIFO): a reservation that does not fit
waits, and those that arrived after it at that budget wait behind it, so a
large answer is never starved by small ones. A reservation waits at one
budget at a time, holding the ones below it: a connection whose peer does
not read fills its own budget and then waits there, in nobody else's queue;
an agent whose connections do not read fills its agent budget, and only its
own connections wait behind it. The server budget is what many agents
together cannot exceed. Nothing here ever fails a reservation for lack of
room: it waits (until its connection closes, which gives back everything
the connection holds and cancels what it waits for).

A reservation is given back (L{Reservation.release}) once its answer has
been handed on: the connection wrote the answer's last slice while its
transport was taking data (L{svc.dataplane.answer_writer}). It may be made
smaller first (L{Reservation.shrink}): a C{chunk_get} reserves the largest
chunk size before it reads, then keeps only what the chunk really is.

Pure logic: no clock, no I/O; waiting is a L{Deferred}.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

import attrs
from twisted.internet.defer import CancelledError, Deferred, fail

from svc.store.chunks import MAX_CHUNK_SIZE

MIB = 1024 * 1024

DEFAULT_PER_CONNECTION = 32 * MIB
"""Answer bytes one connection may hold unsent: two of the largest chunks."""

DEFAULT_PER_AGENT = 64 * MIB
"""Answer bytes all of one agent's connections may hold unsent together."""

DEFAULT_SERVER = 512 * MIB
"""Answer bytes the whole server may hold unsent."""


class ConnectionGone(CancelledError):
    """The connection that asked for a reservation closed while it waited."""


def _at_least_one_chunk(_instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < MAX_CHUNK_SIZE:
        raise ValueError(
            f"{attribute.name} must be at least {MAX_CHUNK_SIZE} bytes (one largest chunk),"
            f" not {value}"
        )


@attrs.frozen
class AnswerLimits:
    """
    The three answer budgets, in bytes. Each must hold at least one largest
    chunk (L{MAX_CHUNK_SIZE}), and each level at least the one below it.
    """

    per_connection: int = attrs.field(default=DEFAULT_PER_CONNECTION, validator=_at_least_one_chunk)
    per_agent: int = attrs.field(default=DEFAULT_PER_AGENT, validator=_at_least_one_chunk)
    server: int = attrs.field(default=DEFAULT_SERVER, validator=_at_least_one_chunk)

    def __attrs_post_init__(self) -> None:
        if self.per_agent < self.per_connection:
            raise ValueError("per_agent must be at least per_connection")
        if self.server < self.per_agent:
            raise ValueError("server must be at least per_agent")


class _Budget:
    """One budget: a capacity, the bytes granted from it, and a FIFO of asks."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.granted = 0
        self.waiting: deque[_Ask] = deque()

    def ask(self, ask: _Ask) -> None:
        """Grant C{ask} now if nobody waits and it fits, else queue it."""
        if not self.waiting and self.granted + ask.size <= self.capacity:
            self.granted += ask.size
            ask.granted_by(self)
        else:
            self.waiting.append(ask)

    def give_back(self, size: int) -> None:
        """C{size} granted bytes are free again: grant the waiters that now fit, in order."""
        self.granted -= size
        self.grant()

    def withdraw(self, ask: _Ask, *, grant: bool = True) -> None:
        """
        C{ask} no longer waits here; unless told not to, grant those behind
        it that now fit (it may have been blocking them).
        """
        try:
            self.waiting.remove(ask)
        except ValueError:
            return
        if grant:
            self.grant()

    def grant(self) -> None:
        """Grant the waiters that fit, in order."""
        # Re-read on every turn: granting runs the next level's code (and the
        # waiter's callbacks), which may give bytes back here.
        while self.waiting and self.granted + self.waiting[0].size <= self.capacity:
            ask = self.waiting.popleft()
            self.granted += ask.size
            ask.granted_by(self)


class _Ask:
    """
    One reservation on its way up the levels (connection, agent, server),
    then held: C{holds} lists the budgets that granted it.
    """

    def __init__(self, size: int, levels: tuple[_Budget, ...], owner: ConnectionBudget) -> None:
        self.size = size
        self._levels = levels
        self._owner = owner
        self.holds: list[_Budget] = []
        self.waiting_at: _Budget | None = None
        self.deferred: Deferred[Reservation] = Deferred(lambda _: self.cancel())

    def start(self) -> None:
        self._next()

    def granted_by(self, budget: _Budget) -> None:
        self.waiting_at = None
        self.holds.append(budget)
        self._next()

    def _next(self) -> None:
        if len(self.holds) == len(self._levels):
            if self._owner.closed:  # granted while its connection was closing
                self.give_back()
                self.deferred.errback(ConnectionGone("the connection closed"))
            else:
                self.deferred.callback(Reservation(self))
            return
        level = self._levels[len(self.holds)]
        self.waiting_at = level
        level.ask(self)

    def cancel(self) -> None:
        """Stop waiting and give back what was granted (a held one: see L{give_back})."""
        waiting, self.waiting_at = self.waiting_at, None
        if waiting is not None:
            waiting.withdraw(self)
        self.give_back()

    def shrink(self, size: int) -> None:
        freed = self.size - size
        self.size = size
        for budget in reversed(self.holds):
            budget.give_back(freed)

    def give_back(self) -> None:
        """Give back everything granted, server first (its waiters hold the most)."""
        holds, self.holds = self.holds, []
        self._owner._forget(self)
        for budget in reversed(holds):
            budget.give_back(self.size)


class Reservation:
    """
    Bytes granted by all three budgets for one answer; give them back with
    L{release} once the answer has been handed on.
    """

    def __init__(self, ask: _Ask) -> None:
        self._ask: _Ask | None = ask

    @property
    def size(self) -> int:
        """The bytes held now (0 once released)."""
        return 0 if self._ask is None else self._ask.size

    def shrink(self, size: int) -> None:
        """
        Keep only C{size} bytes (the answer turned out smaller); the rest is
        given back now. A size larger than held is an error.
        """
        if self._ask is None:
            return
        if not 0 <= size <= self._ask.size:
            raise ValueError(f"cannot shrink a reservation of {self._ask.size} bytes to {size}")
        if size < self._ask.size:
            self._ask.shrink(size)

    def release(self) -> None:
        """Give every byte back. Idempotent; a no-op once the connection closed."""
        ask, self._ask = self._ask, None
        if ask is not None:
            ask.give_back()


class AnswerBudgets:
    """
    The server's answer budgets: its own, and one per agent while that
    agent has connections. Make one L{ConnectionBudget} per connection.
    """

    def __init__(self, limits: AnswerLimits | None = None) -> None:
        self.limits = limits or AnswerLimits()
        self._server = _Budget(self.limits.server)
        self._agents: dict[Hashable, tuple[_Budget, int]] = {}

    @property
    def granted(self) -> int:
        """Bytes the server budget has granted now."""
        return self._server.granted

    def agent_granted(self, agent: Hashable) -> int:
        """Bytes C{agent}'s budget has granted now (0 for an agent without connections)."""
        entry = self._agents.get(agent)
        return 0 if entry is None else entry[0].granted

    def connection(self, agent: Hashable) -> ConnectionBudget:
        """The budget of a new connection of C{agent}; L{ConnectionBudget.close} it at the end."""
        budget, users = self._agents.get(agent, (None, 0))
        if budget is None:
            budget = _Budget(self.limits.per_agent)
        self._agents[agent] = (budget, users + 1)
        levels = (_Budget(self.limits.per_connection), budget, self._server)
        return ConnectionBudget(self, agent, levels)

    def _closed(self, agent: Hashable) -> None:
        budget, users = self._agents[agent]
        if users <= 1:
            del self._agents[agent]
        else:
            self._agents[agent] = (budget, users - 1)


class ConnectionBudget:
    """One connection's way to the three budgets."""

    def __init__(
        self, budgets: AnswerBudgets, agent: Hashable, levels: tuple[_Budget, _Budget, _Budget]
    ) -> None:
        self._budgets = budgets
        self._agent = agent
        self._levels = levels
        self._asks: set[_Ask] = set()
        self.closed = False

    @property
    def granted(self) -> int:
        """Bytes this connection holds now."""
        return self._levels[0].granted

    @property
    def waiting(self) -> int:
        """Reservations of this connection waiting now."""
        return sum(1 for ask in self._asks if ask.waiting_at is not None)

    def reserve(self, size: int) -> Deferred[Reservation]:
        """
        Reserve C{size} answer bytes (at most one connection budget); fires
        with the L{Reservation} once all three budgets granted them. Cancel
        the L{Deferred} to stop waiting. Fails with L{ConnectionGone} once
        the connection closed.
        """
        if self.closed:
            return fail(ConnectionGone("the connection closed"))
        if not 0 <= size <= self._levels[0].capacity:
            raise ValueError(f"cannot reserve {size} bytes of {self._levels[0].capacity}")
        ask = _Ask(size, self._levels, self)
        self._asks.add(ask)
        ask.start()
        return ask.deferred

    def close(self) -> None:
        """
        The connection is gone: give back everything it holds (its
        reservations' later L{Reservation.release} does nothing) and fail
        what it waits for with L{ConnectionGone}. Idempotent.
        """
        if self.closed:
            return
        self.closed = True
        asks, self._asks = self._asks, set()
        # Out of every queue first, so bytes given back below go to other
        # connections, not to this one's own waiting asks.
        withdrawn: list[_Budget] = []
        waiting: list[_Ask] = []
        for ask in asks:
            level, ask.waiting_at = ask.waiting_at, None
            if level is not None:
                level.withdraw(ask, grant=False)
                withdrawn.append(level)
                waiting.append(ask)
        for ask in asks:
            ask.give_back()
        for level in withdrawn:
            level.grant()
        for ask in waiting:
            if not ask.deferred.called:
                ask.deferred.errback(ConnectionGone("the connection closed"))
        self._budgets._closed(self._agent)

    def _forget(self, ask: _Ask) -> None:
        self._asks.discard(ask)
