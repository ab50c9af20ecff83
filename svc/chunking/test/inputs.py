"""
Deterministic test inputs and hypothesis strategies for chunker tests.

Large inputs come from the BLAKE3 extendable output (fast, reproducible)
and from runs of a single byte value, which hold no cut point and so force
cuts at the maximum chunk size.
"""

from __future__ import annotations

from typing import Final

from blake3 import blake3
from hypothesis import strategies as st

MiB: Final = 1 << 20


def xof(seed: bytes, length: int) -> bytes:
    """
    C{length} pseudo-random bytes: the BLAKE3 extendable output for C{seed}.
    """
    return blake3(seed).digest(length=length)


@st.composite
def contents(draw: st.DrawFn, max_pieces: int = 4, max_piece: int = 20 * MiB) -> bytes:
    """
    Inputs built from up to C{max_pieces} pieces, each either pseudo-random
    bytes or a run of one byte value, of up to C{max_piece} bytes each.
    """
    pieces = draw(
        st.lists(
            st.tuples(
                st.sampled_from(["random", "run"]),
                st.integers(min_value=0, max_value=2**32),
                st.integers(min_value=0, max_value=max_piece),
            ),
            max_size=max_pieces,
        )
    )
    parts = []
    for kind, seed, length in pieces:
        if kind == "random":
            parts.append(xof(seed.to_bytes(5, "big"), length))
        else:
            parts.append(bytes([seed % 256]) * length)
    return b"".join(parts)
