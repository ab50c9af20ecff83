"""
Whether an open's C{manifest_get} asks for the file's bytes too
(C{inline_max}, ``docs/specifications/mount-fs.md`` section 6).

On a machine whose chunk cache is cold, a small file's bytes coming with
its chunk list save the open's second round trip (the C{chunk_get}). When
the cache already holds most of them (a restart on the same machine, many
files of one content), they cost the data plane a chunk read and a
transfer for nothing. L{InlineReads} watches the last L{WINDOW} chunks that
came inline: while at most half of them were already held, opens ask;
otherwise they stop asking, except every L{PROBE_EVERY}th open, which asks
again to see whether that changed. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import deque

WINDOW = 32
"""Chunks (that came inline) whose usefulness is remembered."""

PROBE_EVERY = 16
"""While not asking, every this many opens asks anyway."""


class InlineReads:
    """See the module docstring."""

    def __init__(self, max_bytes: int) -> None:
        """
        @param max_bytes: the C{inline_max} to ask with (0: never ask).
        """
        self._max_bytes = max_bytes
        self._new = deque[bool](maxlen=WINDOW)  # True: the chunk was not held
        self._skipped = 0

    def inline_max(self) -> int:
        """What the next cold open asks for (its C{inline_max}, 0: nothing)."""
        if self._max_bytes == 0:
            return 0
        if 2 * sum(self._new) >= len(self._new):
            return self._max_bytes
        self._skipped += 1
        if self._skipped < PROBE_EVERY:
            return 0
        self._skipped = 0
        return self._max_bytes

    def came(self, already_held: bool) -> None:
        """A chunk came inline; the mount held it already, or not."""
        self._new.append(not already_held)
