"""
Tests for L{svc.store.outbox_answers} through L{svc.store.manifests}: a
change naming its outbox entry is applied once; sent again, it gets the
first answer and changes nothing; refused changes are not remembered;
settled answers and a purged disk's answers are dropped.
"""

from __future__ import annotations

import sqlite3

import attrs

from svc.store.errors import AlreadyExists, StaleVersion
from svc.store.manifest_values import PutResult, Writer
from svc.store.outbox_answers import KEEP_MS, AnsweredBefore, OutboxPosition
from svc.store.test.routes_support import ALICE, StoreTestCase, chunk

OUTBOX = bytes(range(16))


def at(seq: int, settled: int = 0, outbox: bytes = OUTBOX) -> Writer:
    """ALICE, sending outbox entry C{seq}; answers are the result's repr."""
    position = OutboxPosition(outbox, seq, settled, answer=lambda result: repr(result).encode())
    return attrs.evolve(ALICE, outbox=position)


class OutboxAnswerTests(StoreTestCase):
    """Exactly once, per outbox entry."""

    def setUp(self) -> None:
        super().setUp()
        self.mkdirs("/alice")

    def stored(self) -> list[tuple[bytes, int]]:
        """The (outbox, seq) of every stored answer."""
        connection = sqlite3.connect(self.db_path)
        try:
            rows = connection.execute("SELECT outbox, seq FROM outbox_answers ORDER BY seq")
            return [(bytes(outbox), seq) for outbox, seq in rows]
        finally:
            connection.close()

    def test_an_entry_sent_again_gets_its_first_answer(self) -> None:
        """
        The same put sent twice makes one version; the second is answered
        with what the first returned, and the journal has one row.
        """
        first = self.write("/alice/f", [chunk(1)], writer=at(1))
        again = self.fails(
            self.put_deferred("/alice/f", 0, [chunk(1)], writer=at(1)), AnsweredBefore
        )
        self.assertEqual(again.answer, repr(first).encode())
        manifest = self.ok(self.store.get("/alice/f"))
        self.assertEqual(manifest.attributes.version, 1)
        rows = self.ok(self.store.journal_entry(first.journal_seq + 1))
        self.assertIsNone(rows)

    def test_every_kind_of_change_is_remembered(self) -> None:
        """mkdir, rename, setattr and delete sent again are not run again."""
        store = self.store
        self.ok(store.mkdir("/alice/d", mode=0o755, uid=0, gid=0, writer=at(1)))
        self.write("/alice/f", [chunk(2)], writer=at(2))
        self.ok(store.rename("/alice/f", "/alice/d/g", writer=at(3)))
        self.ok(store.setattr("/alice/d/g", writer=at(4), mode=0o600))
        self.ok(store.delete("/alice/d/g", writer=at(5)))
        for again in (
            store.mkdir("/alice/d", mode=0o755, uid=0, gid=0, writer=at(1)),
            store.rename("/alice/f", "/alice/d/g", writer=at(3)),
            store.setattr("/alice/d/g", writer=at(4), mode=0o644),
            store.delete("/alice/d/g", writer=at(5)),
        ):
            self.fails(again, AnsweredBefore)
        self.assertEqual([seq for _, seq in self.stored()], [1, 2, 3, 4, 5])

    def test_a_refused_change_is_not_remembered(self) -> None:
        """A change refused applied nothing: sent again, it is asked again."""
        self.write("/alice/f", [chunk(1)])
        self.fails(self.put_deferred("/alice/f", 7, [chunk(2)], writer=at(1)), StaleVersion)
        self.assertEqual(self.stored(), [])
        result = self.ok(self.put_deferred("/alice/f", 1, [chunk(2)], writer=at(1)))
        self.assertIsInstance(result, PutResult)

    def test_settled_answers_are_dropped(self) -> None:
        """An entry naming C{settled} drops the answers up to it, of its own outbox only."""
        other = bytes(16)
        self.mkdirs("/alice/a")
        self.ok(self.store.mkdir("/alice/b", mode=0o755, uid=0, gid=0, writer=at(1)))
        self.ok(self.store.mkdir("/alice/c", mode=0o755, uid=0, gid=0, writer=at(2)))
        self.ok(self.store.mkdir("/alice/x", mode=0o755, uid=0, gid=0, writer=at(1, 0, other)))
        self.ok(self.store.mkdir("/alice/e", mode=0o755, uid=0, gid=0, writer=at(3, settled=2)))
        self.assertEqual(self.stored(), [(other, 1), (OUTBOX, 3)])
        # Settled and dropped: the entry is asked again (and refused: it ran).
        again = self.store.mkdir("/alice/b", mode=0o755, uid=0, gid=0, writer=at(1))
        self.fails(again, AlreadyExists)

    def test_answers_of_an_abandoned_outbox_go_after_a_week(self) -> None:
        """
        An outbox no change names any more keeps its answers for
        L{KEEP_MS}; a change of another outbox of the agent then drops them.
        """
        gone = bytes(16)
        self.ok(self.store.mkdir("/alice/a", mode=0o755, uid=0, gid=0, writer=at(1, 0, gone)))
        self.clock.advance(KEEP_MS / 1000 - 1)
        self.ok(self.store.mkdir("/alice/b", mode=0o755, uid=0, gid=0, writer=at(1)))
        self.assertEqual(self.stored(), [(gone, 1), (OUTBOX, 1)])
        self.clock.advance(2)
        self.ok(self.store.mkdir("/alice/c", mode=0o755, uid=0, gid=0, writer=at(2)))
        self.assertEqual(self.stored(), [(OUTBOX, 1), (OUTBOX, 2)])

    def test_purging_the_disk_drops_its_answers(self) -> None:
        """A purged agent disk keeps no outbox answers."""
        self.write("/alice/f", [chunk(1)], writer=at(1))
        self.ok(self.store.purge_subtree("alice"))
        self.assertEqual(self.stored(), [])

    def test_a_position_is_checked(self) -> None:
        """An outbox id of another length, a seq below 1 or settled not below seq is refused."""
        for outbox, seq, settled in ((b"short", 1, 0), (OUTBOX, 0, 0), (OUTBOX, 2, 2)):
            self.assertRaises(
                ValueError, OutboxPosition, outbox, seq, settled, answer=lambda r: b""
            )
