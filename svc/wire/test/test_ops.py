"""
Tests for L{svc.wire.ops}.
"""

from __future__ import annotations

import re

from twisted.trial.unittest import SynchronousTestCase

from svc.wire.ops import PUSH_OPS, REQUEST_OPS, Op


class OpTests(SynchronousTestCase):
    """
    Tests for the operation names.
    """

    def test_names_are_snake_case(self) -> None:
        """Every operation name is lower snake case and matches its member name."""
        for op in Op:
            self.assertRegex(op.value, re.compile(r"^[a-z]+(_[a-z]+)*$"))
            self.assertEqual(op.name.lower(), op.value)

    def test_partition(self) -> None:
        """Every op is either a request or a push; lease_revoke and changed are the pushes."""
        self.assertEqual(
            PUSH_OPS,
            {Op.LEASE_REVOKE, Op.CHANGED, Op.CREDENTIALS_REVOKED, Op.SESSION_FENCED},
        )
        self.assertEqual(REQUEST_OPS | PUSH_OPS, set(Op))
        self.assertFalse(REQUEST_OPS & PUSH_OPS)

    def test_values_are_plain_strings(self) -> None:
        """An op compares equal to its plain string, as it arrives decoded."""
        self.assertEqual(Op("chunk_put"), "chunk_put")
        self.assertIs(Op("chunk_put"), Op.CHUNK_PUT)
