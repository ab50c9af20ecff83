"""
Tests for consecutive namespace changes of one connection (C{manifest_put}s,
removals, renames, creations, attribute changes): each gives way once
queued in the tenant's database, so a stream of them shares transactions
(group commit), while every answer still comes after its own commit and
every other request waits for them all (L{svc.dataplane.request_order}).
"""

from __future__ import annotations

from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane.test.test_service_inline import put_request
from svc.dataplane.test.test_service_support import ServiceFixture, blob, identity
from svc.testing.worker import ManualWorker
from svc.wire.errno import WireErrno


class PutPipeliningTests(SynchronousTestCase):
    """One agent whose database worker runs only when the test says so."""

    def setUp(self) -> None:
        self.database = ManualWorker()
        self.fixture = ServiceFixture(self, db_worker=self.database)
        self.addCleanup(self.close)
        self.agent = self.fixture.agent()
        opened = self.agent.request("head_file", path=self.agent.root)
        self.database.run()
        self.successResultOf(opened)

    def close(self) -> None:
        closed = self.fixture.service.engine.close()
        self.database.run()
        self.successResultOf(closed)

    def upload(self, *labels: str) -> None:
        """
        Upload the chunks of C{labels} (each upload is charged to the agent
        in the database first, so they are sent before the puts).
        """
        for label in labels:
            chunk_hash, data = blob(label)
            uploaded = self.agent.request("chunk_put", data, hash=chunk_hash)
            self.database.run()
            self.successResultOf(uploaded)

    def put(self, name: str, label: str, **extra: Any) -> Any:
        """Send the C{manifest_put} creating C{name} from the chunk of C{label}."""
        chunk_hash, data = blob(label)
        request = put_request(name, [(chunk_hash, data)], **extra)
        return self.agent.request("manifest_put", **request)

    def test_consecutive_puts_share_a_transaction(self) -> None:
        """
        Three puts sent back to back: the first commits alone (the
        database was idle), the two queued behind it commit together in
        the next transaction. Each is answered only once its own
        transaction has committed.
        """
        self.upload("c0", "c1", "c2")
        puts = [self.put(f"f{index}", f"c{index}") for index in range(3)]
        self.assertEqual(len(self.database.queued), 1)
        for put in puts:
            self.assertNoResult(put)
        self.database.run_one()
        self.assertEqual(self.successResultOf(puts[0]).payload["version"], 1)
        self.assertNoResult(puts[1])
        self.assertNoResult(puts[2])
        self.assertEqual(len(self.database.queued), 1)
        self.database.run_one()
        self.assertEqual([self.successResultOf(put).payload["version"] for put in puts[1:]], [1, 1])
        self.assertEqual(self.database.queued, [])
        self.assertEqual(
            [event.allowed for event in self.fixture.events("manifest_put")], [True] * 3
        )

    def test_a_refused_put_does_not_undo_the_others(self) -> None:
        """
        A put refused in the shared transaction (a stale version) rolls
        back alone; the puts beside it commit, and a later put of the
        stream sees the earlier ones (the same path, one version later).
        """
        self.upload("one", "two", "three")
        first = self.put("f", "one")
        stale = self.put("g", "two", expected_version=5)
        again = self.put("f", "three", expected_version=1)
        self.database.run()
        self.assertEqual(self.successResultOf(first).payload["version"], 1)
        self.assertEqual(self.failureResultOf(stale).value.errno, WireErrno.ESTALE)
        self.assertEqual(self.successResultOf(again).payload["version"], 2)
        self.assertEqual(
            [event.allowed for event in self.fixture.events("manifest_put")], [True, False, True]
        )

    def test_another_request_waits_for_the_puts_ahead_of_it(self) -> None:
        """
        A request that is not a put, sent behind puts, starts only once
        they have all ended: a lease request's work (in the lease database,
        beside the puts' queue) is not even submitted meanwhile, and a
        listing after it sees every put.
        """
        self.upload("c0", "c1")
        puts = [self.put(f"f{index}", f"c{index}") for index in range(2)]
        lease = self.agent.request("lease_grant", path="/agent-1/f0", mode="write")
        listed = self.agent.request("list", path=self.agent.root)
        self.database.run_one()
        self.successResultOf(puts[0])
        self.assertNoResult(lease)
        # Only the second put's transaction is queued: the lease request waits.
        self.assertEqual(len(self.database.queued), 1)
        self.database.run_one()
        self.successResultOf(puts[1])
        self.assertNoResult(lease)
        self.database.run()
        self.successResultOf(lease)
        names = [entry["name"] for entry in self.successResultOf(listed).payload["entries"]]
        self.assertEqual(names, ["f0", "f1"])

    def test_another_connections_read_queues_behind_the_puts(self) -> None:
        """
        A read from another connection while a put waits in the queue
        runs after it: it finds the file, committed, never a half-made one.
        """
        reader = self.fixture.agent(identity(), "reader")
        self.upload("c0", "c1")
        first = self.put("f0", "c0")
        second = self.put("f1", "c1")
        self.database.run_one()
        self.successResultOf(first)
        looked = reader.request("head_file", path="/agent-1/f1")
        self.database.run()
        self.successResultOf(second)
        # The reader's lookup was queued behind the second put's transaction.
        self.assertEqual(self.successResultOf(looked).payload["size"], 1000)

    def test_a_long_stream_released_at_once_does_not_recurse(self) -> None:
        """
        Hundreds of puts waiting for their turn behind a put held at the
        commit gate (by a GC sweep) all start when the sweep ends, each as
        the one before gives way: one after the other, not each inside the
        previous one's call (that recursion overflowed Python's stack).
        """
        storage = self.successResultOf(self.agent.connection.storage())
        self.upload(*(f"c{index}" for index in range(400)))
        swept = storage.sweep()  # holds the commit gate while its reads wait
        puts = [self.put(f"f{index}", f"c{index}") for index in range(400)]
        self.database.run()
        self.successResultOf(swept)
        self.assertEqual(
            [self.successResultOf(put).payload["version"] for put in puts], [1] * len(puts)
        )

    def make(self, *names: str) -> None:
        """Create the files C{names}, each committed before the test goes on."""
        self.upload(*names)
        puts = [self.put(name, name) for name in names]
        self.database.run()
        for put in puts:
            self.successResultOf(put)

    def test_consecutive_removals_share_a_transaction(self) -> None:
        """
        Three unlinks sent back to back (C{rm -r}): the first commits alone,
        the two queued behind it together, each answered after its own
        commit.
        """
        self.make("a", "b", "c")
        removals = [
            self.agent.request("manifest_delete", path=f"/agent-1/{name}") for name in "abc"
        ]
        self.assertEqual(len(self.database.queued), 1)
        self.database.run_one()
        self.successResultOf(removals[0])
        self.assertNoResult(removals[1])
        self.assertEqual(len(self.database.queued), 1)
        self.database.run_one()
        for removal in removals[1:]:
            self.successResultOf(removal)
        self.assertEqual(self.database.queued, [])

    def test_changes_of_every_kind_see_the_ones_before(self) -> None:
        """
        A stream of different changes sharing transactions runs as if one
        at a time: the rename finds the directory made before it, the
        attribute change the renamed file, and a refused change (a second
        C{mkdir} of the same name) rolls back alone.
        """
        self.make("f")
        requests: list[tuple[str, dict[str, Any]]] = [
            ("dir_create", {"path": "/agent-1/d", "mode": 0o755, "uid": 0, "gid": 0}),
            ("dir_create", {"path": "/agent-1/d", "mode": 0o755, "uid": 0, "gid": 0}),
            ("manifest_rename", {"path": "/agent-1/f", "to_path": "/agent-1/d/g"}),
            ("setattr", {"path": "/agent-1/d/g", "mode": 0o600}),
            ("link", {"path": "/agent-1/d/g", "to_path": "/agent-1/h"}),
            ("manifest_delete", {"path": "/agent-1/d/g"}),
        ]
        sent = [self.agent.request(op, **fields) for op, fields in requests]
        self.database.run()
        self.assertEqual(self.failureResultOf(sent[1]).value.errno, WireErrno.EEXIST)
        for answer in sent[:1] + sent[2:]:
            self.successResultOf(answer)
        listed = self.agent.request("list", path=self.agent.root)
        self.database.run()
        entries = self.successResultOf(listed).payload["entries"]
        self.assertEqual(sorted(entry["name"] for entry in entries), ["d", "h"])
        mode = next(entry["mode"] for entry in entries if entry["name"] == "h")
        self.assertEqual(mode & 0o777, 0o600)
