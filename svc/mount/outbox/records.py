"""
The outbox log's byte format (``docs/specifications/mount-outbox.md``
section 2). Pure: no I/O.

A log is L{MAGIC} followed by records. A record is a 4-byte big-endian
payload length, the payload's 4-byte big-endian CRC-32 (zlib's), and the
payload: a msgpack map. The first record names the outbox (L{OUTBOX});
every other is an entry (its C{op} names the kind,
L{svc.mount.outbox.entries}) or a settle mark (C{op} C{"settled"}, C{seq}:
that entry is settled).

Reading stops at the first record that is short, too long, fails its CRC
or is not a msgpack map: what follows a torn write (a machine that lost
power part-way through) is not trusted. A killed process leaves no torn
record: its completed writes are in the kernel's page cache.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from typing import Any

import attrs
import msgpack

MAGIC = b"svc-outbox-1\n"
"""The first bytes of every outbox log."""

HEADER = struct.Struct(">II")
"""A record's length and CRC-32."""

MAX_RECORD_BYTES = 16 * 1024 * 1024
"""The largest payload a record may have (a larger length is damage)."""

SETTLED = "settled"
"""The C{op} of a settle mark."""

OUTBOX = "outbox"
"""The C{op} of a log's first record, C{{"op": "outbox", "id": <16 bytes>}}."""

OUTBOX_ID_BYTES = 16
"""The length of an outbox id."""


def encode_record(payload: dict[str, Any]) -> bytes:
    """The bytes of one record holding C{payload}."""
    packed: bytes = msgpack.packb(payload, use_bin_type=True)
    if len(packed) > MAX_RECORD_BYTES:
        raise ValueError(f"an outbox record of {len(packed)} bytes is over the limit")
    return HEADER.pack(len(packed), zlib.crc32(packed)) + packed


def settle_mark(seq: int) -> dict[str, Any]:
    """The payload saying entry C{seq} is settled."""
    return {"op": SETTLED, "seq": seq}


@attrs.frozen
class Scan:
    """
    What reading a log found.

    @ivar records: the good records' payloads, in order.
    @ivar good_bytes: how many bytes of the log they end at (the length to
        keep; anything after is damage or a torn tail).
    @ivar damage: why reading stopped before the end, or L{None}.
    """

    records: tuple[dict[Any, Any], ...]
    good_bytes: int
    damage: str | None


def scan(data: bytes) -> Scan:
    """The records of log bytes C{data} (L{MAGIC} first), up to any damage."""
    if not data.startswith(MAGIC):
        damage = "no outbox log header" if data else None
        return Scan((), 0, damage)
    return _scan_records(data, len(MAGIC))


def _scan_records(data: bytes, start: int) -> Scan:
    records: list[dict[Any, Any]] = []
    offset = start
    damage = None
    for payload, end in _records(data, start):
        if isinstance(payload, str):
            damage = payload
            break
        records.append(payload)
        offset = end
    return Scan(tuple(records), offset, damage)


def _records(data: bytes, offset: int) -> Iterator[tuple[dict[Any, Any] | str, int]]:
    """Each record's payload and end offset; a string says why reading stops."""
    while offset < len(data):
        if len(data) - offset < HEADER.size:
            yield f"torn record header at byte {offset}", offset
            return
        length, crc = HEADER.unpack_from(data, offset)
        body = offset + HEADER.size
        if length > MAX_RECORD_BYTES:
            yield f"record length {length} at byte {offset} is over the limit", offset
            return
        if len(data) - body < length:
            yield f"torn record at byte {offset}", offset
            return
        packed = data[body : body + length]
        if zlib.crc32(packed) != crc:
            yield f"record at byte {offset} fails its CRC", offset
            return
        try:
            payload = msgpack.unpackb(packed, raw=False, strict_map_key=True)
        except (ValueError, msgpack.UnpackException) as error:
            yield f"record at byte {offset} is not msgpack: {error}", offset
            return
        if not isinstance(payload, dict):
            yield f"record at byte {offset} is not a map", offset
            return
        offset = body + length
        yield payload, offset
