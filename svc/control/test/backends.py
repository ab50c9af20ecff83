"""
Route tests on both store backends, written once.

A route test class is a mixin of L{RouteBackend} whose tests (and whose
C{set_up}) are coroutines that C{await} every request and store call; it
is made concrete twice:

  - with L{SQLiteBackend}, a L{SynchronousTestCase} over
    L{memory_control_store}: every L{Deferred} has already fired, so each
    coroutine is driven to its end synchronously (never the reactor);
  - with L{PostgresBackend}, an asynchronous L{TestCase} over a store
    opened by L{open_store} on a schema of its own on the test PostgreSQL
    server (L{schema_for_test}), requests served over loopback HTTP on the
    real reactor.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Coroutine, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import treq
from twisted.internet import reactor as global_reactor
from twisted.internet.defer import Deferred, succeed
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.client import HTTPConnectionPool
from twisted.web.resource import Resource
from twisted.web.server import Site

from svc.control.store.interface import ControlStore
from svc.control.store.opening import open_store
from svc.control.store.sqlite import SQLiteControlStore
from svc.testing.control_store import TEST_SESSION_KEY, memory_control_store
from svc.testing.postgres import execute, schema_for_test
from svc.testing.web import Answer, request

T = TypeVar("T")
Headers = Mapping[str, str | list[str]]

if TYPE_CHECKING:
    _Base = SynchronousTestCase
else:
    _Base = object

reactor: Any = global_reactor


class RouteBackend(_Base):
    """
    The hooks a backend fills in for route tests; mix test classes from
    this and make them concrete with L{SQLiteBackend} or L{PostgresBackend}.
    """

    async def set_up(self) -> None:
        """The test's fixture (a coroutine on both backends)."""

    async def open_control_store(self) -> ControlStore:
        """A new, empty, migrated store minting with L{TEST_SESSION_KEY}, closed in cleanup."""
        raise NotImplementedError()

    def send(
        self,
        resource: Resource,
        method: str,
        path: str,
        *,
        headers: Headers | None = None,
        body: bytes | None = None,
    ) -> Deferred[Answer]:
        """One request to C{resource}, answered once it is finished."""
        raise NotImplementedError()

    async def sql(self, store: ControlStore, statement: str) -> list[tuple[Any, ...]]:
        """Run C{statement} (no parameters) on C{store}'s database, outside the store."""
        raise NotImplementedError()

    async def result(self, deferred: Deferred[T]) -> T:
        """What C{deferred} fires with."""
        return await deferred


def _drive(case: SynchronousTestCase, coroutine: Coroutine[Any, Any, T]) -> T:
    """Run C{coroutine}, which must finish without the reactor; its result."""
    done: list[T | Failure] = []
    Deferred.fromCoroutine(coroutine).addBoth(done.append)
    if not done:
        case.fail("the test waited for something that never happened synchronously")
    outcome = done[0]
    if isinstance(outcome, Failure):
        outcome.raiseException()
    assert not isinstance(outcome, Failure)
    return outcome


class SQLiteBackend(RouteBackend, SynchronousTestCase):
    """Route tests over the in-memory SQLite store, synchronously."""

    def _run(self, suppress: Any, todo: Any, method: Any, result: Any) -> bool:
        """
        Trial's one-method runner, driving an C{async} test method to its
        end first. (Not by replacing the method on the instance: trial's
        loader, under C{-j}, checks that each test's method is its class's.)
        """
        if inspect.iscoroutinefunction(method):
            coroutine_function = method

            @functools.wraps(coroutine_function)
            def synchronously() -> None:
                _drive(self, coroutine_function())

            method = synchronously
        ran: bool = super()._run(suppress, todo, method, result)
        return ran

    def setUp(self) -> None:
        _drive(self, self.set_up())

    async def open_control_store(self) -> ControlStore:
        return memory_control_store()

    def send(
        self,
        resource: Resource,
        method: str,
        path: str,
        *,
        headers: Headers | None = None,
        body: bytes | None = None,
    ) -> Deferred[Answer]:
        return succeed(request(self, resource, method, path, headers=headers, body=body))

    async def sql(self, store: ControlStore, statement: str) -> list[tuple[Any, ...]]:
        assert isinstance(store, SQLiteControlStore)
        return [tuple(row) for row in store._connection.execute(statement).fetchall()]


class PostgresBackend(RouteBackend, TestCase):
    """Route tests over PostgreSQL on the real reactor, requests over loopback HTTP."""

    def setUp(self) -> Deferred[None]:  # type: ignore[override]  # trial waits for it
        self._urls: dict[int, str] = {}
        self._served: dict[int, str] = {}
        self._pool = HTTPConnectionPool(reactor, persistent=False)
        self.addCleanup(self._pool.closeCachedConnections)
        return Deferred.fromCoroutine(self.set_up())

    async def open_control_store(self) -> ControlStore:
        url = schema_for_test(self)
        store = await open_store(url, reactor, session_key=TEST_SESSION_KEY)
        self.addCleanup(store.close)
        self._urls[id(store)] = url
        return store

    def _address(self, resource: Resource) -> str:
        if id(resource) not in self._served:
            port = reactor.listenTCP(0, Site(resource), interface="127.0.0.1")
            self.addCleanup(port.stopListening)
            self._served[id(resource)] = f"http://127.0.0.1:{port.getHost().port}"
        return self._served[id(resource)]

    def send(
        self,
        resource: Resource,
        method: str,
        path: str,
        *,
        headers: Headers | None = None,
        body: bytes | None = None,
    ) -> Deferred[Answer]:
        return Deferred.fromCoroutine(self._send(resource, method, path, headers, body))

    async def _send(
        self,
        resource: Resource,
        method: str,
        path: str,
        headers: Headers | None,
        body: bytes | None,
    ) -> Answer:
        raw_headers: dict[str | bytes, list[str | bytes]] = {
            name: list(value) if isinstance(value, list) else [value]
            for name, value in (headers or {}).items()
        }
        response = await treq.request(
            method,
            self._address(resource) + path,
            headers=raw_headers,
            data=body,
            pool=self._pool,
            allow_redirects=False,
        )
        content = await response.content()
        found: dict[str, list[str]] = {}
        for name, values in response.headers.getAllRawHeaders():
            found[name.decode("latin-1").lower()] = [v.decode("latin-1") for v in values]
        return Answer(status=response.code, headers=found, body=content)

    async def sql(self, store: ControlStore, statement: str) -> list[tuple[Any, ...]]:
        return execute(self._urls[id(store)], statement)


def json_body(body: object) -> bytes | None:
    """C{body} as JSON, or no body for None."""
    return None if body is None else json.dumps(body).encode()
