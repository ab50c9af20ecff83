"""
Tests for L{svc.wire.correlation.RequestTable}.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from svc.wire.correlation import InFlightLimitReached, RequestTable
from svc.wire.errors import CodecError
from svc.wire.frame import MAX_REQUEST_ID


class RequestTableTests(SynchronousTestCase):
    """
    Tests for request id allocation and answer matching.
    """

    def test_ids_start_at_one(self) -> None:
        """Ids count up from 1; 0 is never handed out."""
        table: RequestTable[str] = RequestTable(10)
        self.assertEqual([table.start("a"), table.start("b"), table.start("c")], [1, 2, 3])

    def test_finish_returns_waiter(self) -> None:
        """An answer's id gives back the waiter of its request, once."""
        table: RequestTable[str] = RequestTable(10)
        first = table.start("a")
        second = table.start("b")
        self.assertEqual(table.finish(second), "b")
        self.assertEqual(table.finish(first), "a")
        self.assertEqual(table.in_flight, 0)
        self.assertRaises(CodecError, table.finish, first)

    def test_unknown_id_is_protocol_error(self) -> None:
        """An answer for an id never sent is a L{CodecError}."""
        table: RequestTable[str] = RequestTable(10)
        self.assertRaises(CodecError, table.finish, 5)
        self.assertRaises(CodecError, table.finish, 0)

    def test_limit(self) -> None:
        """Starting more requests than the limit is refused until one is answered."""
        table: RequestTable[int] = RequestTable(2)
        first = table.start(1)
        table.start(2)
        self.assertFalse(table.has_room())
        self.assertRaises(InFlightLimitReached, table.start, 3)
        table.finish(first)
        self.assertTrue(table.has_room())
        table.start(3)

    def test_wrap_around_skips_ids_in_use(self) -> None:
        """After the last id the ids wrap to 1, skipping ids still in flight."""
        table: RequestTable[str] = RequestTable(3, last_id=4)
        self.assertEqual([table.start("old"), table.start("x")], [1, 2])
        table.finish(2)
        self.assertEqual([table.start("a"), table.start("b")], [3, 4])
        table.finish(3)
        table.finish(4)
        self.assertEqual(table.start("c"), 2)
        self.assertEqual(table.finish(1), "old")

    def test_abandoned_keeps_id(self) -> None:
        """An abandoned request's id is not reused, and its late answer is swallowed."""
        table: RequestTable[str] = RequestTable(2, last_id=3)
        request_id = table.start("a")
        self.assertEqual(table.abandon(request_id), "a")
        self.assertEqual(table.in_flight, 1)
        ids = []
        for name in "bcd":
            ids.append(table.start(name))
            self.assertEqual(table.finish(ids[-1]), name)
        self.assertEqual(ids, [2, 3, 2])
        self.assertIsNone(table.finish(request_id))
        self.assertRaises(CodecError, table.finish, request_id)

    def test_abandon_unknown(self) -> None:
        """Abandoning an id not waited for is a KeyError."""
        table: RequestTable[str] = RequestTable(2)
        self.assertRaises(KeyError, table.abandon, 1)

    def test_drain(self) -> None:
        """Draining returns the waiting waiters in start order and empties the table."""
        table: RequestTable[str] = RequestTable(5)
        table.start("a")
        table.abandon(table.start("b"))
        table.start("c")
        self.assertEqual(table.drain(), ["a", "c"])
        self.assertEqual(table.in_flight, 0)

    def test_limit_range(self) -> None:
        """A limit below 1 or as large as the id space is refused."""
        self.assertRaises(ValueError, RequestTable, 0)
        self.assertRaises(ValueError, RequestTable, MAX_REQUEST_ID)
        self.assertRaises(ValueError, RequestTable, 3, last_id=3)
