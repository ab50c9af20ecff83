"""
The chunking algorithm of ``docs/specifications/chunking.md`` written out
plainly in pure Python, one byte at a time, for checking the compiled cutter
against the specification. Slow (about 10 MB/s): only for small inputs.
"""

from __future__ import annotations

import hashlib

UINT64 = (1 << 64) - 1

# Masks for FastCDC 2020 with average 4 MiB (log2 = 22) at normalization
# level 1: MASK_S has 22 + 1 = 23 bits set, MASK_L has 22 - 1 = 21.
MASK_S = 0x0000_D937_7753_7000
MASK_L = 0x0000_D917_6753_7000


def gear_table() -> list[int]:
    """
    Entry C{i}: the first 8 bytes, big-endian, of MD5 over 64 bytes of value C{i}.
    """
    return [
        int.from_bytes(hashlib.md5(bytes([value]) * 64).digest()[:8], "big") for value in range(256)
    ]


GEAR = gear_table()


def cut_length(
    data: bytes | memoryview,
    min_size: int,
    avg_size: int,
    max_size: int,
    mask_s: int,
    mask_l: int,
) -> int:
    """
    Length of the chunk that starts at C{data[0]}, C{data} being the rest of
    the input.
    """
    remaining = len(data)
    if remaining <= min_size:
        return remaining
    center = avg_size
    if remaining > max_size:
        remaining = max_size
    elif remaining < center:
        center = remaining
    switch = center - center % 2
    end = remaining - remaining % 2
    fingerprint = 0
    for index in range(min_size - min_size % 2, end):
        fingerprint = ((fingerprint << 1) + GEAR[data[index]]) & UINT64
        mask = mask_s if index < switch else mask_l
        if fingerprint & mask == 0:
            return index
    return remaining


def cut_points(
    data: bytes,
    min_size: int = 1 << 20,
    avg_size: int = 4 << 20,
    max_size: int = 16 << 20,
    mask_s: int = MASK_S,
    mask_l: int = MASK_L,
) -> list[tuple[int, int]]:
    """
    C{(offset, length)} of every chunk of C{data}.
    """
    view = memoryview(data)
    points = []
    offset = 0
    while offset < len(data):
        length = cut_length(view[offset:], min_size, avg_size, max_size, mask_s, mask_l)
        points.append((offset, length))
        offset += length
    return points
