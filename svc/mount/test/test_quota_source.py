"""
Tests for L{svc.mount.remote.quota_source}: the C{statfs} answer as a
L{QuotaReport}, kept for a few seconds of an injected clock, failures never
kept; and C{MountFS.statfs} over it against a real data-plane service.
"""

from __future__ import annotations

import errno

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from svc.mount.core.attributes import BLOCK_SIZE, QuotaReport
from svc.mount.core.errors import RemoteFailure
from svc.mount.remote.quota_source import QUOTA_CACHE_SECONDS, QuotaSource, quota_report
from svc.mount.remote.remote_values import DiskUsage
from svc.mount.test.test_fs_support import CALLER, FSFixture
from svc.store.layout import TenantLocation
from svc.wire.errno import WireErrno

LIMITED = DiskUsage(1000, 5000, None, 1000, 4000)


class Requests:
    """A C{statfs} fetcher whose answers the test gives, one Deferred per request."""

    def __init__(self) -> None:
        self.pending: list[Deferred[DiskUsage]] = []

    def __call__(self) -> Deferred[DiskUsage]:
        request: Deferred[DiskUsage] = Deferred()
        self.pending.append(request)
        return request


class QuotaReportTests(SynchronousTestCase):
    """
    L{quota_report}: the quota is the usage plus the room left.
    """

    def test_limited(self) -> None:
        """With a limit the quota is used + available and the usage is the agent's."""
        self.assertEqual(quota_report(LIMITED), QuotaReport(5000, 1000))
        budget_bound = DiskUsage(1000, 5000, 9000, 8500, 500)
        self.assertEqual(quota_report(budget_bound), QuotaReport(1500, 1000))

    def test_unlimited(self) -> None:
        """Without grant or budget the quota is unknown (None)."""
        self.assertEqual(
            quota_report(DiskUsage(700, None, None, 900, None)), QuotaReport(None, 700)
        )

    def test_over_the_grant(self) -> None:
        """Usage over a lowered grant reports a full disk: quota = usage."""
        self.assertEqual(
            quota_report(DiskUsage(3000, 1000, None, 3000, 0)), QuotaReport(3000, 3000)
        )


class QuotaSourceTests(SynchronousTestCase):
    """
    L{QuotaSource}: one request per burst, answers kept for their lifetime.
    """

    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(1000)
        self.requests = Requests()
        self.source = QuotaSource(self.requests, self.clock)

    def test_burst_costs_one_request(self) -> None:
        """Calls while a request is in flight share it; calls within the lifetime reuse it."""
        first, second = self.source(), self.source()
        self.assertEqual(len(self.requests.pending), 1)
        self.assertNoResult(first)
        self.requests.pending[0].callback(LIMITED)
        self.assertEqual(self.successResultOf(first), QuotaReport(5000, 1000))
        self.assertEqual(self.successResultOf(second), QuotaReport(5000, 1000))
        self.clock.advance(QUOTA_CACHE_SECONDS - 0.1)
        self.assertEqual(self.successResultOf(self.source()), QuotaReport(5000, 1000))
        self.assertEqual(len(self.requests.pending), 1)

    def test_expires(self) -> None:
        """After its lifetime (counted from the request) an answer is asked for again."""
        self.source()
        self.clock.advance(2)
        self.requests.pending[0].callback(LIMITED)
        self.clock.advance(QUOTA_CACHE_SECONDS - 2)
        later = self.source()
        self.assertEqual(len(self.requests.pending), 2)
        self.requests.pending[1].callback(DiskUsage(2000, 5000, None, 2000, 3000))
        self.assertEqual(self.successResultOf(later), QuotaReport(5000, 2000))

    def test_failure_not_kept(self) -> None:
        """A failed request fails its callers with its error, and the next call asks again."""
        first, second = self.source(), self.source()
        self.requests.pending[0].errback(RemoteFailure(errno.EIO, "statfs: connection lost"))
        for waiter in (first, second):
            self.assertEqual(self.failureResultOf(waiter, RemoteFailure).value.errno, errno.EIO)
        retried = self.source()
        self.assertEqual(len(self.requests.pending), 2)
        self.requests.pending[1].callback(LIMITED)
        self.assertEqual(self.successResultOf(retried), QuotaReport(5000, 1000))

    def test_server_without_statfs(self) -> None:
        """A data plane answering ENOSYS (older than the mount) means no quota, asked once."""
        first = self.source()
        self.requests.pending[0].errback(
            RemoteFailure(errno.ENOSYS, "statfs: unknown op", WireErrno.ENOSYS)
        )
        self.assertEqual(self.successResultOf(first), QuotaReport(None, 0))
        self.clock.advance(QUOTA_CACHE_SECONDS * 10)
        self.assertEqual(self.successResultOf(self.source()), QuotaReport(None, 0))
        self.assertEqual(len(self.requests.pending), 1)

    def test_expired_answer_not_served_on_failure(self) -> None:
        """Once expired, an old answer is not served when the new request fails."""
        self.source()
        self.requests.pending[0].callback(LIMITED)
        self.clock.advance(QUOTA_CACHE_SECONDS)
        failed = self.source()
        self.requests.pending[1].errback(RemoteFailure(errno.EIO, "statfs: timed out"))
        self.failureResultOf(failed, RemoteFailure)

    def test_clock_going_back(self) -> None:
        """A clock set backwards ends the kept answer instead of stretching its life."""
        self.source()
        self.requests.pending[0].callback(LIMITED)
        self.clock.advance(-60)
        self.source()
        self.assertEqual(len(self.requests.pending), 2)

    def test_answered_at_once(self) -> None:
        """A fetcher that answers synchronously still serves the caller and is kept."""
        calls: list[int] = []

        def answered() -> Deferred[DiskUsage]:
            calls.append(1)
            done: Deferred[DiskUsage] = Deferred()
            done.callback(LIMITED)
            return done

        source = QuotaSource(answered, self.clock)
        self.assertEqual(self.successResultOf(source()), QuotaReport(5000, 1000))
        self.assertEqual(self.successResultOf(source()), QuotaReport(5000, 1000))
        self.assertEqual(len(calls), 1)


class MountStatfsTests(SynchronousTestCase):
    """
    C{MountFS.statfs} over a L{QuotaSource} and a real data-plane service.
    """

    def setUp(self) -> None:
        self.fixture = FSFixture(self)
        self.mount = self.fixture.mount()
        self.clock = Clock()
        self.mount.fs._ctx.quota = QuotaSource(self.mount.remote.statfs, self.clock)

    def test_reports_the_grant(self) -> None:
        """Blocks are the grant; available blocks shrink by the file written, once asked again."""
        engine = self.fixture.service.service.engine
        location = TenantLocation("user-1", "tenant-a")
        self.successResultOf(engine.set_agent_grant(location, "agent-1", 1 << 20))
        before = self.mount.ok(self.mount.fs.statfs(CALLER))
        self.assertEqual((before.blocks, before.blocks_available), (256, 256))
        self.mount.write_file("f", b"x" * 100_000)
        self.assertEqual(self.mount.ok(self.mount.fs.statfs(CALLER)), before)
        self.assertEqual(self.mount.count("statfs"), 1)
        self.clock.advance(QUOTA_CACHE_SECONDS)
        after = self.mount.ok(self.mount.fs.statfs(CALLER))
        used_blocks = -(-100_000 // BLOCK_SIZE)
        self.assertEqual((after.blocks, after.blocks_available), (256, 256 - used_blocks))
        self.assertEqual(self.mount.count("statfs"), 2)

    def test_no_limit(self) -> None:
        """Without grant or budget the capacity is the unknown-quota 1 PiB."""
        stats = self.mount.ok(self.mount.fs.statfs(CALLER))
        self.assertEqual(stats.blocks, (1 << 50) // BLOCK_SIZE)

    def test_lost_connection_is_eio(self) -> None:
        """statfs fails with EIO (an FSError, not a bug) when its request gets no answer."""
        self.successResultOf(self.mount.connection.close())
        self.assertEqual(self.mount.errno(self.mount.fs.statfs(CALLER)), errno.EIO)
