"""
Shared fixture for the L{svc.dataplane.service} tests: the real storage
engine on a temporary directory with inline workers (or a L{ManualWorker}
for the tenants' databases, to see what happens before a write commits), a
L{Clock} set to the wall clock, a recording sink per connection, a
recording audit emitter and real metrics on a fresh registry. No tests of
its own.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from blake3 import blake3
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet.defer import fail
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from svc.audit.events import AuditEvent
from svc.dataplane.admission import AdmittedAgent
from svc.dataplane.answer_budget import AnswerLimits
from svc.dataplane.connection import AgentConnection
from svc.dataplane.errors import OpFailed
from svc.dataplane.interfaces import OpReply
from svc.dataplane.placements import Placements
from svc.dataplane.service import DataPlaneService
from svc.metrics import DataPlaneMetrics
from svc.pki.identity import AgentIdentity
from svc.policy import PathPolicy
from svc.sessions import mint_session_id, session_key
from svc.store.engine import StorageEngine, StorageRoots
from svc.store.lease_values import LeaseTimings
from svc.testing.worker import ImmediateWorker
from svc.wire.contract import RequestRefused, decode, find_command
from svc.wire.errno import WireErrno
from svc.wire.payload import pack_payload, unpack_payload
from svc.worker import IWorker

T = TypeVar("T")

SERVICE_TOKEN = "svc_test-service-token"
KEY = session_key(SERVICE_TOKEN)


def blob(label: str, size: int = 1000) -> tuple[str, bytes]:
    """Deterministic bytes of ``size`` and their chunk hash."""
    data = blake3(label.encode()).digest(length=size)
    return blake3(data).hexdigest(), data


def identity(
    tenant: str = "tenant-a", agent: str = "agent-1", user: str = "user-1", serial: str = "a1"
) -> AgentIdentity:
    """An admitted agent's identity."""
    return AgentIdentity(
        tenant_id=tenant,
        agent_id=agent,
        user_id=user,
        serial=serial,
        subject=f"CN={user},OU=tenant={tenant}",
        not_after=datetime(2031, 1, 1, tzinfo=UTC),
    )


def admitted(
    tenant: str = "tenant-a",
    agent: str = "agent-1",
    user: str = "user-1",
    serial: str = "a1",
    intermediate: str = "1e",
    not_after: datetime = datetime(2031, 1, 1, tzinfo=UTC),
    intermediate_not_after: datetime = datetime(2035, 1, 1, tzinfo=UTC),
) -> AdmittedAgent:
    """An agent's identity as TLS admission gives it: naming its intermediate too."""
    return AdmittedAgent(
        tenant_id=tenant,
        agent_id=agent,
        user_id=user,
        serial=serial,
        subject=f"CN={user},OU=tenant={tenant}",
        not_after=not_after,
        intermediate_serial=intermediate,
        intermediate_not_after=intermediate_not_after,
    )


LEASE_TIMINGS = LeaseTimings(ttl=60.0, revoke_timeout=10.0, wait_margin=5.0)
"""The lease table's timings in L{ServiceFixture}."""


class RecordingSink:
    """An L{IConnectionSink} that records pushes and disconnections."""

    def __init__(self) -> None:
        self.pushes: list[tuple[str, dict[str, object]]] = []
        self.disconnects: list[str] = []
        self.sent: list[str] = []
        """Pushes (their op) and disconnections (C{GOAWAY <reason>}), in order."""

    def push(self, op: str, payload: Mapping[str, object]) -> None:
        # As the peer receives it: through the msgpack profile.
        self.pushes.append((op, unpack_payload(pack_payload(payload))))
        self.sent.append(op)

    def disconnect(self, reason: str) -> None:
        self.disconnects.append(reason)
        self.sent.append(f"GOAWAY {reason}")


class Agent:
    """One connection of one agent, with helpers that unwrap results."""

    def __init__(self, fixture: ServiceFixture, who: AgentIdentity, connection_id: str) -> None:
        self.fixture = fixture
        self.identity = who
        self.sink = RecordingSink()
        self.connection: AgentConnection = fixture.service.connect(who, connection_id, self.sink)
        self.root = "/" + who.agent_id

    def request(self, op: str, raw: bytes = b"", **payload: Any) -> Any:
        """
        The Deferred of one request (payload completed with C{op}), handed
        over as the protocol does: encoded, its operation found (ENOSYS or
        EPROTO as the protocol answers them), its map still packed.
        """
        packed = pack_payload({"op": op, **payload})
        try:
            command = find_command(packed)
        except RequestRefused as error:
            self.connection.refused(error)
            return fail(error)
        except KeyError:
            return fail(OpFailed(WireErrno.ENOSYS, "unknown operation"))
        try:
            decoded = decode(command, packed)
        except RequestRefused as error:
            self.connection.refused(error)
            return fail(error)
        return self.connection.handle(command, decoded, memoryview(raw))

    def reply(self, op: str, raw: bytes = b"", **payload: Any) -> OpReply:
        """The successful answer of one request."""
        result: OpReply = self.fixture.case.successResultOf(self.request(op, raw, **payload))
        return result

    def ok(self, op: str, raw: bytes = b"", **payload: Any) -> dict[str, Any]:
        """The payload of a successful answer, as the client receives it."""
        return unpack_payload(pack_payload(self.reply(op, raw, **payload).payload))

    def error(self, op: str, raw: bytes = b"", **payload: Any) -> Any:
        """The exception of a failed request."""
        failure = self.fixture.case.failureResultOf(self.request(op, raw, **payload))
        return failure.value

    def errno(self, op: str, raw: bytes = b"", **payload: Any) -> WireErrno:
        """The errno of a failed request."""
        value: WireErrno = self.error(op, raw, **payload).errno
        return value

    def pipeline_file(self, name: str, data: bytes) -> tuple[Any, Any]:
        """
        Send C{data}'s C{chunk_put} and, right behind it, the C{manifest_put}
        of a new file C{<root>/<name>} naming it, without waiting: the two
        requests' Deferreds.
        """
        chunk_hash = blake3(data).hexdigest()
        upload = self.request("chunk_put", data, hash=chunk_hash)
        commit = self.request(
            "manifest_put",
            path=f"{self.root}/{name}",
            expected_version=0,
            chunks=[[chunk_hash, len(data)]],
            size=len(data),
            mode=0o644,
            mtime_ns=1,
        )
        return upload, commit

    def put_file(
        self, name: str, data: bytes, expected_version: int = 0, **extra: Any
    ) -> dict[str, Any]:
        """Upload ``data`` as one chunk and commit it at C{<root>/<name>}."""
        chunks: list[list[object]] = []
        if data:
            chunk_hash = blake3(data).hexdigest()
            self.ok("chunk_put", data, hash=chunk_hash)
            chunks.append([chunk_hash, len(data)])
        return self.ok(
            "manifest_put",
            path=f"{self.root}/{name}" if name else self.root,
            expected_version=expected_version,
            chunks=chunks,
            size=len(data),
            mode=0o644,
            mtime_ns=1,
            **extra,
        )


class ServiceFixture:
    """A data-plane service on a temporary directory; see the module docstring."""

    def __init__(
        self,
        case: SynchronousTestCase,
        root: Path | None = None,
        io_worker: IWorker | None = None,
        db_worker: IWorker | None = None,
        placements: Placements | None = None,
        answer_limits: AnswerLimits | None = None,
    ) -> None:
        self.case = case
        self.root = root or Path(case.mktemp())
        self.clock = Clock()
        self.clock.advance(time.time())
        self.registry = CollectorRegistry()
        self.metrics = DataPlaneMetrics(self.registry)
        self.audit: list[AuditEvent] = []
        self.policies: dict[tuple[str, str], PathPolicy] = {}
        self._connections = 0
        self.service = DataPlaneService(
            lambda on_revoke, on_event: StorageEngine(
                StorageRoots.single(self.root),
                self.clock,
                lambda name: db_worker or ImmediateWorker(),
                io_worker or ImmediateWorker(),
                on_revoke,
                on_event,
                lease_timings=LEASE_TIMINGS,
            ),
            audit_emit=self.audit.append,
            metrics=self.metrics,
            clock=self.clock,
            session_key=KEY,
            io_worker=ImmediateWorker(),
            policy_for=lambda tenant, agent: self.policies.get((tenant, agent)),
            placements=placements,
            answer_limits=answer_limits,
        )

    def agent(self, who: AgentIdentity | None = None, connection_id: str | None = None) -> Agent:
        """A new connection for ``who`` (default: tenant-a/agent-1)."""
        self._connections += 1
        return Agent(self, who or identity(), connection_id or f"conn-{self._connections}")

    def session(self, who: AgentIdentity, epoch: int, nonce: bytes = b"\x01" * 8) -> str:
        """A valid session id for ``who`` at ``epoch``."""
        return mint_session_id(
            KEY, tenant_id=who.tenant_id, agent_id=who.agent_id, epoch=epoch, nonce=nonce
        )

    def sample(self, name: str, **labels: str) -> float | None:
        """One sample of the exposition, or L{None} when the series is absent."""
        text = generate_latest(self.registry).decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and sample.labels == labels:
                    return float(sample.value)
        return None

    def events(self, name: str) -> list[AuditEvent]:
        """The audit lines named ``name``, in order."""
        return [event for event in self.audit if event.event == name]

    def last(self) -> AuditEvent:
        """The last audit line."""
        return self.audit[-1]

    def close(self) -> None:
        """Close the engine's databases."""
        self.case.successResultOf(self.service.engine.close())
