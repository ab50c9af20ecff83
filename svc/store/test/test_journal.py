"""
Tests for the write journal of L{svc.store.manifests.ManifestStore}: what
each mutation records, queries and paging, retention, and revert.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from twisted.internet.defer import Deferred

from svc.store.errors import (
    ChunksCollected,
    InvalidArgument,
    NotEmpty,
    NotFound,
)
from svc.store.journal import MAX_PAGE, JournalQuery, RevertResult
from svc.store.journal_rows import JournalEntry
from svc.store.manifest_values import ChunkRef, FileKind
from svc.store.test.routes_support import ALICE, BOB, StoreTestCase, chunk
from svc.wire.errno import WireErrno


def _nothing_missing(hashes: Sequence[str]) -> set[str]:
    return set()


class JournalRecordTests(StoreTestCase):
    """
    Each mutation appends one row in its own transaction.
    """

    def setUp(self) -> None:
        super().setUp()
        self.mkdirs("/alice")

    def all_entries(self) -> tuple[JournalEntry, ...]:
        """Every row, oldest first."""
        return self.ok(self.store.journal_query(JournalQuery(limit=MAX_PAGE))).entries

    def test_every_mutation_is_journaled(self) -> None:
        """Each successful operation adds exactly one row naming its op and author."""
        self.write("/alice/f", [chunk(1)])
        self.write("/alice/f", [chunk(2)], expected_version=1, writer=BOB)
        self.ok(self.store.link("/alice/f", "/alice/g", writer=ALICE))
        self.ok(self.store.rename("/alice/g", "/alice/h", writer=ALICE))
        self.ok(self.store.symlink("/alice/l", "f", uid=0, gid=0, writer=ALICE))
        self.ok(
            self.store.mknod(
                "/alice/p", kind=FileKind.FIFO, mode=0o600, rdev=0, uid=0, gid=0, writer=ALICE
            )
        )
        self.ok(self.store.setattr("/alice/f", mode=0o600, writer=ALICE))
        self.ok(self.store.delete("/alice/h", writer=ALICE))
        self.ok(self.store.rmdir("/alice", writer=ALICE).addErrback(lambda f: f.trap(NotEmpty)))
        entries = self.all_entries()
        self.assertEqual(
            [(e.op, e.path, e.to_path) for e in entries],
            [
                ("mkdir", "/alice", None),
                ("put", "/alice/f", None),
                ("put", "/alice/f", None),
                ("link", "/alice/g", "/alice/f"),
                ("rename", "/alice/g", "/alice/h"),
                ("symlink", "/alice/l", None),
                ("mknod", "/alice/p", None),
                ("setattr", "/alice/f", None),
                ("delete", "/alice/h", None),
            ],
        )
        self.assertEqual([e.seq for e in entries], sorted({e.seq for e in entries}))
        self.assertEqual((entries[2].agent_id, entries[2].session_id), ("bob", "mount:bb"))
        self.assertEqual(entries[2].at_ms, int(self.clock.seconds() * 1000))
        self.assertEqual(self.ok(self.store.journal_row_count()), 9)

    def test_put_rows_hold_both_states(self) -> None:
        """A put row records versions and the full before and after chunk lists."""
        self.write("/alice/f", [chunk(1), chunk(2)])
        self.write("/alice/f", [chunk(3)], expected_version=1)
        created, updated = self.all_entries()[1:]
        self.assertEqual((created.old_version, created.new_version, created.old), (0, 1, None))
        assert created.new is not None and updated.old is not None and updated.new is not None
        self.assertEqual(created.new.chunks, (chunk(1), chunk(2)))
        self.assertEqual((updated.old_version, updated.new_version), (1, 2))
        self.assertEqual(updated.old.chunks, (chunk(1), chunk(2)))
        self.assertEqual(
            (updated.new.chunks, updated.new.size, updated.new.mode), ((chunk(3),), 1000, 0o644)
        )

    def test_rename_row_records_replaced_target(self) -> None:
        """A rename over a file records what the destination held."""
        self.write("/alice/a", [chunk(1)])
        self.write("/alice/b", [chunk(2)])
        self.ok(self.store.rename("/alice/a", "/alice/b", writer=ALICE))
        row = self.all_entries()[-1]
        assert row.old is not None and row.replaced is not None
        self.assertEqual((row.old.chunks, row.replaced.chunks), ((chunk(1),), (chunk(2),)))
        self.assertTrue(row.concerns("/alice/a") and row.concerns("/alice/b"))

    def test_entry_by_seq(self) -> None:
        """A single row is found by its seq; an unknown seq gives None."""
        written = self.write("/alice/f", [chunk(1)])
        entry = self.ok(self.store.journal_entry(written.journal_seq))
        assert entry is not None
        self.assertEqual(
            (entry.op, entry.path, entry.seq), ("put", "/alice/f", written.journal_seq)
        )
        self.assertEqual(entry.hashes(), {chunk(1).hash})
        self.assertIsNone(self.ok(self.store.journal_entry(999)))

    def test_seq_never_reused(self) -> None:
        """After pruning every row, new rows still get larger seqs."""
        self.write("/alice/f", [])
        last = self.all_entries()[-1].seq
        self.clock.advance(10)
        self.assertEqual(self.ok(self.store.journal_prune(int(self.clock.seconds() * 1000))), 2)
        self.assertEqual(self.ok(self.store.journal_row_count()), 0)
        self.write("/alice/g", [])
        self.assertGreater(self.all_entries()[0].seq, last)


class JournalQueryTests(StoreTestCase):
    """
    Filtering and paging.
    """

    def setUp(self) -> None:
        super().setUp()
        self.mkdirs("/alice", "/alice/d", "/alice/d2")
        self.write("/alice/d/a", [chunk(1)])
        self.clock.advance(1)
        self.write("/alice/d2/b", [chunk(2)], writer=BOB)
        self.clock.advance(1)
        self.ok(self.store.rename("/alice/d2/b", "/alice/d/c", writer=BOB))
        self.clock.advance(1)
        self.write("/alice/top", [chunk(3)])

    def seqs(self, **query: Any) -> list[int]:
        """The seqs of the rows matching ``query``."""
        page = self.ok(self.store.journal_query(JournalQuery(**query)))
        return [entry.seq for entry in page.entries]

    def test_exact_path(self) -> None:
        """A path matches rows naming it as path or rename destination."""
        self.assertEqual(self.seqs(path="/alice/d/c"), [6])
        self.assertEqual(self.seqs(path="/alice/d2/b"), [5, 6])
        self.assertEqual(self.seqs(path="/alice/d"), [2])

    def test_below(self) -> None:
        """With below, a directory matches itself and its subtree but not look-alike siblings."""
        self.assertEqual(self.seqs(path="/alice/d", below=True), [2, 4, 6])
        self.assertEqual(self.seqs(path="/", below=True), [1, 2, 3, 4, 5, 6, 7])

    def test_agent_and_time(self) -> None:
        """Rows filter by author and by a half-open time range."""
        start = 1_793_491_200_000
        self.assertEqual(self.seqs(agent_id="bob"), [5, 6])
        self.assertEqual(self.seqs(since_ms=start + 1000, until_ms=start + 3000), [5, 6])
        self.assertEqual(self.seqs(since_ms=start + 3000), [7])

    def test_newest_first(self) -> None:
        """newest_first reverses the order, and its cursor pages backwards."""
        page = self.ok(self.store.journal_query(JournalQuery(newest_first=True, limit=4)))
        self.assertEqual([e.seq for e in page.entries], [7, 6, 5, 4])
        self.assertEqual(page.next_cursor, 4)
        self.assertEqual(self.seqs(newest_first=True, cursor=4), [3, 2, 1])

    def test_limit_bounds(self) -> None:
        """A limit outside 1..MAX_PAGE, or a bad path, is refused."""
        self.assertRaises(InvalidArgument, JournalQuery, limit=0)
        self.assertRaises(InvalidArgument, JournalQuery, limit=MAX_PAGE + 1)
        self.assertRaises(InvalidArgument, JournalQuery, path="relative")

    def test_last_page_has_no_cursor(self) -> None:
        """A page that reaches the end says so, even when it is exactly full."""
        page = self.ok(self.store.journal_query(JournalQuery(limit=7)))
        self.assertEqual((len(page.entries), page.next_cursor), (7, None))
        page = self.ok(self.store.journal_query(JournalQuery(limit=6)))
        self.assertEqual(page.next_cursor, 6)

    @settings(max_examples=40, deadline=None, database=None)
    @given(
        limit=st.integers(1, 8),
        newest_first=st.booleans(),
        path=st.sampled_from([None, "/alice/d", "/alice/d2/b"]),
        below=st.booleans(),
    )
    def test_paging_never_skips_or_repeats(
        self, limit: int, newest_first: bool, path: str | None, below: bool
    ) -> None:
        """Following cursors yields exactly the rows of one unpaged query, in order."""
        whole = self.seqs(path=path, below=below, newest_first=newest_first, limit=MAX_PAGE)
        paged: list[int] = []
        cursor = None
        while True:
            page = self.ok(
                self.store.journal_query(
                    JournalQuery(
                        path=path,
                        below=below,
                        newest_first=newest_first,
                        limit=limit,
                        cursor=cursor,
                    )
                )
            )
            self.assertLessEqual(len(page.entries), limit)
            paged += [entry.seq for entry in page.entries]
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        self.assertEqual(paged, whole)

    def test_paging_while_writing(self) -> None:
        """Rows written between pages appear once, after the rows already seen."""
        seen: list[int] = []
        cursor = None
        for round_ in range(20):
            page = self.ok(self.store.journal_query(JournalQuery(limit=2, cursor=cursor)))
            seen += [entry.seq for entry in page.entries]
            if round_ < 5:
                self.write(f"/alice/new{round_}", [])
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        self.assertEqual(seen, list(range(1, 13)))


class JournalRetentionTests(StoreTestCase):
    """
    The hashes GC must keep, and pruning.
    """

    def test_hashes_since(self) -> None:
        """Hashes named by rows in the window are kept, including deleted files' chunks."""
        self.mkdirs("/alice")
        self.write("/alice/old", [chunk("old")])
        self.clock.advance(100)
        cutoff = int(self.clock.seconds() * 1000)
        self.write("/alice/f", [chunk(1)])
        self.write("/alice/f", [chunk(2)], expected_version=1)
        self.ok(self.store.delete("/alice/f", writer=ALICE))
        self.assertEqual(
            self.ok(self.store.journal_hashes_since(cutoff)), {chunk(1).hash, chunk(2).hash}
        )
        self.assertEqual(self.ok(self.store.live_hashes()), {chunk("old").hash})
        self.assertEqual(self.ok(self.store.journal_prune(cutoff)), 2)
        self.assertEqual(self.ok(self.store.journal_row_count()), 3)
        self.assertEqual(
            self.ok(self.store.journal_hashes_since(0)), {chunk(1).hash, chunk(2).hash}
        )


class RevertTests(StoreTestCase):
    """
    Reverting a path to its state just before an entry.
    """

    def setUp(self) -> None:
        super().setUp()
        self.mkdirs("/alice")
        self.asked: list[list[str]] = []

    def revert(self, path: str, seq: int, missing: Sequence[str] = ()) -> Deferred[RevertResult]:
        """Revert with a chunk store that lacks ``missing``; the Deferred."""

        def missing_chunks(hashes: Sequence[str]) -> set[str]:
            self.asked.append(list(hashes))
            return set(hashes) & set(missing)

        return self.store.journal_revert(path, seq, writer=BOB, missing_chunks=missing_chunks)

    def test_deleted_file_comes_back_exactly(self) -> None:
        """Reverting a delete recreates the file with its exact chunk list and attributes."""
        chunks = [chunk(1, 5), chunk(2, 7), chunk(1, 5)]
        self.write("/alice/f", chunks, mode=0o600)
        gone = self.ok(self.store.delete("/alice/f", writer=ALICE))
        result = self.ok(self.revert("/alice/f", gone.journal_seq))
        manifest = self.ok(self.store.get("/alice/f"))
        self.assertEqual(result.restored, manifest)
        self.assertEqual(manifest.chunks, tuple(chunks))
        self.assertEqual((manifest.size, manifest.attributes.mode), (17, 0o600))
        self.assertEqual(manifest.attributes.mtime_ns, 123)
        self.assertEqual(self.asked, [sorted({chunk(1).hash, chunk(2).hash})])
        row = self.ok(self.store.journal_query(JournalQuery(limit=MAX_PAGE))).entries[-1]
        self.assertEqual(
            (row.op, row.reverts_seq, row.seq), ("revert", gone.journal_seq, result.journal_seq)
        )
        self.assertEqual((row.agent_id, row.old), ("bob", None))
        self.assert_consistent()

    def test_revert_put(self) -> None:
        """Reverting an update restores the previous chunks as a new version."""
        self.write("/alice/f", [chunk(1)])
        update = self.write("/alice/f", [chunk(2)], expected_version=1)
        self.ok(self.revert("/alice/f", update.journal_seq))
        manifest = self.ok(self.store.get("/alice/f"))
        self.assertEqual((manifest.chunks, manifest.version), ((chunk(1),), 3))
        self.assertEqual(manifest.last_writer.agent_id, "bob")
        self.assert_consistent()

    def test_revert_create_deletes(self) -> None:
        """Reverting the put that created a file removes it."""
        created = self.write("/alice/f", [chunk(1)])
        self.write("/alice/f", [chunk(2)], expected_version=1)
        result = self.ok(self.revert("/alice/f", created.journal_seq))
        self.assertIsNone(result.restored)
        self.fails(self.store.get("/alice/f"), NotFound)
        self.assertEqual(self.ok(self.store.live_hashes()), frozenset())
        self.assertEqual(self.asked, [])
        self.assert_consistent()

    def test_already_in_state(self) -> None:
        """Reverting to absence when the path is absent writes no row."""
        created = self.write("/alice/f", [])
        self.ok(self.store.delete("/alice/f", writer=ALICE))
        rows = self.ok(self.store.journal_row_count())
        result = self.ok(self.revert("/alice/f", created.journal_seq))
        self.assertIsNone(result.journal_seq)
        self.assertEqual(self.ok(self.store.journal_row_count()), rows)

    def test_collected_chunks_refuse(self) -> None:
        """A revert needing a collected chunk is ENODATA and writes nothing."""
        self.write("/alice/f", [chunk(1), chunk(2)])
        gone = self.ok(self.store.delete("/alice/f", writer=ALICE))
        rows = self.ok(self.store.journal_row_count())
        refused = self.fails(
            self.revert("/alice/f", gone.journal_seq, missing=[chunk(2).hash]),
            ChunksCollected,
        )
        self.assertEqual((refused.hashes, refused.errno), ((chunk(2).hash,), WireErrno.ENODATA))
        self.fails(self.store.get("/alice/f"), NotFound)
        self.assertEqual(self.ok(self.store.journal_row_count()), rows)
        self.assert_consistent()

    def test_unknown_or_foreign_seq(self) -> None:
        """An unknown seq, or one about another path, is ENOENT."""
        first = self.write("/alice/f", [])
        self.fails(self.revert("/alice/f", 999), NotFound)
        self.fails(self.revert("/alice/g", first.journal_seq), NotFound)

    def test_revert_rename_both_ends(self) -> None:
        """A rename's source comes back with the moved content, its target with what it replaced."""
        self.write("/alice/a", [chunk(1)])
        self.write("/alice/b", [chunk(2)])
        moved = self.ok(self.store.rename("/alice/a", "/alice/b", writer=ALICE))
        assert moved.journal_seq is not None
        self.ok(self.revert("/alice/b", moved.journal_seq))
        self.assertEqual(self.ok(self.store.get("/alice/b")).chunks, (chunk(2),))
        self.ok(self.revert("/alice/a", moved.journal_seq))
        self.assertEqual(self.ok(self.store.get("/alice/a")).chunks, (chunk(1),))
        self.assert_consistent()

    def test_revert_directories(self) -> None:
        """rmdir reverts to a directory with its mode; mkdir reverts to absence if empty."""
        made = self.ok(self.store.mkdir("/alice/d", mode=0o711, uid=1, gid=2, writer=ALICE))
        self.write("/alice/d/f", [])
        self.fails(self.revert("/alice/d", made.journal_seq), NotEmpty)
        self.ok(self.store.delete("/alice/d/f", writer=ALICE))
        removed = self.ok(self.store.rmdir("/alice/d", writer=ALICE))
        self.ok(self.revert("/alice/d", removed.journal_seq))
        attributes = self.ok(self.store.get("/alice/d")).attributes
        self.assertEqual(
            (attributes.kind, attributes.mode, attributes.uid), (FileKind.DIRECTORY, 0o711, 1)
        )
        self.assert_consistent()

    def test_revert_replaces_other_kind(self) -> None:
        """A file snapshot replaces a symlink now standing at the path."""
        self.write("/alice/f", [chunk(1)])
        gone = self.ok(self.store.delete("/alice/f", writer=ALICE))
        self.ok(self.store.symlink("/alice/f", "elsewhere", uid=0, gid=0, writer=ALICE))
        self.ok(self.revert("/alice/f", gone.journal_seq))
        manifest = self.ok(self.store.get("/alice/f"))
        self.assertEqual((manifest.kind, manifest.chunks), (FileKind.FILE, (chunk(1),)))
        self.assert_consistent()

    def test_revert_setattr_and_symlink(self) -> None:
        """Attribute changes and symlink removals revert too."""
        self.write("/alice/f", [])
        changed = self.ok(self.store.setattr("/alice/f", mode=0o400, writer=ALICE))
        assert changed.journal_seq is not None
        self.ok(self.revert("/alice/f", changed.journal_seq))
        self.assertEqual(self.ok(self.store.get("/alice/f")).attributes.mode, 0o644)
        self.ok(self.store.symlink("/alice/l", "target", uid=0, gid=0, writer=ALICE))
        gone = self.ok(self.store.delete("/alice/l", writer=ALICE))
        self.ok(self.revert("/alice/l", gone.journal_seq))
        self.assertEqual(self.ok(self.store.readlink("/alice/l")), "target")

    def test_parent_gone(self) -> None:
        """A path whose parent no longer exists cannot be restored (ENOENT)."""
        self.mkdirs("/alice/d")
        self.write("/alice/d/f", [])
        gone = self.ok(self.store.delete("/alice/d/f", writer=ALICE))
        self.ok(self.store.rmdir("/alice/d", writer=ALICE))
        self.fails(self.revert("/alice/d/f", gone.journal_seq), NotFound)


@attrs.frozen
class _Change:
    """What the model remembers about one journal row."""

    seq: int
    path: str
    to_path: str | None
    before_path: tuple[ChunkRef, ...] | None
    before_to: tuple[ChunkRef, ...] | None


_NAMES = ("a", "b")

#: (operation, name, other name, chunk labels, how far back in history). A
#: rename moves "name" onto the other of the two names; a revert of a rename
#: row reverts its destination when "other name" is "b".
_Operation = tuple[str, str, str, list[int], int]
_operations = st.tuples(
    st.sampled_from(["put", "put", "delete", "rename", "revert", "revert"]),
    st.sampled_from(_NAMES),
    st.sampled_from(_NAMES),
    st.lists(st.integers(0, 5), max_size=3),
    st.integers(0, 3),
)


class JournalModelTests(StoreTestCase):
    """
    Random writes, renames, deletes and reverts against a dict model.
    """

    def setUp(self) -> None:
        super().setUp()
        self.mkdirs("/alice")
        self.runs = 0

    @settings(
        max_examples=40,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(st.lists(_operations, min_size=1, max_size=25))
    @example(
        [
            ("put", "a", "a", [1], 0),
            ("put", "b", "b", [2], 0),
            ("rename", "a", "b", [], 0),
            ("revert", "a", "b", [], 0),
            ("revert", "a", "a", [], 1),
        ]
    )
    def test_matches_model(self, operations: list[_Operation]) -> None:
        """After every operation the store holds what the model says, and revert is exact."""
        self.runs += 1
        base = f"/alice/run{self.runs}"
        self.mkdirs(base)

        model: dict[str, tuple[ChunkRef, ...]] = {}
        history: list[_Change] = []
        for kind, name, other, labels, index in operations:
            path = f"{base}/{name}"
            if kind == "put":
                content = tuple(chunk(label, 10 + label) for label in labels)
                version = self.ok(self.store.get(path)).version if path in model else 0
                written = self.write(path, content, expected_version=version)
                history.append(_Change(written.journal_seq, path, None, model.get(path), None))
                model[path] = content
            elif kind == "delete":
                if path not in model:
                    self.fails(self.store.delete(path, writer=ALICE), NotFound)
                    continue
                removed = self.ok(self.store.delete(path, writer=ALICE))
                history.append(_Change(removed.journal_seq, path, None, model.pop(path), None))
            elif kind == "rename":
                source = path
                destination = f"{base}/{'b' if name == 'a' else 'a'}"
                if source not in model:
                    self.fails(self.store.rename(source, destination, writer=ALICE), NotFound)
                    continue
                moved = self.ok(self.store.rename(source, destination, writer=ALICE))
                if source == destination:
                    self.assertIsNone(moved.journal_seq)
                    continue
                assert moved.journal_seq is not None
                history.append(
                    _Change(
                        moved.journal_seq,
                        source,
                        destination,
                        model[source],
                        model.get(destination),
                    )
                )
                model[destination] = model.pop(source)
            else:
                if not history:
                    continue
                change = history[-1 - index % len(history)]
                use_to = other == "b" and change.to_path is not None
                path = change.to_path if use_to and change.to_path else change.path
                before = change.before_to if use_to else change.before_path
                reverted = self.ok(
                    self.store.journal_revert(
                        path, change.seq, writer=BOB, missing_chunks=_nothing_missing
                    )
                )
                if reverted.journal_seq is not None:
                    history.append(_Change(reverted.journal_seq, path, None, model.get(path), None))
                if before is None:
                    model.pop(path, None)
                else:
                    model[path] = before
            self.assert_matches(base, model)
        for change in history:
            row = self.ok(
                self.store.journal_query(JournalQuery(cursor=change.seq - 1, limit=1))
            ).entries[0]
            self.assertEqual(row.seq, change.seq)
            state = row.state_before(change.path)
            self.assertEqual(None if state is None else state.chunks, change.before_path)
        self.assert_consistent()

    def assert_matches(self, base: str, model: dict[str, tuple[ChunkRef, ...]]) -> None:
        """The directory ``base`` holds exactly the model's files and contents."""
        entries = self.ok(self.store.list_dir(base))
        self.assertEqual(sorted(base + "/" + e.name for e in entries), sorted(model))
        for path, content in model.items():
            self.assertEqual(self.ok(self.store.get(path)).chunks, content)
