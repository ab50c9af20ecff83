"""
Tests for L{svc.control.journal_stream.JournalStream} over the in-memory
journal and a clock: events once each, heartbeats, clean ends, resumption
from a seq without loss or repetition.
"""

from __future__ import annotations

import json

from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from svc.control.journal_access import JournalFilter, TenantRef
from svc.control.journal_stream import (
    JournalStream,
    comment_bytes,
    event_bytes,
    parse_last_event_id,
)
from svc.testing.journal import MemoryJournal

TENANT = TenantRef("alice", "alice")


def parse_events(raw: bytes) -> list[dict[str, str]]:
    """The SSE blocks of C{raw}: field name to value (comments as C{comment})."""
    events = []
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        fields: dict[str, str] = {}
        for line in block.split("\n"):
            if line.startswith(":"):
                fields["comment"] = line[1:].strip()
            else:
                name, _, value = line.partition(": ")
                fields[name] = value
        events.append(fields)
    return events


class StreamFixture:
    def __init__(self, case: SynchronousTestCase, *, allowed: bool = True) -> None:
        self.clock = Clock()
        self.clock.advance(1_000_000)
        self.journal = MemoryJournal(self.clock)
        self.written = bytearray()
        self.allowed = allowed
        self.case = case

    def stream(
        self, where: JournalFilter | None = None, max_seconds: float = 60.0
    ) -> JournalStream:
        return JournalStream(
            self.journal,
            TENANT,
            where or JournalFilter(),
            clock=self.clock,
            write=self.written.extend,
            still_allowed=lambda: succeed(self.allowed),
            heartbeat_seconds=15.0,
            max_seconds=max_seconds,
        )

    def events(self) -> list[dict[str, str]]:
        return parse_events(bytes(self.written))

    def seqs(self) -> list[int]:
        return [int(e["id"]) for e in self.events() if e.get("event") == "journal"]


class FormatTests(SynchronousTestCase):
    def test_event_carries_the_seq_as_id_and_the_entry_as_one_json_line(self) -> None:
        raw = event_bytes({"seq": 7, "op": "put", "path": "/a/b\nc"})
        self.assertEqual(
            raw, b'id: 7\nevent: journal\ndata: {"seq":7,"op":"put","path":"/a/b\\nc"}\n\n'
        )

    def test_comment(self) -> None:
        self.assertEqual(comment_bytes("heartbeat"), b": heartbeat\n\n")

    def test_last_event_id_parsing(self) -> None:
        self.assertIsNone(parse_last_event_id(None))
        self.assertIsNone(parse_last_event_id(" "))
        self.assertEqual(parse_last_event_id("42"), 42)
        for bad in ("-1", "x", "1.5", "٣", "9" * 20):
            self.assertRaises(ValueError, parse_last_event_id, bad)


class StreamTests(SynchronousTestCase):
    def test_starts_after_the_newest_row_when_given_no_seq(self) -> None:
        f = StreamFixture(self)
        f.journal.append(TENANT)
        f.journal.append(TENANT)
        done = Deferred.fromCoroutine(f.stream().run(None))
        f.journal.append(TENANT)
        f.clock.advance(61)
        self.successResultOf(done)
        self.assertEqual(f.seqs(), [3])
        self.assertEqual(f.events()[0], {"retry": "2000", "comment": "connected after=2"})

    def test_sends_every_row_after_the_seq_once_in_order(self) -> None:
        f = StreamFixture(self)
        for _ in range(3):
            f.journal.append(TENANT)
        done = Deferred.fromCoroutine(f.stream().run(1))
        f.journal.append(TENANT)
        f.clock.advance(5)
        f.journal.append(TENANT)
        f.clock.advance(60)
        self.successResultOf(done)
        self.assertEqual(f.seqs(), [2, 3, 4, 5])
        data = json.loads(f.events()[1]["data"])
        self.assertEqual(data["seq"], 2)
        self.assertIn("at", data)
        self.assertNotIn("at_ms", data)

    def test_heartbeat_after_a_quiet_long_poll(self) -> None:
        f = StreamFixture(self)
        done = Deferred.fromCoroutine(f.stream(max_seconds=40).run(0))
        f.clock.advance(15)
        self.assertEqual(f.events()[-1], {"comment": "heartbeat"})
        f.clock.advance(15)
        f.clock.advance(10)
        self.successResultOf(done)
        self.assertEqual([e.get("comment") for e in f.events()[1:]], ["heartbeat"] * 3)
        self.assertEqual(f.journal.waiting, 0)

    def test_ends_when_the_credential_is_gone(self) -> None:
        f = StreamFixture(self)
        done = Deferred.fromCoroutine(f.stream().run(0))
        f.allowed = False
        f.journal.append(TENANT)
        self.successResultOf(done)
        self.assertEqual(f.seqs(), [1])

    def test_stop_abandons_the_long_poll(self) -> None:
        f = StreamFixture(self)
        stream = f.stream()
        done = Deferred.fromCoroutine(stream.run(0))
        self.assertEqual(f.journal.waiting, 1)
        stream.stop()
        self.successResultOf(done)
        self.assertEqual(f.journal.waiting, 0)
        self.assertEqual(f.clock.getDelayedCalls(), [])

    def test_unreachable_data_plane_ends_with_an_error_event(self) -> None:
        f = StreamFixture(self)
        done = Deferred.fromCoroutine(f.stream().run(0))
        f.journal.unreachable = True
        f.clock.advance(15)
        self.successResultOf(done)
        self.assertEqual(f.events()[-1]["event"], "error")
        self.assertEqual(json.loads(f.events()[-1]["data"]), {"error": "dataplane_unreachable"})

    def test_filter_applies_to_streamed_rows(self) -> None:
        f = StreamFixture(self)
        done = Deferred.fromCoroutine(f.stream(JournalFilter(agent="a2")).run(0))
        f.journal.append(TENANT, agent_id="a1")
        f.journal.append(TENANT, agent_id="a2")
        f.clock.advance(61)
        self.successResultOf(done)
        self.assertEqual(f.seqs(), [2])

    def test_reconnect_with_the_last_id_loses_and_repeats_nothing(self) -> None:
        f = StreamFixture(self)
        first = Deferred.fromCoroutine(f.stream(max_seconds=20).run(0))
        f.journal.append(TENANT)
        f.journal.append(TENANT)
        f.clock.advance(20)
        self.successResultOf(first)
        seen = f.seqs()
        last = f.events()[-1].get("id") or str(seen[-1])
        # Rows written while the client is away.
        f.journal.append(TENANT)
        f.journal.append(TENANT)
        f.written.clear()
        second = Deferred.fromCoroutine(f.stream(max_seconds=20).run(parse_last_event_id(last)))
        f.journal.append(TENANT)
        f.clock.advance(20)
        self.successResultOf(second)
        self.assertEqual(seen + f.seqs(), [1, 2, 3, 4, 5])
