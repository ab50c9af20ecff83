"""
Tests for the declared wire contract: L{svc.wire.commands} (every operation
declared once), L{svc.wire.schema} (field kinds and the message codec) and
L{svc.wire.contract} (finding the operation, bounded decoding, answers and
pushes).
"""

from __future__ import annotations

import time
from typing import Any

import attrs
import msgpack
from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from svc.wire.answers import FileAttributes, ListEntry, ListReply, StaleDetails
from svc.wire.commands import BY_NAME, COMMANDS, PUSHES
from svc.wire.contract import (
    RequestRefused,
    answer_map,
    decode_answer,
    decode_push,
    decode_request,
    find_command,
    peek_op,
    request_map,
)
from svc.wire.errno import WireErrno
from svc.wire.kinds import (
    Bool,
    Choice,
    ChunkEntry,
    ChunkEntryKind,
    ChunkList,
    FieldRefused,
    Hash,
    Int,
    Kind,
    ListOf,
    OutboxTag,
    OutboxTagKind,
    Str,
)
from svc.wire.messages import (
    MAX_CHUNK_HAS,
    MAX_INLINE_BYTES,
    MAX_INLINE_CHUNKS,
    MAX_JOURNAL_LIMIT,
    MAX_LIST_ENTRY_CHUNKS,
    MAX_LIST_LIMIT,
    MAX_MANIFEST_CHUNKS,
    EmptyRequest,
    JournalQueryRequest,
    LeaseGrantRequest,
    ListRequest,
    ManifestPutRequest,
    MknodRequest,
    SetattrRequest,
)
from svc.wire.ops import PUSH_OPS, REQUEST_OPS, Op
from svc.wire.payload import pack_payload
from svc.wire.schema import Flat, Nested, decode_message, encode_message, message_fields

H1 = "ab" * 32
H2 = "cd" * 32

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
"""A valid request map of every operation (without C{op})."""

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
"""The required keys of every operation, as ``dataplane-ops.md`` lists them."""


def packed(op: Op | str, payload: dict[str, object]) -> bytes:
    """A request map as a client encodes it: C{op} first."""
    return pack_payload({"op": str(op), **payload})


def parse(op: Op, payload: dict[str, object]) -> Any:
    """The request message of C{op} decoded from C{payload}."""
    request, _map = decode_request(COMMANDS[op], packed(op, payload))
    return request


def errno_of(op: Op, payload: dict[str, object]) -> WireErrno:
    """The errno decoding C{payload} as C{op} is refused with."""
    try:
        parse(op, payload)
    except (FieldRefused, RequestRefused) as e:
        return e.errno
    raise AssertionError(f"{op} accepted {payload!r}")


def sample(kind: Kind) -> object:
    """A valid value of C{kind}, for round trips."""
    if isinstance(kind, Int):
        return max(kind.low, min(kind.high, 7))
    if isinstance(kind, Bool):
        return True
    if isinstance(kind, Str):
        return "x" * max(kind.min_bytes, 1)
    if isinstance(kind, Hash):
        return H1
    if isinstance(kind, Choice):
        return sorted(kind.values)[0]
    if isinstance(kind, ChunkEntryKind):
        return ChunkEntry(H1, 10)
    if isinstance(kind, ChunkList):
        return (ChunkEntry(H1, 10),)
    if isinstance(kind, OutboxTagKind):
        return OutboxTag("0f" * 16, 7, 6)
    if isinstance(kind, ListOf):
        return (sample(kind.item),) * max(kind.min_items, 1)
    if isinstance(kind, Nested | Flat):
        return sample_message(kind.message)
    raise AssertionError(f"no sample for {kind!r}")


def sample_message(message: type) -> Any:
    """A message of class C{message} with every field set."""
    values = {name: sample(spec.kind) for name, spec in message_fields(message)}
    if message is ManifestPutRequest:
        values["inline"] = (H1,)
        values["chunks"] = (ChunkEntry(H1, 10),)
    return message(**values)


class DeclarationTests(SynchronousTestCase):
    """L{svc.wire.commands}: one declaration per operation."""

    def test_every_operation_is_declared(self) -> None:
        """Every request op has a command and every push op a push declaration."""
        self.assertEqual(set(COMMANDS), set(REQUEST_OPS))
        self.assertEqual(set(PUSHES), set(PUSH_OPS))
        self.assertEqual(set(BY_NAME), {op.value for op in REQUEST_OPS})

    def test_required_keys_match_the_specification(self) -> None:
        """The declared required keys are exactly those the operations document lists."""
        for op, command in COMMANDS.items():
            required = {name for name, spec in message_fields(command.request) if spec.required}
            self.assertEqual(required, set(REQUIRED[op]), op)

    def test_every_command_answers_the_generic_errnos(self) -> None:
        """Any request may be answered EPROTO, EIO, EAGAIN, EBADF, ETIMEDOUT."""
        for command in COMMANDS.values():
            for errno in (WireErrno.EPROTO, WireErrno.EIO, WireErrno.EAGAIN, WireErrno.ETIMEDOUT):
                self.assertIn(errno, command.errnos, command.op)

    def test_paths_imply_confinement_errnos(self) -> None:
        """An operation naming a path may answer EACCES and ENAMETOOLONG; others not."""
        for op in (Op.LIST, Op.MANIFEST_PUT, Op.LINK, Op.LEASE_GRANT):
            self.assertIn(WireErrno.EACCES, COMMANDS[op].errnos)
            self.assertIn(WireErrno.ENAMETOOLONG, COMMANDS[op].errnos)
        for op in (Op.PING, Op.STATFS, Op.CHUNK_GET):
            self.assertNotIn(WireErrno.EACCES, COMMANDS[op].errnos)

    def test_resendable_operations(self) -> None:
        """Reads, chunk uploads and pings may be resent after an unknown outcome; writes not."""
        resendable = {op for op, command in COMMANDS.items() if command.resendable}
        self.assertEqual(
            resendable,
            {
                Op.LIST,
                Op.HEAD_FILE,
                Op.MANIFEST_GET,
                Op.READLINK,
                Op.CHUNK_GET,
                Op.CHUNK_HAS,
                Op.CHUNK_PUT,
                Op.JOURNAL_QUERY,
                Op.STATFS,
                Op.PING,
            },
        )

    def test_limits_follow_the_declarations(self) -> None:
        """A ping's map may be a few KiB at most; a manifest_put's fits 12000 chunks."""
        self.assertLess(COMMANDS[Op.PING].limits.payload, 8192)
        put = COMMANDS[Op.MANIFEST_PUT].limits
        self.assertGreaterEqual(put.width, MAX_MANIFEST_CHUNKS)
        self.assertLess(put.payload, 1024 * 1024)
        full = {**VALID[Op.MANIFEST_PUT], "chunks": [[H1, 1]] * MAX_MANIFEST_CHUNKS}
        full["size"] = MAX_MANIFEST_CHUNKS
        full["path"] = "/" + "p" * 4095
        self.assertEqual(len(parse(Op.MANIFEST_PUT, full).chunks), MAX_MANIFEST_CHUNKS)


class RoundTripTests(SynchronousTestCase):
    """Every declared message survives encoding and decoding, both ways."""

    def assert_round_trip(self, message: type) -> None:
        value = sample_message(message)
        wire = msgpack.unpackb(msgpack.packb(encode_message(value)), raw=False)
        self.assertEqual(decode_message(message, wire), value, message.__name__)

    def test_every_command(self) -> None:
        """Each command's request (op first) and answer round-trip."""
        for op, command in COMMANDS.items():
            request = sample_message(command.request)
            payload = pack_payload(request_map(request, op))
            self.assertEqual(peek_op(payload), op.value)
            self.assertIs(find_command(payload), command)
            decoded, _map = decode_request(command, payload)
            self.assertEqual(decoded, request, op)
            answer = sample_message(command.reply)
            carried = msgpack.unpackb(pack_payload(answer_map(answer)), raw=False)
            self.assertEqual(decode_answer(command, carried), answer, op)
            for details in command.details.values():
                self.assert_round_trip(details)

    def test_every_push(self) -> None:
        """Each push's message round-trips."""
        for op, push in PUSHES.items():
            value = sample_message(push.message)
            carried = msgpack.unpackb(pack_payload(answer_map(value)), raw=False)
            self.assertEqual(decode_push(op, carried), value)

    def test_none_is_left_out_unless_nil(self) -> None:
        """An absent optional field is no key; a nil field is sent as nil."""
        self.assertNotIn("session_id", request_map(ListRequest("/a"), Op.LIST))
        self.assertEqual(next(iter(request_map(ListRequest("/a"), Op.LIST))), "op")
        stale = encode_message(StaleDetails("lease_conflict"))
        self.assertEqual(stale, {"reason": "lease_conflict"})


class ListAnswerTests(SynchronousTestCase):
    """The entries of a C{list} answer: C{chunks} and C{inline} only when carried."""

    attributes = FileAttributes(
        inode=2,
        kind="file",
        mode=0o644,
        uid=0,
        gid=0,
        size=10,
        mtime_ns=1,
        atime_ns=1,
        ctime_ns=1,
        version=1,
        nlink=1,
    )

    def carried(self, reply: ListReply) -> Any:
        """C{reply} as a client receives it."""
        wire = msgpack.unpackb(pack_payload(answer_map(reply)), raw=False)
        return wire, decode_answer(COMMANDS[Op.LIST], wire)

    def test_keys_absent_when_not_carried(self) -> None:
        """An entry without a chunk list or inline chunks has neither key (not nil)."""
        wire, decoded = self.carried(ListReply((ListEntry("f", self.attributes),), None))
        self.assertNotIn("chunks", wire["entries"][0])
        self.assertNotIn("inline", wire["entries"][0])
        self.assertEqual((decoded.entries[0].chunks, decoded.entries[0].inline), (None, None))

    def test_chunks_and_inline_round_trip(self) -> None:
        """An entry's C{chunks} is a chunk list and C{inline} an array of hashes."""
        entry = ListEntry("f", self.attributes, chunks=(ChunkEntry(H1, 10),), inline=(H1,))
        empty = ListEntry("e", attrs.evolve(self.attributes, size=0), chunks=())
        wire, decoded = self.carried(ListReply((entry, empty), "f"))
        self.assertEqual(wire["entries"][0]["chunks"], [[H1, 10]])
        self.assertEqual(wire["entries"][0]["inline"], [H1])
        self.assertEqual(wire["entries"][1]["chunks"], [])
        self.assertEqual(decoded, ListReply((entry, empty), "f"))
        self.assertEqual(decoded.entries[0].chunks, (ChunkEntry(H1, 10),))

    def test_entry_bounds(self) -> None:
        """
        An entry carries at most 64 chunk-list entries and 64 inline hashes
        (more is EPROTO to the client).
        """
        wire, _ = self.carried(ListReply((ListEntry("f", self.attributes),), None))
        entry = wire["entries"][0]
        for key, value, limit in (
            ("chunks", [[H1, 1]], MAX_LIST_ENTRY_CHUNKS),
            ("inline", [H1], MAX_INLINE_CHUNKS),
        ):
            decode_answer(COMMANDS[Op.LIST], {"entries": [{**entry, key: value * limit}]})
            with self.assertRaises(FieldRefused) as refused:
                decode_answer(COMMANDS[Op.LIST], {"entries": [{**entry, key: value * (limit + 1)}]})
            self.assertEqual(refused.exception.errno, WireErrno.EPROTO)


class RequestSchemaTests(SynchronousTestCase):
    """Decoding requests: shape EPROTO, range EINVAL, defaults, unknown keys."""

    def test_outbox_tags(self) -> None:
        """
        A change's C{outbox} is C{[32 hex digits, seq >= 1, settled < seq]}:
        another shape is EPROTO, a value out of range EINVAL.
        """
        put = VALID[Op.MANIFEST_PUT]
        good = parse(Op.MANIFEST_PUT, {**put, "outbox": ["ab" * 16, 2, 1]})
        self.assertEqual(good.outbox, OutboxTag("ab" * 16, 2, 1))
        self.assertIsNone(parse(Op.MANIFEST_PUT, put).outbox)
        for value, refused in (
            ("ab" * 16, WireErrno.EPROTO),
            (["ab" * 16, 2], WireErrno.EPROTO),
            (["AB" * 16, 2, 1], WireErrno.EINVAL),
            (["ab" * 15, 2, 1], WireErrno.EINVAL),
            (["ab" * 16, 0, 0], WireErrno.EINVAL),
            (["ab" * 16, 2, 2], WireErrno.EINVAL),
            (["ab" * 16, 2, -1], WireErrno.EINVAL),
            (["ab" * 16, True, 0], WireErrno.EPROTO),
        ):
            self.assertEqual(errno_of(Op.MANIFEST_PUT, {**put, "outbox": value}), refused, value)

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
        """A value of the wrong type is EPROTO; booleans are not integers."""
        put = VALID[Op.MANIFEST_PUT]
        cases: list[tuple[Op, dict[str, object]]] = [
            (Op.LIST, {"path": 5}),
            (Op.LIST, {"path": "/a", "chunks": 1}),
            (Op.LIST, {"path": "/a", "chunks": True, "inline_max": True}),
            (Op.MANIFEST_PUT, {**put, "size": True}),
            (Op.MANIFEST_PUT, {**put, "size": 1.0}),
            (Op.MANIFEST_PUT, {**put, "chunks": {"a": 1}}),
            (Op.MANIFEST_PUT, {**put, "chunks": [[H1]]}),
            (Op.MANIFEST_PUT, {**put, "chunks": [H1]}),
            (Op.MANIFEST_PUT, {**put, "session_id": 5}),
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
        put = VALID[Op.MANIFEST_PUT]
        cases: list[tuple[Op, dict[str, object]]] = [
            (Op.MANIFEST_PUT, {**put, "mode": 0o10000}),
            (Op.MANIFEST_PUT, {**put, "expected_version": -1}),
            (Op.MANIFEST_PUT, {**put, "chunks": [["AB" * 32, 1]]}),
            (Op.MANIFEST_PUT, {**put, "chunks": [[H1, 0]]}),
            (Op.MANIFEST_PUT, {**put, "uid": 2**32}),
            (Op.MANIFEST_PUT, {**put, "inline": [H2]}),
            (Op.MANIFEST_PUT, {**put, "inline": [H1, H1]}),
            (Op.CHUNK_GET, {"hash": "00"}),
            (Op.MKNOD, {"path": "/a", "kind": "dir", "mode": 0}),
            (Op.LEASE_GRANT, {"path": "/a", "mode": "exclusive"}),
            (Op.LIST, {"path": "/a", "limit": 0}),
            (Op.LIST, {"path": "/a", "limit": MAX_LIST_LIMIT + 1}),
            (Op.LIST, {"path": "/a", "chunks": True, "inline_max": MAX_INLINE_BYTES + 1}),
            (Op.LIST, {"path": "/a", "chunks": True, "inline_max": -1}),
            (Op.LIST, {"path": "/a", "inline_max": 1}),
            (Op.LIST, {"path": "/a", "chunks": False, "inline_max": 1}),
            (Op.JOURNAL_QUERY, {"limit": MAX_JOURNAL_LIMIT + 1}),
            (Op.JOURNAL_REVERT_PATH, {"path": "/a", "seq": 0}),
            (Op.SYMLINK, {"path": "/a/l", "target": ""}),
            (Op.LEASE_REFRESH, {"lease_id": "0" * 65}),
            (Op.CHUNK_PUT, {"hash": H1, "session_id": "m" * 257}),
        ]
        for op, payload in cases:
            self.assertEqual(errno_of(op, payload), WireErrno.EINVAL, payload)

    def test_long_path_is_name_too_long(self) -> None:
        """A path string beyond what any path may be is ENAMETOOLONG, not read further."""
        self.assertEqual(
            errno_of(Op.HEAD_FILE, {"path": "/" + "a" * 16384}), WireErrno.ENAMETOOLONG
        )

    def test_array_limits(self) -> None:
        """Arrays longer than declared are EPROTO; at the limit they decode."""
        parse(Op.CHUNK_HAS, {"hashes": [H1] * MAX_CHUNK_HAS})
        self.assertEqual(
            errno_of(Op.CHUNK_HAS, {"hashes": [H1] * (MAX_CHUNK_HAS + 1)}), WireErrno.EPROTO
        )
        payload = {**VALID[Op.MANIFEST_PUT], "chunks": [[H1, 1]] * (MAX_MANIFEST_CHUNKS + 1)}
        self.assertEqual(errno_of(Op.MANIFEST_PUT, payload), WireErrno.EPROTO)

    def test_unknown_keys_ignored(self) -> None:
        """Keys the message does not declare are ignored (forward compatibility)."""
        request = parse(Op.LIST, {"path": "/a", "future": [1, 2], "more": "x"})
        self.assertEqual(request, ListRequest("/a", None, MAX_LIST_LIMIT))

    def test_defaults(self) -> None:
        """Optional keys take their documented defaults; nil counts as absent."""
        put = parse(Op.MANIFEST_PUT, {**VALID[Op.MANIFEST_PUT], "uid": None})
        self.assertEqual((put.uid, put.gid, put.session_id), (0, 0, None))
        self.assertEqual(put.chunks, (ChunkEntry(H1, 10),))
        self.assertEqual(
            parse(Op.JOURNAL_QUERY, {}),
            JournalQueryRequest(None, True, None, None, None, MAX_JOURNAL_LIMIT, False),
        )
        self.assertEqual(
            parse(Op.LEASE_GRANT, {"path": "/a", "mode": "read"}),
            LeaseGrantRequest("/a", "read", False, None),
        )
        mknod = parse(Op.MKNOD, VALID[Op.MKNOD])
        assert isinstance(mknod, MknodRequest)
        self.assertEqual((mknod.kind, mknod.rdev), ("fifo", 0))
        changes = parse(Op.SETATTR, {"path": "/a", "size": 0})
        assert isinstance(changes, SetattrRequest)
        self.assertEqual(changes.changes()["size"], 0)
        self.assertIsNone(changes.changes()["mode"])

    def test_list_chunks_and_inline_max(self) -> None:
        """
        C{list} takes C{chunks} (default false) and C{inline_max} (default
        0, at most 1 MiB, only with C{chunks}); nil counts as absent.
        """
        self.assertEqual(parse(Op.LIST, {"path": "/a"}), ListRequest("/a", None, MAX_LIST_LIMIT))
        plain = parse(Op.LIST, {"path": "/a", "chunks": None, "inline_max": None})
        self.assertEqual((plain.chunks, plain.inline_max), (False, 0))
        asked = parse(Op.LIST, {"path": "/a", "chunks": True, "inline_max": MAX_INLINE_BYTES})
        self.assertEqual(
            asked, ListRequest("/a", None, MAX_LIST_LIMIT, chunks=True, inline_max=MAX_INLINE_BYTES)
        )
        self.assertEqual(
            parse(Op.LIST, {"path": "/a", "chunks": False, "inline_max": 0}),
            ListRequest("/a", None, MAX_LIST_LIMIT),
        )
        with self.assertRaises(FieldRefused) as refused:
            ListRequest("/a", inline_max=1)
        self.assertEqual(refused.exception.errno, WireErrno.EINVAL)

    def test_statfs_takes_no_arguments(self) -> None:
        """statfs decodes to the empty request whatever it carries: it names no agent or path."""
        self.assertEqual(parse(Op.STATFS, {"agent_id": "agent-2", "path": "/b"}), EmptyRequest())

    @given(
        st.sampled_from(sorted(REQUEST_OPS)),
        st.dictionaries(
            st.sampled_from(["path", "to_path", "hash", "hashes", "mode", "size", "chunks", "x"]),
            st.one_of(
                st.none(),
                st.booleans(),
                st.integers(min_value=-(2**63), max_value=2**64 - 1),
                st.text(max_size=5),
                st.binary(max_size=3),
                st.lists(st.integers(min_value=0, max_value=9), max_size=3),
            ),
            max_size=6,
        ),
    )
    def test_garbage(self, op: Op, payload: dict[str, object]) -> None:
        """Arbitrary maps either decode or fail EPROTO or EINVAL, nothing else."""
        try:
            parse(op, payload)
        except (FieldRefused, RequestRefused) as e:
            self.assertIn(e.errno, (WireErrno.EPROTO, WireErrno.EINVAL))


def raw_map(*pairs: bytes) -> bytes:
    """A msgpack map (map32 header) of C{pairs} already encoded, key then value."""
    count = len(pairs) // 2
    return b"\xdf" + count.to_bytes(4, "big") + b"".join(pairs)


def key(name: str) -> bytes:
    """A msgpack string."""
    return pack_payload({"": name})[2:]


class BoundedDecodingTests(SynchronousTestCase):
    """
    A request's decoding costs at most what its operation legitimately
    needs: oversized, wide, deep or container-heavy maps are refused without
    being built (issue 34, item 2).
    """

    def test_op_first_is_read_from_the_first_bytes(self) -> None:
        """With C{op} the first key, the operation is read without decoding the rest."""
        payload = packed(Op.PING, {})
        self.assertEqual(peek_op(payload + b"\xc1garbage after"), "ping")

    def test_op_elsewhere_is_found_by_skipping(self) -> None:
        """An C{op} after other keys is found; their values are skipped, not built."""
        many = b"\xdd" + (1_000_000).to_bytes(4, "big") + b"\x80" * 1_000_000
        payload = raw_map(key("x"), many, key("op"), key("ping"))
        started = time.perf_counter()
        self.assertEqual(peek_op(payload), "ping")
        self.assertLess(time.perf_counter() - started, 0.5)

    def test_no_op(self) -> None:
        """A map without a string C{op}, or not a map, is refused."""
        for payload in (pack_payload({"x": 1}), pack_payload({"op": 5}), b"\x93\x01\x02\x03"):
            error = self.assertRaises(RequestRefused, peek_op, payload)
            self.assertEqual(error.errno, WireErrno.EPROTO)

    def test_a_megabyte_ping_is_refused_unread(self) -> None:
        """A 1 MiB ping of a million empty maps is refused by its size alone, at once."""
        filler = b"\xdd" + (1_000_000).to_bytes(4, "big") + b"\x80" * 1_000_000
        payload = raw_map(key("op"), key("ping"), key("x"), filler)
        self.assertGreater(len(payload), 1_000_000)
        started = time.perf_counter()
        error = self.assertRaises(RequestRefused, decode_request, COMMANDS[Op.PING], payload)
        self.assertLess(time.perf_counter() - started, 0.01)
        self.assertEqual((error.errno, error.reason), (WireErrno.EPROTO, "too_large"))

    def test_containers_are_counted_as_built(self) -> None:
        """A manifest_put full of empty arrays stops at the operation's container limit."""
        filler = b"".join(
            b"\xdc" + (10_000).to_bytes(2, "big") + b"\x90" * 10_000 for _ in range(80)
        )
        payload = raw_map(key("op"), key("manifest_put"), key("x"), b"\xdc\x00\x50" + filler)
        error = self.assertRaises(
            RequestRefused, decode_request, COMMANDS[Op.MANIFEST_PUT], payload
        )
        self.assertEqual(error.reason, "too_many_containers")

    def test_wider_than_declared(self) -> None:
        """An array wider than any the operation declares is refused at its header."""
        payload = packed(Op.HEAD_FILE, {"path": "/a", "x": list(range(100))})
        error = self.assertRaises(RequestRefused, decode_request, COMMANDS[Op.HEAD_FILE], payload)
        self.assertEqual(error.reason, "malformed")

    def test_deeper_than_declared(self) -> None:
        """Nesting deeper than the operation declares is refused."""
        payload = packed(Op.HEAD_FILE, {"path": "/a", "x": [[[]]]})
        error = self.assertRaises(RequestRefused, decode_request, COMMANDS[Op.HEAD_FILE], payload)
        self.assertEqual(error.reason, "too_deep")

    def test_binary_and_extensions_refused(self) -> None:
        """No operation declares binary values or extension types."""
        for value in (b"\xc4\x01x", b"\xd4\x01\x00"):
            payload = raw_map(key("op"), key("ping"), key("x"), value)
            self.assertRaises(RequestRefused, decode_request, COMMANDS[Op.PING], payload)

    def test_duplicate_and_non_string_keys(self) -> None:
        """A key twice in one map, or a key that is not a string, is refused."""
        twice = raw_map(key("op"), key("ping"), key("x"), b"\x01", key("x"), b"\x02")
        self.assertRaises(RequestRefused, decode_request, COMMANDS[Op.PING], twice)
        number = raw_map(key("op"), key("ping"), b"\x05", b"\x01")
        self.assertRaises(RequestRefused, decode_request, COMMANDS[Op.PING], number)

    def test_unknown_command(self) -> None:
        """An op that is not a request operation is not found (the server answers ENOSYS)."""
        self.assertRaises(KeyError, find_command, packed("changed", {}))
        self.assertRaises(KeyError, find_command, packed("nope", {}))
