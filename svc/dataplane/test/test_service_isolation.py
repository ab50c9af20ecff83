"""
Isolation tests for L{svc.dataplane.service}: no generated path escapes the
agent's disk through any path-bearing operation, and no operation lets one
agent read, list, stat or learn of another agent's data, whether the other
agent is in another tenant or in the same tenant store (chunks included).
"""

from __future__ import annotations

from typing import Any

from blake3 import blake3
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from svc.audit.names import path_denial_event_for_op
from svc.dataplane.chunk_visibility import VisibleChunks
from svc.dataplane.test.test_confinement import oracle
from svc.dataplane.test.test_service_statfs import LIMIT_KEYS
from svc.dataplane.test.test_service_support import ServiceFixture, blob, identity
from svc.metrics import op_label
from svc.store.layout import TenantLocation
from svc.wire.errno import WireErrno
from svc.wire.ops import Op

VALID = "/agent-1/ok"

# Path-bearing operations and the payload carrying the path under test in
# one key (the other path of a two-path op stays valid).
PATH_OPS: dict[str, tuple[Op, Any]] = {
    "list": (Op.LIST, lambda p: {"path": p}),
    "head_file": (Op.HEAD_FILE, lambda p: {"path": p}),
    "manifest_get": (Op.MANIFEST_GET, lambda p: {"path": p}),
    "manifest_put": (
        Op.MANIFEST_PUT,
        lambda p: {
            "path": p,
            "expected_version": 0,
            "chunks": [],
            "size": 0,
            "mode": 0o644,
            "mtime_ns": 1,
        },
    ),
    "manifest_delete": (Op.MANIFEST_DELETE, lambda p: {"path": p}),
    "rename_source": (Op.MANIFEST_RENAME, lambda p: {"path": p, "to_path": VALID}),
    "rename_target": (Op.MANIFEST_RENAME, lambda p: {"path": VALID, "to_path": p}),
    "dir_create": (Op.DIR_CREATE, lambda p: {"path": p, "mode": 0o755}),
    "dir_remove": (Op.DIR_REMOVE, lambda p: {"path": p}),
    "setattr": (Op.SETATTR, lambda p: {"path": p, "mode": 0o600}),
    "symlink": (Op.SYMLINK, lambda p: {"path": p, "target": "../../agent-2/secret"}),
    "readlink": (Op.READLINK, lambda p: {"path": p}),
    "mknod": (Op.MKNOD, lambda p: {"path": p, "kind": "fifo", "mode": 0o600}),
    "link_existing": (Op.LINK, lambda p: {"path": p, "to_path": VALID + "2"}),
    "link_new": (Op.LINK, lambda p: {"path": VALID, "to_path": p}),
    "journal_query": (Op.JOURNAL_QUERY, lambda p: {"path": p}),
    "journal_revert_path": (Op.JOURNAL_REVERT_PATH, lambda p: {"path": p, "seq": 1}),
    "lease_grant": (Op.LEASE_GRANT, lambda p: {"path": p, "mode": "write"}),
}

PIECES = st.sampled_from(
    [
        "",
        "/",
        "//",
        ".",
        "..",
        "/.",
        "/..",
        "agent-1",
        "agent-1x",
        "agent-2",
        "agent-",
        "x",
        "é",
        "\u202e",
        "\x00",
        "\ufffd",  # a lone surrogate cannot travel: msgpack strings are strict UTF-8
        "/agent-1",
        "/agent-2",
        "secret",
        "\\",
        " ",
    ]
)
PATHS = st.one_of(
    st.lists(PIECES, max_size=6).map("".join),
    st.text(max_size=30),
    st.builds(lambda rest: "/agent-1" + rest, st.text(alphabet="/.ax\x00", max_size=8)),
    st.builds(lambda n: "/agent-1/" + "y" * n, st.integers(250, 5000)),
    st.just("/agent-1/" + "/".join(["z" * 200] * 25)),
)


class ConfinementServiceTests(SynchronousTestCase):
    """
    Every path-bearing operation confines every path it carries.
    """

    def setUp(self) -> None:
        self.fixture = ServiceFixture(self)
        self.addCleanup(self.fixture.close)
        self.mine = self.fixture.agent()
        self.mine.put_file("ok", b"mine")
        self.other = self.fixture.agent(identity(agent="agent-2", serial="b2"))
        self.other.put_file("secret", b"theirs")
        self.other_view = self.other.ok("manifest_get", path="/agent-2/secret")

    def tenant_root(self) -> list[str]:
        storage = self.successResultOf(
            self.fixture.service.engine.tenant(TenantLocation("user-1", "tenant-a"))
        )
        return [entry.name for entry in self.successResultOf(storage.list_dir("/"))]

    @settings(
        max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
    )
    @given(st.sampled_from(sorted(PATH_OPS)), PATHS)
    def test_no_path_escapes(self, case: str, path: str) -> None:
        """A path outside the disk is EACCES, audited and counted; others are no denial."""
        op, build = PATH_OPS[case]
        label = op_label(op)
        counter = "svc_agent_path_denied_total"
        before = self.fixture.registry.get_sample_value(counter, {"op": label}) or 0.0
        lines = len(self.fixture.audit)
        result = self.mine.request(op.value, **build(path))
        after = self.fixture.registry.get_sample_value(counter, {"op": label}) or 0.0
        if oracle(path):
            self.assertEqual(after, before, repr(path))
            outcome = [None]
            result.addErrback(lambda f: outcome.__setitem__(0, f.value))
            if outcome[0] is not None:
                self.assertNotEqual(
                    getattr(outcome[0], "message", ""), "path outside agent subtree"
                )
            return
        error = self.failureResultOf(result).value
        self.assertEqual(
            (error.errno, error.message), (WireErrno.EACCES, "path outside agent subtree")
        )
        self.assertEqual(after, before + 1)
        if op is Op.LEASE_GRANT:
            self.assertEqual(len(self.fixture.audit), lines)
            return
        self.assertEqual(len(self.fixture.audit), lines + 1)
        denial = self.fixture.last()
        self.assertEqual(denial.event, path_denial_event_for_op(op))
        self.assertFalse(denial.allowed)
        path_empty = op in (Op.JOURNAL_QUERY, Op.JOURNAL_REVERT_PATH)
        self.assertEqual(denial.path, "" if path_empty else path[:4096])
        self.assertEqual(self.tenant_root(), ["agent-1", "agent-2"])
        self.assertEqual(self.other.ok("manifest_get", path="/agent-2/secret"), self.other_view)

    def test_denial_names(self) -> None:
        """Denied list and head_file log as list and stat and count under those op labels."""
        self.assertEqual(self.mine.errno("list", path="/agent-2"), WireErrno.EACCES)
        self.assertEqual(
            (self.fixture.last().event, self.fixture.last().path), ("list", "/agent-2")
        )
        self.assertEqual(self.mine.errno("head_file", path="/"), WireErrno.EACCES)
        self.assertEqual(self.fixture.last().event, "stat")
        self.assertEqual(self.fixture.sample("svc_agent_path_denied_total", op="list"), 1.0)
        self.assertEqual(self.fixture.sample("svc_agent_path_denied_total", op="stat"), 1.0)
        self.assertEqual(
            self.mine.errno("manifest_rename", path=VALID, to_path="/agent-2/stolen"),
            WireErrno.EACCES,
        )
        self.assertEqual(
            (self.fixture.last().event, self.fixture.last().path),
            ("manifest_rename", "/agent-2/stolen"),
        )


class SameTenantIsolationTests(SynchronousTestCase):
    """
    Two agents sharing one tenant store cannot see each other's data, chunks
    included.
    """

    def setUp(self) -> None:
        self.fixture = ServiceFixture(self)
        self.addCleanup(self.fixture.close)
        self.alice = self.fixture.agent()
        self.bob = self.fixture.agent(identity(agent="agent-2", serial="b2"))
        self.content = b"alice's secret " * 40
        self.hash = blake3(self.content).hexdigest()
        self.put = self.alice.put_file("secret", self.content)

    def test_namespace_reads(self) -> None:
        """Listing, stat, manifest_get, readlink and journal of the other agent are EACCES."""
        for op in ("list", "head_file", "manifest_get", "readlink", "journal_query"):
            self.assertEqual(self.bob.errno(op, path="/agent-1/secret"), WireErrno.EACCES, op)
            self.assertEqual(self.bob.errno(op, path="/agent-1"), WireErrno.EACCES, op)
        rows = self.bob.ok("journal_query")["entries"]
        self.assertEqual([(r["op"], r["path"]) for r in rows], [("mkdir", "/agent-2")])
        self.assertEqual(
            self.bob.errno(
                "journal_revert_path", path="/agent-2/secret", seq=self.put["journal_seq"]
            ),
            WireErrno.ENOENT,
        )

    def test_chunks_invisible(self) -> None:
        """Another agent's chunk reads as absent to has, get and manifest_put alike."""
        absent, _ = blob("nobody has this")
        self.assertEqual(
            self.bob.ok("chunk_has", hashes=[self.hash, absent]), {"present": [False, False]}
        )
        seen = self.bob.error("chunk_get", hash=self.hash)
        unseen = self.bob.error("chunk_get", hash=absent)
        self.assertEqual(
            (seen.errno, seen.message.replace(self.hash, "H")),
            (unseen.errno, unseen.message.replace(absent, "H")),
        )
        self.assertEqual(seen.errno, WireErrno.ENOENT)
        error = self.bob.error(
            "manifest_put",
            path="/agent-2/copy",
            expected_version=0,
            chunks=[[self.hash, len(self.content)]],
            size=len(self.content),
            mode=0o644,
            mtime_ns=1,
        )
        self.assertEqual(
            (error.errno, dict(error.details)), (WireErrno.EINVAL, {"missing": [self.hash]})
        )
        self.assertEqual(self.alice.ok("chunk_has", hashes=[self.hash]), {"present": [True]})

    def test_possession_makes_visible(self) -> None:
        """Uploading the bytes proves possession: the chunk is then usable, and stays so."""
        self.assertEqual(
            self.bob.ok("chunk_put", self.content, hash=self.hash)["size"], len(self.content)
        )
        self.assertEqual(self.bob.ok("chunk_has", hashes=[self.hash]), {"present": [True]})
        self.bob.ok(
            "manifest_put",
            path="/agent-2/copy",
            expected_version=0,
            chunks=[[self.hash, len(self.content)]],
            size=len(self.content),
            mode=0o644,
            mtime_ns=1,
        )
        again = self.fixture.agent(identity(agent="agent-2", serial="b2"))
        self.assertEqual(again.ok("chunk_has", hashes=[self.hash]), {"present": [True]})
        self.assertEqual(bytes(again.reply("chunk_get", hash=self.hash).raw), self.content)

    def test_quota_does_not_reveal(self) -> None:
        """At a full budget a put of another agent's content fails like a fresh chunk."""
        self.successResultOf(
            self.fixture.service.engine.set_account_budget("user-1", len(self.content) + 100)
        )
        self.assertEqual(
            self.bob.errno("chunk_put", self.content, hash=self.hash), WireErrno.EDQUOT
        )
        small, data = blob("small", 50)
        self.assertEqual(self.bob.ok("chunk_put", data, hash=small)["size"], 50)
        self.assertEqual(
            self.alice.ok("chunk_put", self.content, hash=self.hash)["size"], len(self.content)
        )

    def test_grant_does_not_reveal(self) -> None:
        """
        An upload is charged to the uploading agent's grant in full, whoever
        else holds the content: past the grant another agent's content is
        refused like fresh bytes, and within it costs the same room.
        """
        engine = self.fixture.service.engine
        location = TenantLocation("user-1", "tenant-a")
        size = len(self.content)
        self.successResultOf(engine.set_agent_grant(location, "agent-2", size - 1))
        fresh, data = blob("fresh bytes", size)
        self.assertEqual(
            self.bob.errno("chunk_put", self.content, hash=self.hash), WireErrno.EDQUOT
        )
        self.assertEqual(self.bob.errno("chunk_put", data, hash=fresh), WireErrno.EDQUOT)
        self.successResultOf(engine.set_agent_grant(location, "agent-2", 2 * size))
        self.bob.ok("chunk_put", self.content, hash=self.hash)
        self.bob.ok("chunk_put", data, hash=fresh)
        one, byte = blob("one more", 1)
        self.assertEqual(self.bob.errno("chunk_put", byte, hash=one), WireErrno.EDQUOT)
        storage = self.successResultOf(engine.tenant(location))
        self.assertEqual(
            self.successResultOf(storage.quota_usage("agent-2")).uncommitted_bytes, 2 * size
        )

    def test_statfs_own_usage(self) -> None:
        """statfs tells each agent its own usage and grant, whatever the request names."""
        engine = self.fixture.service.engine
        location = TenantLocation("user-1", "tenant-a")
        self.successResultOf(engine.set_agent_grant(location, "agent-1", 10_000))
        payloads: list[dict[str, Any]] = [{}, {"agent_id": "agent-1"}, {"path": "/agent-1"}]
        for payload in payloads:
            answer = self.bob.ok("statfs", **payload)
            self.assertEqual(
                (answer["used_bytes"], answer["grant_bytes"], answer["available_bytes"]),
                (0, None, None),
                payload,
            )
        mine = self.alice.ok("statfs")
        self.assertEqual((mine["used_bytes"], mine["grant_bytes"]), (len(self.content), 10_000))
        # Without a budget the account figure is not shown: it would tell bob
        # whether alice's content was new to the tenant store.
        self.assertIsNone(self.bob.ok("statfs")["account_used_bytes"])

    def test_leases_confined(self) -> None:
        """A lease on the other agent's path is EACCES, counted but with no audit line."""
        lines = len(self.fixture.audit)
        self.assertEqual(
            self.bob.errno("lease_grant", path="/agent-1/secret", mode="write"), WireErrno.EACCES
        )
        self.assertEqual(len(self.fixture.audit), lines)
        self.assertEqual(self.fixture.sample("svc_agent_path_denied_total", op="lease_grant"), 1.0)


class CrossTenantIsolationTests(SynchronousTestCase):
    """
    Agents of different tenants use different stores, even with equal agent ids.
    """

    def test_same_agent_id_other_tenant(self) -> None:
        """tenant-b's agent-1 sees its own empty disk, none of tenant-a's agent-1 data."""
        fixture = ServiceFixture(self)
        self.addCleanup(fixture.close)
        alice = fixture.agent()
        content = b"tenant a only"
        chunk_hash = blake3(content).hexdigest()
        alice.put_file("f", content)
        mallory = fixture.agent(identity(tenant="tenant-b", serial="c3"))
        self.assertEqual(mallory.ok("list", path="/agent-1"), {"entries": [], "next_after": None})
        self.assertEqual(mallory.errno("head_file", path="/agent-1/f"), WireErrno.ENOENT)
        self.assertEqual(mallory.errno("manifest_get", path="/agent-1/f"), WireErrno.ENOENT)
        self.assertEqual(mallory.ok("chunk_has", hashes=[chunk_hash]), {"present": [False]})
        self.assertEqual(mallory.errno("chunk_get", hash=chunk_hash), WireErrno.ENOENT)
        self.assertEqual([e["op"] for e in mallory.ok("journal_query")["entries"]], ["mkdir"])
        self.assertEqual(
            mallory.errno(
                "manifest_put",
                path="/agent-1/f",
                expected_version=0,
                chunks=[[chunk_hash, len(content)]],
                size=len(content),
                mode=0o644,
                mtime_ns=1,
            ),
            WireErrno.EINVAL,
        )
        self.assertEqual(mallory.connection.location, TenantLocation("user-1", "tenant-b"))
        self.assertEqual(alice.connection.location, TenantLocation("user-1", "tenant-a"))


class OtherOwnerStatfsTests(SynchronousTestCase):
    """
    An agent of another owner learns nothing of an owner's usage.
    """

    def test_other_owner_account(self) -> None:
        """statfs of another owner's agent with the same agent id counts none of these bytes."""
        fixture = ServiceFixture(self)
        self.addCleanup(fixture.close)
        alice = fixture.agent()
        alice.put_file("f", b"owner one only " * 50)
        stranger = fixture.agent(identity(tenant="tenant-c", user="user-2", serial="d4"))
        answer = stranger.ok("statfs")
        self.assertEqual(
            {key: answer[key] for key in LIMIT_KEYS},
            {
                "used_bytes": 0,
                "grant_bytes": None,
                "budget_bytes": None,
                "account_used_bytes": None,
                "available_bytes": None,
            },
        )


class VisibleChunksTests(SynchronousTestCase):
    """
    L{VisibleChunks}: a bounded memory of hashes known visible.
    """

    def test_bounded_lru(self) -> None:
        """Past its limit the least recently added or used hash is forgotten."""
        memory = VisibleChunks(limit=2)
        memory.add(["a", "b"])
        memory.add(["a"])
        memory.add(["c"])
        self.assertEqual(("a" in memory, "b" in memory, "c" in memory), (True, False, True))
        self.assertEqual(len(memory), 2)
        self.assertEqual(memory.unknown(["c", "d", "d", "a"]), ["d"])
        self.assertRaises(ValueError, VisibleChunks, 0)
