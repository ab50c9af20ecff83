"""
Tests for L{svc.dataplane.outbox_entries} through the data-plane service:
a change that names its mount outbox entry runs once; the same entry sent
again, on any connection, gets the first answer and changes nothing.
"""

from __future__ import annotations

from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane.test.test_service_support import ServiceFixture
from svc.wire.errno import WireErrno

OUTBOX = "5a" * 16


def tag(seq: int, settled: int = 0) -> list[Any]:
    """The C{outbox} field of entry C{seq}."""
    return [OUTBOX, seq, settled]


def put(seq: int, expected: int) -> dict[str, Any]:
    """An empty file's put at C{/agent-1/f}, as outbox entry C{seq}."""
    return {
        "path": "/agent-1/f",
        "expected_version": expected,
        "chunks": [],
        "size": 0,
        "mode": 0o644,
        "mtime_ns": seq,
        "outbox": tag(seq),
    }


class OutboxEntryTests(SynchronousTestCase):
    """Exactly once, as a mount's outbox sends its entries."""

    def setUp(self) -> None:
        self.fixture = ServiceFixture(self)
        self.addCleanup(self.fixture.close)
        self.agent = self.fixture.agent()

    def test_an_entry_sent_again_is_answered_as_the_first_time(self) -> None:
        """
        A put sent again (its answer was lost) on a new connection gets the
        first answer; the file has one version and the journal one row.
        """
        first = self.agent.ok("manifest_put", **put(1, 0))
        again = self.fixture.agent().ok("manifest_put", **put(1, 0))
        self.assertEqual(again, first)
        self.assertEqual(self.agent.ok("head_file", path="/agent-1/f")["version"], 1)
        rows = self.agent.ok("journal_query", path="/agent-1/f")
        self.assertEqual(len(rows["entries"]), 1)

    def test_every_change_is_answered_again_without_running(self) -> None:
        """mkdir, rename, setattr and a delete sent again change nothing more."""
        agent = self.agent
        made = agent.ok("dir_create", path="/agent-1/d", mode=0o755, outbox=tag(1))
        agent.ok("manifest_put", **put(2, 0))
        moved = agent.ok(
            "manifest_rename", path="/agent-1/f", to_path="/agent-1/d/f", outbox=tag(3)
        )
        changed = agent.ok("setattr", path="/agent-1/d/f", mode=0o600, outbox=tag(4))
        gone = agent.ok("manifest_delete", path="/agent-1/d/f", outbox=tag(5))
        self.assertEqual(agent.ok("dir_create", path="/agent-1/d", mode=0o700, outbox=tag(1)), made)
        self.assertEqual(
            agent.ok("manifest_rename", path="/agent-1/f", to_path="/agent-1/d/f", outbox=tag(3)),
            moved,
        )
        self.assertEqual(
            agent.ok("setattr", path="/agent-1/d/f", mode=0o644, outbox=tag(4)), changed
        )
        self.assertEqual(agent.ok("manifest_delete", path="/agent-1/d/f", outbox=tag(5)), gone)
        self.assertEqual(agent.errno("head_file", path="/agent-1/d/f"), WireErrno.ENOENT)

    def test_a_refused_entry_is_asked_again(self) -> None:
        """A refusal is not kept: the entry sent again runs (and may succeed now)."""
        self.assertEqual(self.agent.errno("manifest_put", **put(1, 4)), WireErrno.ESTALE)
        self.assertEqual(self.agent.ok("manifest_put", **put(1, 0))["version"], 1)

    def test_without_an_outbox_a_change_runs_each_time(self) -> None:
        """A request naming no entry is not remembered (the CAS alone guards it)."""
        plain = put(1, 0)
        del plain["outbox"]
        self.agent.ok("manifest_put", **plain)
        self.assertEqual(self.agent.errno("manifest_put", **plain), WireErrno.ESTALE)
