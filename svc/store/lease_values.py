"""
The values of the data-plane lease rules: modes, reasons, holders, timings,
leases, answers and events. Pure data (frozen attrs classes and enums); the
state machine that produces them is L{svc.store.lease_rules.LeaseState}.
"""

from __future__ import annotations

import enum
import re
import secrets
from collections.abc import Mapping

import attrs

from svc.config import ConfigError, env_int
from svc.sessions import SessionRejected, parse_epoch

_LEASE_ID = re.compile(r"\A[0-9a-f]{32}\Z")


class LeaseMode(enum.StrEnum):
    """The two lease modes of the spec."""

    READ = "read"
    WRITE = "write"


class LeaseEventName(enum.StrEnum):
    """Audit event names of the spec's "Lease events" table."""

    GRANT = "lease_grant"
    REFRESH = "lease_refresh"
    RELEASE = "lease_release"
    REVOKE = "lease_revoke"
    VIOLATION = "lease_violation"


class LeaseReason(enum.StrEnum):
    """The C{reason} field of a lease event (empty for grant and refresh)."""

    NONE = ""
    CLIENT = "client"
    CONN_CLOSED = "conn_closed"
    CONTENTION = "contention"
    MANIFEST_PUT_CONTENTION = "manifest_put_contention"
    REVOKE_TIMEOUT = "revoke_timeout"
    EXPIRED = "expired"


class DenialReason(enum.StrEnum):
    """Why a lease request was refused (not an audit field; for the server)."""

    WRITE_HELD = "write_held"
    WRITER_WAITING = "writer_waiting"
    CONTENTION = "contention"
    TIMEOUT = "timeout"
    CONN_CLOSED = "conn_closed"
    CANCELLED = "cancelled"
    SHUTDOWN = "shutdown"


class PutVerdict(enum.StrEnum):
    """What L{LeaseState.manifest_put} decided about a C{manifest_put}."""

    PROCEED = "proceed"
    CONTENDED = "contended"
    FENCED = "fenced"


def _non_empty(_instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not value:
        raise ValueError(f"{attribute.name} must not be empty")


def _lease_id(_instance: object, _attribute: attrs.Attribute[str], value: str) -> None:
    if not _LEASE_ID.match(value):
        raise ValueError(f"lease id must be 32 lowercase hex characters, got {value!r}")


def _positive(_instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not value > 0:
        raise ValueError(f"{attribute.name} must be positive, got {value!r}")


def random_lease_id() -> str:
    """A fresh 128-bit lease id as 32 lowercase hex characters."""
    return secrets.token_hex(16)


@attrs.frozen
class LeaseHolder:
    """
    Who holds a lease: an agent on one data-plane connection. Identity is
    C{(agent_id, connection_id)}; C{session_id} is carried along (it lets a
    reconnecting session reclaim its write lease after a restart, and a newer
    session drop an older one's) but is not part of equality.
    """

    agent_id: str = attrs.field(validator=_non_empty)
    connection_id: str = attrs.field(validator=_non_empty)
    session_id: str | None = attrs.field(default=None, eq=False)

    @property
    def session_epoch(self) -> int | None:
        """
        The mount-lease epoch of C{session_id} (``docs/specifications/sessions.md``),
        or L{None} without a session or for an id not of that format.
        """
        if self.session_id is None:
            return None
        try:
            return parse_epoch(self.session_id)
        except SessionRejected:
            return None

    def supersedes(self, other: LeaseHolder) -> bool:
        """
        Whether C{self}'s session is a newer mount session of C{other}'s agent
        than C{other}'s: the control plane granted the agent's mount lease
        again since, so C{other}'s session is fenced and can write no more.
        """
        newer, older = self.session_epoch, other.session_epoch
        return (
            self.agent_id == other.agent_id
            and newer is not None
            and older is not None
            and newer > older
        )


@attrs.frozen
class LeaseTimings:
    """
    Lease durations in seconds: C{ttl} from grant or refresh to expiry,
    C{revoke_timeout} from a revoke request to the forced drop, and
    C{wait_margin}, added to C{revoke_timeout} to give a waiting request its
    own deadline.
    """

    ttl: float = attrs.field(default=60.0, validator=_positive)
    revoke_timeout: float = attrs.field(default=10.0, validator=_positive)
    wait_margin: float = attrs.field(default=5.0, validator=_positive)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> LeaseTimings:
        """
        Read C{SVC_LEASE_TTL_SECONDS}, C{SVC_LEASE_REVOKE_TIMEOUT_SECONDS} and
        C{SVC_LEASE_WAIT_MARGIN_SECONDS} (whole seconds, defaults 60, 10, 5).
        """
        ttl = env_int(environ, "SVC_LEASE_TTL_SECONDS", 60, minimum=1, maximum=86400)
        revoke = env_int(environ, "SVC_LEASE_REVOKE_TIMEOUT_SECONDS", 10, minimum=1)
        margin = env_int(environ, "SVC_LEASE_WAIT_MARGIN_SECONDS", 5, minimum=1)
        if revoke > ttl:
            raise ConfigError(
                "SVC_LEASE_REVOKE_TIMEOUT_SECONDS", f"must not exceed the lease TTL ({ttl})"
            )
        return cls(float(ttl), float(revoke), float(margin))


@attrs.frozen
class Lease:
    """
    One lease as stored. It ends at L{ends_at}: its expiry, or its revoke
    deadline once the holder has been asked to yield. An C{orphan} is a write
    lease recovered at open whose connection no longer exists.
    """

    lease_id: str = attrs.field(validator=_lease_id)
    path: str = attrs.field(validator=_non_empty)
    mode: LeaseMode
    holder: LeaseHolder
    epoch: int = attrs.field(validator=attrs.validators.ge(1))
    granted_at: float
    expires_at: float
    revoke_reason: LeaseReason | None = None
    revoke_deadline: float | None = None
    orphan: bool = False

    @property
    def ends_at(self) -> float:
        """When this lease is dropped unless released or refreshed first."""
        if self.revoke_deadline is None:
            return self.expires_at
        return min(self.expires_at, self.revoke_deadline)


@attrs.frozen
class LeaseGrant:
    """A lease granted (or renewed) to a holder; C{expires_at} is L{Lease.ends_at}."""

    lease_id: str
    path: str
    mode: LeaseMode
    holder: LeaseHolder
    epoch: int
    expires_at: float

    @classmethod
    def of(cls, lease: Lease) -> LeaseGrant:
        """The grant describing C{lease}."""
        return cls(lease.lease_id, lease.path, lease.mode, lease.holder, lease.epoch, lease.ends_at)


@attrs.frozen
class LeaseDenied:
    """A lease request refused; the client falls back to uncached access."""

    path: str
    mode: LeaseMode
    holder: LeaseHolder
    reason: DenialReason


@attrs.frozen
class Queued:
    """A write request waiting in its path's queue; answered later by id."""

    request_id: int


@attrs.frozen
class LeaseRevoke:
    """A request, to be pushed on the holder's connection, to give up a lease."""

    lease_id: str
    path: str
    mode: LeaseMode
    holder: LeaseHolder
    reason: LeaseReason
    deadline: float


@attrs.frozen
class LeaseEvent:
    """
    One lease audit event. C{leases_on_path} counts the leases on C{path}
    after the event, for the C{svc_lease_held} gauge (remove the series at 0).
    """

    event: LeaseEventName
    agent_id: str
    lease_id: str
    mode: LeaseMode
    reason: LeaseReason
    path: str
    connection_id: str
    leases_on_path: int


Answer = LeaseGrant | LeaseDenied


@attrs.frozen
class LeaseEffects:
    """
    What a transition asks the caller to do, in order: emit C{events}, push
    C{revokes}, deliver C{answers} to queued requests, and make the stored
    rows match C{stored} / C{dropped} (lease ids) and the epoch counter.
    """

    events: tuple[LeaseEvent, ...] = ()
    revokes: tuple[LeaseRevoke, ...] = ()
    answers: tuple[tuple[int, Answer], ...] = ()
    stored: tuple[Lease, ...] = ()
    dropped: tuple[str, ...] = ()
    epoch: int = 0
