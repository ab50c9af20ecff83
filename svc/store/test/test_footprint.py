"""
Tests for an agent's footprint: the pure limits of L{svc.store.footprint}
and the rows of L{svc.store.footprint_rows} behind
L{svc.store.manifests.ManifestStore} (uploads, retained and collectable
chunks, the retained cap, the migration that adds them).
"""

from __future__ import annotations

import sqlite3
from fractions import Fraction

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from svc.store.errors import NotFound, QuotaExceeded
from svc.store.footprint import (
    CollectionBacklog,
    Footprint,
    FootprintPolicy,
    parse_factor,
)
from svc.store.journal import MAX_PAGE, JournalQuery
from svc.store.journal_rows import Snapshot, encode_snapshot
from svc.store.manifest_values import ChunkRef, FileKind, encode_chunks
from svc.store.routes_schema import MIGRATIONS, migrate
from svc.store.sqlite_migrations import schema_version
from svc.store.test.routes_support import ALICE, BOB, StoreTestCase, chunk
from svc.wire.errno import WireErrno

BYTES = st.integers(0, 2**50)


class FootprintPolicyTests(SynchronousTestCase):
    """
    The limits a grant gives: the retained cap, the backlog limit, the bound.
    """

    def test_defaults(self) -> None:
        """By default an agent retains up to its grant; without a grant up to 1 GiB."""
        policy = FootprintPolicy()
        self.assertEqual(policy.retained_cap(1000), 1000)
        self.assertEqual(policy.retained_cap(None), 1 << 30)
        self.assertEqual(policy.backlog_limit(1000), 1000)
        self.assertEqual(policy.backlog_limit(None), 1 << 30)

    def test_factor_rounds_down(self) -> None:
        """The retained cap is floor(factor * grant)."""
        policy = FootprintPolicy(retention_factor=Fraction("0.333"))
        self.assertEqual(policy.retained_cap(1000), 333)
        self.assertEqual(policy.retained_cap(1), 0)
        self.assertEqual(FootprintPolicy(retention_factor=Fraction(0)).retained_cap(10**9), 0)

    def test_bound(self) -> None:
        """The bound is (3 + r) * grant, and none without a grant."""
        self.assertEqual(FootprintPolicy().bound(256 * 1024), 4 * 256 * 1024)
        policy = FootprintPolicy(retention_factor=Fraction("2.5"), ungranted_bytes=7)
        self.assertEqual(policy.bound(100), 550)
        self.assertIsNone(policy.bound(None))

    @given(BYTES, st.fractions(min_value=0, max_value=1000, max_denominator=1000))
    def test_parts_within_bound(self, grant: int, factor: Fraction) -> None:
        """Each limit is within the bound, which is what the parts add up to at most."""
        policy = FootprintPolicy(retention_factor=factor)
        bound = policy.bound(grant)
        assert bound is not None
        # live, uncommitted, retained, collectable
        self.assertEqual(
            bound, 2 * grant + policy.retained_cap(grant) + policy.backlog_limit(grant)
        )
        self.assertLessEqual(policy.retained_cap(grant), factor * grant)

    def test_invalid(self) -> None:
        """A negative factor or byte count is refused when the policy is built."""
        self.assertRaises(ValueError, FootprintPolicy, retention_factor=Fraction(-1))
        self.assertRaises(ValueError, FootprintPolicy, ungranted_bytes=-1)

    def test_total(self) -> None:
        """A footprint's total is the sum of its four parts."""
        self.assertEqual(Footprint(1, 2, 4, 8).total_bytes, 15)

    def test_parse_factor(self) -> None:
        """Factors are decimals with at most three decimals, from 0 to 1000."""
        self.assertEqual(parse_factor("1"), Fraction(1))
        self.assertEqual(parse_factor(" 0.125 "), Fraction(1, 8))
        self.assertEqual(parse_factor("1000"), Fraction(1000))
        for bad in ("", "-1", "1.", ".5", "0.0001", "1e3", "1000.001", "½", "nan", "1,5"):
            self.assertRaises(ValueError, parse_factor, bad)


class UploadChargeTests(StoreTestCase):
    """
    An upload is charged to its agent until one of its files names it.
    """

    def setUp(self) -> None:
        super().setUp()
        self.mkdirs("/alice", "/bob")

    def charge(
        self, top: str, part: ChunkRef, grant: int | None = None, backlog: int | None = None
    ) -> bool:
        result: bool = self.ok(
            self.store.charge_upload(top, part, grant_bytes=grant, backlog_bytes=backlog)
        )
        return result

    def footprint(self, top: str = "alice") -> Footprint:
        return self.ok(self.store.footprint(top))

    def test_charged_until_committed(self) -> None:
        """An upload counts as uncommitted until a put of the agent names it, then as live."""
        self.assertTrue(self.charge("alice", chunk(1, 300)))
        self.assertEqual(self.footprint(), Footprint(0, 300, 0, 0))
        self.write("/alice/f", [chunk(1, 300)])
        self.assertEqual(self.footprint(), Footprint(300, 0, 0, 0))
        self.assert_consistent()

    def test_what_the_agent_holds_costs_nothing(self) -> None:
        """A second upload, or one of a chunk the agent's files name, costs nothing more."""
        self.assertTrue(self.charge("alice", chunk(1)))
        self.assertFalse(self.charge("alice", chunk(1)))
        self.write("/alice/f", [chunk(2)])
        self.assertFalse(self.charge("alice", chunk(2), grant=1000))
        self.assertEqual(self.footprint(), Footprint(1000, 1000, 0, 0))
        self.assert_consistent()

    def test_another_agents_content_is_charged_as_new(self) -> None:
        """Content another agent holds is charged in full, so EDQUOT tells nothing of it."""
        self.write("/bob/f", [chunk("shared")], writer=BOB)
        self.assertTrue(self.charge("alice", chunk("shared")))
        self.assertEqual(self.footprint(), Footprint(0, 1000, 0, 0))
        failure = self.failureResultOf(
            self.store.charge_upload("alice", chunk("shared2"), grant_bytes=1999, backlog_bytes=0),
            QuotaExceeded,
        )
        self.assertEqual(failure.value.errno, WireErrno.EDQUOT)

    def test_grant_counts_uploads_apart_from_files(self) -> None:
        """
        Uploads not yet committed may reach the grant exactly, whatever the
        files hold (a full disk's file can be rewritten); one byte more is EDQUOT.
        """
        self.charge("alice", chunk(1, 1000), grant=1000)
        self.write("/alice/f", [chunk(1, 1000)])
        self.charge("alice", chunk(2, 600), grant=1000)
        self.charge("alice", chunk(4, 400), grant=1000)
        self.failureResultOf(
            self.store.charge_upload("alice", chunk(3, 1), grant_bytes=1000, backlog_bytes=None),
            QuotaExceeded,
        )
        self.assertEqual(self.footprint(), Footprint(1000, 1000, 0, 0))
        # Another agent's room is its own.
        self.charge("bob", chunk(3, 1000), grant=1000)

    def test_put_counts_files(self) -> None:
        """A put meets the grant with the agent's files, its uploads moving to them."""
        self.charge("alice", chunk(1, 800))
        self.ok(self.put_deferred("/alice/f", 0, [chunk(1, 800)], quota_bytes=1000))
        self.assertEqual(self.footprint(), Footprint(800, 0, 0, 0))
        failure = self.failureResultOf(
            self.put_deferred("/alice/g", 0, [chunk(2, 300)], quota_bytes=1000), QuotaExceeded
        )
        self.assertIn("in files", str(failure.value))

    def test_backlog_holds_new_uploads(self) -> None:
        """While an agent's collectable bytes pass the limit, uploads of new bytes are held."""
        self.write("/alice/f", [chunk(1)])
        self.ok(self.store.delete("/alice/f", writer=ALICE))
        self.ok(self.store.enforce_retained_cap("alice", 0))
        self.assertEqual(self.footprint(), Footprint(0, 0, 0, 1000))
        self.failureResultOf(
            self.store.charge_upload("alice", chunk(2), grant_bytes=None, backlog_bytes=999),
            CollectionBacklog,
        )
        self.assertTrue(self.charge("alice", chunk(2), backlog=1000))
        self.assertTrue(self.charge("bob", chunk(3), backlog=0))

    def test_uncharge(self) -> None:
        """A failed upload's charge is taken back."""
        self.charge("alice", chunk(1))
        self.ok(self.store.uncharge_upload("alice", chunk(1).hash))
        self.ok(self.store.uncharge_upload("alice", chunk(1).hash))
        self.assertEqual(self.footprint(), Footprint())
        self.assert_consistent()

    def test_expiry(self) -> None:
        """
        An upload not renewed within the grace stops being charged; one no
        longer named by anything is collectable.
        """
        self.charge("alice", chunk(1))
        self.charge("alice", chunk(2))
        self.charge("bob", chunk(2))
        self.clock.advance(10)
        self.charge("alice", chunk(2))
        now_ms = int(self.clock.seconds() * 1000)
        self.ok(self.store.expire(now_ms - 5000, 0, {}, FootprintPolicy()))
        self.assertEqual(self.footprint(), Footprint(0, 1000, 0, 1000))
        self.assertEqual(self.ok(self.store.upload_hashes()), {chunk(2).hash})
        self.assertEqual(self.ok(self.store.upload_hashes(since_ms=now_ms)), {chunk(2).hash})
        self.assertEqual(self.ok(self.store.collectable_chunks(10)), [(chunk(1).hash, 1000)])
        self.assert_consistent()


class RetainedTests(StoreTestCase):
    """
    Chunks only an agent's journal keeps are retained, up to a cap.
    """

    def setUp(self) -> None:
        super().setUp()
        self.mkdirs("/alice", "/bob")

    def footprint(self, top: str = "alice") -> Footprint:
        return self.ok(self.store.footprint(top))

    def rows(self) -> list[int]:
        page = self.ok(
            self.store.journal_query(JournalQuery(path="/alice", below=True, limit=MAX_PAGE))
        )
        return [entry.seq for entry in page.entries]

    def test_released_versions_are_retained(self) -> None:
        """Overwritten, truncated and deleted content counts as retained, once per chunk."""
        self.write("/alice/f", [chunk(1), chunk(2)])
        self.write("/alice/f", [chunk(2), chunk(3)], expected_version=1)
        self.assertEqual(self.footprint(), Footprint(2000, 0, 1000, 0))
        self.ok(self.store.setattr("/alice/f", size=0, writer=ALICE))
        self.assertEqual(self.footprint(), Footprint(0, 0, 3000, 0))
        self.write("/alice/f", [chunk(1)], expected_version=3)
        self.assertEqual(self.footprint(), Footprint(1000, 0, 2000, 0))
        self.ok(self.store.delete("/alice/f", writer=ALICE))
        self.assertEqual(self.footprint(), Footprint(0, 0, 3000, 0))
        self.assert_consistent()

    def test_rename_over_and_revert(self) -> None:
        """A file replaced by a rename is retained; a revert that names it again makes it live."""
        self.write("/alice/a", [chunk(1)])
        self.write("/alice/b", [chunk(2)])
        renamed = self.ok(self.store.rename("/alice/a", "/alice/b", writer=ALICE))
        self.assertEqual(self.footprint(), Footprint(1000, 0, 1000, 0))
        assert renamed.journal_seq is not None
        self.ok(
            self.store.journal_revert(
                "/alice/b", renamed.journal_seq, writer=ALICE, missing_chunks=lambda h: []
            )
        )
        self.assertEqual(self.footprint(), Footprint(1000, 0, 1000, 0))
        self.assertEqual(self.ok(self.store.get("/alice/b")).chunks, (chunk(2),))
        self.assert_consistent()

    def test_cap_prunes_the_oldest_rows(self) -> None:
        """
        Past its cap, a change prunes the agent's oldest rows; what they
        alone kept is collectable.
        """
        collectable: list[None] = []
        self.store.notify_collectable(lambda: collectable.append(None))
        self.write("/alice/f", [chunk(1)])
        for version, label in enumerate((2, 3, 4), start=1):
            self.ok(self.put_deferred("/alice/f", version, [chunk(label)]).addCallback(lambda r: r))
        self.assertEqual(self.footprint(), Footprint(1000, 0, 3000, 0))
        first, second, *_ = self.rows()
        self.ok(
            self.store.put(
                "/alice/f",
                expected_version=4,
                chunks=[chunk(5)],
                size=1000,
                mode=0o644,
                mtime_ns=0,
                uid=0,
                gid=0,
                writer=ALICE,
                retained_cap=2500,
            )
        )
        # Chunks 1 and 2 were released by the second and third puts.
        self.assertEqual(self.footprint(), Footprint(1000, 0, 2000, 2000))
        self.assertEqual(collectable, [None])
        self.assertNotIn(first, self.rows())
        self.assertNotIn(second, self.rows())
        pruned: list[tuple[str, int]] = self.ok(self.store.collectable_chunks(10))
        self.assertEqual(sorted(pruned), sorted([(chunk(1).hash, 1000), (chunk(2).hash, 1000)]))
        self.assert_consistent()

    def test_prune_keeps_what_others_hold(self) -> None:
        """A chunk another agent still names, or one uploaded meanwhile, is not collectable."""
        self.write("/alice/f", [chunk("shared")])
        self.write("/bob/g", [chunk("shared")], writer=BOB)
        self.ok(self.store.delete("/alice/f", writer=ALICE))
        self.write("/alice/h", [chunk("other")])
        self.ok(self.store.delete("/alice/h", writer=ALICE))
        self.ok(
            self.store.charge_upload("bob", chunk("other"), grant_bytes=None, backlog_bytes=None)
        )
        self.assertEqual(self.ok(self.store.enforce_retained_cap("alice", 0)), 0)
        self.assertEqual(self.footprint(), Footprint())
        self.assertEqual(self.rows(), [])
        self.assert_consistent()

    def test_named_again_is_no_longer_collectable(self) -> None:
        """Uploading or naming a collectable chunk again stops charging it as collectable."""
        self.write("/alice/f", [chunk(1)])
        self.write("/alice/g", [chunk(2)])
        self.ok(self.store.delete("/alice/f", writer=ALICE))
        self.ok(self.store.delete("/alice/g", writer=ALICE))
        self.assertEqual(self.ok(self.store.enforce_retained_cap("alice", 0)), 2000)
        self.ok(self.store.charge_upload("bob", chunk(1), grant_bytes=None, backlog_bytes=None))
        self.write("/bob/g", [chunk(2)], writer=BOB)
        self.assertEqual(self.footprint(), Footprint())
        self.assertEqual(self.ok(self.store.collectable_chunks(10)), [])
        self.assert_consistent()

    def test_pruned_row_cannot_be_reverted(self) -> None:
        """A row pruned for the cap is gone like one pruned for its age."""
        self.write("/alice/f", [chunk(1)])
        removed = self.ok(self.store.delete("/alice/f", writer=ALICE, retained_cap=0))
        self.failureResultOf(
            self.store.journal_revert(
                "/alice/f", removed.journal_seq, writer=ALICE, missing_chunks=lambda h: []
            ),
            NotFound,
        )
        self.assertEqual(self.footprint(), Footprint(0, 0, 0, 1000))

    def test_age_prune(self) -> None:
        """Rows pruned for their age release their chunks too, by seq."""
        self.write("/alice/f", [chunk(1)])
        self.write("/alice/f", [chunk(2)], expected_version=1)
        self.clock.advance(10)
        self.write("/alice/f", [chunk(3)], expected_version=2)
        cutoff = int(self.clock.seconds() * 1000) - 5000
        # The two mkdirs and the two puts.
        self.assertEqual(self.ok(self.store.journal_prune(cutoff)), 4)
        self.assertEqual(self.footprint(), Footprint(1000, 0, 1000, 1000))
        self.assertEqual(self.ok(self.store.collectable_chunks(10)), [(chunk(1).hash, 1000)])
        self.assert_consistent()

    def test_forget_collectable(self) -> None:
        """Chunks that left the store stop being charged."""
        self.write("/alice/f", [chunk(1)])
        self.ok(self.store.delete("/alice/f", writer=ALICE, retained_cap=0))
        self.ok(self.store.forget_collectable([chunk(1).hash, chunk(9).hash]))
        self.assertEqual(self.footprint(), Footprint())
        self.assert_consistent()

    def test_purge(self) -> None:
        """A purge drops the agent's footprint rows and reports their chunks."""
        self.write("/alice/f", [chunk(1)])
        self.write("/alice/f", [chunk(2)], expected_version=1)
        self.ok(self.store.charge_upload("alice", chunk(3), grant_bytes=None, backlog_bytes=None))
        self.write("/alice/g", [chunk(4)])
        self.ok(self.store.delete("/alice/g", writer=ALICE, retained_cap=1000))
        purged = self.ok(self.store.purge_subtree("alice"))
        self.assertEqual(purged.hashes, {chunk(n).hash for n in (1, 2, 3, 4)})
        self.assertEqual(self.footprint(), Footprint())
        self.assertEqual(self.ok(self.store.footprints()), {})
        self.assert_consistent()

    def test_footprints(self) -> None:
        """Every top with charged bytes is listed with its parts."""
        self.write("/alice/f", [chunk(1)])
        self.write("/alice/f", [chunk(2)], expected_version=1)
        self.ok(self.store.charge_upload("bob", chunk(3), grant_bytes=None, backlog_bytes=None))
        self.assertEqual(
            self.ok(self.store.footprints()),
            {"alice": Footprint(1000, 0, 1000, 0), "bob": Footprint(0, 1000, 0, 0)},
        )


class MigrationTwoTests(SynchronousTestCase):
    """
    Migration 2 adds the footprint tables and fills them from the journal.
    """

    def test_backfill(self) -> None:
        """Rows written before it get their top; what they alone keep is retained by the newest."""
        connection = sqlite3.connect(self.mktemp(), isolation_level=None)
        self.addCleanup(connection.close)
        migrate(connection, MIGRATIONS[:1])
        live, gone, twice = chunk("live"), chunk("gone"), chunk("twice")

        def file(chunks: tuple[ChunkRef, ...]) -> bytes | None:
            return encode_snapshot(
                Snapshot(FileKind.FILE, 0o644, 0, 0, 1000, 0, 1, 2, 0, None, chunks)
            )

        rows = [
            ("/alice/f", None, file((twice,))),
            ("/alice/f", file((twice,)), file((gone, twice))),
            ("/alice/f", file((gone, twice)), file((live,))),
            ("/alice", None, None),
            ("/bob/g", file((twice,)), None),
        ]
        for path, old, new in rows:
            connection.execute(
                "INSERT INTO journal (at_ms, agent_id, op, path, old_version, new_version,"
                " old_state, new_state) VALUES (0, 'a', 'put', ?, 0, 0, ?, ?)",
                (path, old, new),
            )
        connection.execute(
            "INSERT INTO chunk_refs (top, hash, size, refs) VALUES ('alice', ?, 1000, 1)",
            (bytes.fromhex(live.hash),),
        )
        self.assertEqual(migrate(connection, MIGRATIONS[:2]), 2)
        self.assertEqual(schema_version(connection), 2)
        self.assertEqual(
            connection.execute("SELECT path, top FROM journal ORDER BY seq").fetchall(),
            [(path, path.split("/")[1]) for path, _, _ in rows],
        )
        self.assertEqual(
            sorted(
                (top, bytes(digest).hex(), last_seq)
                for top, digest, last_seq in connection.execute(
                    "SELECT top, hash, last_seq FROM retained_chunks"
                )
            ),
            sorted([("alice", gone.hash, 3), ("alice", twice.hash, 3), ("bob", twice.hash, 5)]),
        )
        self.assertEqual(
            connection.execute(
                "SELECT top, uncommitted_bytes, retained_bytes, collectable_bytes FROM footprint"
                " ORDER BY top"
            ).fetchall(),
            [("alice", 0, 2000, 0), ("bob", 0, 1000, 0)],
        )
        # The chunk list encoding the backfill decodes by hand.
        self.assertEqual(len(encode_chunks((live,))), 40)
