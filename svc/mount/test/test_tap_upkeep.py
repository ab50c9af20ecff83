"""
L{MountService}'s certificate upkeep: a renewed certificate moves the
data-plane traffic to a connection admitted with it, before the old leaf
expires and the server ends the old connection.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import attrs
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from svc.mount.control.control_client import LeaseLost, Revoked
from svc.mount.runtime.service import MountService
from svc.mount.runtime.settings import MountSettings


@attrs.frozen
class FakeCredentials:
    serial: str
    not_after: datetime


class FakeControl:
    """The control-plane client: C{renew} answers the next scripted result."""

    def __init__(self, *results: FakeCredentials | Exception) -> None:
        self._results = list(results)
        self.renewed: list[str] = []

    def renew(self, creds: FakeCredentials) -> Deferred[FakeCredentials]:
        self.renewed.append(creds.serial)
        result = self._results.pop(0)
        if isinstance(result, Exception):
            return fail(result)
        return succeed(result)


class RefreshingControl:
    """The control-plane client: C{refresh_mount} fails with C{error}."""

    def __init__(self, error: Exception) -> None:
        self._error = error

    def refresh_mount(self, creds: FakeCredentials) -> Deferred[object]:
        return fail(self._error)


class FakeFS:
    """The filesystem core: remembers why it was made read-only."""

    def __init__(self) -> None:
        self.read_only: list[str] = []

    def set_read_only(self, reason: str) -> None:
        self.read_only.append(reason)


class FakeLink:
    """The reconnecting data-plane client: counts switches."""

    def __init__(self) -> None:
        self.switches = 0
        self.closed: list[str] = []

    def switch(self) -> Deferred[bool]:
        self.switches += 1
        return succeed(True)

    def close(self, reason: str) -> None:
        self.closed.append(reason)


def service(control: object, link: FakeLink, clock: Clock) -> MountService:
    settings = MountSettings(
        control_url="http://control.invalid",
        enroll_token="t",
        mount_point=Path("/nonexistent"),
        cache_dir=Path("/nonexistent"),
    )
    mount = MountService(clock, settings, install_signal=None)
    hour = datetime.now(UTC) + timedelta(hours=1)
    internals: Any = mount
    internals._control = control
    internals._dataplane = link
    internals._creds = FakeCredentials("old", hour)
    return mount


class RenewalTests(SynchronousTestCase):
    """
    What a certificate renewal does to the data-plane connection.
    """

    def test_renewal_switches_connection(self) -> None:
        """After a renewal the data-plane client opens a connection with the new leaf."""
        clock = Clock()
        link = FakeLink()
        fresh = FakeCredentials("new", datetime.now(UTC) + timedelta(hours=1))
        mount = service(FakeControl(fresh), link, clock)
        internals: Any = mount
        internals._renew()
        self.assertEqual(link.switches, 1)
        self.assertEqual(internals._creds.serial, "new")
        self.assertEqual(len(clock.getDelayedCalls()), 1, "the next renewal is scheduled")

    def test_failed_renewal_keeps_connection(self) -> None:
        """A renewal that fails leaves the connection alone and is tried again later."""
        clock = Clock()
        link = FakeLink()
        mount = service(FakeControl(ConnectionRefusedError("control down")), link, clock)
        internals: Any = mount
        internals._renew()
        self.assertEqual(link.switches, 0)
        self.assertEqual(internals._creds.serial, "old")
        self.assertEqual(len(clock.getDelayedCalls()), 1)


class LeaseRefreshTests(SynchronousTestCase):
    """
    What a failed mount-lease refresh does.
    """

    def refreshed(self, error: Exception) -> tuple[FakeFS, Clock]:
        clock = Clock()
        mount = service(RefreshingControl(error), FakeLink(), clock)
        fs = FakeFS()
        internals: Any = mount
        internals._fs = fs
        internals._refresh()
        return fs, clock

    def test_lease_lost_makes_mount_read_only(self) -> None:
        """410 lease_lost turns the mount read-only and stops refreshing."""
        fs, clock = self.refreshed(LeaseLost(410, "lease_lost", "", {}))
        self.assertEqual(len(fs.read_only), 1)
        self.assertIn("mount lease lost", fs.read_only[0])
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_revoked_allocation_makes_mount_read_only(self) -> None:
        """410 revoked (the allocation was revoked) turns the mount read-only too."""
        fs, clock = self.refreshed(Revoked(410, "revoked", "", {}))
        self.assertEqual(len(fs.read_only), 1)
        self.assertIn("allocation revoked", fs.read_only[0])
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_revocation_after_its_own_lease_release_is_no_warning(self) -> None:
        """
        Stopping, the mount released its own lease, and the data plane then
        revokes its certificate: no "read-only" warning (its own doing);
        while running, the same push turns the mount read-only.
        """
        for stopping, expected in ((True, 0), (False, 1)):
            mount = service(RefreshingControl(ValueError()), FakeLink(), Clock())
            fs = FakeFS()
            internals: Any = mount
            internals._fs = fs
            internals._stopping = stopping
            internals._credentials_revoked("1e")
            self.assertEqual(len(fs.read_only), expected)

    def test_other_failure_is_retried(self) -> None:
        """Any other failure keeps the mount writable and refreshes again later."""
        fs, clock = self.refreshed(ConnectionRefusedError("control down"))
        self.assertEqual(fs.read_only, [])
        self.assertEqual(len(clock.getDelayedCalls()), 1)
