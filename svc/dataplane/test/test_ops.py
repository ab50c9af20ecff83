"""
Tests for L{svc.dataplane.ops} (request schemas), L{svc.dataplane.replies}
(response maps) and L{svc.dataplane.errors} (store error translation).
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane.errors import OpFailed, from_store_error
from svc.dataplane.ops import (
    MAX_CHUNK_HAS,
    MAX_JOURNAL_LIMIT,
    MAX_LIST_LIMIT,
    MAX_MANIFEST_CHUNKS,
    ChunkHasRequest,
    EmptyRequest,
    JournalQueryRequest,
    LeaseGrantRequest,
    ListRequest,
    ManifestPutRequest,
    MknodRequest,
    PathUse,
    SetattrRequest,
    TwoPathRequest,
    parse_request,
    path_uses,
    request_op,
)
from svc.dataplane.replies import attributes_map, lease_revoke_push, list_map, statfs_map
from svc.store.chunks import CorruptStoredChunk
from svc.store.errors import (
    ChunksCollected,
    LastWriter,
    MissingChunks,
    NotFound,
    StaleVersion,
    WriteLeaseHeld,
)
from svc.store.lease_values import LeaseHolder, LeaseMode, LeaseReason, LeaseRevoke
from svc.store.manifest_values import Attributes, ChunkRef, DirectoryEntry, FileKind
from svc.store.quota import QuotaUsage
from svc.wire.errno import WireErrno
from svc.wire.ops import REQUEST_OPS, Op

H1 = "ab" * 32
H2 = "cd" * 32

# A valid payload for every request op.
VALID: dict[Op, dict[str, object]] = {
    Op.LIST: {"path": "/a"},
    Op.HEAD_FILE: {"path": "/a"},
    Op.MANIFEST_GET: {"path": "/a"},
    Op.MANIFEST_PUT: {
        "path": "/a/f",
        "expected_version": 0,
        "chunks": [[H1, 10]],
        "size": 10,
        "mode": 0o644,
        "mtime_ns": 5,
    },
    Op.MANIFEST_DELETE: {"path": "/a/f"},
    Op.MANIFEST_RENAME: {"path": "/a/f", "to_path": "/a/g"},
    Op.DIR_CREATE: {"path": "/a/d", "mode": 0o755},
    Op.DIR_REMOVE: {"path": "/a/d"},
    Op.SETATTR: {"path": "/a/f"},
    Op.SYMLINK: {"path": "/a/l", "target": "f"},
    Op.READLINK: {"path": "/a/l"},
    Op.MKNOD: {"path": "/a/p", "kind": "fifo", "mode": 0o600},
    Op.LINK: {"path": "/a/f", "to_path": "/a/h"},
    Op.STATFS: {},
    Op.CHUNK_GET: {"hash": H1},
    Op.CHUNK_PUT: {"hash": H1},
    Op.CHUNK_HAS: {"hashes": [H1, H2]},
    Op.JOURNAL_QUERY: {},
    Op.JOURNAL_REVERT_PATH: {"path": "/a/f", "seq": 3},
    Op.LEASE_GRANT: {"path": "/a", "mode": "write"},
    Op.LEASE_REFRESH: {"lease_id": "0" * 32},
    Op.LEASE_RELEASE: {"lease_id": "0" * 32},
    Op.PING: {},
    Op.CLOSE: {},
}

# Required keys of every op.
REQUIRED: dict[Op, tuple[str, ...]] = {
    Op.LIST: ("path",),
    Op.HEAD_FILE: ("path",),
    Op.MANIFEST_GET: ("path",),
    Op.MANIFEST_PUT: ("path", "expected_version", "chunks", "size", "mode", "mtime_ns"),
    Op.MANIFEST_DELETE: ("path",),
    Op.MANIFEST_RENAME: ("path", "to_path"),
    Op.DIR_CREATE: ("path", "mode"),
    Op.DIR_REMOVE: ("path",),
    Op.SETATTR: ("path",),
    Op.SYMLINK: ("path", "target"),
    Op.READLINK: ("path",),
    Op.MKNOD: ("path", "kind", "mode"),
    Op.LINK: ("path", "to_path"),
    Op.STATFS: (),
    Op.CHUNK_GET: ("hash",),
    Op.CHUNK_PUT: ("hash",),
    Op.CHUNK_HAS: ("hashes",),
    Op.JOURNAL_QUERY: (),
    Op.JOURNAL_REVERT_PATH: ("path", "seq"),
    Op.LEASE_GRANT: ("path", "mode"),
    Op.LEASE_REFRESH: ("lease_id",),
    Op.LEASE_RELEASE: ("lease_id",),
    Op.PING: (),
    Op.CLOSE: (),
}


def errno_of(op: Op, payload: dict[str, object]) -> WireErrno:
    try:
        parse_request(op, payload)
    except OpFailed as e:
        return e.errno
    raise AssertionError(f"{op} accepted {payload!r}")


class RequestSchemaTests(SynchronousTestCase):
    """
    L{parse_request} for every request op.
    """

    def test_every_request_op_has_a_schema(self) -> None:
        """Each op a client may send parses its valid payload; push ops are unknown."""
        self.assertEqual(set(VALID), set(REQUEST_OPS))
        for op, payload in VALID.items():
            parse_request(op, {"op": op.value, **payload})
        for push in ("lease_revoke", "changed"):
            error = self.assertRaises(OpFailed, request_op, push)
            self.assertEqual(error.errno, WireErrno.ENOSYS)
        self.assertEqual(self.assertRaises(OpFailed, request_op, "nope").errno, WireErrno.ENOSYS)
        self.assertEqual(self.assertRaises(OpFailed, request_op, 7).errno, WireErrno.ENOSYS)

    def test_missing_required_keys(self) -> None:
        """Removing any required key (or setting it nil) is EPROTO."""
        for op, keys in REQUIRED.items():
            for key in keys:
                payload = dict(VALID[op])
                del payload[key]
                self.assertEqual(errno_of(op, payload), WireErrno.EPROTO, (op, key))
                payload[key] = None
                self.assertEqual(errno_of(op, payload), WireErrno.EPROTO, (op, key))

    def test_wrong_types(self) -> None:
        """A value of the wrong type is EPROTO, booleans are not integers."""
        cases: list[tuple[Op, dict[str, object]]] = [
            (Op.LIST, {"path": 5}),
            (Op.LIST, {"path": b"/a"}),
            (Op.MANIFEST_PUT, {**VALID[Op.MANIFEST_PUT], "size": True}),
            (Op.MANIFEST_PUT, {**VALID[Op.MANIFEST_PUT], "size": 1.0}),
            (Op.MANIFEST_PUT, {**VALID[Op.MANIFEST_PUT], "chunks": {"a": 1}}),
            (Op.MANIFEST_PUT, {**VALID[Op.MANIFEST_PUT], "chunks": [[H1]]}),
            (Op.MANIFEST_PUT, {**VALID[Op.MANIFEST_PUT], "chunks": [H1]}),
            (Op.MANIFEST_PUT, {**VALID[Op.MANIFEST_PUT], "session_id": 5}),
            (Op.CHUNK_HAS, {"hashes": H1}),
            (Op.CHUNK_HAS, {"hashes": [1]}),
            (Op.LEASE_GRANT, {"path": "/a", "mode": "read", "wait": 1}),
            (Op.JOURNAL_QUERY, {"path": 3}),
            (Op.SETATTR, {"path": "/a", "mode": "755"}),
        ]
        for op, payload in cases:
            self.assertEqual(errno_of(op, payload), WireErrno.EPROTO, payload)

    def test_out_of_range(self) -> None:
        """Values of the right type outside their range or set are EINVAL."""
        cases: list[tuple[Op, dict[str, object]]] = [
            (Op.MANIFEST_PUT, {**VALID[Op.MANIFEST_PUT], "mode": 0o10000}),
            (Op.MANIFEST_PUT, {**VALID[Op.MANIFEST_PUT], "expected_version": -1}),
            (Op.MANIFEST_PUT, {**VALID[Op.MANIFEST_PUT], "chunks": [["AB" * 32, 1]]}),
            (Op.MANIFEST_PUT, {**VALID[Op.MANIFEST_PUT], "chunks": [[H1, 0]]}),
            (Op.MANIFEST_PUT, {**VALID[Op.MANIFEST_PUT], "uid": 2**32}),
            (Op.CHUNK_GET, {"hash": "00"}),
            (Op.MKNOD, {"path": "/a", "kind": "dir", "mode": 0}),
            (Op.LEASE_GRANT, {"path": "/a", "mode": "exclusive"}),
            (Op.LIST, {"path": "/a", "limit": 0}),
            (Op.LIST, {"path": "/a", "limit": MAX_LIST_LIMIT + 1}),
            (Op.JOURNAL_QUERY, {"limit": MAX_JOURNAL_LIMIT + 1}),
            (Op.JOURNAL_REVERT_PATH, {"path": "/a", "seq": 0}),
            (Op.SYMLINK, {"path": "/a/l", "target": ""}),
            (Op.LEASE_REFRESH, {"lease_id": "0" * 65}),
            (Op.CHUNK_PUT, {"hash": H1, "session_id": "m" * 257}),
        ]
        for op, payload in cases:
            self.assertEqual(errno_of(op, payload), WireErrno.EINVAL, payload)

    def test_array_limits(self) -> None:
        """Arrays longer than their limit are EPROTO; at the limit they parse."""
        parse_request(Op.CHUNK_HAS, {"hashes": [H1] * MAX_CHUNK_HAS})
        self.assertEqual(
            errno_of(Op.CHUNK_HAS, {"hashes": [H1] * (MAX_CHUNK_HAS + 1)}), WireErrno.EPROTO
        )
        payload = {**VALID[Op.MANIFEST_PUT], "chunks": [[H1, 1]] * (MAX_MANIFEST_CHUNKS + 1)}
        self.assertEqual(errno_of(Op.MANIFEST_PUT, payload), WireErrno.EPROTO)

    def test_unknown_keys_ignored(self) -> None:
        """Keys the schema does not name are ignored (forward compatibility)."""
        request = parse_request(Op.LIST, {"op": "list", "path": "/a", "future": [1, {"x": 2}]})
        self.assertEqual(request, ListRequest("/a", None, MAX_LIST_LIMIT))

    def test_defaults(self) -> None:
        """Optional keys take their documented defaults; nil counts as absent."""
        put = parse_request(Op.MANIFEST_PUT, {**VALID[Op.MANIFEST_PUT], "uid": None})
        assert isinstance(put, ManifestPutRequest)
        self.assertEqual((put.uid, put.gid, put.session_id), (0, 0, None))
        self.assertEqual(put.chunks, (ChunkRef(H1, 10),))
        query = parse_request(Op.JOURNAL_QUERY, {})
        self.assertEqual(
            query, JournalQueryRequest(None, True, None, None, None, MAX_JOURNAL_LIMIT, False)
        )
        grant = parse_request(Op.LEASE_GRANT, {"path": "/a", "mode": "read"})
        self.assertEqual(grant, LeaseGrantRequest("/a", LeaseMode.READ, False, None))
        mknod = parse_request(Op.MKNOD, VALID[Op.MKNOD])
        assert isinstance(mknod, MknodRequest)
        self.assertEqual((mknod.kind, mknod.rdev), (FileKind.FIFO, 0))
        setattr_request = parse_request(Op.SETATTR, {"path": "/a", "size": 0})
        assert isinstance(setattr_request, SetattrRequest)
        self.assertEqual(setattr_request.changes()["size"], 0)
        self.assertIsNone(setattr_request.changes()["mode"])

    def test_path_uses(self) -> None:
        """Every path a request carries is listed with its access kind."""
        rename = parse_request(Op.MANIFEST_RENAME, VALID[Op.MANIFEST_RENAME])
        link = parse_request(Op.LINK, VALID[Op.LINK])
        assert isinstance(rename, TwoPathRequest) and isinstance(link, TwoPathRequest)
        self.assertEqual(
            path_uses(Op.MANIFEST_RENAME, rename),
            (PathUse("/a/f", write=True), PathUse("/a/g", write=True)),
        )
        self.assertEqual(
            path_uses(Op.LINK, link), (PathUse("/a/f", write=False), PathUse("/a/h", write=True))
        )
        listing = parse_request(Op.LIST, VALID[Op.LIST])
        self.assertEqual(path_uses(Op.LIST, listing), (PathUse("/a", traverse=True),))
        has = parse_request(Op.CHUNK_HAS, VALID[Op.CHUNK_HAS])
        assert isinstance(has, ChunkHasRequest)
        self.assertEqual(path_uses(Op.CHUNK_HAS, has), ())
        self.assertEqual(path_uses(Op.JOURNAL_QUERY, parse_request(Op.JOURNAL_QUERY, {})), ())

    def test_statfs_takes_no_arguments(self) -> None:
        """statfs parses to the empty request whatever it carries: it names no agent or path."""
        request = parse_request(Op.STATFS, {"op": "statfs", "agent_id": "agent-2", "path": "/b"})
        self.assertEqual(request, EmptyRequest())
        self.assertEqual(path_uses(Op.STATFS, request), ())

    @given(
        st.sampled_from(sorted(REQUEST_OPS)),
        st.dictionaries(
            st.sampled_from(["path", "to_path", "hash", "hashes", "mode", "size", "chunks", "x"]),
            st.one_of(
                st.none(),
                st.booleans(),
                st.integers(),
                st.text(max_size=5),
                st.binary(max_size=3),
                st.lists(st.integers(), max_size=3),
            ),
            max_size=6,
        ),
    )
    def test_garbage(self, op: Op, payload: dict[str, object]) -> None:
        """Arbitrary payloads either parse or fail with EPROTO or EINVAL, nothing else."""
        try:
            parse_request(op, payload)
        except OpFailed as e:
            self.assertIn(e.errno, (WireErrno.EPROTO, WireErrno.EINVAL))


ATTRS = Attributes(
    inode=7,
    kind=FileKind.SYMLINK,
    mode=0o777,
    uid=1,
    gid=2,
    size=3,
    mtime_ns=4,
    atime_ns=5,
    ctime_ns=6,
    version=8,
    nlink=1,
    rdev=0,
    symlink_target="abc",
)


class ReplyTests(SynchronousTestCase):
    """
    L{svc.dataplane.replies} and L{from_store_error}.
    """

    def test_attributes(self) -> None:
        """The attribute map has every documented key; listings omit the target."""
        reply = attributes_map(ATTRS)
        self.assertEqual(
            set(reply),
            {
                "inode",
                "kind",
                "mode",
                "uid",
                "gid",
                "size",
                "mtime_ns",
                "atime_ns",
                "ctime_ns",
                "version",
                "nlink",
                "rdev",
                "symlink_target",
            },
        )
        self.assertEqual(reply["kind"], "symlink")
        listing = list_map([DirectoryEntry("l", ATTRS)], "l")
        entries = listing["entries"]
        assert isinstance(entries, list)
        self.assertEqual(entries[0]["name"], "l")
        self.assertNotIn("symlink_target", entries[0])
        self.assertEqual(listing["next_after"], "l")

    def test_revoke_push(self) -> None:
        """The lease_revoke push carries id, path, mode, reason and deadlines."""
        holder = LeaseHolder("a", "c")
        revoke = LeaseRevoke(
            "f" * 32, "/a/f", LeaseMode.WRITE, holder, LeaseReason.CONTENTION, 110.0
        )
        self.assertEqual(
            lease_revoke_push(revoke, 100.0),
            {
                "lease_id": "f" * 32,
                "path": "/a/f",
                "mode": "write",
                "reason": "contention",
                "deadline_unix_ms": 110000,
                "deadline_ms": 10000,
            },
        )

    def test_statfs_map(self) -> None:
        """The statfs answer has all five keys, nil for the limits that do not exist."""
        self.assertEqual(
            statfs_map(QuotaUsage(300, 1000, 700, None)),
            {
                "used_bytes": 300,
                "grant_bytes": 1000,
                "budget_bytes": None,
                "account_used_bytes": 700,
                "available_bytes": 700,
            },
        )
        self.assertEqual(
            statfs_map(QuotaUsage(300, None, None, None)),
            {
                "used_bytes": 300,
                "grant_bytes": None,
                "budget_bytes": None,
                "account_used_bytes": None,
                "available_bytes": None,
            },
        )

    def test_stale_details(self) -> None:
        """ESTALE from a lost compare-and-swap names the version and last writer."""
        error = from_store_error(StaleVersion(1, 3, LastWriter("a", "mount:x", 99)))
        self.assertEqual(error.errno, WireErrno.ESTALE)
        self.assertEqual(
            dict(error.details),
            {
                "reason": "version_changed",
                "expected_version": 1,
                "current_version": 3,
                "last_writer_agent_id": "a",
                "last_writer_session_id": "mount:x",
                "last_writer_at_unix_ms": 99,
            },
        )
        absent = from_store_error(StaleVersion(2, 0, None))
        self.assertEqual(
            dict(absent.details),
            {"reason": "version_changed", "expected_version": 2, "current_version": 0},
        )

    def test_other_details(self) -> None:
        """Missing chunks, collected chunks and lease conflicts carry their details."""
        missing = from_store_error(MissingChunks((H1, H2, H1)))
        self.assertEqual(
            (missing.errno, missing.details), (WireErrno.EINVAL, {"missing": [H1, H2]})
        )
        collected = from_store_error(ChunksCollected((H1,)))
        self.assertEqual(
            (collected.errno, collected.details), (WireErrno.ENODATA, {"missing": [H1]})
        )
        lease = from_store_error(WriteLeaseHeld("x"))
        self.assertEqual(
            (lease.errno, lease.details), (WireErrno.ESTALE, {"reason": "lease_conflict"})
        )
        self.assertEqual(from_store_error(CorruptStoredChunk(H1)).errno, WireErrno.EIO)
        plain = from_store_error(NotFound("/a/f"))
        self.assertEqual(
            (plain.errno, plain.message, dict(plain.details)), (WireErrno.ENOENT, "/a/f", {})
        )
