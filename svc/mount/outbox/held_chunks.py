"""
The bytes of the chunks unsettled commits name and the data plane may not
have yet, kept on the cache disk until the commits that name them settle
(``mount-outbox.md`` section 6), so a mount killed before its commits were
answered can replay them.

    held, missing = HeldChunks.open(cache / "outbox" / "chunks", {seq: names, ...})
    held.hold(entry.seq, {chunk.hash: data, ...})   # before the entry is appended
    held.release(entry.seq)                          # when it settles

A holder is an entry's seq, or (negative) a staging: chunks written piece
by piece before their entry is appended, then L{HeldChunks.transfer}red to it.

Each chunk is the file C{<hash>} (64 lowercase hex digits), written to
C{<hash>.tmp} and renamed, so a killed writer leaves no torn chunk under
its name; no C{fsync} (the log has none either). A chunk is kept while any
unsettled entry holds it, and deleted when the last one is released.
L{HeldChunks.read} verifies the bytes against the name (BLAKE3): a file
that does not match is reported missing, never sent.

Not thread-safe: its owner serialises calls (the mount's local-state lock).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from svc.chunking import chunk_hash
from svc.mount.outbox.entries import Commit, Entry

_NAME = re.compile(r"[0-9a-f]{64}")


def new_chunks(entry: Entry) -> frozenset[str]:
    """
    The chunks a replay of C{entry} may have to send: a commit's chunks
    that are not in its base (those are in a committed version already).
    """
    if not isinstance(entry, Commit):
        return frozenset()
    return frozenset(c.hash for c in entry.chunks) - {c.hash for c in entry.base}


class HeldChunks:
    """See the module docstring."""

    def __init__(self, root: Path, holders: dict[str, set[int]]) -> None:
        self._root = root
        self._holders = holders  # chunk -> seqs of the entries holding it
        self._held_by: dict[int, set[str]] = {}
        for name, seqs in holders.items():
            for seq in seqs:
                self._held_by.setdefault(seq, set()).add(name)

    @classmethod
    def open(
        cls, root: Path, needs: Mapping[int, Iterable[str]]
    ) -> tuple[HeldChunks, frozenset[str]]:
        """
        Open the directory C{root} (creating it), keeping the chunks the
        unsettled entries of a replay need (C{needs}: seq to chunk names)
        and deleting every other file. Returns the store and the needed
        chunks that are not there (their entries cannot be replayed as they
        are).
        """
        root.mkdir(parents=True, exist_ok=True)
        holders: dict[str, set[int]] = {}
        for seq, names in needs.items():
            for name in names:
                holders.setdefault(name, set()).add(seq)
        present = set()
        for path in root.iterdir():
            if path.name in holders:
                present.add(path.name)
            else:
                path.unlink()
        return cls(root, holders), frozenset(holders) - present

    def hold(self, seq: int, chunks: Mapping[str, bytes | memoryview]) -> None:
        """
        Keep C{chunks} (name to bytes) for entry C{seq}: written, if not
        already there, before this returns.
        """
        for name, data in chunks.items():
            if not _NAME.fullmatch(name):
                raise ValueError(f"not a chunk name: {name!r}")
            if name not in self._holders:
                self._write(name, data)
            self._holders.setdefault(name, set()).add(seq)
            self._held_by.setdefault(seq, set()).add(name)

    def transfer(self, source: int, seq: int) -> None:
        """The chunks held for C{source} (a staging, L{Outbox.staging}) are now held for C{seq}."""
        for name in self._held_by.pop(source, ()):
            seqs = self._holders[name]
            seqs.discard(source)
            seqs.add(seq)
            self._held_by.setdefault(seq, set()).add(name)

    def release(self, seq: int) -> None:
        """Entry C{seq} settled: delete the chunks nothing else holds."""
        for name in self._held_by.pop(seq, ()):
            seqs = self._holders[name]
            seqs.discard(seq)
            if not seqs:
                del self._holders[name]
                (self._root / name).unlink(missing_ok=True)

    def read(self, name: str) -> bytes | None:
        """Chunk C{name}'s bytes, or L{None} if it is missing or damaged."""
        if name not in self._holders:
            return None
        try:
            data = (self._root / name).read_bytes()
        except FileNotFoundError:
            return None
        return data if chunk_hash(data) == name else None

    def held(self) -> frozenset[str]:
        """The chunks kept now."""
        return frozenset(self._holders)

    def _write(self, name: str, data: bytes | memoryview) -> None:
        temporary = self._root / f"{name}.tmp"
        with temporary.open("wb") as file:
            file.write(data)
        os.replace(temporary, self._root / name)
