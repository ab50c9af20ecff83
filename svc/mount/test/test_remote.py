"""
Tests for L{svc.mount.remote.data_plane.Remote} over L{svc.testing.local_connection}
against a real data-plane service: typed replies, errno translation by
name, transport failures, lease pushes, and L{DirectChunkSource}.
"""

from __future__ import annotations

import errno
from collections.abc import Mapping
from typing import Any

from blake3 import blake3
from twisted.internet.defer import Deferred, fail, succeed
from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane_client.client import Reply
from svc.dataplane_client.errors import NotExecuted, RemoteError
from svc.mount.core.attributes import AttributeChanges, FileKind
from svc.mount.core.errors import RemoteFailure, local_errno
from svc.mount.remote.data_plane import ChunkEntry, DirectChunkSource, DiskUsage, Remote
from svc.mount.test.test_fs_support import AGENT, FSFixture
from svc.store.layout import TenantLocation
from svc.testing.local_connection import LocalConnection
from svc.wire.control import ErrorInfo
from svc.wire.errno import WireErrno

TENANT_A = TenantLocation("user-1", "tenant-a")


class Canned:
    """A caller answering every request with one reply or failure."""

    def __init__(self, answer: Reply | Exception) -> None:
        self.answer = answer

    def call(
        self,
        op: str,
        payload: Mapping[str, object],
        raw: bytes | memoryview = b"",
        *,
        timeout: float | None = None,
    ) -> Deferred[Reply]:
        if isinstance(self.answer, Exception):
            return fail(self.answer)
        return succeed(self.answer)


class RemoteTests(SynchronousTestCase):
    """Each operation's reply as a typed value."""

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        self.connection = LocalConnection(self.fixture.service.service, AGENT, "c1")
        self.remote = Remote(self.connection)
        self.session = self.fixture.session()

    def failure(self, deferred: Deferred[Any]) -> RemoteFailure:
        value: RemoteFailure = self.failureResultOf(deferred, RemoteFailure).value
        return value

    def test_files_and_chunks(self) -> None:
        """chunk_put/has/get and manifest_put/get round-trip with their fields."""
        data = b"hello chunk"
        name = blake3(data).hexdigest()
        self.assertEqual(self.successResultOf(self.remote.chunk_has([name])), [False])
        put = self.remote.chunk_put(name, data, session_id=self.session)
        self.assertEqual(self.successResultOf(put), len(data))
        self.assertEqual(self.successResultOf(self.remote.chunk_has([name])), [True])
        result = self.successResultOf(
            self.remote.manifest_put(
                "/agent-1/f",
                expected_version=0,
                chunks=[ChunkEntry(name, len(data))],
                size=len(data),
                mode=0o640,
                mtime_ns=5,
                uid=3,
                gid=4,
                session_id=self.session,
            )
        )
        self.assertEqual((result.version, result.size, result.created), (1, len(data), True))
        manifest = self.successResultOf(self.remote.manifest_get("/agent-1/f"))
        self.assertEqual(manifest.chunks, (ChunkEntry(name, len(data)),))
        self.assertEqual(manifest.attributes.kind, FileKind.FILE)
        self.assertEqual((manifest.attributes.mode, manifest.attributes.uid), (0o640, 3))
        self.assertEqual(manifest.last_writer.agent_id, "agent-1")
        self.assertEqual(manifest.last_writer.session_id, self.session)
        self.assertEqual(self.successResultOf(self.remote.chunk_get(name)), data)

    def test_namespace(self) -> None:
        """Directories, listing pages, symlinks, links, nodes, setattr, rename, removal."""
        remote = self.remote
        made = self.successResultOf(
            remote.dir_create("/agent-1/d", mode=0o700, uid=1, gid=2, session_id=None)
        )
        self.assertEqual((made.kind, made.mode, made.nlink), (FileKind.DIR, 0o700, 2))
        for leaf in ("a", "b", "c"):
            self.successResultOf(
                remote.mknod(
                    f"/agent-1/d/{leaf}",
                    kind=FileKind.FILE,
                    mode=0o600,
                    rdev=0,
                    uid=0,
                    gid=0,
                    session_id=None,
                )
            )
        page = self.successResultOf(remote.list_dir("/agent-1/d", limit=2))
        self.assertEqual([e.name for e in page.entries], ["a", "b"])
        rest = self.successResultOf(remote.list_dir("/agent-1/d", after=page.next_after))
        self.assertEqual(([e.name for e in rest.entries], rest.next_after), (["c"], None))
        link = self.successResultOf(remote.link("/agent-1/d/a", "/agent-1/d/z", session_id=None))
        self.assertEqual(link.nlink, 2)
        symlink = self.successResultOf(
            remote.symlink("/agent-1/s", "d/a", uid=0, gid=0, session_id=None)
        )
        self.assertEqual(symlink.symlink_target, "d/a")
        self.assertEqual(self.successResultOf(remote.readlink("/agent-1/s")), "d/a")
        changed = self.successResultOf(
            remote.setattr("/agent-1/d/b", AttributeChanges(mode=0o444), session_id=None)
        )
        self.assertEqual(changed.mode, 0o444)
        renamed = self.successResultOf(
            remote.rename("/agent-1/d/b", "/agent-1/d/c", session_id=None)
        )
        self.assertEqual((renamed.moved, renamed.replaced), (1, True))
        self.successResultOf(remote.manifest_delete("/agent-1/d/c", session_id=None))
        head = self.successResultOf(remote.head_file("/agent-1/d"))
        self.assertEqual(head.kind, FileKind.DIR)

    def test_errors_by_name(self) -> None:
        """Server errnos arrive as local errnos of the same name, with details."""
        missing = self.failure(self.remote.head_file("/agent-1/nope"))
        self.assertEqual((missing.errno, missing.wire), (errno.ENOENT, WireErrno.ENOENT))
        self.successResultOf(
            self.remote.mknod(
                "/agent-1/f", kind=FileKind.FILE, mode=0o600, rdev=0, uid=0, gid=0, session_id=None
            )
        )
        stale = self.failure(
            self.remote.manifest_put(
                "/agent-1/f",
                expected_version=7,
                chunks=[],
                size=0,
                mode=0o600,
                mtime_ns=1,
                uid=0,
                gid=0,
                session_id=None,
            )
        )
        self.assertEqual(stale.errno, errno.ESTALE)
        self.assertEqual(stale.details["reason"], "version_changed")
        self.assertEqual(stale.details["current_version"], 1)
        outside = self.failure(self.remote.head_file("/agent-2"))
        self.assertEqual(outside.errno, errno.EACCES)
        for wire in WireErrno:
            self.assertEqual(local_errno(wire), getattr(errno, wire.name))

    def test_server_timeout_may_have_run(self) -> None:
        """
        The server's ETIMEDOUT keeps its errno but is marked unknown (the
        request may still run); any other server errno is a plain refusal.
        """
        timed_out = ErrorInfo(WireErrno.ETIMEDOUT, "operation did not finish in time")
        failure = self.failure(Remote(Canned(RemoteError(timed_out))).head_file("/agent-1"))
        self.assertEqual((failure.errno, failure.unknown), (errno.ETIMEDOUT, True))
        refused = ErrorInfo(WireErrno.EACCES, "denied")
        failure = self.failure(Remote(Canned(RemoteError(refused))).head_file("/agent-1"))
        self.assertEqual((failure.errno, failure.unknown), (errno.EACCES, False))

    def test_transport_and_shape_failures(self) -> None:
        """No answer, or an answer of the wrong shape, is EIO."""
        lost = Remote(Canned(NotExecuted("connection closed")))
        failure = self.failure(lost.head_file("/agent-1"))
        self.assertEqual((failure.errno, failure.wire), (errno.EIO, None))
        odd = Remote(Canned(Reply({"inode": "seven"})))
        self.assertEqual(self.failure(odd.head_file("/agent-1")).errno, errno.EIO)
        self.successResultOf(self.connection.close())
        self.assertEqual(self.failure(self.remote.head_file("/agent-1")).errno, errno.EIO)

    def test_statfs(self) -> None:
        """statfs answers the agent's usage and limits as a DiskUsage."""
        self.assertEqual(
            self.successResultOf(self.remote.statfs()), DiskUsage(0, None, None, None, None)
        )
        engine = self.fixture.service.service.engine
        self.successResultOf(engine.set_agent_grant(TENANT_A, "agent-1", 50_000))
        self.successResultOf(engine.set_account_budget("user-1", 80_000))
        data = b"counted" * 100
        name = blake3(data).hexdigest()
        self.successResultOf(self.remote.chunk_put(name, data, session_id=None))
        self.successResultOf(
            self.remote.manifest_put(
                "/agent-1/f",
                expected_version=0,
                chunks=[ChunkEntry(name, len(data))],
                size=len(data),
                mode=0o600,
                mtime_ns=1,
                uid=0,
                gid=0,
                session_id=None,
            )
        )
        self.assertEqual(
            self.successResultOf(self.remote.statfs()),
            DiskUsage(len(data), 50_000, 80_000, len(data), 50_000 - len(data)),
        )

    def test_statfs_bad_replies(self) -> None:
        """A statfs answer missing a figure, mistyped, negative or inconsistent is EIO."""
        good: dict[str, object] = {
            "used_bytes": 10,
            "grant_bytes": 100,
            "budget_bytes": None,
            "account_used_bytes": 30,
            "available_bytes": 90,
        }
        parsed = self.successResultOf(Remote(Canned(Reply(good))).statfs())
        self.assertEqual(parsed, DiskUsage(10, 100, None, 30, 90))
        bad = [
            {k: v for k, v in good.items() if k != "used_bytes"},
            {**good, "used_bytes": True},
            {**good, "used_bytes": "10"},
            {**good, "grant_bytes": 1.5},
            {**good, "account_used_bytes": -1},
            {**good, "available_bytes": -5},
            {**good, "available_bytes": None},
            {**good, "grant_bytes": None, "available_bytes": 90},
        ]
        for payload in bad:
            failure = self.failure(Remote(Canned(Reply(payload))).statfs())
            self.assertEqual((failure.errno, failure.wire), (errno.EIO, None), payload)
        lost = self.failure(Remote(Canned(NotExecuted("connection closed"))).statfs())
        self.assertEqual(lost.errno, errno.EIO)

    def test_leases_and_pushes(self) -> None:
        """Lease answers are typed; a revoke reaches the holder's push callbacks."""
        pushes: list[tuple[str, Mapping[str, object]]] = []
        self.connection.on_push(lambda op, payload, raw: pushes.append((op, payload)))
        granted = self.successResultOf(self.remote.lease_grant("/agent-1", "write"))
        self.assertTrue(granted.granted)
        assert granted.lease_id is not None
        refreshed = self.successResultOf(self.remote.lease_refresh(granted.lease_id))
        self.assertEqual(refreshed.lease_id, granted.lease_id)
        other = Remote(LocalConnection(self.fixture.service.service, AGENT, "c2"))
        waiting = other.lease_grant("/agent-1", "write", wait=True)
        self.assertEqual([op for op, _ in pushes], ["lease_revoke"])
        self.assertEqual(pushes[0][1]["lease_id"], granted.lease_id)
        self.successResultOf(self.remote.lease_release(granted.lease_id))
        self.assertTrue(self.successResultOf(waiting).granted)
        refused = self.successResultOf(self.remote.lease_grant("/agent-1", "write"))
        self.assertFalse(refused.granted)
        self.assertIsInstance(refused.reason, str)


class DirectChunkSourceTests(SynchronousTestCase):
    """Fetching chunks straight from the data plane, verified."""

    def test_verified(self) -> None:
        """Bytes that hash to the name are returned; others are EIO."""
        data = b"payload"
        name = blake3(data).hexdigest()
        good = DirectChunkSource(Remote(Canned(Reply({"hash": name, "size": 7}, data))))
        self.assertEqual(self.successResultOf(good.fetch(name)), data)
        bad = DirectChunkSource(Remote(Canned(Reply({"hash": name, "size": 7}, b"tampered"))))
        self.assertEqual(
            self.failureResultOf(bad.fetch(name), RemoteFailure).value.errno, errno.EIO
        )
