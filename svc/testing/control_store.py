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
from svc.testing.worker import ImmediateWorker

MIGRATED_AT = datetime(2026, 1, 1, tzinfo=UTC)


def counting_random_bytes() -> Callable[[int], bytes]:
    """A C{random_bytes} giving 1, 2, 3, ... big-endian: predictable ids."""
    counter = itertools.count(1)
    return lambda size: next(counter).to_bytes(size, "big")


def memory_control_store(
    random_bytes: Callable[[int], bytes] = os.urandom,
) -> SQLiteControlStore:
    """A new, empty, migrated store whose operations complete synchronously."""
    opened: list[SQLiteControlStore] = []
    SQLiteControlStore.open(":memory:", ImmediateWorker(), MIGRATED_AT, random_bytes).addCallback(
        opened.append
    )
    return opened[0]
