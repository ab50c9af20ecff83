"""
C{statfs} through a real mount: the agent's grant, set through the control
plane with the service token, is what C{os.statvfs} of the mount reports,
and the free space shrinks by a file written through the mount; a write
past the grant fails C{EDQUOT} itself.
"""

from __future__ import annotations

import errno
import os
import re
import time
from collections.abc import Callable

from svc.quickstart import DEMO_AGENT, http
from tests.mount_harness import Mount, MountStackCase

GRANT = 64 << 20
"""Bytes: the demo agent's grant for this test (the quickstart gives it 1 GiB)."""

SIZE = 3 << 20
"""Bytes of the file written (random, so every chunk is new)."""

SETTLE_SECONDS = 30.0
"""How long a change may take to show: quota delivery plus the mount's 5 s cache."""


class MountStatfsTests(MountStackCase):
    """df on the mount reports the disk's quota."""

    def wait_for(self, what: str, check: Callable[[os.statvfs_result], bool]) -> os.statvfs_result:
        """The mount's C{statvfs} once C{check} accepts it."""
        deadline = time.monotonic() + SETTLE_SECONDS
        while True:
            stats = os.statvfs(self.mount_point)
            if check(stats):
                return stats
            if time.monotonic() > deadline:
                self.fail(f"statvfs never showed {what}: {stats}")
            time.sleep(0.5)

    def statfs_requests(self) -> float:
        """C{svc_dataplane_op_duration_seconds_count{op="statfs"}} of the data plane."""
        found = re.search(
            r'^svc_dataplane_op_duration_seconds_count\{op="statfs"\}\s+(\S+)',
            self.dataplane_metrics(),
            re.M,
        )
        return float(found.group(1)) if found else 0.0

    def mount_with_grant(self) -> Mount:
        """Give the demo agent the grant C{GRANT} (the host API), then mount."""
        status, body = http(
            "PATCH",
            f"{self.control_url}/v1/entities/agent/{DEMO_AGENT}",
            {"grant_bytes": GRANT},
            self.state["token"],
        )
        self.assertEqual(status, 200, body)
        return self.mount()

    def test_statvfs_reports_the_grant(self) -> None:
        """f_blocks is the grant, f_bavail drops by a file's size, a burst is one request."""
        mount = self.mount_with_grant()
        before = self.wait_for(
            "the grant", lambda st: abs(st.f_blocks * st.f_frsize - GRANT) < st.f_frsize
        )
        free_before = before.f_bavail * before.f_frsize
        self.assertLessEqual(free_before, GRANT)

        asked = self.statfs_requests()
        for _ in range(20):
            os.statvfs(self.mount_point)
        self.assertLessEqual(self.statfs_requests() - asked, 1)

        (self.mount_point / "sized.bin").write_bytes(os.urandom(SIZE))
        after = self.wait_for(
            "the file's bytes", lambda st: st.f_bavail * st.f_frsize < free_before - SIZE // 2
        )
        # Usage is rounded up to whole blocks before and after.
        shrunk = free_before - after.f_bavail * after.f_frsize
        self.assertAlmostEqual(shrunk, SIZE, delta=2 * after.f_frsize)
        self.assertEqual(after.f_blocks, before.f_blocks)
        self.unmount(mount)

    def test_a_write_past_the_grant_fails_at_the_write(self) -> None:
        """
        Writing more than the grant through the mount: a C{write} fails
        C{EDQUOT} before the C{close} (which then succeeds), the bytes
        written before it are committed, and removing the file gives the
        room back to the next write at once.
        """
        mount = self.mount_with_grant()
        self.wait_for("the grant", lambda st: abs(st.f_blocks * st.f_frsize - GRANT) < st.f_frsize)
        piece = os.urandom(1 << 20)
        path = self.mount_point / "too-big.bin"
        written = 0
        with path.open("wb", buffering=0) as out:
            with self.assertRaises(OSError) as raised:
                while written <= 2 * GRANT:
                    written += out.write(piece)
        self.assertEqual(raised.exception.errno, errno.EDQUOT)
        self.assertLess(written, GRANT)
        self.assertEqual(path.stat().st_size, written)
        path.unlink()
        (self.mount_point / "after.bin").write_bytes(piece)
        self.unmount(mount)
