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

from svc.mount.settings import MountSettings
from svc.mount.tap import MountService


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


class FakeLink:
    """The reconnecting data-plane client: counts switches."""

    def __init__(self) -> None:
        self.switches = 0

    def switch(self) -> Deferred[bool]:
        self.switches += 1
        return succeed(True)


def service(control: FakeControl, link: FakeLink, clock: Clock) -> MountService:
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
