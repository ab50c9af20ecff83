"""
The outbox log on the cache disk: entries appended in program order, each
written with one C{write(2)} before the call that made it returns (no
C{fsync}: a killed mount loses nothing the kernel took), settle marks
appended as the data plane answers, and the entries still unsettled read
back by the next mount on the same cache (``mount-outbox.md`` section 2).

    log, replay = OutboxLog.open(cache / "outbox" / "log")
    entry = log.append(lambda seq: Unlink(seq, "/agent-1/f"))
    ...
    log.settle(entry.seq)

Damage (a torn tail after a lost machine, a record this version cannot
read) is never dropped in silence: the whole file is kept beside the log as
C{log.damaged-<n>}, the good records before it are written to a new log,
and L{Replay.damage} says what happened for the caller to log.

The log itself is not thread-safe: its owner calls it from one thread at a
time (the mount's local-state lock, ``mount-outbox.md`` section 5).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import attrs

from svc.mount.outbox.entries import BadEntry, Entry, entry_from_map, entry_to_map
from svc.mount.outbox.records import (
    MAGIC,
    OUTBOX,
    OUTBOX_ID_BYTES,
    SETTLED,
    encode_record,
    scan,
    settle_mark,
)

COMPACT_BYTES = 64 * 1024 * 1024
"""A log this long with settled entries in it is rewritten with the unsettled only."""

E = TypeVar("E", bound=Entry)


@attrs.frozen
class Replay:
    """
    What a log held when it was opened.

    @ivar unsettled: its entries not settled, in order.
    @ivar damage: why reading stopped before the end (the file was kept as
        C{kept}), or L{None}.
    @ivar kept: the damaged file's new name, or L{None}.
    @ivar held: the chunks entries carry in their records (C{held}).
    """

    unsettled: tuple[Entry, ...]
    damage: str | None = None
    kept: Path | None = None
    held: Mapping[int, Mapping[str, bytes]] = attrs.field(factory=dict)
    """The chunk bytes unsettled entries carry in their records, by seq."""


DAMAGE_SEQ_GAP = 1 << 24
"""How far seqs jump after a damaged log with entries to replay: more than
the records the damage can hide (a log is compacted at 64 MiB, and a record
takes at least 8 bytes)."""


class OutboxLog:
    """See the module docstring."""

    def __init__(
        self,
        path: Path,
        fd: int,
        outbox_id: bytes,
        size: int,
        entries: dict[int, Entry],
        next_seq: int,
        held: dict[int, dict[str, bytes]],
    ) -> None:
        self._path = path
        self._held = held  # the chunks unsettled entries carry in their records
        self._fd = fd
        self._outbox_id = outbox_id
        self._header_bytes = len(_header(outbox_id))
        self._size = size
        self._unsettled = entries
        self._next_seq = next_seq

    @classmethod
    def open(
        cls, path: Path, new_id: Callable[[], bytes] = lambda: os.urandom(OUTBOX_ID_BYTES)
    ) -> tuple[OutboxLog, Replay]:
        """
        Open (creating if needed) the log at C{path}, reading what a
        previous mount left in it; a new log gets the outbox id C{new_id()}.
        """
        path.parent.mkdir(parents=True, exist_ok=True)
        data = path.read_bytes() if path.exists() else b""
        found = scan(data)
        entries: dict[int, Entry] = {}
        held: dict[int, dict[str, bytes]] = {}
        settled: set[int] = set()
        last_seq = 0
        damage = found.damage
        records = list(found.records)
        outbox_id = _outbox_id(records[0]) if records else None
        if outbox_id is not None:
            del records[0]
        elif records:
            damage = "the log does not start with its outbox id"
            records = []
        for record in records:
            if record.get("op") == SETTLED:
                seq = record.get("seq")
                if isinstance(seq, int):
                    settled.add(seq)
                continue
            try:
                entry = entry_from_map(record)
                carried = held_from_map(record)
            except BadEntry as error:
                damage = f"unreadable entry: {error}"
                break
            if entry.seq <= last_seq:
                damage = f"entry {entry.seq} out of order after {last_seq}"
                break
            entries[entry.seq] = entry
            if carried:
                held[entry.seq] = carried
            last_seq = entry.seq
        for seq in settled:
            entries.pop(seq, None)
            held.pop(seq, None)
        kept = None
        if damage is not None:
            kept = _keep_aside(path)
        next_seq = max(last_seq, max(settled, default=0)) + 1
        if outbox_id is None or not entries:
            # Nothing to replay: a new id, so no seq of this run meets an
            # answer the data plane keeps for an earlier run's (the log was
            # emptied, so the seqs it reached are not known).
            outbox_id, next_seq = new_id(), 1
        elif damage is not None:
            # The damage may hide records of higher seqs: skip past them.
            next_seq += DAMAGE_SEQ_GAP
        log = cls._rewrite(path, outbox_id, entries, next_seq, held)
        unsettled = tuple(entries[seq] for seq in sorted(entries))
        return log, Replay(unsettled, damage, kept, dict(held))

    @classmethod
    def _rewrite(
        cls,
        path: Path,
        outbox_id: bytes,
        entries: dict[int, Entry],
        next_seq: int,
        held: dict[int, dict[str, bytes]],
    ) -> OutboxLog:
        """A fresh log at C{path} holding C{entries} (written aside, then renamed over)."""
        fresh = path.with_name(path.name + ".new")
        body = _header(outbox_id) + b"".join(
            encode_record(_record(entries[seq], held.get(seq, {}))) for seq in sorted(entries)
        )
        fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        try:
            _write_all(fd, body)
            os.replace(fresh, path)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, outbox_id, len(body), dict(entries), next_seq, dict(held))

    @property
    def path(self) -> Path:
        """Where the log is."""
        return self._path

    @property
    def outbox_id(self) -> bytes:
        """This outbox's id (16 bytes, kept for the cache's life)."""
        return self._outbox_id

    def settled_through(self) -> int:
        """The highest seq up to which every entry is settled."""
        return min(self._unsettled, default=self._next_seq) - 1

    @property
    def size(self) -> int:
        """The log's length in bytes."""
        return self._size

    def unsettled(self) -> tuple[Entry, ...]:
        """The entries not settled yet, in order."""
        return tuple(self._unsettled[seq] for seq in sorted(self._unsettled))

    def append(self, make: Callable[[int], E], held: Mapping[str, bytes] = {}) -> E:
        """
        Append the entry C{make} builds with the next sequence number,
        carrying the chunks C{held} (name to bytes) in its record; written
        before this returns.
        """
        entry = make(self._next_seq)
        if entry.seq != self._next_seq:
            raise ValueError(f"entry built with seq {entry.seq}, not {self._next_seq}")
        self._write(encode_record(_record(entry, held)))
        self._next_seq += 1
        self._unsettled[entry.seq] = entry
        if held:
            self._held[entry.seq] = dict(held)
        return entry

    def held(self, name: str) -> bytes | None:
        """The bytes of chunk C{name} as an unsettled entry's record carries them, or L{None}."""
        for carried in self._held.values():
            data = carried.get(name)
            if data is not None:
                return data
        return None

    def settle(self, seq: int) -> None:
        """
        Entry C{seq} is settled (answered, or refused and reconciled): it is
        not replayed. Once nothing is unsettled the log is emptied; a long
        log is rewritten with the unsettled entries only.
        """
        if self._unsettled.pop(seq, None) is None:
            raise KeyError(f"no unsettled outbox entry {seq}")
        self._held.pop(seq, None)
        if not self._unsettled:
            os.ftruncate(self._fd, self._header_bytes)
            self._size = self._header_bytes
            return
        self._write(encode_record(settle_mark(seq)))
        if self._size >= COMPACT_BYTES:
            os.close(self._fd)
            fresh = self._rewrite(
                self._path, self._outbox_id, self._unsettled, self._next_seq, self._held
            )
            self._fd, self._size = fresh._fd, fresh._size

    def close(self) -> None:
        """Close the file (the unsettled entries stay in it for the next mount)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _write(self, record: bytes) -> None:
        _write_all(self._fd, record)
        self._size += len(record)


def _header(outbox_id: bytes) -> bytes:
    """A log's first bytes: the magic, then the record naming its outbox."""
    return MAGIC + encode_record({"op": OUTBOX, "id": outbox_id})


def _outbox_id(record: dict[Any, Any]) -> bytes | None:
    """The outbox id a log's first record names, or L{None}."""
    value = record.get("id")
    if record.get("op") != OUTBOX or not isinstance(value, bytes):
        return None
    return value if len(value) == OUTBOX_ID_BYTES else None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _keep_aside(path: Path) -> Path:
    """Rename damaged log C{path} to the first free C{<name>.damaged-<n>}."""
    for number in range(1, 10_000):
        kept = path.with_name(f"{path.name}.damaged-{number}")
        if not kept.exists():
            os.replace(path, kept)
            return kept
    raise OSError(f"too many damaged outbox logs beside {path}")


HELD = "held"
"""The key of the chunks an entry's record carries: C{[[hash, bytes], ...]}."""


def _record(entry: Entry, held: Mapping[str, bytes]) -> dict[str, Any]:
    """The record of C{entry}, carrying C{held}."""
    record = entry_to_map(entry)
    if held:
        record[HELD] = [[bytes.fromhex(name), bytes(data)] for name, data in held.items()]
    return record


def held_from_map(record: Mapping[str, Any]) -> dict[str, bytes]:
    """
    The chunks an entry's record carries (its C{held} key, absent: none);
    L{BadEntry} when the key is there but malformed. The bytes are checked
    against their names when read (L{svc.mount.outbox.outbox.Outbox.held_chunk}).
    """
    carried = record.get(HELD)
    if carried is None:
        return {}
    if not isinstance(carried, list):
        raise BadEntry("held is not a list")
    found: dict[str, bytes] = {}
    for item in carried:
        if (
            not isinstance(item, list)
            or len(item) != 2
            or not isinstance(item[0], bytes)
            or len(item[0]) != 32
            or not isinstance(item[1], bytes)
        ):
            raise BadEntry("held is not a list of [32-byte hash, bytes]")
        found[item[0].hex()] = item[1]
    return found
