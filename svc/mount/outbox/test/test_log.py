"""
Tests for L{svc.mount.outbox.log} and L{svc.mount.outbox.records}: entries
appended survive a closed (or killed) log, settled ones are not replayed,
damage is kept aside and reported, never dropped in silence.
"""

from __future__ import annotations

import os
import struct
import zlib
from functools import partial
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from svc.mount.outbox import log as log_module
from svc.mount.outbox.entries import Mkdir, Owner, Rename, Unlink
from svc.mount.outbox.log import OutboxLog
from svc.mount.outbox.records import MAGIC, MAX_RECORD_BYTES, encode_record, scan

OWNER = Owner(0o40755, 0, 0)


def header(log: OutboxLog) -> bytes:
    """The bytes of C{log} with no entry: the magic and its outbox id."""
    return MAGIC + encode_record({"op": "outbox", "id": log.outbox_id})


def unlink_at(path: str, seq: int) -> Unlink:
    """An unlink of C{path} with sequence number C{seq}."""
    return Unlink(seq, path)


class RecordTests(SynchronousTestCase):
    """The byte format: what a scan keeps and where it stops."""

    def test_records_read_back_in_order(self) -> None:
        """Records after the header come back as their maps, with the length they end at."""
        data = MAGIC + encode_record({"op": "unlink", "seq": 1}) + encode_record({"n": 2})
        found = scan(data)
        self.assertEqual(found.records, ({"op": "unlink", "seq": 1}, {"n": 2}))
        self.assertEqual((found.good_bytes, found.damage), (len(data), None))

    def test_empty_and_headerless(self) -> None:
        """An empty file is an empty log; bytes without the header are damage."""
        self.assertEqual(scan(b"").damage, None)
        self.assertEqual(scan(b"something else").damage, "no outbox log header")

    def test_reading_stops_at_the_first_damage(self) -> None:
        """A torn tail, a bad CRC, a huge length or a non-map payload ends the good records."""
        first = MAGIC + encode_record({"seq": 1})
        second = encode_record({"seq": 2})
        bad_crc = bytearray(second)
        bad_crc[-1] ^= 0xFF
        huge = struct.pack(">II", MAX_RECORD_BYTES + 1, 0)
        not_a_map = struct.pack(">II", 1, zlib.crc32(b"\x01")) + b"\x01"
        later = encode_record({"seq": 3})
        for tail, why in (
            (second[:3], "torn record header"),
            (second[:-1], "torn record"),
            (bytes(bad_crc) + later, "fails its CRC"),
            (huge + later, "over the limit"),
            (not_a_map + later, "not a map"),
        ):
            found = scan(first + tail)
            self.assertEqual(found.records, ({"seq": 1},))
            self.assertEqual(found.good_bytes, len(first))
            assert found.damage is not None
            self.assertIn(why, found.damage)


class OutboxLogTests(SynchronousTestCase):
    """Appending, settling and replaying on a real file."""

    def setUp(self) -> None:
        self.path = Path(self.mktemp()) / "outbox" / "log"

    def reopen(self, log: OutboxLog) -> tuple[OutboxLog, log_module.Replay]:
        log.close()
        again, replay = OutboxLog.open(self.path)
        self.addCleanup(again.close)
        return again, replay

    def test_unsettled_entries_are_replayed_in_order(self) -> None:
        """What was appended and not settled comes back to the next open, in order."""
        log, replay = OutboxLog.open(self.path)
        self.assertEqual(replay.unsettled, ())
        made = log.append(lambda seq: Mkdir(seq, "/agent-1/d", OWNER))
        moved = log.append(lambda seq: Rename(seq, "/agent-1/d", "/agent-1/e"))
        gone = log.append(lambda seq: Unlink(seq, "/agent-1/f"))
        self.assertEqual([made.seq, moved.seq, gone.seq], [1, 2, 3])
        log.settle(moved.seq)
        _, replay = self.reopen(log)
        self.assertEqual(replay.unsettled, (made, gone))
        self.assertIsNone(replay.damage)

    def test_a_killed_writer_loses_nothing_it_wrote(self) -> None:
        """The log is written as entries are appended: no close is needed to keep them."""
        log, _ = OutboxLog.open(self.path)
        entry = log.append(lambda seq: Unlink(seq, "/agent-1/f"))
        # No close: another open reads the file as a killed mount left it.
        again, replay = OutboxLog.open(self.path)
        self.addCleanup(again.close)
        self.addCleanup(log.close)
        self.assertEqual(replay.unsettled, (entry,))

    def test_settling_everything_empties_the_log(self) -> None:
        """Once nothing is unsettled the file is back to its header."""
        log, _ = OutboxLog.open(self.path)
        for name in ("a", "b"):
            entry = log.append(partial(unlink_at, f"/agent-1/{name}"))
            log.settle(entry.seq)
        self.assertEqual(self.path.read_bytes(), header(log))
        later = log.append(lambda seq: Unlink(seq, "/agent-1/c"))
        self.assertEqual(later.seq, 3)
        _, replay = self.reopen(log)
        self.assertEqual(replay.unsettled, (later,))

    def test_settling_twice_or_unknown_is_an_error(self) -> None:
        """Settling an entry that is not unsettled is a caller's bug, said loudly."""
        log, _ = OutboxLog.open(self.path)
        self.addCleanup(log.close)
        entry = log.append(lambda seq: Unlink(seq, "/agent-1/f"))
        log.append(lambda seq: Unlink(seq, "/agent-1/g"))
        log.settle(entry.seq)
        self.assertRaises(KeyError, log.settle, entry.seq)
        self.assertRaises(KeyError, log.settle, 99)

    def test_an_entry_built_with_another_seq_is_refused(self) -> None:
        """The log gives the sequence numbers: an entry built otherwise is not written."""
        log, _ = OutboxLog.open(self.path)
        self.addCleanup(log.close)
        self.assertRaises(ValueError, log.append, lambda seq: Unlink(seq + 1, "/agent-1/f"))
        self.assertEqual(self.path.read_bytes(), header(log))

    def test_a_long_log_is_rewritten_with_the_unsettled_only(self) -> None:
        """Past the compaction size, settled entries and their marks leave the file."""
        self.patch(log_module, "COMPACT_BYTES", 4096)
        log, _ = OutboxLog.open(self.path)
        kept = log.append(lambda seq: Unlink(seq, "/agent-1/kept"))
        for number in range(200):
            entry = log.append(partial(unlink_at, f"/agent-1/f{number}"))
            log.settle(entry.seq)
        self.assertLess(log.size, 4096)
        self.assertEqual(log.size, os.path.getsize(self.path))
        after = log.append(lambda seq: Unlink(seq, "/agent-1/after"))
        _, replay = self.reopen(log)
        self.assertEqual(replay.unsettled, (kept, after))

    def test_damage_is_kept_aside_and_reported(self) -> None:
        """
        A torn tail: the good entries before it are replayed, the damaged
        file is kept beside the log, the replay says why, and seqs go on
        past any the damage may have hidden.
        """
        log, _ = OutboxLog.open(self.path)
        entry = log.append(lambda seq: Unlink(seq, "/agent-1/f"))
        log.close()
        with self.path.open("ab") as file:
            file.write(encode_record({"op": "unlink", "seq": 2, "path": "/x"})[:-2])
        damaged = self.path.read_bytes()
        again, replay = OutboxLog.open(self.path)
        self.addCleanup(again.close)
        self.assertEqual(replay.unsettled, (entry,))
        assert replay.damage is not None and replay.kept is not None
        self.assertIn("torn record", replay.damage)
        self.assertEqual(replay.kept.read_bytes(), damaged)
        self.assertEqual(replay.kept.name, "log.damaged-1")
        later = again.append(lambda seq: Unlink(seq, "/agent-1/g"))
        self.assertEqual(later.seq, 2 + log_module.DAMAGE_SEQ_GAP)

    def test_an_unreadable_entry_stops_the_replay(self) -> None:
        """A well-framed record that is no entry ends the replay there, and is kept."""
        self.path.parent.mkdir(parents=True)
        first = {"op": "unlink", "seq": 1, "path": "/agent-1/f"}
        self.path.write_bytes(
            MAGIC
            + encode_record({"op": "outbox", "id": b"i" * 16})
            + encode_record(first)
            + encode_record({"op": "unlink", "seq": "two", "path": "/agent-1/g"})
            + encode_record({"op": "unlink", "seq": 3, "path": "/agent-1/h"})
        )
        log, replay = OutboxLog.open(self.path)
        self.addCleanup(log.close)
        self.assertEqual(replay.unsettled, (Unlink(1, "/agent-1/f"),))
        assert replay.damage is not None
        self.assertIn("unreadable entry", replay.damage)
        self.assertIsNotNone(replay.kept)
        self.assertEqual(log.outbox_id, b"i" * 16)

    def test_the_outbox_id_is_kept_while_entries_wait(self) -> None:
        """
        A log with entries to replay keeps its id and seqs across reopening
        and compaction; one with nothing to replay starts a new id at seq 1
        (the data plane may keep answers for the seqs the emptied log
        reached, which it no longer knows).
        """
        self.patch(log_module, "COMPACT_BYTES", 1024)
        log, _ = OutboxLog.open(self.path, new_id=lambda: b"a" * 16)
        self.assertEqual(log.outbox_id, b"a" * 16)
        kept = log.append(partial(unlink_at, "/agent-1/kept"))
        for number in range(50):
            entry = log.append(partial(unlink_at, f"/agent-1/f{number}"))
            log.settle(entry.seq)
        again, replay = self.reopen(log)
        self.assertEqual(replay.unsettled, (kept,))
        self.assertEqual(again.outbox_id, b"a" * 16)
        self.assertEqual(again.append(partial(unlink_at, "/agent-1/next")).seq, 52)
        again.close()
        emptied, _ = OutboxLog.open(self.path, new_id=lambda: b"b" * 16)
        for seq in (1, 52):
            emptied.settle(seq)
        fresh, replay = self.reopen(emptied)
        self.assertEqual(replay.unsettled, ())
        self.assertNotEqual(fresh.outbox_id, b"a" * 16)
        self.assertEqual(fresh.append(partial(unlink_at, "/agent-1/f")).seq, 1)

    def test_a_log_without_its_outbox_id_is_damage(self) -> None:
        """Records with no outbox id first are kept aside; the new log gets a new id."""
        self.path.parent.mkdir(parents=True)
        self.path.write_bytes(MAGIC + encode_record({"op": "unlink", "seq": 1, "path": "/a/f"}))
        log, replay = OutboxLog.open(self.path, new_id=lambda: b"n" * 16)
        self.addCleanup(log.close)
        self.assertEqual(replay.unsettled, ())
        self.assertEqual(replay.damage, "the log does not start with its outbox id")
        self.assertEqual(log.outbox_id, b"n" * 16)

    def test_settled_through(self) -> None:
        """Everything up to the oldest unsettled entry, or to the last entry, is settled."""
        log, _ = OutboxLog.open(self.path)
        self.addCleanup(log.close)
        self.assertEqual(log.settled_through(), 0)
        first, second, third = (log.append(partial(unlink_at, f"/a/{n}")) for n in "xyz")
        log.settle(second.seq)
        self.assertEqual(log.settled_through(), 0)
        log.settle(first.seq)
        self.assertEqual(log.settled_through(), 2)
        log.settle(third.seq)
        self.assertEqual(log.settled_through(), 3)


class CarriedChunksTests(SynchronousTestCase):
    """Chunks an entry's record carries (its C{held} key)."""

    def setUp(self) -> None:
        self.path = Path(self.mktemp()) / "log"
        self.name = "ab" * 32

    def test_carried_until_settled_through_reopen_and_compaction(self) -> None:
        """
        The bytes come back with the replay and from L{OutboxLog.held},
        survive a compaction, and go with the entry's settle mark.
        """
        self.patch(log_module, "COMPACT_BYTES", 1024)
        log, _ = OutboxLog.open(self.path)
        kept = log.append(partial(unlink_at, "/agent-1/kept"), {self.name: b"bytes"})
        self.assertEqual(log.held(self.name), b"bytes")
        for number in range(50):
            entry = log.append(partial(unlink_at, f"/agent-1/f{number}"))
            log.settle(entry.seq)
        log.close()
        again, replay = OutboxLog.open(self.path)
        self.addCleanup(again.close)
        self.assertEqual(replay.held, {kept.seq: {self.name: b"bytes"}})
        self.assertEqual(again.held(self.name), b"bytes")
        again.settle(kept.seq)
        self.assertIsNone(again.held(self.name))

    def test_a_malformed_held_key_is_damage(self) -> None:
        """A C{held} that is not a list of [32-byte hash, bytes] stops the replay there."""
        self.path.parent.mkdir(parents=True)
        outbox = {"op": "outbox", "id": b"i" * 16}
        good = {"op": "unlink", "seq": 1, "path": "/agent-1/f", "held": [[b"h" * 32, b"x"]]}
        bad = {"op": "unlink", "seq": 2, "path": "/agent-1/g", "held": [[b"short", b"x"]]}
        self.path.write_bytes(
            MAGIC + b"".join(encode_record(record) for record in (outbox, good, bad))
        )
        log, replay = OutboxLog.open(self.path)
        self.addCleanup(log.close)
        self.assertEqual(replay.unsettled, (Unlink(1, "/agent-1/f"),))
        self.assertEqual(replay.held, {1: {(b"h" * 32).hex(): b"x"}})
        assert replay.damage is not None
        self.assertIn("held", replay.damage)
