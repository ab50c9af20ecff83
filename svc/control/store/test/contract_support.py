"""
What the contract mixins share: fixed times, hashes, holders, and
L{StoreCase}, whose hooks each implementation's test class fills in.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from twisted.internet.defer import Deferred

from svc.control.store.interface import ControlStore
from svc.control.store.values import Allocation, MountHolder
from svc.testing.control_store import TEST_SESSION_KEY

if TYPE_CHECKING:
    from twisted.trial.unittest import TestCase

    _Base = TestCase
else:
    _Base = object

E = TypeVar("E", bound=BaseException)

NOW = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
"""The time every contract test starts at."""

SESSION_KEY = TEST_SESSION_KEY
"""The key every contract store mints mount session ids with."""

GIB = 2**30
TTL = timedelta(seconds=60)
HOUR = timedelta(hours=1)


def token_hash(token: str) -> str:
    """The SHA-256 of C{token} as the store wants it."""
    return hashlib.sha256(token.encode()).hexdigest()


def holder(
    agent_id: str = "agent-1", serial: str = "a1", fingerprint: str | None = None
) -> MountHolder:
    """An enrollment of C{agent_id} whose leaf (C{serial}) expires in an hour."""
    return MountHolder(agent_id, serial, NOW + HOUR, fingerprint)


class StoreCase(_Base):
    """
    The fixture of every contract test: L{store} is a new store on an empty
    database. Implementations fill in L{open_store}, L{tamper},
    L{stored_text} and L{open_previous_release}, opening every store with
    L{SESSION_KEY}.
    """

    store: ControlStore

    async def open_store(self) -> ControlStore:
        """
        Open a store on this test's database (the same database on every
        call) and arrange for it to be closed in cleanup.
        """
        raise NotImplementedError()

    async def tamper(self, statement: str) -> None:
        """Run C{statement} on this test's database, outside the store."""
        raise NotImplementedError()

    async def stored_text(self) -> str:
        """Everything this test's database holds, as text."""
        raise NotImplementedError()

    async def open_previous_release(self, statements: Sequence[str]) -> ControlStore:
        """
        Bring a second, empty database to migration 1 only (the schema of
        the release before migration 2), run C{statements} on it, then open
        a store on it (which migrates it) and arrange for it to be closed in
        cleanup.
        """
        raise NotImplementedError()

    def setUp(self) -> Deferred[None]:  # type: ignore[override]  # trial waits for it
        return Deferred.fromCoroutine(self._open_fixture())

    async def _open_fixture(self) -> None:
        self.store = await self.open_store()

    async def refused(self, deferred: Deferred[Any], kind: type[E]) -> E:
        """C{assertFailure}, typed: the exception C{deferred} failed with."""
        error = await self.assertFailure(deferred, kind)
        assert isinstance(error, kind)
        return error

    def reopen(self) -> Deferred[ControlStore]:
        """L{open_store} as a L{Deferred} (for C{assertFailure})."""
        return Deferred.fromCoroutine(self.open_store())

    async def provisioned(
        self,
        agent_id: str | None = "agent-1",
        owner_id: str = "alice",
        tenant_id: str = "tenant-a",
        grant_bytes: int = GIB,
    ) -> Allocation:
        """A new live allocation."""
        done = await self.store.provision(
            agent_id=agent_id,
            owner_id=owner_id,
            tenant_id=tenant_id,
            grant_bytes=grant_bytes,
            now=NOW,
        )
        return done.allocation

    async def enroll_token(
        self, allocation: Allocation, token: str = "enroll-secret", expires_in: timedelta = HOUR
    ) -> str:
        """Store an enroll token for C{allocation}; its id."""
        stored = await self.store.create_enroll_token(
            allocation.allocation_id, token_hash(token), NOW, NOW + expires_in
        )
        return stored.token_id
