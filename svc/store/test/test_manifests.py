"""
Tests for L{svc.store.manifests}: the compare-and-swap put, reads,
setattr, chunk reference tracking, and the store's life cycle.
"""

from __future__ import annotations

from svc.store.errors import (
    InvalidArgument,
    IsADirectory,
    LastWriter,
    NotADirectory,
    NotFound,
    QuotaExceeded,
    StaleVersion,
)
from svc.store.manifest_values import ChunkRef, FileKind
from svc.store.manifests import StoreClosed
from svc.store.test.routes_support import ALICE, BOB, StoreTestCase, chunk
from svc.wire.errno import WireErrno


class PutTests(StoreTestCase):
    """
    L{ManifestStore.put} creates and replaces file content by version.
    """

    def setUp(self) -> None:
        super().setUp()
        self.mkdirs("/alice")

    def test_create(self) -> None:
        """Expected version 0 creates the file at version 1 with all attributes."""
        chunks = [chunk(1, 100), chunk(2, 50)]
        result = self.write("/alice/f", chunks, mode=0o640)
        self.assertEqual((result.version, result.size, result.created), (1, 150, True))
        self.assertEqual(result.new_chunks, tuple(chunks))
        self.assertEqual(result.old_chunks, ())
        manifest = self.ok(self.store.get("/alice/f"))
        self.assertEqual(manifest.chunks, tuple(chunks))
        self.assertEqual(manifest.kind, FileKind.FILE)
        self.assertEqual((manifest.version, manifest.size), (1, 150))
        self.assertEqual(manifest.attributes.mode, 0o640)
        self.assertEqual(manifest.attributes.mtime_ns, 123)
        self.assertEqual(manifest.attributes.nlink, 1)
        self.assertEqual(manifest.attributes.inode, result.inode)
        self.assertEqual(
            manifest.last_writer, LastWriter("alice", "mount:aa", int(self.clock.seconds() * 1000))
        )

    def test_update_with_current_version(self) -> None:
        """The right expected version replaces the content as version + 1."""
        self.write("/alice/f", [chunk(1)])
        result = self.write("/alice/f", [chunk(2), chunk(3)], expected_version=1)
        self.assertEqual((result.version, result.created), (2, False))
        self.assertEqual(result.old_chunks, (chunk(1),))
        self.assertEqual(self.ok(self.store.get("/alice/f")).chunks, (chunk(2), chunk(3)))

    def test_wrong_version_names_the_winner(self) -> None:
        """A stale version fails with ESTALE, the current version and its writer."""
        self.write("/alice/f", [chunk(1)])
        self.clock.advance(5)
        self.write("/alice/f", [chunk(2)], expected_version=1, writer=BOB)
        stale = self.fails(
            self.store.put(
                "/alice/f",
                expected_version=1,
                chunks=[chunk(3)],
                size=1000,
                mode=0o644,
                mtime_ns=1,
                uid=0,
                gid=0,
                writer=ALICE,
            ),
            StaleVersion,
        )
        self.assertEqual(stale.errno, WireErrno.ESTALE)
        self.assertEqual(int(stale.errno), 116)
        self.assertEqual((stale.expected_version, stale.current_version), (1, 2))
        self.assertEqual(
            stale.last_writer, LastWriter("bob", "mount:bb", int(self.clock.seconds() * 1000))
        )
        self.assertEqual(self.ok(self.store.get("/alice/f")).chunks, (chunk(2),))

    def test_create_over_existing_is_stale(self) -> None:
        """Expected version 0 on an existing file is a lost CAS, not an overwrite."""
        self.write("/alice/f", [chunk(1)])
        stale = self.fails(self.put_deferred("/alice/f", 0, [chunk(2)]), StaleVersion)
        self.assertEqual(stale.current_version, 1)
        self.assertEqual(stale.last_writer, LastWriter("alice", "mount:aa", 1_793_491_200_000))

    def test_update_of_absent_is_stale(self) -> None:
        """A non-zero expected version for a missing path reports current version 0."""
        stale = self.fails(self.put_deferred("/alice/f", 3, [chunk(1)]), StaleVersion)
        self.assertEqual((stale.current_version, stale.last_writer), (0, None))

    def test_race_from_same_version(self) -> None:
        """Of two writers that read version 1, one wins; the other gets the winner's version."""
        self.write("/alice/f", [chunk(0)])
        seen_by_alice = self.ok(self.store.get("/alice/f")).version
        seen_by_bob = self.ok(self.store.get("/alice/f")).version
        won = self.ok(self.put_deferred("/alice/f", seen_by_bob, [chunk("b")], writer=BOB))
        lost = self.fails(self.put_deferred("/alice/f", seen_by_alice, [chunk("a")]), StaleVersion)
        self.assertEqual(lost.current_version, won.version)
        assert lost.last_writer is not None
        self.assertEqual(lost.last_writer.agent_id, "bob")

    def test_lost_put_writes_nothing(self) -> None:
        """A refused put leaves content, references and the journal unchanged."""
        self.write("/alice/f", [chunk(1)])
        rows = self.ok(self.store.journal_row_count())
        self.fails(self.put_deferred("/alice/f", 7, [chunk(2)]), StaleVersion)
        self.assertEqual(self.ok(self.store.journal_row_count()), rows)
        self.assertEqual(self.ok(self.store.live_hashes()), {chunk(1).hash})
        self.assert_consistent()

    def test_empty_file(self) -> None:
        """A file with no chunks has size 0."""
        result = self.write("/alice/empty", [])
        self.assertEqual(result.size, 0)
        self.assertEqual(self.ok(self.store.get("/alice/empty")).chunks, ())

    def test_size_must_equal_chunk_sum(self) -> None:
        """The size must be the sum of the chunk sizes (holes are zero chunks)."""
        d = self.store.put(
            "/alice/f",
            expected_version=0,
            chunks=[chunk(1, 10)],
            size=11,
            mode=0o644,
            mtime_ns=0,
            uid=0,
            gid=0,
            writer=ALICE,
        )
        self.fails(d, InvalidArgument)
        self.fails(self.store.get("/alice/f"), NotFound)

    def test_invalid_arguments(self) -> None:
        """Bad hashes, chunk sizes, versions, modes and ids are EINVAL."""
        self.assertRaises(InvalidArgument, ChunkRef, "AB" * 32, 1)
        self.assertRaises(InvalidArgument, ChunkRef, "ab" * 31, 1)
        self.assertRaises(InvalidArgument, ChunkRef, "ab" * 32, 0)
        self.assertRaises(InvalidArgument, ChunkRef, "ab" * 32, 16 * 1024 * 1024 + 1)
        self.fails(self.put_deferred("/alice/f", -1, []), InvalidArgument)
        self.fails(self.put_deferred("/alice/f", 0, [("zz" * 32, 5)]), InvalidArgument)
        self.fails(self.put_deferred("/alice/f", 0, [], mode=0o10000), InvalidArgument)
        self.fails(self.put_deferred("/alice/f", 0, [], uid=-1), InvalidArgument)
        self.assertEqual(self.ok(self.store.journal_row_count()), 1)

    def test_pairs_accepted(self) -> None:
        """Chunks may be given as (hash, size) pairs."""
        self.ok(self.put_deferred("/alice/f", 0, [(chunk(1).hash, 1000)]))
        self.assertEqual(self.ok(self.store.get("/alice/f")).chunks, (chunk(1),))

    def test_directory_targets(self) -> None:
        """Putting to a directory or the root is EISDIR."""
        self.fails(self.put_deferred("/alice", 1, []), IsADirectory)
        self.fails(self.put_deferred("/alice", 0, []), IsADirectory)
        self.fails(self.put_deferred("/", 1, []), IsADirectory)

    def test_parent_must_be_a_directory(self) -> None:
        """A create needs an existing parent directory (ENOENT, ENOTDIR)."""
        self.fails(self.put_deferred("/alice/missing/f", 0, []), NotFound)
        self.write("/alice/file", [])
        self.fails(self.put_deferred("/alice/file/f", 0, []), NotADirectory)

    def test_put_to_special_file(self) -> None:
        """A put aimed at a symlink or fifo is EINVAL."""
        self.ok(self.store.symlink("/alice/l", "x", uid=0, gid=0, writer=ALICE))
        self.fails(self.put_deferred("/alice/l", 1, []), InvalidArgument)

    def test_same_hash_two_sizes(self) -> None:
        """A hash already recorded with another size in the same disk is EINVAL."""
        self.write("/alice/a", [chunk(1, 10)])
        self.fails(self.put_deferred("/alice/b", 0, [(chunk(1).hash, 11)]), InvalidArgument)
        self.fails(self.store.get("/alice/b"), NotFound)
        self.assert_consistent()

    def test_quota(self) -> None:
        """A put raising unique bytes above the quota is EDQUOT and writes nothing."""
        self.write("/alice/a", [chunk(1, 600)])
        over = self.put_deferred("/alice/b", 0, [chunk(2, 500)], quota_bytes=1000)
        self.assertEqual(self.fails(over, QuotaExceeded).errno, WireErrno.EDQUOT)
        self.fails(self.store.get("/alice/b"), NotFound)
        deduped = self.ok(self.put_deferred("/alice/b", 0, [chunk(1, 600)], quota_bytes=1000))
        self.assertEqual(deduped.usage_bytes, 600)
        fits = self.ok(self.put_deferred("/alice/c", 0, [chunk(3, 400)], quota_bytes=1000))
        self.assertEqual(fits.usage_bytes, 1000)
        self.assert_consistent()

    def test_quota_allows_shrinking(self) -> None:
        """Over quota, a put that lowers usage still succeeds."""
        self.write("/alice/a", [chunk(1, 600), chunk(2, 600)])
        result = self.ok(self.put_deferred("/alice/a", 1, [chunk(1, 600)], quota_bytes=100))
        self.assertEqual(result.usage_bytes, 600)


class SetattrTests(StoreTestCase):
    """
    L{ManifestStore.setattr} changes attributes; size only to 0.
    """

    def setUp(self) -> None:
        super().setUp()
        self.mkdirs("/alice")
        self.write("/alice/f", [chunk(1), chunk(2)])

    def test_attributes_keep_version(self) -> None:
        """mode, uid, gid and times change without a new version; ctime becomes now."""
        self.clock.advance(10)
        result = self.ok(
            self.store.setattr(
                "/alice/f", writer=BOB, mode=0o600, uid=7, gid=8, mtime_ns=5, atime_ns=6
            )
        )
        attributes = self.ok(self.store.get("/alice/f")).attributes
        self.assertEqual(result.attributes, attributes)
        self.assertEqual(
            (attributes.mode, attributes.uid, attributes.gid, attributes.mtime_ns),
            (0o600, 7, 8, 5),
        )
        self.assertEqual(attributes.atime_ns, 6)
        self.assertEqual(attributes.version, 1)
        self.assertEqual(attributes.ctime_ns, int(self.clock.seconds() * 1e9))

    def test_truncate_to_zero(self) -> None:
        """Size 0 empties the chunk list as a new version and releases the chunks."""
        self.clock.advance(3)
        result = self.ok(self.store.setattr("/alice/f", writer=BOB, size=0))
        manifest = self.ok(self.store.get("/alice/f"))
        self.assertEqual((manifest.size, manifest.version, manifest.chunks), (0, 2, ()))
        self.assertEqual(manifest.attributes.mtime_ns, int(self.clock.seconds() * 1e9))
        self.assertEqual(manifest.last_writer.agent_id, "bob")
        self.assertEqual(result.released_hashes, {chunk(1).hash, chunk(2).hash})
        self.assertEqual(self.ok(self.store.subtree_usage("alice")), 0)
        self.assert_consistent()

    def test_same_size_is_accepted(self) -> None:
        """Setting the current size changes nothing about the content."""
        self.ok(self.store.setattr("/alice/f", writer=ALICE, size=2000))
        self.assertEqual(self.ok(self.store.get("/alice/f")).version, 1)

    def test_other_sizes_refused(self) -> None:
        """Growing or shrinking to a non-zero size is EINVAL (the client re-chunks and puts)."""
        self.fails(self.store.setattr("/alice/f", writer=ALICE, size=1000), InvalidArgument)
        self.fails(self.store.setattr("/alice/f", writer=ALICE, size=5000), InvalidArgument)
        self.fails(self.store.setattr("/alice", writer=ALICE, size=0), IsADirectory)

    def test_nothing_given(self) -> None:
        """A setattr with no attribute writes no journal row."""
        rows = self.ok(self.store.journal_row_count())
        result = self.ok(self.store.setattr("/alice/f", writer=ALICE))
        self.assertIsNone(result.journal_seq)
        self.assertEqual(self.ok(self.store.journal_row_count()), rows)

    def test_missing(self) -> None:
        """A setattr of a missing path is ENOENT."""
        self.fails(self.store.setattr("/alice/nope", writer=ALICE, mode=0), NotFound)


class ReferenceTests(StoreTestCase):
    """
    Chunk references per top-level directory drive usage and GC.
    """

    def setUp(self) -> None:
        super().setUp()
        self.mkdirs("/alice", "/bob")

    def test_shared_chunk_counted_once(self) -> None:
        """A chunk in two files of one disk counts once in its usage."""
        self.write("/alice/a", [chunk(1, 100), chunk(2, 10)])
        self.write("/alice/b", [chunk(1, 100)])
        self.assertEqual(self.ok(self.store.subtree_usage("alice")), 110)
        self.assert_consistent()

    def test_usage_drops_with_last_reference(self) -> None:
        """Usage falls only when the last file naming a chunk lets go of it."""
        self.write("/alice/a", [chunk(1, 100)])
        self.write("/alice/b", [chunk(1, 100)])
        released = self.ok(self.store.delete("/alice/a", writer=ALICE)).released_hashes
        self.assertEqual(released, frozenset())
        self.assertEqual(self.ok(self.store.subtree_usage("alice")), 100)
        released = self.ok(self.store.delete("/alice/b", writer=ALICE)).released_hashes
        self.assertEqual(released, {chunk(1).hash})
        self.assertEqual(self.ok(self.store.subtree_usage("alice")), 0)
        self.assertEqual(self.ok(self.store.live_hashes()), frozenset())
        self.assert_consistent()

    def test_hard_links_do_not_double_count(self) -> None:
        """An inode's chunks count once however many names it has."""
        self.write("/alice/a", [chunk(1, 100)])
        self.ok(self.store.link("/alice/a", "/alice/b", writer=ALICE))
        self.assertEqual(self.ok(self.store.subtree_usage("alice")), 100)
        self.ok(self.store.delete("/alice/a", writer=ALICE))
        self.assertEqual(self.ok(self.store.subtree_usage("alice")), 100)
        self.assert_consistent()

    def test_repeated_chunk_in_one_file(self) -> None:
        """A chunk used twice in one file counts once and survives losing one use."""
        self.write("/alice/a", [chunk(0, 100), chunk(0, 100)])
        self.assertEqual(self.ok(self.store.subtree_usage("alice")), 100)
        self.write("/alice/a", [chunk(0, 100)], expected_version=1)
        self.assertEqual(self.ok(self.store.subtree_usage("alice")), 100)
        self.assert_consistent()

    def test_disks_are_separate(self) -> None:
        """The same chunk counts in each disk that references it; live hashes span all."""
        self.write("/alice/a", [chunk(1, 100)])
        self.write("/bob/a", [chunk(1, 100), chunk(2, 5)])
        self.assertEqual(self.ok(self.store.usage_by_top()), {"alice": 100, "bob": 105})
        self.assertEqual(self.ok(self.store.live_hashes()), {chunk(1).hash, chunk(2).hash})
        self.ok(self.store.delete("/bob/a", writer=BOB))
        self.assertEqual(self.ok(self.store.usage_by_top()), {"alice": 100})
        self.assertEqual(self.ok(self.store.live_hashes()), {chunk(1).hash})
        self.assert_consistent()

    def test_update_moves_references(self) -> None:
        """Replacing content releases the chunks no longer named and adds the new ones."""
        self.write("/alice/a", [chunk(1, 100), chunk(2, 10)])
        self.write("/alice/a", [chunk(2, 10), chunk(3, 1)], expected_version=1)
        self.assertEqual(self.ok(self.store.subtree_usage("alice")), 11)
        self.assertEqual(self.ok(self.store.live_hashes()), {chunk(2).hash, chunk(3).hash})
        self.assert_consistent()


class LifecycleTests(StoreTestCase):
    """
    Opening, reopening and closing a store.
    """

    def test_reopen_keeps_everything(self) -> None:
        """A closed and reopened database has the same namespace and journal."""
        self.mkdirs("/alice")
        self.write("/alice/f", [chunk(1)])
        self.ok(self.store.close())
        store = self.open_store()
        self.addCleanup(store.close)
        self.assertEqual(self.ok(store.get("/alice/f")).chunks, (chunk(1),))
        self.assertEqual(self.ok(store.journal_row_count()), 2)

    def test_closed_store_refuses(self) -> None:
        """Calls after close fail with StoreClosed; closing twice is harmless."""
        self.ok(self.store.close())
        self.fails(self.store.get("/"), StoreClosed)
        self.fails(self.store.mkdir("/x", mode=0, uid=0, gid=0, writer=ALICE), StoreClosed)
        self.ok(self.store.close())

    def test_root_exists(self) -> None:
        """A new database has an empty root directory and nothing else."""
        root = self.ok(self.store.get("/"))
        self.assertEqual((root.kind, root.attributes.nlink), (FileKind.DIRECTORY, 2))
        self.assertEqual(self.ok(self.store.list_dir("/")), ())
        self.assertEqual(self.ok(self.store.journal_row_count()), 0)
