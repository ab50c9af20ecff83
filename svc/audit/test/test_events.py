"""
Tests for the audit event model: every event name of the specification's
tables renders with exactly the fields the specification gives it.

The table below is written from the specification, independently of
L{svc.audit.names}, so a wrong shape there fails here.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import attrs
from twisted.trial.unittest import SynchronousTestCase

from svc.audit.client_events import (
    EvictionReason,
    FlushStats,
    SetattrField,
    WriteConflict,
    cache_corrupt_event,
    cache_evicted_event,
    enrollment_event,
    flush_event,
    lease_denied_event,
    setattr_event,
)
from svc.audit.events import (
    NO_CERT,
    NO_PROCESS,
    AuditEvent,
    CallerProcess,
    CertFields,
    client_event,
    server_event,
)
from svc.audit.jsonl import render_line
from svc.audit.names import (
    CLIENT_SHAPES,
    SERVER_SHAPES,
    EventName,
    Origin,
    event_for_op,
    path_denial_event,
    path_denial_event_for_op,
    shape_of,
)
from svc.audit.server_events import (
    agent_data_purged_event,
    gc_swept_chunks_event,
    http_auth_event,
    http_get_audit_event,
    lease_event,
    lease_line,
    path_denied_event,
)
from svc.pki.identity import AgentIdentity
from svc.store.lease_values import LeaseEvent, LeaseEventName, LeaseMode, LeaseReason
from svc.wire.ops import Op

TS = 1_790_000_000.25
CALLER = CallerProcess(command="cat", pid=4242, uid=1000, gid=1001)
CERT = CertFields(
    agent_id="agent-1",
    tenant_id="tenant-a",
    cert_serial="1a2b",
    cert_subject="CN=user-1,OU=tenant=tenant-a",
)
HASH = "ab" * 32
LEASE_ID = "0123456789abcdef0123456789abcdef"
SESSION = "mount:" + "cd" * 16

ENVELOPE = frozenset({"ts", "event", "path", "allowed", "command", "size", "offset"})
PROCESS = frozenset({"agent_pid", "uid", "gid"})
IDENTITY = frozenset({"agent_id", "tenant_id", "cert_serial", "cert_subject"})
ALL_OPTIONAL = PROCESS | IDENTITY | {"session_id"}


def client(event: str, **kwargs: object) -> AuditEvent:
    fields: dict[str, object] = {"ts": TS, "path": "/agent-1/f", "allowed": True}
    fields.update(kwargs)
    return client_event(event, caller=CALLER, **fields)  # type: ignore[arg-type]


def server(event: str, **kwargs: object) -> AuditEvent:
    fields: dict[str, object] = {"ts": TS, "path": "/agent-1/f", "allowed": True}
    fields.update(kwargs)
    return server_event(event, cert=CERT, **fields)  # type: ignore[arg-type]


def lease(event: LeaseEventName, reason: LeaseReason) -> AuditEvent:
    return lease_event(
        ts=TS,
        event=event,
        agent_id="agent-1",
        lease_id=LEASE_ID,
        mode=LeaseMode.WRITE,
        reason=reason,
        path="/agent-1/f",
    )


@attrs.frozen
class Row:
    """One spec line: how to build it and the exact keys it must have."""

    name: str
    build: Callable[[], AuditEvent]
    keys: frozenset[str]
    values: dict[str, object] = attrs.field(factory=dict)


CONFLICT = WriteConflict(
    kind="cas_conflict",
    suggested_action="refetch_and_retry",
    your_version=3,
    current_version=4,
    last_writer_agent_id="agent-2",
    last_writer_session_id=SESSION,
    last_writer_at_unix_ms=1_790_000_000_000,
)
RECOVERY = frozenset(
    {
        "recovery_kind",
        "recovery_suggested_action",
        "recovery_your_version",
        "recovery_current_version",
        "recovery_last_writer_agent_id",
        "recovery_last_writer_session_id",
        "recovery_last_writer_at_unix_ms",
    }
)
FLUSH_STATS = frozenset({"chunks_new", "chunks_reused", "cas_retries", "version_new"})
C = ENVELOPE | PROCESS
S = ENVELOPE | IDENTITY
SERVER: dict[str, object] = {"command": "svc-server"}

ROWS: tuple[Row, ...] = (
    # Mount client events (Linux FUSE surface).
    Row("lookup", lambda: client("lookup", size=12), C, {"size": 12, "command": "cat"}),
    Row("opendir", lambda: client("opendir"), C, {"size": None}),
    Row("readdir_entry", lambda: client("readdir_entry", size=3), C, {"size": 3}),
    Row("readdirplus_entry", lambda: client("readdirplus_entry", size=3), C, {"size": 3}),
    Row("open", lambda: client("open", size=9), C, {"size": 9}),
    Row("read", lambda: client("read", size=9, offset=4), C, {"size": 9, "offset": 4}),
    Row("create", lambda: client("create", mode=0o644), C | {"mode"}, {"mode": 0o644}),
    Row("mkdir", lambda: client("mkdir", mode=0o755), C | {"mode"}, {"mode": 0o755}),
    Row("unlink", lambda: client("unlink"), C),
    Row("rmdir", lambda: client("rmdir"), C),
    Row("symlink", lambda: client("symlink"), C),
    Row("rename", lambda: client("rename", to_path="/agent-1/g"), C | {"to_path"}),
    Row("link", lambda: client("link", to_path="/agent-1/g"), C | {"to_path"}),
    Row(
        "setattr",
        lambda: setattr_event(
            ts=TS,
            path="/agent-1/f",
            caller=CALLER,
            allowed=True,
            fields=SetattrField.MODE | SetattrField.MTIME,
        ),
        C | {"setattr_fields"},
        {"setattr_fields": 0x11},
    ),
    Row(
        "flush",
        lambda: flush_event(
            ts=TS,
            path="/agent-1/f",
            caller=CALLER,
            size=100,
            stats=FlushStats(2, 1, 0, 7),
            session_id=SESSION,
        ),
        C | FLUSH_STATS | {"session_id"},
        {"chunks_new": 2, "chunks_reused": 1, "cas_retries": 0, "version_new": 7},
    ),
    Row(
        "flush",
        lambda: flush_event(
            ts=TS, path="/agent-1/f", caller=CALLER, size=100, allowed=False, conflict=CONFLICT
        ),
        C | RECOVERY,
        {"recovery_kind": "cas_conflict", "recovery_current_version": 4, "allowed": False},
    ),
    Row(
        "lease_denied",
        lambda: lease_denied_event(ts=TS, path="/agent-1/f", caller=CALLER),
        C,
        {"allowed": True},
    ),
    # Cache and enrollment events.
    Row(
        "cache_corrupt",
        lambda: cache_corrupt_event(ts=TS, chunk_hash=HASH, size=4096),
        ENVELOPE,
        {"path": HASH, "size": 4096, "allowed": False, "command": None},
    ),
    Row(
        "cache_evicted",
        lambda: cache_evicted_event(
            ts=TS, bytes_freed=1 << 20, chunks_evicted=5, reason=EvictionReason.HIGH_WATER
        ),
        ENVELOPE | {"chunks_reused", "reason"},
        {"path": "", "size": 1 << 20, "chunks_reused": 5, "reason": "high_water", "allowed": True},
    ),
    Row(
        "enrollment",
        lambda: enrollment_event(ts=TS, serial="9f01"),
        ENVELOPE,
        {"path": "9f01", "allowed": True},
    ),
    Row(
        "enrollment",
        lambda: enrollment_event(ts=TS, serial=None),
        ENVELOPE,
        {"path": "", "allowed": False},
    ),
    # Data-plane events.
    Row("list_entries", lambda: server("list_entries"), S, SERVER),
    Row("head_file", lambda: server("head_file", size=5), S, {"size": 5, **SERVER}),
    Row(
        "manifest_get",
        lambda: server("manifest_get", size=5, version=2),
        S | {"version"},
        {"size": 5, "version": 2},
    ),
    Row(
        "manifest_put",
        lambda: server("manifest_put", size=5, version=3, session_id=SESSION),
        S | {"version", "session_id"},
        {"version": 3, "session_id": SESSION},
    ),
    *(
        Row(name, functools.partial(server, name, session_id=SESSION), S | {"session_id"})
        for name in (
            "manifest_delete",
            "dir_create",
            "dir_remove",
            "setattr",
            "symlink",
            "mknod",
            "manifest_rename",
            "link",
        )
    ),
    Row("readlink", lambda: server("readlink"), S),
    # Client readlink: implied by the macOS note ("readlink is not emitted").
    Row("readlink", lambda: client("readlink"), C, {"command": "cat"}),
    Row(
        "chunk_get",
        lambda: server("chunk_get", path="", hash=HASH, size=7),
        S | {"hash"},
        {"path": "", "hash": HASH, "size": 7},
    ),
    Row(
        "chunk_put",
        lambda: server("chunk_put", path="", hash=HASH, size=7, session_id=SESSION),
        S | {"hash", "session_id"},
        {"path": "", "hash": HASH, "size": 7},
    ),
    Row(
        "chunk_has",
        lambda: server("chunk_has", path="", count=31),
        S | {"count"},
        {"path": "", "count": 31, "size": None},
    ),
    Row("journal_query", lambda: server("journal_query", path=""), S, {"path": ""}),
    Row("journal_revert_path", lambda: server("journal_revert_path", path=""), S, {"path": ""}),
    Row(
        "list",
        lambda: path_denied_event(ts=TS, op=Op.LIST, cert=CERT, path="/agent-2"),
        S,
        {"allowed": False, "path": "/agent-2"},
    ),
    Row(
        "stat",
        lambda: path_denied_event(ts=TS, op=Op.HEAD_FILE, cert=CERT, path="/agent-2/x"),
        S,
        {"allowed": False},
    ),
    # Lease events (reduced envelope).
    *(
        Row(
            event.value,
            functools.partial(lease, event, reason),
            ENVELOPE | {"agent_id", "lease_id", "mode", "reason"},
            {
                "allowed": True,
                "agent_id": "agent-1",
                "lease_id": LEASE_ID,
                "mode": "write",
                "reason": reason.value,
                **SERVER,
            },
        )
        for event, reason in (
            (LeaseEventName.GRANT, LeaseReason.NONE),
            (LeaseEventName.REFRESH, LeaseReason.NONE),
            (LeaseEventName.RELEASE, LeaseReason.CLIENT),
            (LeaseEventName.RELEASE, LeaseReason.CONN_CLOSED),
            (LeaseEventName.REVOKE, LeaseReason.CONTENTION),
            (LeaseEventName.REVOKE, LeaseReason.MANIFEST_PUT_CONTENTION),
            (LeaseEventName.VIOLATION, LeaseReason.REVOKE_TIMEOUT),
            (LeaseEventName.VIOLATION, LeaseReason.EXPIRED),
        )
    ),
    # GC, purge and HTTP events.
    Row(
        "gc_swept_chunks",
        lambda: gc_swept_chunks_event(
            ts=TS, tenant_id="tenant-a", count=3, bytes_freed=300, dry_run=True
        ),
        ENVELOPE | {"tenant_id", "count", "bytes_freed", "dry_run"},
        {"path": "", "tenant_id": "tenant-a", "count": 3, "bytes_freed": 300, "dry_run": True},
    ),
    Row(
        "agent_data_purged",
        lambda: agent_data_purged_event(
            ts=TS, tenant_id="tenant-a", agent_id="agent-1", count=4, bytes_freed=400
        ),
        ENVELOPE | {"tenant_id", "count", "bytes_freed"},
        {"tenant_id": "tenant-a", "count": 4, "bytes_freed": 400, "path": "/agent-1"},
    ),
    Row(
        "http_get_audit",
        lambda: http_get_audit_event(ts=TS, cert=CERT, records=17),
        S,
        {"path": "/audit", "size": 17, "allowed": True, **SERVER},
    ),
    Row(
        "http_auth",
        lambda: http_auth_event(ts=TS, request_path="/audit?limit=5"),
        ENVELOPE,
        {"path": "/audit?limit=5", "allowed": False, **SERVER},
    ),
)

SPEC_EVENT_NAMES = frozenset(
    """
    lookup opendir readdir_entry readdirplus_entry open read create mkdir unlink rmdir
    symlink rename link setattr flush lease_denied cache_corrupt cache_evicted enrollment
    list_entries head_file manifest_get manifest_put manifest_delete dir_create dir_remove
    mknod manifest_rename readlink chunk_get chunk_put chunk_has journal_query
    journal_revert_path list stat lease_grant lease_refresh lease_release lease_revoke
    lease_violation gc_swept_chunks agent_data_purged http_get_audit http_auth
    """.split()
)


def rendered(event: AuditEvent) -> dict[str, object]:
    line = render_line(event)
    value = json.loads(line)
    assert isinstance(value, dict)
    return value


class EventTableTests(SynchronousTestCase):
    """
    Every event of the specification's tables, rendered.
    """

    def test_table_covers_the_specification(self) -> None:
        """The test table names every spec event and the model names no other."""
        self.assertEqual({row.name for row in ROWS}, SPEC_EVENT_NAMES)
        self.assertEqual({name.value for name in EventName}, SPEC_EVENT_NAMES)

    def test_exact_keys(self) -> None:
        """Each spec event's line has exactly the spec's keys, nothing more or less."""
        for row in ROWS:
            line = rendered(row.build())
            self.assertEqual(line["event"], row.name)
            self.assertEqual(frozenset(line), row.keys, row.name)

    def test_shapes_allow_only_spec_fields(self) -> None:
        """The model allows no event-specific field the spec does not give that event."""
        wanted: dict[tuple[Origin, str], set[str]] = {}
        for row in ROWS:
            key = (row.build().origin, row.name)
            wanted.setdefault(key, set()).update(row.keys - ENVELOPE - ALL_OPTIONAL)
        for (origin, name), extras in wanted.items():
            shape = shape_of(origin, name)
            self.assertEqual(set(shape.extras), extras, f"{origin.value} {name}")
        self.assertEqual(
            set(wanted),
            {(Origin.CLIENT, n) for n in CLIENT_SHAPES}
            | {(Origin.SERVER, n) for n in SERVER_SHAPES},
        )

    def test_values(self) -> None:
        """The spec's fixed values (path, allowed, size, command...) are as stated."""
        for row in ROWS:
            line = rendered(row.build())
            for key, value in row.values.items():
                self.assertEqual(line[key], value, f"{row.name}.{key}")

    def test_envelope_always_present(self) -> None:
        """command, size and offset are present (possibly null) on every line."""
        for row in ROWS:
            line = rendered(row.build())
            for key in ("ts", "event", "path", "allowed", "command", "size", "offset"):
                self.assertIn(key, line, row.name)
            self.assertIsInstance(line["allowed"], bool)
            self.assertIsInstance(line["path"], str)

    def test_server_lines(self) -> None:
        """Server lines say command svc-server; client lines never have tenant_id."""
        for row in ROWS:
            event = row.build()
            line = rendered(event)
            if event.origin is Origin.SERVER:
                self.assertEqual(line["command"], "svc-server", row.name)
                self.assertFalse(PROCESS & set(line), row.name)
            else:
                self.assertNotEqual(line["command"], "svc-server", row.name)
                self.assertNotIn("tenant_id", line, row.name)
                self.assertFalse(IDENTITY & set(line), row.name)

    def test_plain_server_lines_carry_cert_identity(self) -> None:
        """A data-plane operation line carries tenant and certificate fields."""
        line = rendered(server("manifest_get", size=1, version=1))
        self.assertEqual(line["tenant_id"], "tenant-a")
        self.assertEqual(line["agent_id"], "agent-1")
        self.assertEqual(line["cert_serial"], "1a2b")
        self.assertEqual(line["cert_subject"], "CN=user-1,OU=tenant=tenant-a")

    def test_lease_lines_reduced(self) -> None:
        """Lease lines keep agent_id only: no tenant, certificate or session fields."""
        for row in ROWS:
            if row.name.startswith("lease_") and row.name != "lease_denied":
                line = rendered(row.build())
                self.assertFalse((ALL_OPTIONAL - {"agent_id"}) & set(line), row.name)
                self.assertIs(line["allowed"], True)

    def test_size_only_on_size_bearing_events(self) -> None:
        """Rule 5: only size-bearing events (plus http_get_audit) have a non-null size."""
        size_bearing = {
            "read",
            "flush",
            "open",
            "lookup",
            "readdir_entry",
            "readdirplus_entry",
            "head_file",
            "manifest_get",
            "manifest_put",
            "chunk_get",
            "chunk_put",
            "cache_corrupt",
            "cache_evicted",
            "http_get_audit",
        }
        for row in ROWS:
            if rendered(row.build())["size"] is not None:
                self.assertIn(row.name, size_bearing)


class EventRefusalTests(SynchronousTestCase):
    """
    The model refuses lines the specification does not allow.
    """

    def test_unknown_field(self) -> None:
        """A field the event does not carry (e.g. contents) is refused."""
        self.assertRaises(ValueError, server, "chunk_put", path="", hash=HASH, data="secret")
        self.assertRaises(ValueError, client, "read", size=1, content="secret")

    def test_size_on_sizeless_event(self) -> None:
        """size on an event that is not size-bearing is refused."""
        self.assertRaises(ValueError, server, "list_entries", size=4)
        self.assertRaises(ValueError, client, "opendir", size=4)

    def test_offset_only_on_read_and_flush(self) -> None:
        """offset is refused outside read and flush."""
        self.assertRaises(ValueError, client, "open", size=1, offset=0)
        self.assertRaises(ValueError, server, "manifest_get", size=1, offset=0)

    def test_session_only_on_writes(self) -> None:
        """session_id is refused on read events."""
        self.assertRaises(ValueError, server, "manifest_get", session_id=SESSION)
        self.assertRaises(ValueError, client, "read", session_id=SESSION)

    def test_fixed_allowed(self) -> None:
        """Events with a fixed allowed value refuse the other one."""
        self.assertRaises(ValueError, client, "lease_denied", allowed=False)
        self.assertRaises(ValueError, server, "list", allowed=True)
        self.assertRaises(ValueError, server, "http_auth", allowed=True)

    def test_chunk_path_empty(self) -> None:
        """Chunk and journal lines refuse a non-empty path."""
        self.assertRaises(ValueError, server, "chunk_get", hash=HASH)
        self.assertRaises(ValueError, server, "journal_query")

    def test_wrong_side(self) -> None:
        """An event is only written by its own side."""
        self.assertRaises(ValueError, client, "manifest_get")
        self.assertRaises(ValueError, server, "lookup")

    def test_client_cannot_claim_server(self) -> None:
        """A client line with command svc-server is refused."""
        self.assertRaises(
            ValueError,
            client_event,
            "lookup",
            ts=TS,
            path="/x",
            allowed=True,
            caller=CallerProcess(command="svc-server"),
        )

    def test_field_types(self) -> None:
        """Extra fields must have the spec's JSON type."""
        self.assertRaises(ValueError, client, "create", mode="0644")
        self.assertRaises(ValueError, server, "chunk_has", path="", count=True)
        self.assertRaises(ValueError, server, "manifest_get", version=-1)

    def test_lease_reason_must_fit_event(self) -> None:
        """A lease event refuses a reason its row of the spec does not list."""
        self.assertRaises(ValueError, lease, LeaseEventName.GRANT, LeaseReason.CLIENT)
        self.assertRaises(ValueError, lease, LeaseEventName.RELEASE, LeaseReason.EXPIRED)

    def test_lease_line_needs_agent(self) -> None:
        """A lease line without agent_id or with tenant fields is refused."""
        fields: dict[str, Any] = {"lease_id": LEASE_ID, "mode": "read", "reason": ""}
        self.assertRaises(ValueError, server, "lease_grant", **fields)
        self.assertRaises(
            ValueError,
            server_event,
            "lease_grant",
            ts=TS,
            cert=NO_CERT,
            path="/a",
            allowed=True,
            **fields,
        )
        event = server_event(
            "lease_grant", ts=TS, cert=CertFields(agent_id="a"), path="/a", allowed=True, **fields
        )
        self.assertEqual(event.agent_id, "a")

    def test_cache_lines_have_no_process(self) -> None:
        """cache_corrupt refuses a command, pid, uid or gid."""
        self.assertRaises(
            ValueError,
            client_event,
            "cache_corrupt",
            ts=TS,
            path=HASH,
            allowed=False,
            caller=CALLER,
            size=1,
        )

    def test_bad_timestamp(self) -> None:
        """A negative or non-finite ts is refused."""
        self.assertRaises(ValueError, client, "opendir", ts=-1.0)
        self.assertRaises(ValueError, client, "opendir", ts=float("nan"))


class EventHelperTests(SynchronousTestCase):
    """
    Name mappings and the constructors' details.
    """

    def test_path_denial_names(self) -> None:
        """Rule 2: path denials of list_entries and head_file log list and stat."""
        self.assertEqual(path_denial_event("list_entries"), "list")
        self.assertEqual(path_denial_event("head_file"), "stat")
        self.assertEqual(path_denial_event("manifest_put"), "manifest_put")
        self.assertEqual(path_denial_event_for_op(Op.LIST), "list")
        self.assertEqual(path_denial_event_for_op(Op.HEAD_FILE), "stat")

    def test_event_for_op(self) -> None:
        """Wire ops map to their event names; lease, statfs, ping, close and changed have none."""
        self.assertEqual(event_for_op(Op.LIST), "list_entries")
        self.assertEqual(event_for_op(Op.HEAD_FILE), "head_file")
        self.assertEqual(event_for_op(Op.CHUNK_HAS), "chunk_has")
        for op in (Op.PING, Op.CLOSE, Op.LEASE_GRANT, Op.LEASE_REVOKE, Op.STATFS, Op.CHANGED):
            self.assertRaises(ValueError, event_for_op, op)

    def test_denied_chunk_path_empty(self) -> None:
        """A path denial of a chunk op logs the op name with an empty path."""
        line = rendered(path_denied_event(ts=TS, op=Op.CHUNK_PUT, cert=CERT, path="/agent-2"))
        self.assertEqual((line["event"], line["path"], line["allowed"]), ("chunk_put", "", False))

    def test_policy_denial_reuses_name(self) -> None:
        """A policy denial is the op's own event with allowed false."""
        line = rendered(client("open", allowed=False))
        self.assertEqual((line["event"], line["allowed"]), ("open", False))

    def test_lease_line_from_table_event(self) -> None:
        """A LeaseEvent from the lease table becomes its reduced line."""
        event = LeaseEvent(
            event=LeaseEventName.REVOKE,
            agent_id="agent-9",
            lease_id=LEASE_ID,
            mode=LeaseMode.READ,
            reason=LeaseReason.CONTENTION,
            path="/agent-9/f",
            connection_id="c1",
            leases_on_path=1,
        )
        line = rendered(lease_line(event, ts=TS))
        self.assertEqual(
            (line["event"], line["agent_id"], line["mode"], line["reason"], line["path"]),
            ("lease_revoke", "agent-9", "read", "contention", "/agent-9/f"),
        )

    def test_cert_fields_of_agent(self) -> None:
        """CertFields.of_agent copies the identity's ids, serial and subject."""
        identity = AgentIdentity(
            tenant_id="tenant-a",
            agent_id="agent-1",
            user_id="user-1",
            serial="ff",
            subject="CN=user-1",
            not_after=datetime(2030, 1, 1, tzinfo=UTC),
        )
        self.assertEqual(
            CertFields.of_agent(identity),
            CertFields("agent-1", "tenant-a", "ff", "CN=user-1"),
        )

    def test_setattr_bits(self) -> None:
        """setattr_fields bits are the spec's values."""
        self.assertEqual([int(f) for f in SetattrField], [0x01, 0x02, 0x04, 0x08, 0x10, 0x20])
        self.assertEqual(
            [f.name for f in SetattrField], ["MODE", "UID", "GID", "SIZE", "MTIME", "ATIME"]
        )

    def test_unknown_process(self) -> None:
        """A client line without a known caller has command null and no ids."""
        line = rendered(client_event("read", ts=TS, path="/a", allowed=True, caller=NO_PROCESS))
        self.assertIsNone(line["command"])
        self.assertFalse(PROCESS & set(line))

    def test_last_writer_fields_only_when_known(self) -> None:
        """recovery_last_writer_* appear only when known."""
        conflict = WriteConflict("cas_conflict", "refetch", 1, 2)
        line = rendered(
            flush_event(ts=TS, path="/a", caller=CALLER, size=1, allowed=False, conflict=conflict)
        )
        self.assertEqual(
            {k for k in line if k.startswith("recovery_")},
            {
                "recovery_kind",
                "recovery_suggested_action",
                "recovery_your_version",
                "recovery_current_version",
            },
        )
