"""
Edit locality: a small insertion or deletion changes only a few chunks.

The bound, L{NEW_CHUNKS_BOUND}, is empirical, not a theorem: content-defined
cutting with a minimum size can cascade when an edit destroys a cut point
(the next boundaries may fall within the skipped first 1 MiB of the new
chunks). Measured on this test's input with every cut point edited at every
offset from 80 bytes before to 16 bytes after it (insert and delete of 1, 13
and 64 bytes, 8,148 edits): 1 new chunk for 64%, 2 for 24%, 3 for 8%, 4 for
4%, never more. Edits away from cut points almost always change only the chunk holding
them.
"""

from __future__ import annotations

from functools import cache

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from svc.chunking.core import ChunkRef, chunk_bytes
from svc.chunking.test.inputs import MiB, xof

NEW_CHUNKS_BOUND = 4
"""At most this many chunks of the edited input are not chunks of the original."""

INPUT_SIZE = 64 * MiB

edits = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@cache
def _original() -> tuple[bytes, list[ChunkRef]]:
    data = xof(b"svc.chunking edit locality", INPUT_SIZE)
    return data, chunk_bytes(data)


class EditLocalityTests(SynchronousTestCase):
    """
    Inserting or deleting 1 to 64 bytes in a 64 MiB pseudo-random input.
    """

    def _check(self, position: int, size: int, insert: bool) -> None:
        data, old = _original()
        if insert:
            edited = data[:position] + xof(position.to_bytes(8, "big"), size) + data[position:]
        else:
            edited = data[:position] + data[position + size :]
        new = chunk_bytes(edited)
        shift = size if insert else -size

        # Chunks whose cut was decided before the edit are untouched. (A cut at
        # offset e depends on the bytes up to and including byte e.)
        before = [ref for ref in old if ref.end < position]
        self.assertEqual(new[: len(before)], before)

        # Every other chunk is either new, or an old chunk moved by the shift;
        # once the cuts fall back into step they stay in step to the end.
        old_after = {(ref.offset + shift, ref.length, ref.hash) for ref in old[len(before) :]}
        novel = [
            index
            for index, ref in enumerate(new)
            if index >= len(before) and (ref.offset, ref.length, ref.hash) not in old_after
        ]
        self.assertGreaterEqual(len(novel), 1)
        self.assertLessEqual(len(novel), NEW_CHUNKS_BOUND)
        self.assertEqual(novel, list(range(novel[0], novel[0] + len(novel))))
        self.assertEqual(sum(ref.length for ref in new), len(edited))

    @edits
    @given(
        st.integers(min_value=0, max_value=INPUT_SIZE - 64),
        st.integers(min_value=1, max_value=64),
        st.booleans(),
    )
    def test_edit_anywhere(self, position: int, size: int, insert: bool) -> None:
        """An edit at any offset changes between 1 and NEW_CHUNKS_BOUND chunks."""
        self._check(position, size, insert)

    @edits
    @given(
        st.integers(min_value=0, max_value=100),
        st.integers(min_value=-80, max_value=16),
        st.integers(min_value=1, max_value=64),
        st.booleans(),
    )
    def test_edit_near_cut_point(self, which: int, delta: int, size: int, insert: bool) -> None:
        """An edit in the bytes that decide a cut changes at most NEW_CHUNKS_BOUND chunks."""
        _data, old = _original()
        cut = old[which % (len(old) - 1)].end
        self._check(cut + delta, size, insert)
