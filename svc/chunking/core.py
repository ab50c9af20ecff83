"""
The content-defined chunker: parameters, chunk values and in-memory cutting.

Chunk boundaries come from FastCDC 2020 (the compiled ``pyfastcdc``
extension, which releases the GIL while it scans) with the parameters pinned
below; each chunk is named by the lowercase hex BLAKE3-256 of its bytes. The
exact algorithm, precise enough for a second implementation, and test vectors
are in ``docs/specifications/chunking.md``.

Nothing here does I/O; L{svc.chunking.stream} cuts files and streams with a
bounded buffer, L{svc.chunking.off_reactor} runs that work on an injected
worker.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Final, Literal

import attrs
from blake3 import blake3
from pyfastcdc import FastCDC

if TYPE_CHECKING:
    from typing_extensions import Buffer

MIN_CHUNK_SIZE: Final = 1 << 20
"""Smallest chunk the cutter produces, except a final (or only) chunk: 1 MiB."""

AVG_CHUNK_SIZE: Final = 4 << 20
"""FastCDC's target ("average") size parameter: 4 MiB."""

MAX_CHUNK_SIZE: Final = 16 << 20
"""Largest chunk the cutter ever produces: 16 MiB (a forced cut)."""

NORMALIZATION_LEVEL: Final[Literal[1]] = 1
"""
FastCDC normalized-chunking level (NC), the default of the reference Rust
implementation. Measured on random data: mean chunk 4.85 MiB, standard
deviation 2.4 MiB; a forced cut at the maximum ends about 1 chunk in 600. Level 2
packs sizes tighter (mean 4.5 MiB) but re-synchronises worse after an edit
that destroys a cut point (up to 6 new chunks instead of 3 to 4 in our
measurements), because its easier mask after the average finds more
boundaries that the old cut had skipped.
"""

GEAR_SEED: Final = 0
"""
``pyfastcdc`` seed; 0 keeps the reference gear table unmodified (see the
specification for how that table is generated).
"""

HASH_HEX_LENGTH: Final = 64
"""Characters in a chunk name: BLAKE3-256 as lowercase hexadecimal."""

_HASH_PATTERN: Final = re.compile(r"[0-9a-f]{64}")


def _check_hash(_instance: object, _attribute: object, value: str) -> None:
    if not isinstance(value, str) or _HASH_PATTERN.fullmatch(value) is None:
        raise ValueError(f"chunk hash must be 64 lowercase hex characters, got {value!r}")


def _check_offset(_instance: object, _attribute: object, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"chunk offset must be a non-negative integer, got {value!r}")


def _check_length(_instance: object, _attribute: object, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not (0 < value <= MAX_CHUNK_SIZE):
        raise ValueError(f"chunk length must be an integer in [1, {MAX_CHUNK_SIZE}], got {value!r}")


@attrs.frozen
class ChunkRef:
    """
    Where a chunk sits in its input and what it is called.

    @ivar offset: byte offset of the chunk's first byte in the input.
    @ivar length: number of bytes, 1 to L{MAX_CHUNK_SIZE}.
    @ivar hash: lowercase hex BLAKE3-256 of the chunk's bytes (its name).
    """

    offset: int = attrs.field(validator=_check_offset)
    length: int = attrs.field(validator=_check_length)
    hash: str = attrs.field(validator=_check_hash)

    @property
    def end(self) -> int:
        """
        Offset one past the chunk's last byte.
        """
        return self.offset + self.length


def chunk_hash(data: Buffer) -> str:
    """
    The name of a chunk: lowercase hex BLAKE3-256 of C{data}.
    """
    return blake3(data).hexdigest()


def new_cutter() -> FastCDC:
    """
    A FastCDC cutter configured with the pinned parameters.

    A cutter holds no per-input state and may be reused for many inputs, but
    one cutter's iterators must not be driven from two threads at once.
    """
    return FastCDC(
        AVG_CHUNK_SIZE,
        min_size=MIN_CHUNK_SIZE,
        max_size=MAX_CHUNK_SIZE,
        normalized_chunking=NORMALIZATION_LEVEL,
        seed=GEAR_SEED,
    )


def iter_cut_points(data: Buffer) -> Iterator[tuple[int, int]]:
    """
    Yield C{(offset, length)} of each chunk of C{data}, in order, without
    hashing. Empty input yields nothing.
    """
    for chunk in new_cutter().cut_buf(memoryview(data).cast("B")):
        yield chunk.offset, chunk.length


def chunk_bytes(data: Buffer) -> list[ChunkRef]:
    """
    Cut an in-memory buffer into chunks and name each one.

    The chunks, in order, concatenate back to C{data}; empty input gives no
    chunks. Slices are hashed in place (no copies).
    """
    view = memoryview(data).cast("B")
    return [
        ChunkRef(offset, length, chunk_hash(view[offset : offset + length]))
        for offset, length in iter_cut_points(view)
    ]
