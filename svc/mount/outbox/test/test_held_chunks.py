"""
Tests for L{svc.mount.outbox.held_chunks}: the bytes of unsettled commits'
new chunks are kept until the last entry naming them settles, survive a
reopen, and are never handed out when damaged.
"""

from __future__ import annotations

from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from svc.chunking import ChunkRef, chunk_hash
from svc.mount.outbox.entries import Commit, Owner, Unlink
from svc.mount.outbox.held_chunks import HeldChunks, new_chunks

OLD = b"old bytes"
NEW = b"new bytes"
MORE = b"more bytes"


def commit(seq: int, base: tuple[bytes, ...], content: tuple[bytes, ...]) -> Commit:
    """A commit of C{content} (chunks in order) made on C{base}."""

    def refs(pieces: tuple[bytes, ...]) -> tuple[ChunkRef, ...]:
        out, offset = [], 0
        for piece in pieces:
            out.append(ChunkRef(offset, len(piece), chunk_hash(piece)))
            offset += len(piece)
        return tuple(out)

    size = sum(map(len, content))
    owner = Owner(0o100644, 0, 0)
    return Commit(seq, "/agent-1/f", 1, False, refs(base), refs(content), size, owner, 1)


class HeldChunksTests(SynchronousTestCase):
    """Holding, releasing and reopening."""

    def setUp(self) -> None:
        self.root = Path(self.mktemp()) / "chunks"

    def test_new_chunks_leave_out_the_base(self) -> None:
        """Only the chunks a commit adds to its base need keeping; other entries need none."""
        entry = commit(1, (OLD,), (OLD, NEW))
        self.assertEqual(new_chunks(entry), {chunk_hash(NEW)})
        self.assertEqual(new_chunks(Unlink(2, "/agent-1/f")), frozenset())

    def test_kept_until_the_last_holder_settles(self) -> None:
        """A chunk two entries hold stays until both are released, then its file is gone."""
        held, missing = HeldChunks.open(self.root, {})
        self.assertEqual(missing, frozenset())
        name = chunk_hash(NEW)
        held.hold(1, {name: NEW})
        held.hold(2, {name: NEW, chunk_hash(MORE): MORE})
        held.release(1)
        self.assertEqual(held.read(name), NEW)
        held.release(2)
        self.assertIsNone(held.read(name))
        self.assertEqual(list(self.root.iterdir()), [])

    def test_a_staging_s_chunks_go_to_its_entry(self) -> None:
        """
        Chunks staged (held under a negative holder) before their entry
        exists are the entry's once transferred: a chunk another entry held
        meanwhile is not deleted when that one settles, and the entry's
        release deletes them.
        """
        held, _ = HeldChunks.open(self.root, {})
        name = chunk_hash(NEW)
        held.hold(1, {name: NEW})
        held.hold(-1, {name: NEW, chunk_hash(MORE): MORE})
        held.release(1)
        held.transfer(-1, 2)
        self.assertEqual((held.read(name), held.read(chunk_hash(MORE))), (NEW, MORE))
        held.release(-1)  # nothing is left under the staging
        self.assertEqual(held.read(name), NEW)
        held.release(2)
        self.assertEqual(list(self.root.iterdir()), [])

    def test_an_abandoned_staging_leaves_nothing(self) -> None:
        """A staging released without an entry deletes the chunks nobody else holds."""
        held, _ = HeldChunks.open(self.root, {})
        held.hold(1, {chunk_hash(NEW): NEW})
        held.hold(-1, {chunk_hash(NEW): NEW, chunk_hash(MORE): MORE})
        held.release(-1)
        self.assertEqual(held.held(), {chunk_hash(NEW)})

    def test_reopen_keeps_what_the_replay_needs(self) -> None:
        """
        Reopened with the unsettled entries, the store keeps their new
        chunks, deletes everything else, and names what is missing.
        """
        held, _ = HeldChunks.open(self.root, {})
        held.hold(1, {chunk_hash(NEW): NEW, chunk_hash(OLD): OLD})
        (self.root / "stray.tmp").write_bytes(b"half")
        kept = commit(1, (OLD,), (OLD, NEW, MORE))
        again, missing = HeldChunks.open(self.root, {kept.seq: new_chunks(kept)})
        self.assertEqual(again.held(), {chunk_hash(NEW), chunk_hash(MORE)})
        self.assertEqual(missing, {chunk_hash(MORE)})
        self.assertEqual(again.read(chunk_hash(NEW)), NEW)
        self.assertEqual(sorted(p.name for p in self.root.iterdir()), [chunk_hash(NEW)])
        again.release(1)
        self.assertEqual(list(self.root.iterdir()), [])

    def test_damaged_bytes_are_never_read(self) -> None:
        """A chunk file whose bytes do not match its name reads as missing."""
        held, _ = HeldChunks.open(self.root, {})
        name = chunk_hash(NEW)
        held.hold(1, {name: NEW})
        (self.root / name).write_bytes(b"something else")
        self.assertIsNone(held.read(name))

    def test_a_name_that_is_not_a_chunk_is_refused(self) -> None:
        """Only 64 lowercase hex digits name a chunk file."""
        held, _ = HeldChunks.open(self.root, {})
        self.assertRaises(ValueError, held.hold, 1, {"../escape": b"x"})
        self.assertEqual(list(self.root.iterdir()), [])
