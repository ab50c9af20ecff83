"""
Tests for L{svc.store.quota}: the room an agent has left under its grant and
its owner's account budget.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from svc.store.quota import QuotaUsage, available_bytes

BYTES = st.integers(0, 2**63 - 1)
LIMITS = st.none() | BYTES


class AvailableBytesTests(SynchronousTestCase):
    """
    L{available_bytes} and L{QuotaUsage.available_bytes}.
    """

    def test_neither_limit(self) -> None:
        """With no grant and no budget nothing limits the agent: None."""
        self.assertIsNone(available_bytes(500, None, 9000, None))

    def test_grant_only(self) -> None:
        """With only a grant the room is what the grant leaves."""
        self.assertEqual(available_bytes(300, 1000, 9000, None), 700)

    def test_budget_only(self) -> None:
        """With only a budget the room is what the account has left."""
        self.assertEqual(available_bytes(300, None, 700, 1000), 300)

    def test_both_grant_tighter(self) -> None:
        """With both limits a grant tighter than the budget decides."""
        self.assertEqual(available_bytes(300, 1000, 700, 10_000), 700)

    def test_budget_tighter_than_grant(self) -> None:
        """A budget that other agents have nearly used up is tighter than the grant."""
        self.assertEqual(available_bytes(300, 10_000, 9_500, 10_000), 500)

    def test_floored_at_zero(self) -> None:
        """Usage over a lowered grant or budget leaves 0 room, never a negative one."""
        self.assertEqual(available_bytes(2000, 1000, 2000, None), 0)
        self.assertEqual(available_bytes(0, None, 5000, 1000), 0)
        self.assertEqual(available_bytes(0, 1000, 5000, 1000), 0)

    def test_usage_value(self) -> None:
        """A QuotaUsage reports the room its figures leave."""
        self.assertEqual(QuotaUsage(300, 1000, 700, 800).available_bytes, 100)
        self.assertIsNone(QuotaUsage(300, None, 700, None).available_bytes)

    @given(BYTES, LIMITS, BYTES, LIMITS)
    def test_bounds(
        self, used: int, grant: int | None, account_used: int, budget: int | None
    ) -> None:
        """The room is None only without limits, never negative, never past either limit."""
        room = available_bytes(used, grant, account_used, budget)
        if grant is None and budget is None:
            self.assertIsNone(room)
            return
        assert room is not None
        self.assertGreaterEqual(room, 0)
        if grant is not None:
            self.assertLessEqual(room, max(0, grant - used))
        if budget is not None:
            self.assertLessEqual(room, max(0, budget - account_used))
