"""
Data-plane lease rules: who may hold what on a path, who must yield, and when
a lease ends. Pure logic: no I/O, no reactor; time is passed in as ``now``
(seconds, the same scale as C{IReactorTime.seconds()}) and lease ids come from
an injected source.

L{LeaseState} is the whole state machine. Every transition returns a
L{LeaseEffects} listing what the caller (L{svc.store.leases.LeaseTable}) must
do: audit events to emit, revoke requests to push, answers for queued
requests, and lease rows to store or drop. The rules themselves are written
down in ``docs/specifications/leases-db.md``; in short:

  - C{read} leases are shared; a C{write} lease excludes every other holder's
    leases on the path. A holder has at most one lease per path.
  - A holder re-requesting a mode its lease covers renews it; a sole reader
    asking for C{write} is upgraded in place (same lease id, new epoch).
  - A write request that conflicts asks the other holders to yield
    (C{lease_revoke}, reason C{contention}) and either waits in a FIFO queue
    per path or is denied at once. Read requests never wait and never revoke.
  - A lease ends at the earlier of its expiry (C{lease_violation expired})
    and, once asked to yield, its revoke deadline (C{lease_violation
    revoke_timeout}). A write lease ended that way fences its holder on that
    path until the holder is granted a lease there again.
  - A write lease restored after a restart is an orphan its own session may
    reclaim. A newer mount session of the same agent that meets it (a
    request or a put on its path) drops it at once (C{lease_release},
    reason C{conn_closed}) instead of asking it to yield and waiting: the
    older session is fenced and can never reclaim it.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable

import attrs

from svc.store.lease_values import (
    Answer,
    DenialReason,
    Lease,
    LeaseDenied,
    LeaseEffects,
    LeaseEvent,
    LeaseEventName,
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


@attrs.define
class _Waiter:
    request_id: int
    path: str
    holder: LeaseHolder
    deadline: float


class _Pending:
    """Effects being accumulated by one transition."""

    def __init__(self) -> None:
        self.events: list[LeaseEvent] = []
        self.revokes: list[LeaseRevoke] = []
        self.answers: list[tuple[int, Answer]] = []
        self.records: dict[str, Lease | None] = {}

    def freeze(self, epoch: int) -> LeaseEffects:
        return LeaseEffects(
            tuple(self.events),
            tuple(self.revokes),
            tuple(self.answers),
            tuple(lease for lease in self.records.values() if lease is not None),
            tuple(key for key, lease in self.records.items() if lease is None),
            epoch,
        )


_LEASE_END = 0
_WAIT_END = 1


class LeaseState:
    """
    Every lease and waiting request of one lease table, and the rules that
    change them. Each transition first processes every deadline up to
    C{now}, in time order, as if a timer had fired exactly at each.
    """

    def __init__(
        self,
        timings: LeaseTimings,
        new_lease_id: Callable[[], str] = random_lease_id,
        epoch: int = 0,
    ) -> None:
        self.timings = timings
        self._new_lease_id = new_lease_id
        self._epoch = epoch
        self._leases: dict[str, Lease] = {}
        self._paths: dict[str, dict[str, None]] = {}
        self._queues: dict[str, deque[_Waiter]] = {}
        self._waiters: dict[int, _Waiter] = {}
        self._fenced: set[tuple[str, LeaseHolder]] = set()
        self._deadlines: list[tuple[float, int, int, str]] = []
        self._sequence = 0

    # Queries.

    @property
    def epoch(self) -> int:
        """The highest epoch handed out so far."""
        return self._epoch

    def leases(self) -> tuple[Lease, ...]:
        """Every live lease."""
        return tuple(self._leases.values())

    def leases_on(self, path: str) -> tuple[Lease, ...]:
        """The live leases on C{path}, oldest first."""
        return tuple(self._leases[key] for key in self._paths.get(path, ()))

    def waiting(self, path: str) -> tuple[int, ...]:
        """Request ids queued on C{path}, head first."""
        return tuple(waiter.request_id for waiter in self._queues.get(path, ()))

    def waiter_deadline(self, request_id: int) -> float | None:
        """When a queued request gives up, or L{None} if it is not queued."""
        waiter = self._waiters.get(request_id)
        return None if waiter is None else waiter.deadline

    def is_fenced(self, holder: LeaseHolder, path: str) -> bool:
        """Whether C{holder}'s write lease on C{path} was forcibly dropped."""
        return (path, holder) in self._fenced

    def check_write(self, path: str, holder: LeaseHolder) -> bool:
        """
        Whether C{holder} may write C{path} without contention: it is not
        fenced there, and it holds the write lease (or its session owns the
        orphaned one) or nobody holds any lease on the path (an orphan of a
        session C{holder}'s supersedes does not count: it would be dropped).
        """
        if self.is_fenced(holder, path):
            return False
        leases = [lease for lease in self.leases_on(path) if not self._superseded(lease, holder)]
        return not leases or any(
            lease.mode is LeaseMode.WRITE and self._owned_by(lease, holder) for lease in leases
        )

    def next_deadline(self) -> float | None:
        """The earliest time at which something ends, or L{None}."""
        while self._deadlines and not self._is_current(self._deadlines[0]):
            heapq.heappop(self._deadlines)
        return self._deadlines[0][0] if self._deadlines else None

    # Transitions.

    def restore(self, leases: Iterable[Lease], now: float) -> LeaseEffects:
        """
        Take in the leases stored by a previous run, whose connections are
        all gone. A write lease carrying a session id and not yet expired is
        kept as an orphan until the earlier of its expiry and C{now + ttl},
        reclaimable by a connection of the same agent and session, and
        dropped as soon as a newer session of the agent meets it (see
        L{request}); every other row is released with reason C{conn_closed}.
        """
        pending = _Pending()
        for lease in leases:
            self._epoch = max(self._epoch, lease.epoch)
            keep = (
                lease.mode is LeaseMode.WRITE
                and lease.holder.session_id is not None
                and lease.expires_at > now
            )
            if keep:
                expires = min(lease.expires_at, now + self.timings.ttl)
                orphan = attrs.evolve(
                    lease,
                    expires_at=expires,
                    revoke_reason=None,
                    revoke_deadline=None,
                    orphan=True,
                )
                self._put(orphan, pending)
            else:
                pending.records[lease.lease_id] = None
                self._event(pending, LeaseEventName.RELEASE, lease, LeaseReason.CONN_CLOSED)
        return pending.freeze(self._epoch)

    def advance(self, now: float) -> LeaseEffects:
        """Process every deadline up to C{now}."""
        pending = _Pending()
        self._process_due(now, pending)
        return pending.freeze(self._epoch)

    def request(
        self, path: str, mode: LeaseMode, holder: LeaseHolder, wait: bool, now: float
    ) -> tuple[Answer | Queued, LeaseEffects]:
        """
        A holder asks for a lease. Returns the answer now, or L{Queued} when a
        write request waits (C{wait}) for conflicting holders to yield. An
        orphan on C{path} whose session C{holder}'s supersedes is dropped
        first (C{lease_release}, reason C{conn_closed}), never waited for.
        """
        pending = _Pending()
        self._process_due(now, pending)
        self._drop_superseded(path, holder, now, pending)
        answer = self._request(path, mode, holder, wait, now, pending)
        return answer, pending.freeze(self._epoch)

    def refresh(
        self, lease_id: str, holder: LeaseHolder, now: float
    ) -> tuple[LeaseGrant | None, LeaseEffects]:
        """Extend a live lease of C{holder}'s; L{None} if there is none."""
        pending = _Pending()
        self._process_due(now, pending)
        lease = self._leases.get(lease_id)
        if lease is None or not self._held_by(lease, holder):
            return None, pending.freeze(self._epoch)
        lease = self._renew(lease, now, pending)
        return LeaseGrant.of(lease), pending.freeze(self._epoch)

    def release(
        self, lease_id: str, holder: LeaseHolder, reason: LeaseReason, now: float
    ) -> tuple[bool, LeaseEffects]:
        """Give up a lease of C{holder}'s; C{False} if there is none."""
        if reason not in (LeaseReason.CLIENT, LeaseReason.CONN_CLOSED):
            raise ValueError(f"not a release reason: {reason!r}")
        pending = _Pending()
        self._process_due(now, pending)
        lease = self._leases.get(lease_id)
        if lease is None or not self._held_by(lease, holder):
            return False, pending.freeze(self._epoch)
        self._drop(lease, LeaseEventName.RELEASE, reason, pending)
        self._advance_queue(lease.path, now, pending)
        return True, pending.freeze(self._epoch)

    def release_connection(self, connection_id: str, now: float) -> LeaseEffects:
        """
        A connection closed: release its leases (reason C{conn_closed}),
        refuse its queued requests, and forget its fences.
        """
        pending = _Pending()
        self._process_due(now, pending)
        paths: dict[str, None] = {}
        for lease in list(self._leases.values()):
            if lease.holder.connection_id == connection_id and not lease.orphan:
                self._drop(lease, LeaseEventName.RELEASE, LeaseReason.CONN_CLOSED, pending)
                paths[lease.path] = None
        for waiter in list(self._waiters.values()):
            if waiter.holder.connection_id == connection_id:
                self._remove_waiter(waiter, DenialReason.CONN_CLOSED, pending)
                paths[waiter.path] = None
        self._fenced = {
            (path, holder)
            for (path, holder) in self._fenced
            if holder.connection_id != connection_id
        }
        for path in paths:
            self._advance_queue(path, now, pending)
        return pending.freeze(self._epoch)

    def withdraw(self, request_id: int, reason: DenialReason, now: float) -> LeaseEffects:
        """Take a queued request out of its queue, answering it with C{reason}."""
        pending = _Pending()
        self._process_due(now, pending)
        waiter = self._waiters.get(request_id)
        if waiter is not None:
            self._remove_waiter(waiter, reason, pending)
            self._advance_queue(waiter.path, now, pending)
        return pending.freeze(self._epoch)

    def shutdown(self) -> LeaseEffects:
        """Refuse every queued request (reason C{shutdown}); leases stay as they are."""
        pending = _Pending()
        for waiter in list(self._waiters.values()):
            self._remove_waiter(waiter, DenialReason.SHUTDOWN, pending)
        return pending.freeze(self._epoch)

    def manifest_put(
        self, path: str, writer: LeaseHolder, now: float
    ) -> tuple[PutVerdict, LeaseEffects]:
        """
        A C{manifest_put} on C{path} from C{writer} is about to run. A fenced
        writer is refused. A writer holding the write lease (or reclaiming its
        session's orphan) proceeds. If another holder holds a write lease it
        is asked to yield (reason C{manifest_put_contention}) and the put is
        refused as contended. Otherwise the put proceeds and other holders'
        read leases are asked to yield with the same reason (their cached
        copy is about to be outdated). An orphan of a session C{writer}'s
        supersedes is dropped first, as in L{request}.
        """
        pending = _Pending()
        self._process_due(now, pending)
        self._drop_superseded(path, writer, now, pending)
        if self.is_fenced(writer, path):
            return PutVerdict.FENCED, pending.freeze(self._epoch)
        own = self._own_lease(path, writer, now, pending)
        if own is not None and own.mode is LeaseMode.WRITE:
            return PutVerdict.PROCEED, pending.freeze(self._epoch)
        others = [lease for lease in self.leases_on(path) if lease is not own]
        writers = [lease for lease in others if lease.mode is LeaseMode.WRITE]
        reason = LeaseReason.MANIFEST_PUT_CONTENTION
        if writers:
            self._ask_to_yield(writers, reason, now, pending)
            return PutVerdict.CONTENDED, pending.freeze(self._epoch)
        self._ask_to_yield(others, reason, now, pending)
        return PutVerdict.PROCEED, pending.freeze(self._epoch)

    # Rules.

    def _request(
        self,
        path: str,
        mode: LeaseMode,
        holder: LeaseHolder,
        wait: bool,
        now: float,
        pending: _Pending,
    ) -> Answer | Queued:
        adopted = self._adoptable(path, holder) is not None
        own = self._own_lease(path, holder, now, pending)
        if own is not None and (own.mode is LeaseMode.WRITE or mode is LeaseMode.READ):
            if not adopted:
                own = self._renew(own, now, pending)
            return LeaseGrant.of(own)
        others = [lease for lease in self.leases_on(path) if lease is not own]
        queue = self._queues.get(path)
        if mode is LeaseMode.READ:
            if any(lease.mode is LeaseMode.WRITE for lease in others):
                return LeaseDenied(path, mode, holder, DenialReason.WRITE_HELD)
            if queue:
                return LeaseDenied(path, mode, holder, DenialReason.WRITER_WAITING)
            return LeaseGrant.of(self._grant(path, mode, holder, own, now, pending))
        if not others and not queue:
            return LeaseGrant.of(self._grant(path, mode, holder, own, now, pending))
        if not queue:
            others = self._ask_to_yield(others, LeaseReason.CONTENTION, now, pending)
        if not wait:
            return LeaseDenied(path, mode, holder, DenialReason.CONTENTION)
        self._sequence += 1
        deadline = now + self.timings.revoke_timeout + self.timings.wait_margin
        if not queue:
            ends = [lease.ends_at + self.timings.wait_margin for lease in others]
            deadline = max([deadline, *ends])
        waiter = _Waiter(self._sequence, path, holder, deadline)
        self._queues.setdefault(path, deque()).append(waiter)
        self._waiters[waiter.request_id] = waiter
        self._schedule(deadline, _WAIT_END, str(waiter.request_id))
        return Queued(waiter.request_id)

    def _advance_queue(self, path: str, now: float, pending: _Pending) -> None:
        """Grant queued write requests on C{path}, head first, while possible."""
        queue = self._queues.get(path)
        while queue:
            head = queue[0]
            adopted = self._adoptable(path, head.holder) is not None
            own = self._own_lease(path, head.holder, now, pending)
            others = [lease for lease in self.leases_on(path) if lease is not own]
            if others:
                others = self._ask_to_yield(others, LeaseReason.CONTENTION, now, pending)
                needed = max(lease.ends_at for lease in others) + self.timings.wait_margin
                if needed > head.deadline:
                    head.deadline = needed
                    self._schedule(needed, _WAIT_END, str(head.request_id))
                break
            queue.popleft()
            del self._waiters[head.request_id]
            if own is not None and own.mode is LeaseMode.WRITE:
                lease = own if adopted else self._renew(own, now, pending)
            else:
                lease = self._grant(path, LeaseMode.WRITE, head.holder, own, now, pending)
            pending.answers.append((head.request_id, LeaseGrant.of(lease)))
        if not queue:
            self._queues.pop(path, None)

    def _process_due(self, now: float, pending: _Pending) -> None:
        while self._deadlines and self._deadlines[0][0] <= now:
            entry = heapq.heappop(self._deadlines)
            if not self._is_current(entry):
                continue
            at, kind, _, key = entry
            if kind == _LEASE_END:
                lease = self._leases[key]
                by_revoke = lease.revoke_deadline is not None and at == lease.revoke_deadline
                reason = LeaseReason.REVOKE_TIMEOUT if by_revoke else LeaseReason.EXPIRED
                self._drop(lease, LeaseEventName.VIOLATION, reason, pending)
                if lease.mode is LeaseMode.WRITE and not lease.orphan:
                    self._fenced.add((lease.path, lease.holder))
                self._advance_queue(lease.path, at, pending)
            else:
                waiter = self._waiters[int(key)]
                was_head = self._queues[waiter.path][0] is waiter
                self._remove_waiter(waiter, DenialReason.TIMEOUT, pending)
                if was_head:
                    self._advance_queue(waiter.path, at, pending)

    # Primitive steps.

    def _is_current(self, entry: tuple[float, int, int, str]) -> bool:
        at, kind, _, key = entry
        if kind == _LEASE_END:
            lease = self._leases.get(key)
            return lease is not None and lease.ends_at == at
        waiter = self._waiters.get(int(key))
        return waiter is not None and waiter.deadline == at

    def _schedule(self, at: float, kind: int, key: str) -> None:
        self._sequence += 1
        heapq.heappush(self._deadlines, (at, kind, self._sequence, key))

    def _held_by(self, lease: Lease, holder: LeaseHolder) -> bool:
        return not lease.orphan and lease.holder == holder

    def _owned_by(self, lease: Lease, holder: LeaseHolder) -> bool:
        return self._held_by(lease, holder) or (
            lease.orphan
            and holder.session_id is not None
            and lease.holder.agent_id == holder.agent_id
            and lease.holder.session_id == holder.session_id
        )

    def _superseded(self, lease: Lease, holder: LeaseHolder) -> bool:
        """Whether C{lease} is an orphan of a session older than C{holder}'s."""
        return lease.orphan and holder.supersedes(lease.holder)

    def _drop_superseded(
        self, path: str, holder: LeaseHolder, now: float, pending: _Pending
    ) -> None:
        """
        Drop the orphans on C{path} of sessions older than C{holder}'s, as a
        release of their closed connection, and let the path's queue move.
        """
        superseded = [lease for lease in self.leases_on(path) if self._superseded(lease, holder)]
        for lease in superseded:
            self._drop(lease, LeaseEventName.RELEASE, LeaseReason.CONN_CLOSED, pending)
        if superseded:
            self._advance_queue(path, now, pending)

    def _adoptable(self, path: str, holder: LeaseHolder) -> Lease | None:
        leases = self.leases_on(path)
        if any(self._held_by(lease, holder) for lease in leases):
            return None
        for lease in leases:
            if lease.orphan and self._owned_by(lease, holder):
                return lease
        return None

    def _own_lease(
        self, path: str, holder: LeaseHolder, now: float, pending: _Pending
    ) -> Lease | None:
        """C{holder}'s lease on C{path}, adopting its session's orphan if any."""
        orphan = self._adoptable(path, holder)
        if orphan is None:
            for lease in self.leases_on(path):
                if self._held_by(lease, holder):
                    return lease
            return None
        lease = attrs.evolve(orphan, holder=holder, orphan=False, expires_at=now + self.timings.ttl)
        self._put(lease, pending)
        self._fenced.discard((path, holder))
        self._event(pending, LeaseEventName.GRANT, lease, LeaseReason.NONE)
        if lease.revoke_reason is not None and lease.revoke_deadline is not None:
            pending.revokes.append(
                LeaseRevoke(
                    lease.lease_id,
                    path,
                    lease.mode,
                    holder,
                    lease.revoke_reason,
                    lease.revoke_deadline,
                )
            )
        return lease

    def _grant(
        self,
        path: str,
        mode: LeaseMode,
        holder: LeaseHolder,
        own: Lease | None,
        now: float,
        pending: _Pending,
    ) -> Lease:
        """A new lease, or C{own} upgraded to C{mode} as a fresh grant."""
        self._epoch += 1
        if own is None:
            lease_id = self._new_lease_id()
            if lease_id in self._leases:
                raise ValueError(f"lease id source repeated {lease_id!r}")
        else:
            lease_id = own.lease_id
        lease = Lease(lease_id, path, mode, holder, self._epoch, now, now + self.timings.ttl)
        self._put(lease, pending)
        self._fenced.discard((path, holder))
        self._event(pending, LeaseEventName.GRANT, lease, LeaseReason.NONE)
        return lease

    def _renew(self, lease: Lease, now: float, pending: _Pending) -> Lease:
        lease = attrs.evolve(lease, expires_at=max(lease.expires_at, now + self.timings.ttl))
        self._put(lease, pending)
        self._event(pending, LeaseEventName.REFRESH, lease, LeaseReason.NONE)
        return lease

    def _ask_to_yield(
        self, leases: Iterable[Lease], reason: LeaseReason, now: float, pending: _Pending
    ) -> list[Lease]:
        """
        Ask each lease not yet asked to yield by C{now + revoke_timeout};
        return the leases as they now are.
        """
        result = []
        for lease in leases:
            if lease.revoke_deadline is not None:
                result.append(lease)
                continue
            deadline = now + self.timings.revoke_timeout
            asked = attrs.evolve(lease, revoke_reason=reason, revoke_deadline=deadline)
            result.append(asked)
            self._put(asked, pending)
            self._event(pending, LeaseEventName.REVOKE, asked, reason)
            if not asked.orphan:
                pending.revokes.append(
                    LeaseRevoke(
                        asked.lease_id, asked.path, asked.mode, asked.holder, reason, deadline
                    )
                )
        return result

    def _put(self, lease: Lease, pending: _Pending) -> None:
        self._leases[lease.lease_id] = lease
        self._paths.setdefault(lease.path, {})[lease.lease_id] = None
        self._schedule(lease.ends_at, _LEASE_END, lease.lease_id)
        pending.records[lease.lease_id] = lease

    def _drop(
        self, lease: Lease, event: LeaseEventName, reason: LeaseReason, pending: _Pending
    ) -> None:
        del self._leases[lease.lease_id]
        on_path = self._paths[lease.path]
        del on_path[lease.lease_id]
        if not on_path:
            del self._paths[lease.path]
        pending.records[lease.lease_id] = None
        self._event(pending, event, lease, reason)

    def _remove_waiter(self, waiter: _Waiter, reason: DenialReason, pending: _Pending) -> None:
        del self._waiters[waiter.request_id]
        queue = self._queues[waiter.path]
        queue.remove(waiter)
        if not queue:
            del self._queues[waiter.path]
        denied = LeaseDenied(waiter.path, LeaseMode.WRITE, waiter.holder, reason)
        pending.answers.append((waiter.request_id, denied))

    def _event(
        self, pending: _Pending, name: LeaseEventName, lease: Lease, reason: LeaseReason
    ) -> None:
        pending.events.append(
            LeaseEvent(
                name,
                lease.holder.agent_id,
                lease.lease_id,
                lease.mode,
                reason,
                lease.path,
                lease.holder.connection_id,
                len(self._paths.get(lease.path, ())),
            )
        )
