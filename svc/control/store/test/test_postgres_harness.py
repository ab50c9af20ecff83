"""
Tests for L{svc.testing.postgres}, the PostgreSQL test harness, and for
L{svc.testing.control_store}, the synchronous store for unit tests.
"""

from __future__ import annotations

import os
from pathlib import Path

import psycopg2
from twisted.trial.unittest import SkipTest, SynchronousTestCase, TestCase

from svc.control.store.errors import NotFound
from svc.control.store.test.contract_support import GIB, NOW
from svc.testing import postgres as harness
from svc.testing.control_store import counting_random_bytes, memory_control_store


class AvailabilityTests(SynchronousTestCase):
    """What happens when no PostgreSQL can be had."""

    def _without_server(self, environ: dict[str, str]) -> None:
        self.patch(harness, "_found", ["no server anywhere"])
        self.patch(os, "environ", environ)

    def test_skip_outside_ci(self) -> None:
        """Outside CI a missing server skips, giving the reason."""
        self._without_server({})
        error = self.assertRaises(SkipTest, harness.postgres_server)
        self.assertIn("no server anywhere", str(error))

    def test_failure_under_ci(self) -> None:
        """Under CI=true a missing server is an error, never a skip."""
        self._without_server({"CI": "true"})
        self.assertRaises(harness.PostgresUnavailable, harness.postgres_server)

    def test_drop_refuses_other_databases(self) -> None:
        """Only databases the harness named can be dropped through it."""
        server = harness.PostgresServer("postgres://postgres@127.0.0.1:1/postgres")
        self.assertRaises(ValueError, harness.drop_database, server, server.database_url("prod"))


class SchemaForTestTests(TestCase):
    """L{harness.schema_for_test} against the real test server."""

    def test_schema_is_first_on_search_path(self) -> None:
        """Connections through the URL create and find tables in the test's own schema."""
        url = harness.schema_for_test(self)
        harness.execute(url, "CREATE TABLE probe (x integer)")
        ((schema,),) = harness.execute(url, "SELECT current_schema()")
        self.assertRegex(str(schema), "^t_[0-9a-f]{12}$")
        self.assertEqual(harness.execute(url, "SELECT count(*) FROM probe"), [(0,)])


class ThrowawayClusterTests(SynchronousTestCase):
    """The fallback: a cluster of our own."""

    def test_start_and_stop(self) -> None:
        """initdb + pg_ctl give a server that answers, and stopping removes its directory."""
        if harness.find_binary("initdb") is None:
            raise SkipTest("initdb is not installed")
        server, base = harness.start_throwaway_cluster(stop_at_exit=False)
        try:
            connection = psycopg2.connect(server.admin_url, connect_timeout=5)
            connection.close()
        finally:
            harness.stop_throwaway_cluster(base)
        self.assertFalse(Path(base).exists())


class MemoryControlStoreTests(SynchronousTestCase):
    """L{memory_control_store}."""

    def test_synchronous(self) -> None:
        """Operations fire at once, ids are predictable, and refusals are failed Deferreds."""
        store = memory_control_store(counting_random_bytes())
        done = self.successResultOf(
            store.provision(
                agent_id="agent-1", owner_id="alice", tenant_id="tenant-a", grant_bytes=GIB, now=NOW
            )
        )
        self.assertEqual(done.allocation.allocation_id, "00000000000000000000000000000001")
        self.failureResultOf(store.get_user("nobody"), NotFound)
        self.successResultOf(store.close())
