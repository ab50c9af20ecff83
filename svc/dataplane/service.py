"""
The data-plane logic object: L{DataPlaneService} implements
L{svc.dataplane.interfaces.IDataPlaneService} over the storage engine.

It owns what all connections share: the storage engine (built by the factory
it is given, with this service's lease callbacks), the live connections by
id (lease revokes are pushed to the holder's connection; a connection whose
leaf or intermediate is deny-listed is disconnected when the deny-list
changes, and every connection is disconnected at its leaf's or
intermediate's not-after by a timer of its own; a committed write is pushed as
C{changed} to the agent's other connections, L{DataPlaneService.announce}),
the session epochs of each tenant, the placement check (a connection opens
its storage only for an identity placed on this server, else EACCES and
GOAWAY: L{svc.dataplane.placements}), the path policies, the audit emitter
and the metrics. Each admitted connection gets an
L{svc.dataplane.connection.AgentConnection}, which runs its operations. No
sockets, TLS or frames here. The operations are specified in
``docs/specifications/dataplane-ops.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol

from twisted.internet.defer import Deferred, DeferredLock
from twisted.logger import Logger, LogLevel

from svc.audit.events import AuditEvent
from svc.audit.server_events import lease_line
from svc.dataplane.admission import Lapse, Standing, expiry, standing
from svc.dataplane.answer_budget import AnswerBudgets, AnswerLimits
from svc.dataplane.change_notices import (
    MANY_CONNECTIONS,
    AgentConnections,
    ChangeNotice,
    readable_paths,
)
from svc.dataplane.chunk_visibility import DEFAULT_MEMORY
from svc.dataplane.confinement import disk_root
from svc.dataplane.connection import AgentConnection
from svc.dataplane.connection_context import ConnectionContext, DiskHandle
from svc.dataplane.drain_fences import DrainFences
from svc.dataplane.errors import NotPlaced, OpFailed, PlacementUnconfirmed
from svc.dataplane.interfaces import IConnectionSink
from svc.dataplane.placements import Placements, Verdict
from svc.dataplane.rate_limited_log import RateLimitedLog
from svc.dataplane.replies import (
    credentials_revoked_push,
    lease_revoke_push,
    session_fenced_push,
)
from svc.dataplane.session_epochs import SESSIONS_FILE, SessionEpochs
from svc.metrics import DataPlaneMetrics
from svc.pki.identity import AgentIdentity, DenyList
from svc.policy import PathPolicy
from svc.store.engine import StorageEngine
from svc.store.errors import AlreadyExists
from svc.store.layout import TenantLocation, metadata_dir
from svc.store.lease_values import LeaseEvent, LeaseRevoke
from svc.store.manifest_values import Writer
from svc.wire.errno import WireErrno
from svc.wire.ops import Op
from svc.worker import IWorker

RevokeCallback = Callable[[TenantLocation, LeaseRevoke], object]
EventCallback = Callable[[TenantLocation, LeaseEvent], object]
EngineFactory = Callable[[RevokeCallback, EventCallback], StorageEngine]
"""Builds the storage engine with the service's lease callbacks."""

PolicyLookup = Callable[[str, str], PathPolicy | None]
"""C{(tenant_id, agent_id)} to that agent's path policy (L{None}: unrestricted)."""

DISK_ROOT_MODE = 0o755
"""Mode of an agent's disk root when the server creates it."""

DENIED_GOAWAY_REASON = "credentials_expired"
"""
The GOAWAY reason (wire section 4.6) of a connection whose leaf or
intermediate is deny-listed or has expired, or whose identity is not placed
on this server.
"""

REFUSAL_LOG_LINES = 10
REFUSAL_LOG_WINDOW = 60.0
"""At most L{REFUSAL_LOG_LINES} log lines about unplaced identities per this
many seconds; the next line allowed counts those left out."""


class ServiceClock(Protocol):
    """The part of a reactor (or C{Clock}) the service uses."""

    def seconds(self) -> float:
        """Now, in seconds since the epoch."""

    def callLater(
        self, delay: float, callable: Callable[..., object], *args: object, **kw: object
    ) -> Any:
        """Schedule a call."""


def _agent_key(identity: AgentIdentity) -> tuple[str, str]:
    """Whose connections are fenced together (L{DrainFences})."""
    return (identity.tenant_id, identity.agent_id)


def location_of(identity: AgentIdentity) -> TenantLocation:
    """
    Where an identity's data lives: owner = user id (the leaf CN), tenant =
    tenant id (the tenant level exists only when they differ).
    """
    return TenantLocation(owner=identity.user_id, tenant=identity.tenant_id)


def allocation_label(identity: AgentIdentity) -> str:
    """
    The C{allocation_id} label of the journal metrics: C{<tenant>/<agent>},
    the agent's disk (the data plane does not know control-plane allocation
    ids).
    """
    return f"{identity.tenant_id}/{identity.agent_id}"


def _no_policy(tenant_id: str, agent_id: str) -> PathPolicy | None:
    return None


def _location_or_none(identity: AgentIdentity) -> TenantLocation | None:
    try:
        return location_of(identity)
    except ValueError:
        return None


class DataPlaneService:
    """
    The data-plane logic; see the module docstring.

    @ivar engine: the storage engine, built by C{engine_factory} with
        L{on_lease_revoke} and L{on_lease_event} (so the HTTP surface and the
        GC loop use the same engine).
    """

    _log = Logger()

    def __init__(
        self,
        engine_factory: EngineFactory,
        *,
        audit_emit: Callable[[AuditEvent], object],
        metrics: DataPlaneMetrics,
        clock: ServiceClock,
        session_key: bytes,
        io_worker: IWorker,
        policy_for: PolicyLookup = _no_policy,
        deny_list: DenyList | None = None,
        visible_memory: int = DEFAULT_MEMORY,
        placements: Placements | None = None,
        answer_limits: AnswerLimits | None = None,
    ) -> None:
        """
        @param placements: the identities placed on this server; an agent
            whose identity is not placed gets C{EACCES} when it first opens
            its storage, and its connections are closed. L{None}: every
            admitted identity is served (unit tests, benchmarks, and a
            static-certificate server started with C{SVC_PLACEMENT_CHECK=off}).
        @param answer_limits: the answer budgets (L{AnswerLimits}() by default).
        """
        self.answer_budgets = AnswerBudgets(answer_limits)
        # Refusals a peer can cause (unplaced identities, requests refused
        # before decoding) are logged at a bounded rate.
        self._refusal_log = RateLimitedLog(
            clock.seconds, self._log, burst=REFUSAL_LOG_LINES, interval=REFUSAL_LOG_WINDOW
        )
        self._context = ConnectionContext(
            clock=clock,
            metrics=metrics,
            audit_emit=audit_emit,
            session_key=session_key,
            policy_for=policy_for,
            open_disk=self._open_disk,
            forget=self._forget,
            draining=self._draining,
            visible_memory=visible_memory,
            announce=self.announce,
            refusals=self._refusal_log,
            answer_budgets=self.answer_budgets,
            fenced=self._tell_fenced,
        )
        self._clock = clock
        self._metrics = metrics
        self._audit_emit = audit_emit
        self._io = io_worker
        self._deny_list = deny_list if deny_list is not None else DenyList()
        self._connections: dict[str, AgentConnection] = {}
        self._agents: AgentConnections[AgentConnection] = AgentConnections()
        self._dismissed: set[str] = set()
        self._expiry_timers: dict[str, Any] = {}
        self._epochs: dict[TenantLocation, SessionEpochs] = {}
        self._epochs_lock = DeferredLock()
        self._fences = DrainFences(clock)
        self._placements = placements
        self.engine = engine_factory(self.on_lease_revoke, self.on_lease_event)

    # IDataPlaneService

    def connect(
        self, identity: AgentIdentity, connection_id: str, sink: IConnectionSink
    ) -> AgentConnection:
        """
        A new admitted connection. Nothing is opened yet: the tenant's
        storage is resolved on the connection's first operation. A timer
        disconnects it at the earliest not-after of its leaf and
        intermediate (L{svc.dataplane.admission.expiry}), with no leeway.
        """
        if connection_id in self._connections:
            raise ValueError(f"connection id {connection_id!r} is already live")
        connection = AgentConnection(
            self._context,
            identity,
            connection_id,
            sink,
            after=self._fences.fence(_agent_key(identity)),
        )
        self._connections[connection_id] = connection
        try:
            location = location_of(identity)
        except ValueError:
            pass  # no storage for it: it can write nothing, so is told nothing
        else:
            self._agents.add(location, identity.agent_id, connection)
        moment, serial = expiry(identity)
        delay = max(0.0, moment.timestamp() - self._clock.seconds())
        lapse = Lapse(Standing.EXPIRED, serial)
        self._expiry_timers[connection_id] = self._clock.callLater(
            delay, self._dismiss, connection, lapse
        )
        return connection

    def connection(self, connection_id: str) -> AgentConnection | None:
        """The live connection with C{connection_id}, if any."""
        return self._connections.get(connection_id)

    # Deny-list

    @property
    def deny_list(self) -> DenyList:
        """The deny-list the protocol's admission checks new connections against."""
        return self._deny_list

    def set_deny_list(self, deny_list: DenyList) -> None:
        """
        Install C{deny_list} (what the server's deny-list is now: see
        L{svc.dataplane.revocations}) and check every live connection
        against it (L{check_credentials}).
        """
        self._deny_list = deny_list
        self.check_credentials()

    def check_credentials(self) -> None:
        """
        Disconnect (GOAWAY C{credentials_expired}) every live connection
        whose leaf or intermediate serial is deny-listed or whose leaf or
        intermediate has expired (L{svc.dataplane.admission.standing}); each
        connection once. Runs whenever a deny-list is installed; expiry
        alone is each connection's own timer (L{connect}).
        """
        now = datetime.fromtimestamp(self._clock.seconds(), UTC)
        for connection in list(self._connections.values()):
            lapse = standing(connection.identity, self._deny_list, now)
            if lapse is not None:
                self._dismiss(connection, lapse)

    def _dismiss(self, connection: AgentConnection, lapse: Lapse) -> None:
        """
        GOAWAY C{credentials_expired} to a live C{connection}, once, logged;
        when a certificate of its chain is deny-listed, PUSH
        C{credentials_revoked} first, so the client knows no reconnection
        with it will be admitted (an expired leaf may have been renewed).
        """
        if connection.connection_id in self._dismissed:
            return
        if self._connections.get(connection.connection_id) is not connection:
            return
        self._log.info(
            "disconnecting {connection_id}: serial {serial} is {reason}",
            connection_id=connection.connection_id,
            serial=lapse.serial,
            reason=lapse.reason.value,
            tenant_id=connection.identity.tenant_id,
            agent_id=connection.identity.agent_id,
            leaf_serial=connection.identity.serial,
        )
        self._dismissed.add(connection.connection_id)
        if lapse.reason is Standing.DENIED:
            connection.sink.push(
                Op.CREDENTIALS_REVOKED.value, credentials_revoked_push(lapse.serial)
            )
        connection.sink.disconnect(DENIED_GOAWAY_REASON)

    # Fencing (the session_fenced push)

    def fence_sessions(self, location: TenantLocation, agent_id: str, epoch: int) -> Deferred[None]:
        """
        The control plane granted C{agent_id}'s mount lease at C{epoch}:
        fence its older sessions now (kept in C{sessions.json} first), as
        the new holder's first write would, and tell its live connections
        (L{_tell_fenced}), so a displaced mount stops writing at once.
        """

        async def fencing() -> None:
            epochs = await self._session_epochs(location)
            if epochs.raise_to(agent_id, epoch):
                await epochs.save()
                self._log.info(
                    "sessions of {agent_id} in {tenant_id} older than epoch {epoch} fenced",
                    agent_id=agent_id,
                    tenant_id=location.tenant,
                    epoch=epoch,
                )
            newest = epochs.newest(agent_id)
            self._tell_fenced(location, agent_id, epoch if newest is None else newest, None)

        return Deferred.fromCoroutine(fencing())

    def _tell_fenced(
        self,
        location: TenantLocation,
        agent_id: str,
        epoch: int,
        source: AgentConnection | None,
    ) -> None:
        """
        Push C{session_fenced} (C{epoch}) to every live connection of the
        agent in C{location} but C{source} (whose session raised it) and
        those whose session is at least that new: a connection that has
        written no session yet is told too, its mount knows its own epoch.
        """
        payload = session_fenced_push(epoch)
        for connection in self._agents.of(location, agent_id):
            if (
                connection is source
                or connection.connection_id in self._dismissed
                or connection.closing
                or (connection.session_epoch is not None and connection.session_epoch >= epoch)
            ):
                continue
            connection.sink.push(Op.SESSION_FENCED.value, payload)

    # Changes (the changed push)

    def announce(self, notice: ChangeNotice) -> None:
        """
        A write committed: push C{changed} to every connection
        L{AgentConnections.audience} names (the agent's other live
        connections in that tenant), with the paths the agent's path policy
        lets it read; nothing when none is left. Best effort: a connection
        that is closing or gone is skipped, a push that fails is logged, and
        nothing is retried or acknowledged. Not audited, not timed.
        """
        audience = self._agents.audience(notice, self._dismissed)
        if not audience:
            return
        if len(audience) > MANY_CONNECTIONS:
            self._log.info(
                "changed push to {count} connections of {agent_id}",
                count=len(audience),
                agent_id=notice.agent_id,
                tenant_id=notice.location.tenant,
            )
        policy = self._context.policy_for(notice.location.tenant, notice.agent_id)
        paths = readable_paths(notice, policy)
        if not paths:
            return
        payload = notice.push(paths)
        for connection in audience:
            try:
                connection.sink.push(Op.CHANGED.value, payload)
            except Exception:
                self._log.failure(
                    "changed push to {connection_id} failed",
                    connection_id=connection.connection_id,
                )

    # Lease callbacks (given to the storage engine)

    def on_lease_revoke(self, location: TenantLocation, revoke: LeaseRevoke) -> None:
        """
        Push C{lease_revoke} to the connection holding the lease; a holder
        whose connection is gone is left to the lease's deadline.
        """
        started = self._clock.seconds()
        connection = self._connections.get(revoke.holder.connection_id)
        if connection is None or connection.location != location:
            self._log.info(
                "lease revoke for {lease_id} has no live connection {connection_id}",
                lease_id=revoke.lease_id,
                connection_id=revoke.holder.connection_id,
            )
            return
        connection.sink.push(Op.LEASE_REVOKE.value, lease_revoke_push(revoke, started))
        self._metrics.observe_op(Op.LEASE_REVOKE.value, self._clock.seconds() - started)

    def on_lease_event(self, location: TenantLocation, event: LeaseEvent) -> None:
        """
        A lease event: its audit line (reduced envelope) and the
        C{svc_lease_held} gauge of its path.
        """
        self._audit_emit(lease_line(event, ts=self._clock.seconds()))
        try:
            self._metrics.set_lease_held(
                event.path, event.leases_on_path, f"{location.owner}/{location.tenant}"
            )
        except KeyError:
            pass  # the series was never set (a lease restored from a previous run)

    # Used by connections

    def _forget(self, connection: AgentConnection) -> None:
        if self._connections.get(connection.connection_id) is connection:
            del self._connections[connection.connection_id]
            self._dismissed.discard(connection.connection_id)
            self._agents.discard(connection.connection_id)
            timer = self._expiry_timers.pop(connection.connection_id, None)
            if timer is not None and timer.active():
                timer.cancel()

    def _draining(self, connection: AgentConnection, drained: Deferred[None]) -> None:
        self._fences.closing(_agent_key(connection.identity), drained)

    def _open_disk(self, identity: AgentIdentity) -> Deferred[DiskHandle]:
        async def opening() -> DiskHandle:
            try:
                location = location_of(identity)
            except ValueError:
                self._log.warn(
                    "no storage location for tenant {tenant} user {user}",
                    tenant=identity.tenant_id,
                    user=identity.user_id,
                )
                raise OpFailed(WireErrno.EIO, "tenant storage unavailable") from None
            if self._placements is not None:
                verdict = await self._placements.check(location, identity.agent_id)
                if verdict is Verdict.NOT_PLACED:
                    self._refuse_unplaced(identity, location)
                    raise NotPlaced()
                if verdict is Verdict.UNCONFIRMED:
                    raise PlacementUnconfirmed()
            storage = await self.engine.tenant(location)
            epochs = await self._session_epochs(location)
            root = disk_root(identity.agent_id)
            try:
                await storage.dir_create(
                    root, mode=DISK_ROOT_MODE, uid=0, gid=0, writer=Writer(identity.agent_id)
                )
            except AlreadyExists:
                pass
            else:
                self._metrics.count_journal_write("mkdir", allocation_label(identity))
            return DiskHandle(location, storage, epochs)

        return Deferred.fromCoroutine(opening())

    def _refuse_unplaced(self, identity: AgentIdentity, location: TenantLocation) -> None:
        """
        Close (GOAWAY C{credentials_expired}) every live connection of an
        identity that is not placed here; log it, at most
        L{REFUSAL_LOG_LINES} lines per L{REFUSAL_LOG_WINDOW} seconds
        (L{RateLimitedLog}).
        """
        closing = [
            c
            for c in self._connections.values()
            if c.identity.agent_id == identity.agent_id
            and c.connection_id not in self._dismissed
            and _location_or_none(c.identity) == location
        ]
        for connection in closing:
            self._dismissed.add(connection.connection_id)
            connection.sink.disconnect(DENIED_GOAWAY_REASON)
        self._refusal_log.emit(
            "unplaced",
            LogLevel.warn,
            "refused owner {owner} tenant {tenant_id} agent {agent_id} (leaf {leaf_serial}):"
            " not placed on this server; closed {count} connection(s)"
            " ({suppressed} earlier refusals not logged)",
            owner=location.owner,
            tenant_id=identity.tenant_id,
            agent_id=identity.agent_id,
            leaf_serial=identity.serial,
            count=len(closing),
        )

    async def _session_epochs(self, location: TenantLocation) -> SessionEpochs:
        await self._epochs_lock.acquire()
        try:
            epochs = self._epochs.get(location)
            if epochs is None:
                path = metadata_dir(self.engine.roots.metadata_root, location) / SESSIONS_FILE
                epochs = await SessionEpochs.load(location.tenant, path, self._io)
                self._epochs[location] = epochs
            return epochs
        finally:
            self._epochs_lock.release()
