"""
Shared fixture for the mount client's filesystem core tests: a real
data-plane service (L{ServiceFixture}: the storage engine on a temporary
directory, inline workers, a clock at wall time) reached through
L{LocalConnection} (whose answers a test may hold back: L{HeldAnswers}),
an in-memory chunk source that fetches with C{chunk_get}, and L{MountFS}
instances over it with recorded audit lines. No tests of its own.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any, TypeVar

from blake3 import blake3
from twisted.internet.defer import Deferred, fail, succeed
from twisted.trial.unittest import SynchronousTestCase

from svc.audit.events import AuditEvent, CallerProcess
from svc.dataplane.test.test_service_support import ServiceFixture, identity
from svc.dataplane_client.client import Reply
from svc.dataplane_client.errors import NotExecuted, OutcomeUnknown
from svc.mount.core.attributes import Entry, QuotaReport
from svc.mount.core.errors import FSError, RemoteFailure
from svc.mount.core.inodes import ROOT_INODE
from svc.mount.fs import FSSettings, MountFS
from svc.mount.outbox.replay import open_outbox
from svc.mount.remote.data_plane import Remote
from svc.mount.remote.write_leases import revoke_pushes
from svc.mount.writeback.unsent import UnsentFiles
from svc.pki.identity import AgentIdentity
from svc.policy import UNRESTRICTED, PathPolicy
from svc.testing.local_connection import LocalConnection
from svc.testing.worker import ImmediateWorker

T = TypeVar("T")

AGENT = identity()
"""The agent whose disk is mounted (tenant-a / agent-1)."""

CALLER = CallerProcess(command="editor", pid=4242, uid=1000, gid=1000)
"""The process the tests pretend calls the filesystem."""


def pseudo_random(label: str, size: int) -> bytes:
    """C{size} deterministic, incompressible bytes."""
    return blake3(label.encode()).digest(length=size)


class MemoryChunkSource:
    """
    An in-memory L{svc.mount.remote.data_plane.IChunkSource}: misses are fetched with
    C{chunk_get} (and verified), every chunk kept; C{fetched} counts misses.
    """

    def __init__(self, remote: Remote) -> None:
        self.remote = remote
        self.chunks: dict[str, bytes] = {}
        self.fetched = 0

    def fetch(self, chunk_hash: str, /) -> Deferred[bytes]:
        data = self.chunks.get(chunk_hash)
        if data is not None:
            return succeed(data)

        async def fetching() -> bytes:
            self.fetched += 1
            got = await self.remote.chunk_get(chunk_hash)
            if blake3(got).hexdigest() != chunk_hash:
                raise RemoteFailure(5, "corrupt chunk")
            self.chunks[chunk_hash] = got
            return got

        return Deferred.fromCoroutine(fetching())

    def put(self, chunk_hash: str, data: bytes | memoryview, /) -> None:
        self.chunks[chunk_hash] = bytes(data)

    def holds(self, chunk_hash: str, /) -> bool:
        return chunk_hash in self.chunks


class HeldAnswers:
    """
    A connection whose answers to the ops named in L{hold} are kept back
    until L{release}: the request has run on the server, the mount has not
    heard back yet (a commit in flight). Or it has not even run yet
    (C{hold(unsent=...)}: still on its way), and answers can be lost with
    the connection (L{release} with C{lost}, L{lose}). While C{down}, no
    connection can be had: every call fails L{NotExecuted}.
    """

    def __init__(self, connection: LocalConnection) -> None:
        self._connection = connection
        self.down = False
        self._ops: frozenset[str] = frozenset()
        self._unsent: frozenset[str] = frozenset()
        self._held: list[tuple[str, Callable[[], Deferred[Reply]], bool, Deferred[Reply]]] = []
        self._lost: dict[str, list[bool]] = {}

    @property
    def held(self) -> int:
        """Answers kept back now."""
        return len(self._held)

    def hold(self, *ops: str, unsent: Collection[str] = ()) -> None:
        """
        Keep back the answers of C{ops} from now on; for those also in
        C{unsent}, the requests too (they run when released).
        """
        self._ops = frozenset(ops)
        self._unsent = frozenset(unsent)

    def release(self, *still: str, lost: bool | Collection[str] = False) -> None:
        """
        Deliver every answer kept back, in order, holding from now on only
        the answers of C{still} (none by default). With C{lost}, the
        connection is lost instead: every request kept back (C{True}), or
        of the ops named, fails L{OutcomeUnknown}, and those not run yet
        never run.
        """
        self._ops = frozenset(still)
        self._unsent = frozenset()
        held, self._held = self._held, []
        for op, answer, ran, waiter in held:
            if lost is False or (lost is not True and op not in lost):
                answer().chainDeferred(waiter)
                continue
            if ran:
                answer().addErrback(lambda _: None)  # the mount never hears
            waiter.errback(OutcomeUnknown("the connection was lost"))

    @property
    def losses_left(self) -> int:
        """Calls still to be lost (L{lose})."""
        return sum(len(losses) for losses in self._lost.values())

    def lose(self, *ops: str, ran: bool, times: int = 1) -> None:
        """
        The next C{times} calls of each of C{ops} fail L{OutcomeUnknown}
        (the connection lost with the answer): having run on the server
        when C{ran}, else without reaching it.
        """
        for op in ops:
            self._lost[op] = [ran] * times

    def call(
        self,
        op: str,
        payload: Mapping[str, object],
        raw: bytes | memoryview = b"",
        *,
        timeout: float | None = None,
    ) -> Deferred[Reply]:
        def run() -> Deferred[Reply]:
            return self._connection.call(op, payload, raw, timeout=timeout)

        if self.down:
            return fail(NotExecuted(f"{op}: no data-plane connection"))
        losses = self._lost.get(op)
        ran = losses.pop() if losses else None
        if ran is not None:
            if ran:
                run().addErrback(lambda _: None)  # whatever it answered, the mount never hears
            return fail(OutcomeUnknown(f"{op}: the connection was lost"))
        if op not in self._ops:
            return run()
        waiter: Deferred[Reply] = Deferred()
        if op not in self._unsent:
            answer = run()
            self._held.append((op, lambda: answer, True, waiter))
        else:
            self._held.append((op, run, False, waiter))
        return waiter


class Mount:
    """One L{MountFS} on its own connection, with helpers that unwrap results."""

    def __init__(
        self,
        fixture: FSFixture,
        *,
        session_id: str | None,
        policy: PathPolicy,
        who: AgentIdentity,
        settings: FSSettings,
        quota: Callable[[], Deferred[QuotaReport]] | None = None,
        clock_ahead: float = 0.0,
        connected: Callable[[], bool] = lambda: True,
        outbox_dir: Path | None = None,
    ) -> None:
        self.fixture = fixture
        case = fixture.case
        self.connection = LocalConnection(fixture.service.service, who, fixture.connection_id())
        self.answers = HeldAnswers(self.connection)
        unrecorded = Remote(self.answers)
        self.audit: list[AuditEvent] = []
        self.invalidated: list[int] = []
        self.invalidated_entries: list[tuple[int, bytes]] = []
        self.forgotten_attributes: list[int] = []
        self.spill_dir = Path(case.mktemp())
        self.unsent_dir = Path(case.mktemp())
        self.outbox_dir = outbox_dir if outbox_dir is not None else Path(case.mktemp())
        now = lambda: fixture.service.clock.seconds() + clock_ahead  # noqa: E731
        self.outbox, replaying = open_outbox(
            self.outbox_dir,
            unrecorded,
            fixture.service.clock,
            now,
            session_id,
            UnsentFiles(self.unsent_dir, ImmediateWorker(), now),
            lambda call: call(),
        )
        case.addCleanup(self.outbox.stop)
        self.ok(replaying)
        self.remote = Remote(self.answers, recorder=self.outbox)
        self.chunks = MemoryChunkSource(self.remote)
        self.fs = MountFS(
            remote=self.remote,
            chunks=self.chunks,
            agent_id=who.agent_id,
            session_id=session_id,
            spill_dir=self.spill_dir,
            unsent_dir=self.unsent_dir,
            worker=ImmediateWorker(),
            now=now,
            clock=fixture.service.clock,
            emit=self.audit.append,
            policy=policy,
            invalidate=self.invalidated.append,
            invalidate_entry=lambda parent, name: self.invalidated_entries.append((parent, name)),
            forget_attributes=self.forgotten_attributes.append,
            settings=settings,
            quota=quota,
            connected=connected,
            outbox=self.outbox,
        )
        self.connection.on_push(revoke_pushes(self.fs.lease_revoked))
        self.ok(self.fs.start())

    # Unwrapping

    def ok(self, deferred: Deferred[T]) -> T:
        """The result of an operation that must succeed."""
        result: T = self.fixture.case.successResultOf(deferred)
        return result

    def errno(self, deferred: Deferred[Any]) -> int:
        """The local errno of an operation that must fail with L{FSError}."""
        failure = self.fixture.case.failureResultOf(deferred, FSError)
        value: int = failure.value.errno
        return value

    # Traffic

    def count(self, op: str) -> int:
        """How many C{op} requests this mount sent."""
        return self.connection.calls.count(op)

    def events(self, name: str) -> list[AuditEvent]:
        """This mount's audit lines called C{name}."""
        return [event for event in self.audit if event.event == name]

    # Paths

    def lookup_path(self, path: str) -> Entry:
        """The entry of a mount-relative path (C{"a/b"})."""
        entry = Entry(ROOT_INODE, self.ok(self.fs.getattr(ROOT_INODE, CALLER)))
        for part in [p for p in path.split("/") if p]:
            entry = self.ok(self.fs.lookup(entry.ino, part.encode(), CALLER))
        return entry

    def parent_of(self, path: str) -> tuple[int, bytes]:
        """The directory inode and the last name of C{path}."""
        head, _, name = path.rpartition("/")
        return self.lookup_path(head).ino, name.encode()

    def write_file(self, path: str, data: bytes, piece: int = 1 << 20) -> Entry:
        """Create C{path} (or open it for writing), write C{data} in pieces, close."""
        parent, name = self.parent_of(path)
        created = self.fs.create(parent, name, 0o644, os.O_WRONLY | os.O_CREAT, CALLER)
        opened, entry = self.ok(created)
        for offset in range(0, len(data), piece):
            written = self.ok(
                self.fs.write(opened.fh, offset, data[offset : offset + piece], CALLER)
            )
            assert written == len(data[offset : offset + piece])
        self.ok(self.fs.flush(opened.fh, CALLER))
        self.ok(self.fs.release(opened.fh, CALLER))
        return entry

    def read_file(self, path: str, piece: int = 1 << 20) -> bytes:
        """Open C{path} read-only and read it whole."""
        entry = self.lookup_path(path)
        opened = self.ok(self.fs.open(entry.ino, os.O_RDONLY, CALLER))
        parts = []
        offset = 0
        while True:
            data = self.ok(self.fs.read(opened.fh, offset, piece, CALLER))
            if not data:
                break
            parts.append(data)
            offset += len(data)
        self.ok(self.fs.release(opened.fh, CALLER))
        return b"".join(parts)

    def names(self, path: str) -> list[str]:
        """The names listed in directory C{path}, without C{.} and C{..}."""
        entry = self.lookup_path(path)
        fh = self.ok(self.fs.opendir(entry.ino, CALLER))
        names: list[str] = []
        offset = 0
        while True:
            page = self.fs.readdir(fh, offset, CALLER)
            if not page:
                break
            names.extend(item.name.decode() for item in page if item.name not in (b".", b".."))
            offset = page[-1].next_offset
        self.fs.releasedir(fh)
        return names


class FSFixture:
    """A data-plane service and mounts of one agent's disk; see the module docstring."""

    def __init__(self, case: SynchronousTestCase) -> None:
        self.case = case
        self.service = ServiceFixture(case)
        case.addCleanup(self.service.close)
        self._connections = 0

    def connection_id(self) -> str:
        """A fresh connection id."""
        self._connections += 1
        return f"mount-{self._connections}"

    def session(self, epoch: int = 1, who: AgentIdentity = AGENT) -> str:
        """A valid mount session id at C{epoch}."""
        return self.service.session(who, epoch)

    def mount(
        self,
        *,
        session_id: str | None = None,
        epoch: int = 1,
        policy: PathPolicy = UNRESTRICTED,
        who: AgentIdentity = AGENT,
        settings: FSSettings | None = None,
        quota: Callable[[], Deferred[QuotaReport]] | None = None,
        clock_ahead: float = 0.0,
        connected: Callable[[], bool] = lambda: True,
        outbox_dir: Path | None = None,
    ) -> Mount:
        """
        A new started L{MountFS} on a new connection (session at C{epoch}),
        its clock C{clock_ahead} seconds ahead of the data plane's;
        C{connected} is what it is told of its connection being open; its
        outbox is under C{outbox_dir} (a new directory by default: a new
        cache), whose unsettled entries it sends before it starts.
        """
        return Mount(
            self,
            session_id=session_id if session_id is not None else self.session(epoch, who),
            policy=policy,
            who=who,
            settings=settings or FSSettings(),
            quota=quota,
            clock_ahead=clock_ahead,
            connected=connected,
            outbox_dir=outbox_dir,
        )
