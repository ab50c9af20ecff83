"""
Tests for the C{subtree_check} of L{svc.store.manifests.ManifestStore.rename}:
asked inside the rename's transaction, only when a directory moves.
"""

from __future__ import annotations

from svc.store.errors import SubtreeMoveRefused
from svc.store.manifest_names import SubtreeMoveCheck
from svc.store.test.routes_support import ALICE, StoreTestCase, chunk
from svc.wire.errno import WireErrno


class SubtreeCheckTests(StoreTestCase):
    """
    A rename asks its C{subtree_check} before moving a directory.
    """

    def setUp(self) -> None:
        super().setUp()
        self.mkdirs("/alice", "/alice/d", "/alice/d/e")
        self.write("/alice/d/e/f", [chunk(1)])
        self.write("/alice/g", [chunk(2)])
        self.asked: list[tuple[str, str]] = []

    def check(self, answer: str | None) -> SubtreeMoveCheck:
        def subtree_check(source: str, destination: str) -> str | None:
            self.asked.append((source, destination))
            return answer

        return subtree_check

    def test_refused_directory_move_changes_nothing(self) -> None:
        """A refusal is EACCES with the check's reason; nothing moves, no journal row is written."""
        rows = self.ok(self.store.journal_row_count())
        error = self.fails(
            self.store.rename(
                "/alice/d", "/alice/x", writer=ALICE, subtree_check=self.check("deny")
            ),
            SubtreeMoveRefused,
        )
        self.assertEqual((error.errno, error.reason), (WireErrno.EACCES, "deny"))
        self.assertEqual(self.asked, [("/alice/d", "/alice/x")])
        self.assertEqual(self.names("/alice"), ["d", "g"])
        self.assertEqual(self.ok(self.store.get("/alice/d/e/f")).chunks, (chunk(1),))
        self.assertEqual(self.ok(self.store.journal_row_count()), rows)
        self.assert_consistent()

    def test_allowed_directory_move(self) -> None:
        """A check answering L{None} lets the directory move with its subtree."""
        self.ok(
            self.store.rename("/alice/d", "/alice/x", writer=ALICE, subtree_check=self.check(None))
        )
        self.assertEqual(self.asked, [("/alice/d", "/alice/x")])
        self.assertEqual(self.ok(self.store.get("/alice/x/e/f")).chunks, (chunk(1),))

    def test_not_asked_for_a_file(self) -> None:
        """A non-directory has nothing below it: the check is not asked, the file moves."""
        self.ok(
            self.store.rename(
                "/alice/g", "/alice/h", writer=ALICE, subtree_check=self.check("deny")
            )
        )
        self.assertEqual(self.asked, [])
        self.assertEqual(self.names("/alice"), ["d", "h"])
