"""
One admitted connection's view of the data plane: L{AgentConnection}
implements L{svc.dataplane.interfaces.IConnectionHandler}.

For every request it, in order: takes the request the protocol decoded
within its operation's declared limits (L{svc.wire.contract.decode}; a
refusal of its fields is audited here), takes its place in the connection's
order, confines
every path to C{/<agent_id>} (EACCES, a C{list}/C{stat}/... denial line and
C{svc_agent_path_denied_total}), applies the agent's path policy (EACCES,
the op's own event with C{allowed: false}; both L{svc.dataplane.path_checks}),
verifies a presented
C{session_id} (EPERM, C{svc_session_forgery_rejected_total}), runs the
operation (L{svc.dataplane.handlers}), announces a successful write to
the agent's other connections (the C{changed} push, through the service:
L{svc.dataplane.change_notices}) and writes one audit line with the
outcome. Every op is timed into C{svc_dataplane_op_duration_seconds}.

Ordering (wire section 5: a request sees the effects of every earlier
request of its connection) is L{svc.dataplane.request_order}'s: namespace,
journal, lease and C{close} requests run one at a time in arrival order,
except that consecutive C{manifest_put}s overlap once each is queued in the
database; C{chunk_get}, C{chunk_has} and C{statfs} wait for the earlier
ones but do not hold up later ones; C{chunk_put} starts at once, and any
later request naming its hash waits for it (L{svc.dataplane.pending_uploads});
C{ping} waits for nothing. A
write's C{changed} push is sent once it has committed and before its turn
ends, so before the connection's next request other than a C{manifest_put}
starts and before the write's own answer is sent.

A request the protocol gives up on (its timeout, the connection closing)
is stopped only while it waits for its turn; one that has started runs to
its end, and the requests after it still see its effects
(dataplane-ops.md section 7).

The audit lines are L{svc.dataplane.connection_audit}'s; what the service
gives every connection is L{svc.dataplane.connection_context}'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

from twisted.internet.defer import Deferred, DeferredLock
from twisted.logger import Logger, LogLevel
from twisted.python.failure import Failure

from svc.audit.events import CertFields
from svc.dataplane.answer_budget import ConnectionBudget
from svc.dataplane.calls import Call, Outcome, inline_segments
from svc.dataplane.change_notices import ChangeNotice, changed_paths
from svc.dataplane.chunk_visibility import VisibleChunks, referenced_by_disk
from svc.dataplane.confinement import PathOutsideSubtree, disk_root
from svc.dataplane.connection_audit import ConnectionAudit
from svc.dataplane.connection_context import ConnectionContext, DiskHandle
from svc.dataplane.errors import OpFailed, SessionRefused, from_store_error
from svc.dataplane.handlers import perform
from svc.dataplane.inline_reads import released, with_inline
from svc.dataplane.interfaces import IConnectionSink, OpReply
from svc.dataplane.outbox_entries import AnswerOf, answered_before, position_of
from svc.dataplane.path_checks import apply_policy, confine_paths
from svc.dataplane.pending_uploads import PendingUploads, named_hashes
from svc.dataplane.request_order import RequestOrder, Running, Turn
from svc.dataplane.request_paths import first_path, session_of
from svc.metrics import op_label
from svc.pki.identity import AgentIdentity
from svc.policy import PathPolicy
from svc.sessions import MountSession, SessionRejected, verify_session_id
from svc.store.errors import StoreError
from svc.store.layout import TenantLocation
from svc.store.lease_values import LeaseHolder
from svc.store.manifest_values import Writer
from svc.store.outbox_answers import AnsweredBefore
from svc.store.tenant import TenantStorage
from svc.wire.commands import Command
from svc.wire.contract import DecodedRequest, RequestRefused
from svc.wire.errno import WireErrno
from svc.wire.kinds import FieldRefused
from svc.wire.messages import (
    ChunkGetRequest,
    ChunkHasRequest,
    ChunkPutRequest,
    ManifestPutRequest,
)
from svc.wire.ops import Op


class AgentConnection:
    """
    One connection of one agent; see the module docstring.
    """

    _log = Logger()

    def __init__(
        self,
        context: ConnectionContext,
        identity: AgentIdentity,
        connection_id: str,
        sink: IConnectionSink,
        after: Deferred[None] | None = None,
    ) -> None:
        """
        @param after: fires once the agent's closed connections have run
            the ordered requests they had received (L{DrainFences}): this
            connection's ordered requests wait for it.
        """
        self._context = context
        self._clock = context.clock
        self.metrics = context.metrics
        self.identity = identity
        self.connection_id = connection_id
        self.sink = sink
        self.agent_id = identity.agent_id
        self.root = disk_root(identity.agent_id)
        self.cert = CertFields.of_agent(identity)
        self.audit = ConnectionAudit(
            agent_id=identity.agent_id,
            cert=self.cert,
            now=self.now,
            emit=context.audit_emit,
            metrics=context.metrics,
        )
        self.visible = VisibleChunks(context.visible_memory)
        self.session_id: str | None = None
        self.session_epoch: int | None = None
        """The epoch of C{session_id}, the newest session verified here."""
        self.closing = False
        self.answers: ConnectionBudget = context.answer_budgets.connection(
            (identity.tenant_id, identity.agent_id)
        )
        """This connection's answer budget: bulk answers reserve their bytes here."""
        # Session ids presented here that passed the tag check.
        self._seen_sessions: dict[str, MountSession] = {}
        self._disk: DiskHandle | None = None
        self._open_lock = DeferredLock()
        self._order = RequestOrder(after)
        self._uploads = PendingUploads()

    # Properties the handlers use.

    @property
    def location(self) -> TenantLocation | None:
        """The tenant location, once the storage is open."""
        return None if self._disk is None else self._disk.location

    @property
    def allocation(self) -> str:
        """The C{allocation_id} metric label: C{<tenant>/<agent>}."""
        return f"{self.identity.tenant_id}/{self.agent_id}"

    def now(self) -> float:
        """The service clock."""
        return self._clock.seconds()

    def policy(self) -> PathPolicy | None:
        """The agent's path policy now (L{None}: unrestricted)."""
        return self._context.policy_for(self.identity.tenant_id, self.agent_id)

    def writer(self, call: Call, answer: AnswerOf | None = None) -> Writer:
        """
        The author of a change: the agent and the request's verified
        session; with the request's mount outbox entry, if it names one
        (L{svc.dataplane.outbox_entries}).
        """
        return Writer(self.agent_id, call.session_id, position_of(call.request, answer))

    def holder(self) -> LeaseHolder:
        """This connection as a lease holder (with its newest verified session)."""
        return LeaseHolder(self.agent_id, self.connection_id, self.session_id)

    async def storage(self) -> TenantStorage:
        """The tenant's storage, opened (and the disk root created) on first use."""
        if self._disk is None:
            await self._open_lock.acquire()
            try:
                if self._disk is None:
                    self._disk = await self._context.open_disk(self.identity)
            finally:
                self._open_lock.release()
        return self._disk.storage

    async def visible_of(self, storage: TenantStorage, hashes: list[str]) -> set[str]:
        """Those of C{hashes} the agent may see (see L{svc.dataplane.chunk_visibility})."""
        unknown = self.visible.unknown(hashes)
        if unknown:
            found = await referenced_by_disk(storage, self.agent_id, unknown)
            self.visible.add(found)
        return {h for h in hashes if h in self.visible}

    def wait_uploads(self, hashes: list[str]) -> Deferred[object]:
        """Fires once every C{chunk_put} in flight for C{hashes} has finished."""
        return self._uploads.wait(hashes)

    # IConnectionHandler

    def handle(
        self, command: Command, decoded: DecodedRequest, raw: memoryview
    ) -> Deferred[OpReply]:
        """
        Run one request (see the module docstring): C{decoded} is its map
        decoded by the protocol within C{command}'s limits (or the refusal
        of its fields). Cancelling the answer (the protocol gave up on it)
        stops the request only while it waits for its turn; once started it
        runs to its end, and its answer is dropped
        (L{svc.dataplane.request_order.Running}).
        """
        running = Running()
        answer: Deferred[OpReply] = Deferred(lambda _: running.give_up())
        done = Deferred.fromCoroutine(self._handle(command, decoded, raw, running))
        done.addBoth(_pass_on, answer)
        return answer

    def refused(self, error: RequestRefused) -> None:
        """
        A request refused before its operation was known or its map decoded
        (answered C{EPROTO} by the protocol): counted and logged at a bounded
        rate, not audited (there is no request to name, and a flood of them
        must not flood the audit log).
        """
        self.metrics.count_request_refused(error.reason)
        self._context.refusals.emit(
            "request",
            LogLevel.warn,
            "refused a request from {agent} of {tenant}: {message} ({suppressed} more not logged)",
            agent=self.agent_id,
            tenant=self.identity.tenant_id,
            message=error.message,
        )

    def closed(self, reason: str) -> Deferred[None]:
        """
        Release the connection's leases (reason C{conn_closed}) and forget
        it; refused lease requests afterwards.
        """
        self.closing = True
        self.answers.close()
        self._context.forget(self)
        # The requests already received still run (their answers go nowhere);
        # the agent's next connection waits for them (DrainFences).
        drained = self._order.drained()
        self._context.draining(self, drained)
        self._log.debug(
            "connection {connection_id} of {agent} closed: {reason}",
            connection_id=self.connection_id,
            agent=self.agent_id,
            reason=reason,
        )

        async def closing() -> None:
            await self._open_lock.acquire()
            self._open_lock.release()
            if self._disk is not None:
                await self._disk.storage.leases.release_connection(self.connection_id)

        return Deferred.fromCoroutine(closing())

    # Sessions

    async def verify_session(self, call: Call) -> None:
        """
        Verify the request's C{session_id}, if any: HMAC for this tenant and
        agent, then fencing by epoch (persisting a newer epoch). A session
        first seen on this connection whose epoch was already known is a
        rebind. Sets C{call.session_id}.

        @raise SessionRefused: EPERM, counted by reason.
        """
        presented = session_of(call.request)
        if presented is None:
            return
        await self.storage()
        assert self._disk is not None
        epochs = self._disk.epochs
        try:
            # The tag check is a function of the id, the key and this
            # connection's identity: an id verified once needs no second HMAC.
            session = self._seen_sessions.get(presented)
            if session is None:
                session = verify_session_id(
                    self._context.session_key,
                    presented,
                    tenant_id=self.identity.tenant_id,
                    agent_id=self.agent_id,
                )
            previous = epochs.newest(self.agent_id)
            raised = epochs.admit(session)
        except SessionRejected as e:
            self.metrics.count_session_forgery(e.reason.value)
            self._log.info(
                "session refused for {agent}: {reason}", agent=self.agent_id, reason=e.reason.value
            )
            raise SessionRefused(e.reason) from None
        if presented not in self._seen_sessions:
            self._seen_sessions[presented] = session
            if not raised:
                self.metrics.count_session_rebind()
        call.session_id = presented
        self.session_id = presented
        self.session_epoch = session.epoch
        if raised:
            await epochs.save()
            if previous is not None:  # an older session had written: it is fenced now
                self._context.fenced(self._disk.location, self.agent_id, session.epoch, self)

    # The request pipeline

    async def _handle(
        self, command: Command, decoded: DecodedRequest, raw: memoryview, running: Running
    ) -> OpReply:
        op = command.op
        started = self.now()
        try:
            refused = decoded.refused
            if refused is not None:
                self.audit.failed(op, _raw_path(refused.payload), None)
                raise refused
            request = decoded.request
            if len(raw) > command.max_raw:
                self.audit.failed(op, first_path(request), None)
                raise FieldRefused(
                    WireErrno.EPROTO, f"{op.value} carries no raw segment of {len(raw)} bytes"
                )
            if op is Op.MANIFEST_PUT:
                self.metrics.count_bytes("in", op.value, decoded.size)
            return await self._run(op, request, raw, running)
        finally:
            self.metrics.observe_op(op_label(op), self.now() - started)

    async def _run(
        self,
        op: Op,
        request: object,
        raw: memoryview,
        running: Running | None = None,
        *,
        answer_reserved: bool = False,
    ) -> OpReply:
        if op is Op.CHUNK_PUT:
            self.metrics.count_bytes("in", op.value, len(raw))
        try:
            segments = inline_segments(request, raw)
        except OpFailed:
            self.audit.failed(op, first_path(request), None)
            raise
        call = Call(
            op,
            request,
            inline_stored=self._store_inline(request, segments),
            answer_reserved=answer_reserved,
        )
        upload = self._uploads.begin(request)
        turn = self._order.enter(op)
        if running is not None:
            running.turn = turn
        try:
            try:
                await turn.ready
                if self.closing:
                    # Lost before its turn came: not run (dataplane-ops.md section 7).
                    raise OpFailed(WireErrno.EBADF, "the connection closed before it ran")
                try:
                    outcome = await self._checked(call, raw, turn)
                except AnsweredBefore as before:
                    outcome = answered_before(before)
                else:
                    self._announce(call)
            except PathOutsideSubtree:
                raise
            except StoreError as e:
                self.audit.failed(op, first_path(request), call)
                raise from_store_error(e) from None
            except Exception:
                self.audit.failed(op, first_path(request), call)
                raise
            finally:
                turn.end()
            self.audit.succeeded(call, outcome)
        finally:
            # After the line: a put waiting for this upload writes its own after it.
            self._uploads.end(request, upload)
        if outcome.inline is not None:
            return await with_inline(
                self.answers, outcome.reply, outcome.inline, self._fetch_inline
            )
        return outcome.reply

    def _store_inline(
        self, request: object, segments: list[tuple[str, memoryview]]
    ) -> list[Deferred[Exception | None]]:
        """
        Start storing a C{manifest_put}'s inline chunks, each exactly as the
        C{chunk_put} it stands for (its checks, audit line, metrics, and
        place among uploads in flight, so the put waits for it).
        """
        stored: list[Deferred[Exception | None]] = []
        for chunk_hash, data in segments:
            upload = ChunkPutRequest(chunk_hash, session_of(request))
            run = Deferred.fromCoroutine(self._run(Op.CHUNK_PUT, upload, data))
            stored.append(run.addCallbacks(lambda _: None, lambda failure: failure.value))
        return stored

    def _fetch_inline(self, name: str) -> Deferred[OpReply]:
        """One inline chunk of an answer, read as a C{chunk_get} of it (its bytes reserved)."""
        request = ChunkGetRequest(name)
        return Deferred.fromCoroutine(
            self._run(Op.CHUNK_GET, request, _NO_RAW, answer_reserved=True)
        )

    async def _checked(self, call: Call, raw: memoryview, turn: Turn) -> Outcome:
        confine_paths(call, self.agent_id, self.audit)
        policy = self.policy()
        if policy is not None:
            apply_policy(call, policy, self.agent_id)
        await self.verify_session(call)
        if isinstance(call.request, ManifestPutRequest | ChunkGetRequest | ChunkHasRequest):
            hashes = named_hashes(call.request)
            await self.wait_uploads(hashes)
        return await perform(self, call, raw, turn.release)

    def _announce(self, call: Call) -> None:
        """
        Tell the agent's other connections what the successful C{call}
        changed, if anything; never fails the request (it has committed).
        """
        try:
            paths = changed_paths(call.op, call.request)
            location = self.location
            if not paths or location is None:
                return
            notice = ChangeNotice(
                location, self.agent_id, paths, call.session_id, source=self.connection_id
            )
            self._context.announce(notice)
        except Exception:
            self._log.failure(
                "announcing {op} of {agent} failed", op=call.op.value, agent=self.agent_id
            )


_NO_RAW = memoryview(b"")


def _pass_on(result: object, answer: Deferred[OpReply]) -> None:
    """
    Fire C{answer} with a request's C{result}, unless it was given up
    (cancelled): then nobody wants the result (a failure was audited
    already; a reply's lent chunk is given back).
    """
    if answer.called:
        released(result)
    elif isinstance(result, Failure):
        answer.errback(result)
    else:
        answer.callback(cast(OpReply, result))


def _raw_path(payload: Mapping[str, object] | None) -> str | None:
    path = None if payload is None else payload.get("path")
    return path if isinstance(path, str) else None
