"""
Tests for L{svc.dataplane.service}: each operation's success and error
paths over the real storage engine, with its audit line checked field by
field and its metrics read back from the exposition.
"""

from __future__ import annotations

from typing import Any

from blake3 import blake3
from twisted.trial.unittest import SynchronousTestCase

from svc.audit.events import AuditEvent
from svc.audit.jsonl import line_object
from svc.dataplane.test.test_service_support import ServiceFixture, blob, identity
from svc.policy import PathPolicy
from svc.store.layout import TenantLocation
from svc.wire.errno import WireErrno

CERT = {
    "command": "svc-server",
    "offset": None,
    "agent_id": "agent-1",
    "tenant_id": "tenant-a",
    "cert_serial": "a1",
    "cert_subject": "CN=user-1,OU=tenant=tenant-a",
}


def line(event: AuditEvent) -> dict[str, Any]:
    """The JSON object of an audit line, without its timestamp."""
    fields = line_object(event)
    del fields["ts"]
    return fields


def expected(
    event: str, path: str, allowed: bool = True, size: int | None = None, **extra: Any
) -> dict[str, Any]:
    """A server line of tenant-a/agent-1 as the audit-log document fixes it."""
    fields: dict[str, Any] = {"event": event, "path": path, "allowed": allowed, "size": size}
    fields.update(CERT)
    fields.update(extra)
    return fields


class NamespaceOpsTests(SynchronousTestCase):
    """
    Namespace operations: replies, errors, audit lines and journal metrics.
    """

    def setUp(self) -> None:
        self.fixture = ServiceFixture(self)
        self.agent = self.fixture.agent()
        self.addCleanup(self.fixture.close)

    def test_disk_root_created(self) -> None:
        """The first operation creates the agent's disk root, once, journaled."""
        self.assertEqual(
            self.agent.ok("list", path="/agent-1"), {"entries": [], "next_after": None}
        )
        self.assertEqual(line(self.fixture.last()), expected("list_entries", "/agent-1"))
        other = self.fixture.agent()
        other.ok("list", path="/agent-1")
        count = self.fixture.sample(
            "svc_journal_writes_total", op="mkdir", allocation_id="tenant-a/agent-1"
        )
        self.assertEqual(count, 1.0)
        self.assertEqual(self.agent.ok("head_file", path="/agent-1")["kind"], "dir")

    def test_put_sets_atime_when_given(self) -> None:
        """
        C{atime_ns} on C{manifest_put} is the file's atime, on create and on
        replace; without it a new file's atime is its mtime and a replaced
        one keeps its own.
        """
        chunk_hash, data = blob("a", 10)
        self.agent.ok("chunk_put", data, hash=chunk_hash)

        def put(name: str, version: int, mtime_ns: int, atime_ns: int | None = None) -> Any:
            path = f"/agent-1/{name}"
            request: dict[str, Any] = {
                "path": path,
                "expected_version": version,
                "chunks": [[chunk_hash, 10]],
                "size": 10,
                "mode": 0o644,
                "mtime_ns": mtime_ns,
            }
            if atime_ns is not None:
                request["atime_ns"] = atime_ns
            self.agent.ok("manifest_put", **request)
            return self.agent.ok("head_file", path=path)

        self.assertEqual(put("a", 0, 5)["atime_ns"], 5)
        self.assertEqual(put("b", 0, 5, atime_ns=77)["atime_ns"], 77)
        self.assertEqual(put("b", 1, 6)["atime_ns"], 77)
        head = put("b", 2, 6, atime_ns=99)
        self.assertEqual((head["atime_ns"], head["mtime_ns"], head["version"]), (99, 6, 3))

    def test_put_get_head(self) -> None:
        """A file put is read back by manifest_get and head_file with their audit fields."""
        chunk_hash, data = blob("f", 300)
        self.agent.ok("chunk_put", data, hash=chunk_hash)
        put = self.agent.ok(
            "manifest_put",
            path="/agent-1/f",
            expected_version=0,
            chunks=[[chunk_hash, 300]],
            size=300,
            mode=0o640,
            mtime_ns=12,
            uid=5,
            gid=6,
        )
        self.assertEqual(
            put,
            {
                "inode": put["inode"],
                "version": 1,
                "size": 300,
                "created": True,
                "journal_seq": 2,
                "ctime_ns": put["ctime_ns"],
            },
        )
        self.assertEqual(
            line(self.fixture.last()), expected("manifest_put", "/agent-1/f", size=300, version=1)
        )
        got = self.agent.ok("manifest_get", path="/agent-1/f")
        self.assertEqual((got["chunks"], got["inode"]), ([[chunk_hash, 300]], put["inode"]))
        self.assertEqual(
            (got["size"], got["version"], got["mode"], got["uid"], got["gid"], got["mtime_ns"]),
            (300, 1, 0o640, 5, 6, 12),
        )
        self.assertEqual(got["last_writer_agent_id"], "agent-1")
        self.assertNotIn("last_writer_session_id", got)
        self.assertEqual(
            line(self.fixture.last()), expected("manifest_get", "/agent-1/f", size=300, version=1)
        )
        head = self.agent.ok("head_file", path="/agent-1/f")
        self.assertEqual((head["kind"], head["size"], head["nlink"]), ("file", 300, 1))
        self.assertNotIn("chunks", head)
        self.assertEqual(line(self.fixture.last()), expected("head_file", "/agent-1/f", size=300))
        parent = self.agent.ok("head_file", path="/agent-1")
        self.assertEqual(
            (head["ctime_ns"], parent["mtime_ns"], parent["ctime_ns"]), (put["ctime_ns"],) * 3
        )
        self.assertEqual(
            self.fixture.sample(
                "svc_journal_writes_total", op="put", allocation_id="tenant-a/agent-1"
            ),
            1.0,
        )

    def test_stale_version(self) -> None:
        """A lost compare-and-swap is ESTALE with the current version and last writer."""
        self.agent.put_file("f", b"one")
        error = self.agent.error(
            "manifest_put",
            path="/agent-1/f",
            expected_version=0,
            chunks=[],
            size=0,
            mode=0o644,
            mtime_ns=1,
        )
        self.assertEqual(error.errno, WireErrno.ESTALE)
        details = dict(error.details)
        self.assertEqual(details["reason"], "version_changed")
        self.assertEqual((details["expected_version"], details["current_version"]), (0, 1))
        self.assertEqual(details["last_writer_agent_id"], "agent-1")
        self.assertIsInstance(details["last_writer_at_unix_ms"], int)
        self.assertEqual(line(self.fixture.last()), expected("manifest_put", "/agent-1/f", False))

    def test_missing_chunks(self) -> None:
        """A manifest naming chunks never uploaded is EINVAL listing them."""
        chunk_hash, _ = blob("never", 10)
        error = self.agent.error(
            "manifest_put",
            path="/agent-1/f",
            expected_version=0,
            chunks=[[chunk_hash, 10]],
            size=10,
            mode=0o644,
            mtime_ns=1,
        )
        self.assertEqual(
            (error.errno, dict(error.details)), (WireErrno.EINVAL, {"missing": [chunk_hash]})
        )

    def test_directories(self) -> None:
        """dir_create, list with attributes, dir_remove; removing a non-empty one is ENOTEMPTY."""
        made = self.agent.ok("dir_create", path="/agent-1/d", mode=0o700, uid=3, gid=4)
        self.assertEqual((made["kind"], made["mode"], made["uid"]), ("dir", 0o700, 3))
        self.assertEqual(line(self.fixture.last()), expected("dir_create", "/agent-1/d"))
        self.agent.put_file("d/f", b"x")
        listing = self.agent.ok("list", path="/agent-1")
        entries = listing["entries"]
        assert isinstance(entries, list)
        self.assertEqual([(e["name"], e["kind"]) for e in entries], [("d", "dir")])
        self.assertEqual(self.agent.errno("dir_remove", path="/agent-1/d"), WireErrno.ENOTEMPTY)
        self.assertEqual(line(self.fixture.last()), expected("dir_remove", "/agent-1/d", False))
        deleted = self.agent.ok("manifest_delete", path="/agent-1/d/f")
        self.assertEqual(line(self.fixture.last()), expected("manifest_delete", "/agent-1/d/f"))
        after_delete = self.agent.ok("head_file", path="/agent-1/d")
        self.assertEqual(deleted, {"dir_ctime_ns": after_delete["ctime_ns"]})
        self.assertEqual(after_delete["mtime_ns"], after_delete["ctime_ns"])
        removed = self.agent.ok("dir_remove", path="/agent-1/d")
        self.assertEqual(line(self.fixture.last()), expected("dir_remove", "/agent-1/d"))
        parent = self.agent.ok("head_file", path="/agent-1")
        self.assertEqual(removed, {"dir_ctime_ns": parent["ctime_ns"]})
        self.assertEqual(self.agent.errno("list", path="/agent-1/d"), WireErrno.ENOENT)
        self.assertEqual(line(self.fixture.last()), expected("list_entries", "/agent-1/d", False))

    def test_list_paging(self) -> None:
        """A listing is paged by name with limit and after."""
        for name in ("e", "a", "c", "b", "d"):
            self.agent.put_file(name, b"")
        first = self.agent.ok("list", path="/agent-1", limit=2)
        self.assertEqual([e["name"] for e in first["entries"]], ["a", "b"])
        self.assertEqual(first["next_after"], "b")
        rest = self.agent.ok("list", path="/agent-1", limit=3, after="b")
        self.assertEqual([e["name"] for e in rest["entries"]], ["c", "d", "e"])
        self.assertIsNone(rest["next_after"])

    def test_list_pages_skip_hidden_names_without_naming_them(self) -> None:
        """
        Names the policy hides are left out of pages, however long a run of
        them; C{next_after} is always a name a page showed; every visible
        name comes once, in order.
        """
        visible = ["a", "b", "zz"]
        for name in [*visible, *(f"secret-{index:02d}" for index in range(7))]:
            self.agent.put_file(name, b"")
        self.fixture.policies[("tenant-a", "agent-1")] = PathPolicy(deny=("secret-*",))
        seen: list[str] = []
        after: str | None = None
        while True:
            options: dict[str, Any] = (
                {"limit": 2} if after is None else {"limit": 2, "after": after}
            )
            page = self.agent.ok("list", path="/agent-1", **options)
            names = [entry["name"] for entry in page["entries"]]
            seen += names
            after = page["next_after"]
            if after is None:
                break
            self.assertIn(after, names)
        self.assertEqual(seen, visible)

    def test_a_list_page_reads_only_its_own_rows(self) -> None:
        """The store is asked for a page's rows and one more, not the whole directory."""
        for index in range(30):
            self.agent.put_file(f"f{index:02d}", b"")
        asked: list[tuple[str | None, int | None]] = []
        storage = self.successResultOf(
            self.fixture.service.engine.tenant(TenantLocation("user-1", "tenant-a"))
        )
        real = storage.list_dir

        def list_dir(path: str, *, after: str | None = None, limit: int | None = None) -> Any:
            asked.append((after, limit))
            return real(path, after=after, limit=limit)

        self.patch(storage, "list_dir", list_dir)
        page = self.agent.ok("list", path="/agent-1", limit=5, after="f09")
        self.assertEqual(
            [entry["name"] for entry in page["entries"]], [f"f{i}" for i in range(10, 15)]
        )
        self.assertEqual(asked, [("f09", 6)])

    def test_names(self) -> None:
        """rename, link, symlink, readlink, mknod and setattr with their audit paths."""
        self.agent.put_file("f", b"data")
        renamed = self.agent.ok("manifest_rename", path="/agent-1/f", to_path="/agent-1/g")
        self.assertEqual(line(self.fixture.last()), expected("manifest_rename", "/agent-1/f"))
        stamp = self.agent.ok("head_file", path="/agent-1")["ctime_ns"]
        self.assertEqual(renamed, {"moved": 1, "replaced": False, "dir_ctime_ns": stamp})
        self.assertEqual(self.agent.ok("head_file", path="/agent-1/g")["ctime_ns"], stamp)
        onto_itself = self.agent.ok("manifest_rename", path="/agent-1/g", to_path="/agent-1/g")
        self.assertEqual(onto_itself, {"moved": 0, "replaced": False})
        linked = self.agent.ok("link", path="/agent-1/g", to_path="/agent-1/h")
        self.assertEqual(linked["nlink"], 2)
        self.assertEqual(line(self.fixture.last()), expected("link", "/agent-1/g"))
        made = self.agent.ok("symlink", path="/agent-1/l", target="g")
        self.assertEqual((made["kind"], made["symlink_target"]), ("symlink", "g"))
        self.assertEqual(line(self.fixture.last()), expected("symlink", "/agent-1/l"))
        self.assertEqual(self.agent.ok("readlink", path="/agent-1/l"), {"target": "g"})
        self.assertEqual(line(self.fixture.last()), expected("readlink", "/agent-1/l"))
        self.assertEqual(self.agent.errno("readlink", path="/agent-1/g"), WireErrno.EINVAL)
        fifo = self.agent.ok("mknod", path="/agent-1/p", kind="fifo", mode=0o600)
        self.assertEqual(fifo["kind"], "fifo")
        self.assertEqual(line(self.fixture.last()), expected("mknod", "/agent-1/p"))
        changed = self.agent.ok("setattr", path="/agent-1/g", mode=0o600, size=0, mtime_ns=99)
        self.assertEqual((changed["mode"], changed["size"], changed["mtime_ns"]), (0o600, 0, 99))
        self.assertEqual(line(self.fixture.last()), expected("setattr", "/agent-1/g"))
        self.assertEqual(self.agent.errno("setattr", path="/agent-1/g", size=5), WireErrno.EINVAL)
        self.assertEqual(
            self.agent.errno("link", path="/agent-1/g", to_path="/agent-1/h"), WireErrno.EEXIST
        )

    def test_disk_root_protected(self) -> None:
        """The disk root cannot be removed, renamed or replaced (EPERM)."""
        self.agent.ok("dir_create", path="/agent-1/d", mode=0o755)
        self.assertEqual(self.agent.errno("dir_remove", path="/agent-1"), WireErrno.EPERM)
        self.assertEqual(
            self.agent.errno("manifest_rename", path="/agent-1", to_path="/agent-1/x"),
            WireErrno.EPERM,
        )
        self.assertEqual(
            self.agent.errno("manifest_rename", path="/agent-1/d", to_path="/agent-1"),
            WireErrno.EPERM,
        )
        self.assertEqual(
            self.agent.errno("journal_revert_path", path="/agent-1", seq=1), WireErrno.EPERM
        )
        self.assertEqual(self.agent.ok("head_file", path="/agent-1")["kind"], "dir")

    def test_schema_and_unknown_ops(self) -> None:
        """EPROTO is audited as a failure of its op; an unknown op is ENOSYS and not audited."""
        self.assertEqual(self.agent.errno("manifest_get", path=7), WireErrno.EPROTO)
        self.assertEqual(line(self.fixture.last()), expected("manifest_get", "", False))
        lines = len(self.fixture.audit)
        self.assertEqual(self.agent.errno("frobnicate"), WireErrno.ENOSYS)
        self.assertEqual(self.agent.errno("lease_revoke"), WireErrno.ENOSYS)
        self.assertEqual(len(self.fixture.audit), lines)

    def test_too_long(self) -> None:
        """A confined path past the length limits is ENAMETOOLONG, audited, not a denial."""
        path = "/agent-1/" + "n" * 300
        self.assertEqual(self.agent.errno("head_file", path=path), WireErrno.ENAMETOOLONG)
        self.assertEqual(line(self.fixture.last()), expected("head_file", path, False))
        self.assertIsNone(self.fixture.sample("svc_agent_path_denied_total", op="stat"))

    def test_op_durations(self) -> None:
        """Every operation is timed under its spec label (head_file is stat)."""
        self.agent.ok("head_file", path="/agent-1")
        self.agent.ok("ping")
        self.agent.errno("manifest_get", path="/agent-1/none")
        self.assertEqual(
            self.fixture.sample("svc_dataplane_op_duration_seconds_count", op="stat"), 1.0
        )
        self.assertEqual(
            self.fixture.sample("svc_dataplane_op_duration_seconds_count", op="ping"), 1.0
        )
        self.assertEqual(
            self.fixture.sample("svc_dataplane_op_duration_seconds_count", op="manifest_get"), 1.0
        )
        self.assertIsNone(
            self.fixture.sample("svc_dataplane_op_duration_seconds_count", op="head_file")
        )


class ChunkOpsTests(SynchronousTestCase):
    """
    chunk_put, chunk_get and chunk_has: bytes, audit lines and metrics.
    """

    def setUp(self) -> None:
        self.fixture = ServiceFixture(self)
        self.agent = self.fixture.agent()
        self.addCleanup(self.fixture.close)

    def test_put_and_get(self) -> None:
        """An uploaded chunk is served back in the raw segment; states and bytes are counted."""
        chunk_hash, data = blob("c", 2048)
        self.assertEqual(
            self.agent.ok("chunk_put", data, hash=chunk_hash), {"hash": chunk_hash, "size": 2048}
        )
        self.assertEqual(
            line(self.fixture.last()), expected("chunk_put", "", size=2048, hash=chunk_hash)
        )
        reply = self.agent.reply("chunk_get", hash=chunk_hash)
        self.assertEqual(
            (dict(reply.payload), bytes(reply.raw)), ({"hash": chunk_hash, "size": 2048}, data)
        )
        self.assertEqual(
            line(self.fixture.last()), expected("chunk_get", "", size=2048, hash=chunk_hash)
        )
        self.agent.ok("chunk_put", data, hash=chunk_hash)
        sample = self.fixture.sample
        self.assertEqual(sample("svc_chunks_total", state="cached"), 1.0)
        self.assertEqual(sample("svc_chunks_total", state="deduped"), 1.0)
        self.assertEqual(sample("svc_chunks_total", state="fetched"), 1.0)
        self.assertEqual(
            sample("svc_dataplane_bytes_total", direction="in", op="chunk_put"), 4096.0
        )
        self.assertEqual(
            sample("svc_dataplane_bytes_total", direction="out", op="chunk_get"), 2048.0
        )

    def test_get_lends_the_stored_bytes_until_sent(self) -> None:
        """
        chunk_get answers with the store's lent buffer and a C{sent} that
        gives it back: after it the reply's bytes refuse use, and the next
        get (served from the same buffer) is still right.
        """
        chunk_hash, data = blob("c", 3000)
        other_hash, other = blob("d", 5000)
        self.agent.ok("chunk_put", data, hash=chunk_hash)
        self.agent.ok("chunk_put", other, hash=other_hash)
        reply = self.agent.reply("chunk_get", hash=chunk_hash)
        self.assertEqual(bytes(reply.raw), data)
        assert reply.sent is not None
        reply.sent()
        with self.assertRaises(ValueError):
            bytes(reply.raw)
        again = self.agent.reply("chunk_get", hash=other_hash)
        self.assertEqual(bytes(again.raw), other)

    def test_bad_puts(self) -> None:
        """Bytes that do not hash to the name, and an empty raw segment, are EINVAL."""
        chunk_hash, data = blob("c", 100)
        error = self.agent.error("chunk_put", data + b"!", hash=chunk_hash)
        self.assertEqual(error.errno, WireErrno.EINVAL)
        self.assertEqual(
            line(self.fixture.last()), expected("chunk_put", "", False, hash=chunk_hash)
        )
        self.assertEqual(self.agent.errno("chunk_put", b"", hash=chunk_hash), WireErrno.EINVAL)

    def test_get_absent(self) -> None:
        """An absent chunk is ENOENT, audited with its hash."""
        chunk_hash, _ = blob("absent")
        error = self.agent.error("chunk_get", hash=chunk_hash)
        self.assertEqual(
            (error.errno, error.message), (WireErrno.ENOENT, f"chunk {chunk_hash} not present")
        )
        self.assertEqual(
            line(self.fixture.last()), expected("chunk_get", "", False, hash=chunk_hash)
        )

    def test_has(self) -> None:
        """chunk_has answers in request order, one audit line per batch, batch metrics counted."""
        stored, data = blob("stored", 50)
        absent, _ = blob("absent", 50)
        self.agent.ok("chunk_put", data, hash=stored)
        answer = self.agent.ok("chunk_has", hashes=[absent, stored, absent])
        self.assertEqual(answer, {"present": [False, True, False]})
        self.assertEqual(line(self.fixture.last()), expected("chunk_has", "", count=3))
        sample = self.fixture.sample
        self.assertEqual(
            sample("svc_chunk_batch_items_total", operation="has", result="present"), 1.0
        )
        self.assertEqual(
            sample("svc_chunk_batch_items_total", operation="has", result="absent"), 2.0
        )
        self.assertEqual(sample("svc_chunk_batch_size_count", operation="has"), 1.0)
        self.assertEqual(sample("svc_chunk_batch_size_sum", operation="has"), 3.0)
        self.assertEqual(sample("svc_chunk_batch_duration_seconds_count", operation="has"), 1.0)
        self.assertGreater(
            sample("svc_dataplane_bytes_total", direction="out", op="chunk_has") or 0, 0
        )

    def test_manifest_bytes(self) -> None:
        """manifest_put counts its request payload in, manifest_get its answer out."""
        self.agent.put_file("f", b"abc")
        self.agent.ok("manifest_get", path="/agent-1/f")
        sample = self.fixture.sample
        self.assertGreater(
            sample("svc_dataplane_bytes_total", direction="in", op="manifest_put") or 0, 60
        )
        self.assertGreater(
            sample("svc_dataplane_bytes_total", direction="out", op="manifest_get") or 0, 100
        )


class JournalOpsTests(SynchronousTestCase):
    """
    journal_query and journal_revert_path on the agent's own rows.
    """

    def setUp(self) -> None:
        self.fixture = ServiceFixture(self)
        self.agent = self.fixture.agent()
        self.addCleanup(self.fixture.close)

    def test_query(self) -> None:
        """The agent's rows come back paged, oldest first, with an empty-path audit line."""
        self.agent.put_file("a", b"1")
        self.agent.put_file("b", b"2")
        page = self.agent.ok("journal_query", limit=2)
        entries = page["entries"]
        assert isinstance(entries, list)
        self.assertEqual(
            [(e["op"], e["path"]) for e in entries], [("mkdir", "/agent-1"), ("put", "/agent-1/a")]
        )
        self.assertEqual(entries[1]["new_size"], 1)
        self.assertEqual(line(self.fixture.last()), expected("journal_query", ""))
        rest = self.agent.ok("journal_query", cursor=page["next_cursor"])
        self.assertEqual([e["path"] for e in rest["entries"]], ["/agent-1/b"])
        self.assertIsNone(rest["next_cursor"])
        only = self.agent.ok("journal_query", path="/agent-1/b", newest_first=True)
        self.assertEqual(len(only["entries"]), 1)
        self.assertEqual(self.fixture.sample("svc_journal_query_duration_seconds_count"), 3.0)

    def test_revert(self) -> None:
        """Reverting a put restores the previous content; revert results are counted."""
        self.agent.put_file("f", b"first")
        second = self.agent.put_file("f", b"second", expected_version=1)
        reverted = self.agent.ok(
            "journal_revert_path", path="/agent-1/f", seq=second["journal_seq"]
        )
        self.assertEqual((reverted["exists"], reverted["size"], reverted["version"]), (True, 5, 3))
        self.assertEqual(line(self.fixture.last()), expected("journal_revert_path", ""))
        label = "tenant-a/agent-1"
        self.assertEqual(
            self.fixture.sample("svc_journal_revert_total", allocation_id=label, result="reverted"),
            1.0,
        )
        self.assertEqual(
            self.fixture.sample("svc_journal_writes_total", op="revert", allocation_id=label), 1.0
        )
        self.assertEqual(
            self.agent.errno("journal_revert_path", path="/agent-1/f", seq=999), WireErrno.ENOENT
        )
        self.assertEqual(
            self.fixture.sample("svc_journal_revert_total", allocation_id=label, result="error"),
            1.0,
        )
        created = self.agent.put_file("g", b"g")
        self.agent.ok("manifest_delete", path="/agent-1/g")
        noop = self.agent.ok("journal_revert_path", path="/agent-1/g", seq=created["journal_seq"])
        self.assertEqual((noop["exists"], noop["journal_seq"]), (False, None))
        self.assertEqual(
            self.fixture.sample("svc_journal_revert_total", allocation_id=label, result="noop"), 1.0
        )

    def test_revert_reads_back(self) -> None:
        """After a revert the old bytes are readable again by chunk_get."""
        self.agent.put_file("f", b"first")
        second = self.agent.put_file("f", b"second", expected_version=1)
        self.agent.ok("journal_revert_path", path="/agent-1/f", seq=second["journal_seq"])
        got = self.agent.ok("manifest_get", path="/agent-1/f")
        chunk_hash: str = got["chunks"][0][0]
        self.assertEqual(bytes(self.agent.reply("chunk_get", hash=chunk_hash).raw), b"first")
        self.assertEqual(chunk_hash, blake3(b"first").hexdigest())

    def test_other_tenant_owner_layout(self) -> None:
        """An agent of another user lands in its own storage location."""
        other = self.fixture.agent(identity(user="user-2", agent="agent-1", serial="b2"))
        self.assertEqual(other.ok("journal_query")["entries"][0]["op"], "mkdir")
        self.agent.put_file("f", b"x")
        self.assertEqual(len(other.ok("journal_query")["entries"]), 1)
