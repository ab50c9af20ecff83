"""
Tests for L{svc.dataplane.service}: leases (grant, refresh, release, revoke
pushed to the holder's connection, connection close), and the ordering of a
connection's pipelined requests.
"""

from __future__ import annotations

from blake3 import blake3
from twisted.trial.unittest import SynchronousTestCase

from svc.audit.jsonl import line_object
from svc.dataplane.test.test_service_support import ServiceFixture, blob
from svc.testing.worker import ManualWorker
from svc.wire.errno import WireErrno

PATH = "/agent-1/f"


class LeaseTests(SynchronousTestCase):
    """
    Lease operations, revoke pushes, lease audit lines and the held gauge.
    """

    def setUp(self) -> None:
        self.fixture = ServiceFixture(self)
        self.addCleanup(self.fixture.close)
        self.first = self.fixture.agent()
        self.second = self.fixture.agent()

    def held(self, path: str = PATH) -> float | None:
        return self.fixture.sample("svc_lease_held", path=path)

    def test_grant_refresh_release(self) -> None:
        """A write lease is granted, refreshed and released, each with its lease line."""
        grant = self.first.ok("lease_grant", path=PATH, mode="write")
        lease_id = grant["lease_id"]
        self.assertEqual((grant["granted"], grant["mode"], grant["ttl_ms"]), (True, "write", 60000))
        self.assertEqual(
            grant["expires_at_unix_ms"], round((self.fixture.clock.seconds() + 60) * 1000)
        )
        fields = line_object(self.fixture.last())
        del fields["ts"]
        self.assertEqual(
            fields,
            {
                "event": "lease_grant",
                "path": PATH,
                "allowed": True,
                "command": "svc-server",
                "size": None,
                "offset": None,
                "agent_id": "agent-1",
                "lease_id": lease_id,
                "mode": "write",
                "reason": "",
            },
        )
        self.assertEqual(self.held(), 1.0)
        self.fixture.clock.advance(30)
        refreshed = self.first.ok("lease_refresh", lease_id=lease_id)
        self.assertEqual((refreshed["lease_id"], refreshed["ttl_ms"]), (lease_id, 60000))
        self.assertEqual(self.fixture.last().event, "lease_refresh")
        self.assertEqual(self.first.ok("lease_release", lease_id=lease_id), {})
        self.assertEqual(
            (self.fixture.last().event, self.fixture.last().get("reason")),
            ("lease_release", "client"),
        )
        self.assertIsNone(self.held())
        self.assertEqual(self.first.errno("lease_refresh", lease_id=lease_id), WireErrno.ENOENT)
        self.assertEqual(self.first.errno("lease_release", lease_id=lease_id), WireErrno.ENOENT)
        self.assertEqual(
            self.fixture.sample("svc_dataplane_op_duration_seconds_count", op="lease_grant"), 1.0
        )

    def test_lease_of_other_connection(self) -> None:
        """A lease id is only usable by the connection that holds it."""
        lease_id = self.first.ok("lease_grant", path=PATH, mode="read")["lease_id"]
        self.assertEqual(self.second.errno("lease_release", lease_id=lease_id), WireErrno.ENOENT)
        self.assertEqual(self.held(), 1.0)

    def test_contention_pushes_revoke(self) -> None:
        """A conflicting write request pushes lease_revoke to the holder's connection only."""
        lease_id = self.first.ok("lease_grant", path=PATH, mode="write")["lease_id"]
        denied = self.second.ok("lease_grant", path=PATH, mode="write")
        self.assertEqual(denied, {"granted": False, "mode": "write", "reason": "contention"})
        [(op, push)] = self.first.sink.pushes
        self.assertEqual(op, "lease_revoke")
        self.assertEqual(
            (push["lease_id"], push["path"], push["mode"], push["reason"], push["deadline_ms"]),
            (lease_id, PATH, "write", "contention", 10000),
        )
        self.assertEqual(self.second.sink.pushes, [])
        revoke = self.fixture.events("lease_revoke")[-1]
        self.assertEqual((revoke.get("reason"), revoke.get("lease_id")), ("contention", lease_id))
        self.assertEqual(
            self.fixture.sample("svc_dataplane_op_duration_seconds_count", op="lease_revoke"), 1.0
        )

    def test_waiting_grant(self) -> None:
        """A waiting write request is granted when the holder releases; other requests proceed."""
        lease_id = self.first.ok("lease_grant", path=PATH, mode="write")["lease_id"]
        waiting = self.second.request("lease_grant", path=PATH, mode="write", wait=True)
        self.assertNoResult(waiting)
        self.assertEqual(self.second.ok("ping"), {})
        self.assertEqual(self.second.ok("list", path="/agent-1")["entries"], [])
        self.first.ok("lease_release", lease_id=lease_id)
        granted = self.successResultOf(waiting).payload
        self.assertTrue(granted["granted"])

    def test_revoke_timeout_fences(self) -> None:
        """A holder that does not yield is dropped at the deadline and its puts refused."""
        self.first.ok("lease_grant", path=PATH, mode="write")
        waiting = self.second.request("lease_grant", path=PATH, mode="write", wait=True)
        self.fixture.clock.advance(10)
        self.assertTrue(self.successResultOf(waiting).payload["granted"])
        violation = self.fixture.events("lease_violation")[-1]
        self.assertEqual(violation.get("reason"), "revoke_timeout")
        error = self.first.error(
            "manifest_put", path=PATH, expected_version=0, chunks=[], size=0, mode=0o644, mtime_ns=1
        )
        self.assertEqual(
            (error.errno, dict(error.details)), (WireErrno.ESTALE, {"reason": "lease_conflict"})
        )

    def test_manifest_put_contention(self) -> None:
        """Another connection's put under a write lease is ESTALE; the holder must yield."""
        self.first.ok("lease_grant", path=PATH, mode="write")
        error = self.second.error(
            "manifest_put", path=PATH, expected_version=0, chunks=[], size=0, mode=0o644, mtime_ns=1
        )
        self.assertEqual(error.errno, WireErrno.ESTALE)
        [(_, push)] = self.first.sink.pushes
        self.assertEqual(push["reason"], "manifest_put_contention")
        self.first.put_file("f", b"")

    def test_closed_releases(self) -> None:
        """closed() releases the leases (conn_closed), lets waiters in, forgets the connection."""
        self.first.ok("lease_grant", path=PATH, mode="write")
        self.first.ok("lease_grant", path="/agent-1", mode="read")
        waiting = self.second.request("lease_grant", path=PATH, mode="write", wait=True)
        self.assertIsNotNone(self.fixture.service.connection("conn-1"))
        self.successResultOf(self.first.connection.closed("idle_timeout"))
        releases = [e.get("reason") for e in self.fixture.events("lease_release")]
        self.assertEqual(releases, ["conn_closed", "conn_closed"])
        self.assertIsNone(self.fixture.service.connection("conn-1"))
        self.assertTrue(self.successResultOf(waiting).payload["granted"])
        self.successResultOf(self.second.connection.closed("shutdown"))
        self.assertIsNone(self.held())
        self.assertIsNone(self.held("/agent-1"))

    def test_closed_refuses_new_leases(self) -> None:
        """A lease request still running when the connection closes is refused."""
        self.successResultOf(self.first.connection.closed("shutdown"))
        self.assertEqual(self.first.errno("lease_grant", path=PATH, mode="read"), WireErrno.EBADF)

    def test_close_op(self) -> None:
        """The close operation releases the connection's leases and answers an empty map."""
        self.first.ok("lease_grant", path=PATH, mode="write")
        self.assertEqual(self.first.ok("close"), {})
        self.assertEqual(self.fixture.last().get("reason"), "conn_closed")
        self.assertIsNone(self.held())


class OrphanTests(SynchronousTestCase):
    """
    A write lease of a mount session left behind by a server restart (an
    orphan), met by that session again and by a newer session of the agent.
    """

    def setUp(self) -> None:
        before = ServiceFixture(self)
        agent = before.agent()
        self.who = agent.identity
        self.orphan_id = agent.ok(
            "lease_grant", path=PATH, mode="write", session_id=before.session(self.who, 3)
        )["lease_id"]
        before.close()
        self.fixture = ServiceFixture(self, before.root)
        self.addCleanup(self.fixture.close)

    def test_its_session_reclaims_it(self) -> None:
        """The orphan's own session, on a new connection, is granted the same lease."""
        again = self.fixture.agent().ok(
            "lease_grant", path=PATH, mode="write", session_id=self.fixture.session(self.who, 3)
        )
        self.assertEqual((again["granted"], again["lease_id"]), (True, self.orphan_id))

    def test_a_newer_session_is_granted_the_path_at_once(self) -> None:
        """
        A newer session's waiting write request does not wait for the orphan:
        the orphan is released (conn_closed) and the request granted at once.
        """
        grant = self.fixture.agent().ok(
            "lease_grant",
            path=PATH,
            mode="write",
            wait=True,
            session_id=self.fixture.session(self.who, 4),
        )
        self.assertTrue(grant["granted"])
        self.assertNotEqual(grant["lease_id"], self.orphan_id)
        [released] = self.fixture.events("lease_release")
        self.assertEqual(
            (released.get("lease_id"), released.get("reason")), (self.orphan_id, "conn_closed")
        )
        self.assertEqual(self.fixture.events("lease_revoke"), [])

    def test_a_newer_sessions_commit_is_not_refused_for_it(self) -> None:
        """A newer session's manifest_put on the orphan's path commits (no ESTALE)."""
        agent = self.fixture.agent()
        done = agent.put_file("f", b"new", session_id=self.fixture.session(self.who, 4))
        self.assertEqual(done["version"], 1)
        [released] = self.fixture.events("lease_release")
        self.assertEqual(released.get("reason"), "conn_closed")


class OrderingTests(SynchronousTestCase):
    """
    Pipelined requests of one connection see the effects of earlier ones.
    """

    def test_manifest_waits_for_upload(self) -> None:
        """A manifest sent right after its chunk waits for the upload, then commits."""
        worker = ManualWorker()
        fixture = ServiceFixture(self, io_worker=worker)
        agent = fixture.agent()
        data = b"pipelined"
        chunk_hash = blake3(data).hexdigest()
        put, manifest = agent.pipeline_file("f", data)
        fetched = agent.request("chunk_get", hash=chunk_hash)
        listing = agent.request("list", path="/agent-1")
        self.assertNoResult(manifest)
        worker.run()
        self.assertEqual(self.successResultOf(put).payload["size"], len(data))
        self.assertEqual(self.successResultOf(manifest).payload["version"], 1)
        self.assertEqual(bytes(self.successResultOf(fetched).raw), data)
        self.assertEqual(
            [e["name"] for e in self.successResultOf(listing).payload["entries"]], ["f"]
        )
        worker.run()
        self.successResultOf(fixture.service.engine.close())
        worker.run()

    def test_requests_in_order(self) -> None:
        """Namespace requests take effect in arrival order while the first is still pending."""
        worker = ManualWorker()
        fixture = ServiceFixture(self, io_worker=worker)
        agent = fixture.agent()
        made = agent.request("dir_create", path="/agent-1/d", mode=0o755)
        inner = agent.request("dir_create", path="/agent-1/d/e", mode=0o755)
        removed = agent.request("dir_remove", path="/agent-1/d")
        chunk_hash, _ = blob("x")
        has = agent.request("chunk_has", hashes=[chunk_hash])
        self.assertNoResult(made)
        worker.run()
        self.successResultOf(made)
        self.successResultOf(inner)
        self.assertEqual(self.failureResultOf(removed).value.errno, WireErrno.ENOTEMPTY)
        self.assertEqual(self.successResultOf(has).payload, {"present": (False,)})
        self.successResultOf(fixture.service.engine.close())
        worker.run()
