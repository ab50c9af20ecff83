"""
A control-plane store for unit tests of code built on
L{svc.control.store.interface.ControlStore} (routes, services).

It is the real SQLite implementation on an in-memory database with an
L{ImmediateWorker}: every L{Deferred} it returns has already fired, so a
L{twisted.trial.unittest.SynchronousTestCase} can use C{successResultOf} and
C{failureResultOf}. Being the real implementation, it keeps every rule of
the contract (``svc/control/store/test/contract.py``); its random ids can be
made deterministic with C{random_bytes}.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from datetime import UTC, datetime

from svc.control.store.sqlite import SQLiteControlStore
from svc.sessions import session_key
from svc.testing.worker import ImmediateWorker

MIGRATED_AT = datetime(2026, 1, 1, tzinfo=UTC)

TEST_SERVICE_TOKEN = "svc-test-service-token-0123456789abcdef"  # noqa: S105 - a test fixture
"""The service token whose session key the test stores mint with."""

TEST_SESSION_KEY = session_key(TEST_SERVICE_TOKEN)
"""The fixed key of L{memory_control_store}: verify its session ids with it."""


def counting_random_bytes() -> Callable[[int], bytes]:
    """A C{random_bytes} giving 1, 2, 3, ... big-endian: predictable ids."""
    counter = itertools.count(1)
    return lambda size: next(counter).to_bytes(size, "big")


def memory_control_store(
    random_bytes: Callable[[int], bytes] = os.urandom,
    session_key: bytes = TEST_SESSION_KEY,
) -> SQLiteControlStore:
    """
    A new, empty, migrated store whose operations complete synchronously;
    it mints mount session ids with C{session_key} (by default the fixed
    L{TEST_SESSION_KEY}).
    """
    opened: list[SQLiteControlStore] = []
    SQLiteControlStore.open(
        ":memory:", ImmediateWorker(), MIGRATED_AT, random_bytes, session_key=session_key
    ).addCallback(opened.append)
    return opened[0]
