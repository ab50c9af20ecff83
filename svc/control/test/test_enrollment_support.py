"""
Fixtures shared by the enrollment, renewal, agent-identity and
sign-server-cert tests (no tests here): a control app with the enrollment
routes over the in-memory store, a filesystem CA with a KEK in a temporary
directory, and a L{Clock}.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar, cast

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.logger import ILogObserver, LogEvent, globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.resource import Resource

from svc.control.app import build_control_app
from svc.control.ca import AgentCAProvider, init_org_root, open_agent_ca
from svc.control.enrollment import EnrollmentDeps, hash_token, new_secret_token
from svc.control.routes_enrollment import enrollment_authenticators, enrollment_routes
from svc.control.routing import Route
from svc.control.settings import ControlSettings
from svc.control.store.interface import ControlStore
from svc.control.store.sqlite import SQLiteControlStore
from svc.control.store.values import Allocation, EnrollToken
from svc.control.test.backends import RouteBackend
from svc.control.test.test_routes_entities import RecordedPushes
from svc.pki.pem import certs_from_pem, key_from_pem
from svc.testing.control_store import memory_control_store
from svc.testing.web import Answer, request
from svc.testing.worker import ImmediateWorker

T = TypeVar("T")

NOW = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
TRUST_DOMAIN = "svc.test"
ORG = "Acme"
KEK = b"k" * 32
SERVICE_TOKEN = "s" * 40
GIB = 2**30
SERVER_FQDN = "dataplane.test"
SERVER_ADDR = "10.0.0.1:7443"


def control_environ(secrets_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a control plane with a filesystem CA and a KEK."""
    environ = {
        "DATABASE_URL": "sqlite:////nonexistent/control.db",
        "SVC_CONTROL_PLANE_TOKEN": SERVICE_TOKEN,
        "SVC_SECRETS_DIR": str(secrets_dir),
        "SVC_CA_KEK": base64.b64encode(KEK).decode("ascii"),
        "SVC_TRUST_DOMAIN": TRUST_DOMAIN,
        "SVC_ORG_NAME": ORG,
    }
    environ.update(extra)
    return environ


def capture_logs(case: SynchronousTestCase) -> list[LogEvent]:
    """Every log event emitted during the rest of C{case}."""
    events: list[LogEvent] = []

    def observe(event: LogEvent) -> None:
        events.append(event)

    observer = cast(ILogObserver, observe)
    globalLogPublisher.addObserver(observer)
    case.addCleanup(globalLogPublisher.removeObserver, observer)
    return events


class EnrollmentWorld:
    """
    One control plane with the enrollment routes, its store, CA and clock.

    @ivar provider: opens the CA lazily (so a root created later is found).
    @ivar pushes: what the enrollment routes told the push loop.
    """

    def __init__(
        self,
        case: SynchronousTestCase,
        *,
        with_root: bool = True,
        with_server: bool = True,
        **environ: str,
    ) -> None:
        self.case = case
        self.clock = Clock()
        self.clock.advance(NOW.timestamp())
        self.secrets = Path(case.mktemp())
        self.settings = ControlSettings.from_environ(control_environ(self.secrets, **environ))
        self.store: SQLiteControlStore = memory_control_store()
        self.worker = ImmediateWorker()
        if with_root:
            self.init_root()
        self.provider = AgentCAProvider(
            lambda: open_agent_ca(self.settings, self.store, self.worker)
        )
        self.pushes = RecordedPushes()
        self.deps = EnrollmentDeps.build(
            self.store, self.provider, self.settings, self.clock.seconds, self.pushes
        )
        self.serve(self.deps)
        if with_server:
            self.register_server()

    def serve(self, deps: EnrollmentDeps, more_routes: Sequence[Route] = ()) -> None:
        """Serve the enrollment routes built over C{deps} (and C{more_routes}) from now on."""
        self.deps = deps
        app = build_control_app(
            self.settings,
            self.clock.seconds,
            routes=[*enrollment_routes(deps), *more_routes],
            authenticators=enrollment_authenticators(deps),
        )
        self.resource = app.resource()

    def now(self) -> datetime:
        """The clock's time."""
        return datetime.fromtimestamp(self.clock.seconds(), UTC)

    def result(self, deferred: Deferred[T]) -> T:
        """The result of an already-fired L{Deferred}."""
        return self.case.successResultOf(deferred)

    def init_root(self) -> None:
        """Create the org root (C{svc ca init})."""
        self.result(init_org_root(self.settings, self.store, self.now(), self.worker))

    def register_server(
        self, fqdn: str = SERVER_FQDN, address: str = SERVER_ADDR, capacity: int = 10
    ) -> None:
        """Register a data-plane server with room for C{capacity} tenants."""
        self.result(self.store.register_server(fqdn, address, capacity, self.now()))

    def provision(
        self,
        agent_id: str | None = "agent-1",
        owner_id: str = "alice",
        tenant_id: str = "acme",
    ) -> Allocation:
        """An allocation (agent-scoped unless C{agent_id} is None)."""
        provisioned = self.result(
            self.store.provision(
                agent_id=agent_id,
                owner_id=owner_id,
                tenant_id=tenant_id,
                grant_bytes=GIB,
                now=self.now(),
            )
        )
        return provisioned.allocation

    def token(
        self, allocation: Allocation | None = None, ttl: timedelta = timedelta(hours=1)
    ) -> str:
        """A new enroll token for C{allocation} (default: a new agent-1 allocation)."""
        allocation = allocation or self.provision()
        token = new_secret_token()
        self.result(
            self.store.create_enroll_token(
                allocation.allocation_id, hash_token(token), self.now(), self.now() + ttl
            )
        )
        return token

    def token_spent(self, token: str) -> bool:
        """Whether C{token} has been consumed."""
        return self.token_row(token).consumed_at is not None

    def token_row(self, token: str) -> EnrollToken:
        """The stored record of C{token} (looked up by hash, in the test only)."""
        connection = self.store._connection
        row = connection.execute(
            "SELECT token_id FROM enroll_tokens WHERE token_hash = ?", (hash_token(token),)
        ).fetchone()
        return self.result(self.store.get_enroll_token(row[0]))

    def enroll(self, token: str | None) -> Answer:
        """C{POST /agent/enroll} with C{token}."""
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        return request(self.case, self.resource, "POST", "/agent/enroll", headers=headers)

    def post_json(
        self,
        path: str,
        body: Mapping[str, Any] | None,
        headers: Mapping[str, str] | None = None,
    ) -> Answer:
        """A POST with a JSON body."""
        all_headers = {"Content-Type": "application/json", **(headers or {})}
        data = None if body is None else json.dumps(body).encode()
        return request(self.case, self.resource, "POST", path, headers=all_headers, body=data)

    def enrolled(self) -> Enrolled:
        """A successful enrollment of a fresh agent-1 allocation."""
        answer = self.enroll(self.token())
        self.case.assertEqual(answer.status, 200, answer.body)
        return Enrolled(answer.json())


class Enrolled:
    """An enrollment response, parsed."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body
        (self.leaf,) = certs_from_pem(body["client_cert_pem"].encode())
        self.chain = certs_from_pem(body["ca_chain_pem"].encode())
        key = key_from_pem(body["client_key_pem"].encode())
        assert isinstance(key, Ed25519PrivateKey)
        self.key = key

    @property
    def intermediate(self) -> x509.Certificate:
        """The tenant intermediate of the chain."""
        return self.chain[0]

    @property
    def serial(self) -> str:
        """The leaf's serial."""
        return str(self.body["serial"])


class RouteWorld:
    """
    L{EnrollmentWorld} for tests on either store backend
    (L{svc.control.test.backends}): the store comes from the test's backend
    and every operation is awaited.
    """

    case: RouteBackend
    store: ControlStore
    clock: Clock
    secrets: Path
    settings: ControlSettings
    worker: ImmediateWorker
    provider: AgentCAProvider
    pushes: RecordedPushes
    deps: EnrollmentDeps
    resource: Resource

    @classmethod
    async def open(
        cls,
        case: RouteBackend,
        *,
        with_root: bool = True,
        with_server: bool = True,
        **environ: str,
    ) -> RouteWorld:
        """A world over a new store of C{case}'s backend."""
        world = cls()
        world.case = case
        world.clock = Clock()
        world.clock.advance(NOW.timestamp())
        world.secrets = Path(case.mktemp())
        world.settings = ControlSettings.from_environ(control_environ(world.secrets, **environ))
        world.store = await case.open_control_store()
        world.worker = ImmediateWorker()
        store = world.store
        world.provider = AgentCAProvider(lambda: open_agent_ca(world.settings, store, world.worker))
        world.pushes = RecordedPushes()
        world.serve(
            EnrollmentDeps.build(
                world.store, world.provider, world.settings, world.clock.seconds, world.pushes
            )
        )
        if with_root:
            await world.init_root()
        if with_server:
            await world.register_server()
        return world

    def serve(self, deps: EnrollmentDeps, more_routes: Sequence[Route] = ()) -> None:
        """Serve the enrollment routes built over C{deps} (and C{more_routes}) from now on."""
        self.deps = deps
        app = build_control_app(
            self.settings,
            self.clock.seconds,
            routes=[*enrollment_routes(deps), *more_routes],
            authenticators=enrollment_authenticators(deps),
        )
        self.resource = app.resource()

    def now(self) -> datetime:
        """The clock's time."""
        return datetime.fromtimestamp(self.clock.seconds(), UTC)

    async def result(self, deferred: Deferred[T]) -> T:
        """What C{deferred} fires with."""
        return await deferred

    async def init_root(self) -> None:
        """Create the org root (C{svc ca init})."""
        await init_org_root(self.settings, self.store, self.now(), self.worker)

    async def register_server(
        self, fqdn: str = SERVER_FQDN, address: str = SERVER_ADDR, capacity: int = 10
    ) -> None:
        """Register a data-plane server with room for C{capacity} tenants."""
        await self.store.register_server(fqdn, address, capacity, self.now())

    async def provision(
        self,
        agent_id: str | None = "agent-1",
        owner_id: str = "alice",
        tenant_id: str = "acme",
    ) -> Allocation:
        """An allocation (agent-scoped unless C{agent_id} is None)."""
        provisioned = await self.store.provision(
            agent_id=agent_id,
            owner_id=owner_id,
            tenant_id=tenant_id,
            grant_bytes=GIB,
            now=self.now(),
        )
        return provisioned.allocation

    async def token(
        self, allocation: Allocation | None = None, ttl: timedelta = timedelta(hours=1)
    ) -> str:
        """A new enroll token for C{allocation} (default: a new agent-1 allocation)."""
        allocation = allocation or await self.provision()
        token = new_secret_token()
        await self.store.create_enroll_token(
            allocation.allocation_id, hash_token(token), self.now(), self.now() + ttl
        )
        return token

    async def token_spent(self, token: str) -> bool:
        """Whether C{token} has been consumed."""
        return (await self.token_row(token)).consumed_at is not None

    async def token_row(self, token: str) -> EnrollToken:
        """The stored record of C{token} (looked up by hash, in the test only)."""
        [(token_id,)] = await self.case.sql(
            self.store,
            f"SELECT token_id FROM enroll_tokens WHERE token_hash = '{hash_token(token)}'",
        )
        return await self.store.get_enroll_token(str(token_id))

    async def enroll(self, token: str | None) -> Answer:
        """C{POST /agent/enroll} with C{token}."""
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        return await self.case.send(self.resource, "POST", "/agent/enroll", headers=headers)

    async def post_json(
        self,
        path: str,
        body: Mapping[str, Any] | None,
        headers: Mapping[str, str] | None = None,
    ) -> Answer:
        """A POST with a JSON body."""
        all_headers = {"Content-Type": "application/json", **(headers or {})}
        data = None if body is None else json.dumps(body).encode()
        return await self.case.send(self.resource, "POST", path, headers=all_headers, body=data)

    async def enrolled(self) -> Enrolled:
        """A successful enrollment of a fresh agent-1 allocation."""
        answer = await self.enroll(await self.token())
        self.case.assertEqual(answer.status, 200, answer.body)
        return Enrolled(answer.json())
