"""
Tests for the push callbacks that end a mount's right to write:
L{svc.mount.remote.pushes.revoked_pushes} (C{credentials_revoked}) and
L{svc.mount.remote.pushes.fenced_pushes} (C{session_fenced}).
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from svc.mount.remote.pushes import fenced_pushes, revoked_pushes


class RevokedPushTests(SynchronousTestCase):
    """C{credentials_revoked} reaches the mount, even malformed; other pushes do not."""

    def test_delivered_with_its_serial(self) -> None:
        """A credentials_revoked push hands its serial on."""
        received: list[str] = []
        push = revoked_pushes(received.append)
        push("credentials_revoked", {"serial": "1f3a"}, b"")
        self.assertEqual(received, ["1f3a"])

    def test_malformed_still_counts(self) -> None:
        """A malformed one still ends writing (the serial unknown): the GOAWAY follows anyway."""
        received: list[str] = []
        push = revoked_pushes(received.append)
        push("credentials_revoked", {"serial": 7}, b"")
        self.assertEqual(received, ["unknown"])

    def test_other_pushes_ignored(self) -> None:
        """Other pushes never reach the receiver."""
        received: list[str] = []
        push = revoked_pushes(received.append)
        push("changed", {"paths": ["/a"]}, b"")
        push("session_fenced", {"epoch": 3}, b"")
        self.assertEqual(received, [])


class FencedPushTests(SynchronousTestCase):
    """C{session_fenced} reaches the mount with its epoch; malformed ones are dropped."""

    def test_delivered_with_its_epoch(self) -> None:
        """A session_fenced push hands its epoch on."""
        received: list[int] = []
        push = fenced_pushes(received.append)
        push("session_fenced", {"epoch": 12}, b"")
        self.assertEqual(received, [12])

    def test_malformed_and_other_pushes_ignored(self) -> None:
        """A push without an integer epoch, or another push, never reaches the receiver."""
        received: list[int] = []
        push = fenced_pushes(received.append)
        for payload in ({}, {"epoch": "3"}, {"epoch": None}):
            push("session_fenced", payload, b"")
        push("credentials_revoked", {"serial": "1f"}, b"")
        self.assertEqual(received, [])
